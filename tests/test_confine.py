"""`autoresearch agent`: an agent started by hand, confined like the loop's, through the real CLI. Inside it the
held-out rows cannot be reached (by path, through the cache, through /proc), nothing the harness executes can be
written, and the harness's commands still work: the broker runs them outside, and refuses what would lower the
protection. Fast but the last: a probe instead of an agent, no training."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, cli, sh

PROBE = textwrap.dedent(r'''
    import json, os, subprocess, sys
    from pathlib import Path
    def lineage():  # this process and its ancestors: bubblewrap's init, the network relay (netproxy.py run as a script)
        pid, seen = os.getpid(), set()
        while pid > 0 and pid not in seen:
            seen.add(pid)
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        return seen
    cache = Path(os.environ["AUTORESEARCH_CACHE"])
    manifest = json.load(open(cache / "manifest.json"))
    held_out = [rel for rel in manifest["files"] if "/val." in rel or "/test." in rel]
    out = {"held_out_by_path": [rel for rel in held_out if os.path.exists(cache / rel)],
           "cache": sorted(os.listdir(cache)),
           "data": sorted(os.listdir(cache / manifest["data_dir"])),
           "other_processes": [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in lineage()],
           "ray_token": os.path.exists(os.path.expanduser("~/.ray/auth_token")) or "RAY_AUTH_TOKEN" in os.environ}
    for pid in ("1", "2"):  # the sandbox's own: no /proc/PID/root or fd/ of the harness to walk into
        try:
            out.setdefault("proc_roots", []).append(os.path.exists(Path("/proc", pid, "root") / cache.relative_to("/")
                                                                   / held_out[0]))
        except OSError:
            pass
    def harness(*args):
        proc = subprocess.run([sys.executable, "-m", "autoresearch.cli", *args], capture_output=True, text=True)
        return proc.returncode, proc.stdout + proc.stderr
    out["setup"] = harness("setup", "--tag", "conf")
    def write(path):
        try:
            with open(path, "a") as f:
                f.write("")
            return "written"
        except OSError as e:
            return e.strerror
    out["writes"] = {name: write(path) for name, path in (
        ("train.py", "train.py"), ("prepare.py", "prepare.py"), ("new file", "notes.txt"), ("probe", "probe.py"),
        ("git hook", ".git/hooks/post-commit"), ("harness", sys.argv[1]), ("state", ".autoresearch/tags/conf.json"))}
    out["status"] = harness("status", "--json")
    out["setup_again"] = harness("setup", "--tag", "conf2")  # from the experiment branch: a base of its own
    out["run_off"] = harness("run", "-m", "x", "--sandbox", "off")
    out["loop"] = harness("loop")
    out["report_out"] = harness("report", "--out", "/tmp/x.png")
    out["huge_seed"] = harness("run", "-m", "x", "--seed", "9" * 4000)  # a second channel into the training
    print("PROBE " + json.dumps(out))
''')


def test_an_agent_started_by_hand_reaches_no_held_out_row_and_drives_the_harness(repo, env, tmp_path, bwrap_or_skip):
    bwrap_or_skip()
    (repo / "probe.py").write_text(PROBE)  # where the agent sees it: /tmp is its own
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write("probe.py\n")
    proc = cli(repo, "agent", "--", sys.executable, "probe.py", str(ROOT / "autoresearch" / "cli.py"),
               env=dict(env, RAY_AUTH_TOKEN="the parallel loop's"), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "confined" in proc.stderr
    seen = json.loads(proc.stdout.split("PROBE ", 1)[1])
    assert seen["held_out_by_path"] == [] and seen["other_processes"] == [] and not seen["ray_token"], seen
    assert seen["cache"] == ["data", "manifest.json", "tokenizer.json"]  # no downloads, no secrets
    assert all(name.startswith("train_") for name in seen["data"]) and seen["data"]
    assert not any(seen.get("proc_roots", [])), seen
    assert seen["writes"] == {"train.py": "written", "prepare.py": "Read-only file system",
                              "new file": "Read-only file system", "probe": "Read-only file system", "git hook": "Read-only file system",
                              "harness": "Read-only file system", "state": "Read-only file system"}, seen["writes"]
    # the harness's commands ran outside, in the repository: the tag exists there, under bubblewrap
    rc, text = seen["setup"]
    assert rc == 0 and "protection bwrap" in text, text
    assert sh(repo, "git", "branch", "--show-current") == "autoresearch/conf"
    rc, text = seen["status"]
    assert rc == 0 and json.loads(text)["current_tag"] == "conf", text
    for key, fix in (("run_off", "bubblewrap"), ("loop", "does not run inside"), ("report_out", "takes only"),
                     ("setup_again", "not from an experiment branch"), ("huge_seed", "a seed is between")):
        rc, text = seen[key]
        assert rc == 2 and fix in text, (key, text)


def small_cache_of(env) -> Path:
    return Path(env["AUTORESEARCH_CACHE"])


def test_agent_without_data_or_with_a_missing_command_is_a_clear_error(repo, env, home, bwrap_or_skip):
    bwrap_or_skip()
    env = dict(env, HOME=str(home))
    proc = cli(repo, "agent", "--", "no-such-agent-xyz", env=env)
    assert proc.returncode == 2 and "not on PATH" in proc.stderr
    (home / ".config").mkdir()
    # .git or ~/.config (git's config): a core.fsmonitor ran outside at the broker's next git call; what exists
    # is refused whatever it is (test_allow_opens_only_a_new_empty_directory_the_harness_creates)
    for undoing in (repo, repo / ".git", small_cache_of(env), home, home / ".config", Path("/usr/local/bin")):
        proc = cli(repo, "agent", "--allow", str(undoing), "--", "true", env=env)
        assert proc.returncode == 2 and "choose a path that does not exist" in proc.stderr, proc.stderr
    # new, but where what it holds would be run or read by the harness, git or a program at its start
    for undoing in (repo / "notes", repo / ".git" / "hooks2", small_cache_of(env) / "new", home / ".config" / "git",
                    Path("/usr/local/bin/new-xyz")):  # on PATH: a `git` planted there ran at the broker's next call
        proc = cli(repo, "agent", "--allow", str(undoing), "--", "true", env=env)
        assert proc.returncode == 2 and ("may not write" in proc.stderr or "hidden directory" in proc.stderr), \
            proc.stderr
        assert not undoing.exists()


def test_a_train_py_carrying_more_than_the_tags_limit_is_refused_before_it_runs(repo, env):
    """3 KB beyond the base, compressed with it as dictionary: random bytes in base85 cannot hide in it."""
    import base64
    import os

    from test_harness import rows
    assert cli(repo, "setup", "--tag", "carry", "--sandbox", "off", env=env).returncode == 0
    base = (repo / "train.py").read_text()
    (repo / "train.py").write_text(base + f"\nHELD_OUT = {base64.b85encode(os.urandom(4000)).decode()!r}\n")
    proc = cli(repo, "run", "-m", "memoriser", env=env)
    [row] = rows(repo)
    assert proc.returncode == 1 and row.status == "refused", row.description
    assert "carries" in row.description and "limit of 3,072" in row.description
    assert "Remove what it embeds" in row.description


NIGHT = textwrap.dedent(r'''
    import re, subprocess, sys, time
    def harness(*args):
        proc = subprocess.run([sys.executable, "-m", "autoresearch.cli", *args], capture_output=True, text=True)
        print(f"$ autoresearch {' '.join(args)}\n{proc.stdout}{proc.stderr}[exit {proc.returncode}]", flush=True)
        return proc.returncode
    def experiment(message):
        assert harness("run", "-m", message, "--detach") == 0
        while harness("wait", "--timeout", "60") == 3:
            pass
    assert harness("setup", "--tag", "byhand", "--decision", "naive") == 0
    # a process of the agent's that would share the machine with its runs: a daemon beating every 10 ms
    beat = subprocess.Popen([sys.executable, "-c", "import time\nwhile True:\n    print(time.time(), flush=True)\n"
                             "    time.sleep(0.01)"], stdout=open("/tmp/beats", "w"), start_new_session=True)
    experiment("baseline")
    src = open("train.py").read()
    open("train.py", "w").write(re.sub(r"^WARMDOWN_RATIO = .*$", "WARMDOWN_RATIO = 0.3", src, flags=re.M))
    experiment("shorter warmdown (0.3)")
    harness("status")
    beats = [float(t) for t in open("/tmp/beats").read().split()]
    print("PAUSES", [round(b - a, 1) for a, b in zip(beats, beats[1:]) if b - a > 1.0], flush=True)
''')


@pytest.mark.slow
def test_an_agent_started_by_hand_runs_a_short_night_through_the_broker(repo, env, bwrap_or_skip):
    """What program.md tells an agent, from inside `autoresearch agent`: setup, `run --detach` and `wait`, an edit
    of train.py, a second experiment; recorded outside, under bubblewrap. The naive rule: one run an experiment
    (under the stat rule the baseline's three runs and the change's series took 59-90 s of the suite)."""
    bwrap_or_skip()
    from test_harness import rows
    (repo / "night.py").write_text(NIGHT)
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write("night.py\n")
    proc = cli(repo, "agent", "--", sys.executable, "night.py", env=env,
               timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recorded = rows(repo)
    assert [r.description.split(" [")[0] for r in recorded][:1] == ["baseline"], proc.stdout[-3000:]
    assert recorded[-1].description.startswith("shorter warmdown (0.3)") and recorded[-1].status in ("keep", "discard")
    assert all(r.protection == "bwrap" for r in recorded)
    assert "WARMDOWN_RATIO = 0.3" in sh(repo, "git", "show", f"{recorded[-1].commit}:train.py")
    # the agent's daemon ran nothing while either run trained (pause.py): two pauses, each longer than a run's
    # training budget (a daemon let run mid-training splits its run's pause in two shorter ones). Gaps over a second
    # but shorter than a training are the machine stalling outside the runs, not pauses: not counted
    pauses = json.loads(proc.stdout.split("PAUSES ", 1)[1].splitlines()[0])
    assert len([p for p in pauses if p > float(env["AUTORESEARCH_TIME_BUDGET"])]) == 2, proc.stdout[-3000:]
    # the session's tokens (tokens.py): unknown (this agent records none), its runs all those of its stretch
    report = json.loads(cli(repo, "report", "--json", env=env).stdout)
    bill = report["tags"][0]["agent_tokens"]
    assert [(s["kind"], s["total"], s["runs"]) for s in bill["sessions"]] == [("session", None,
                                                                               [r.run_id for r in recorded])]
    assert bill["unknown"] == 1 and "left no session record" in bill["sessions"][0]["source"]


def test_a_run_trains_on_the_train_py_it_checked_and_committed(repo, env, tmp_path):
    """A confined agent may rewrite train.py at any moment: between the check and the commit, or while the run
    trains. What runs is a copy read once (bound at train.py's path in the sandbox), checked again, and equal
    to the commit."""
    import json as _json
    import os

    from autoresearch import execute, git, sandbox, tags
    assert cli(repo, "setup", "--tag", "snap", "--sandbox", "off", env=env).returncode == 0
    old = dict(os.environ)
    os.environ.update(AUTORESEARCH_CACHE=env["AUTORESEARCH_CACHE"])
    try:
        config = tags.load_tag(repo)
        (repo / "train.py").write_text((repo / "train.py").read_text() + "\n# the change\n")
        commit = git.commit_file(repo, "train.py", "change")
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        assert execute.checked_source(repo, config, run_dir, commit) is None
        assert (run_dir / sandbox.SOURCE).read_bytes() == (repo / "train.py").read_bytes()
        (repo / "train.py").write_text((repo / "train.py").read_text() + "\nX = 1  # swapped in after\n")
        assert "changed after it was checked and committed" in execute.checked_source(repo, config, run_dir, commit)
        (run_dir / sandbox.VIEW_DIR).mkdir()  # made by the harness before a sandbox mounts them
        (run_dir / sandbox.OUT_DIR).mkdir()
        argv = sandbox.wrap(["true"], repo, run_dir, Path(env["AUTORESEARCH_CACHE"]), _json.loads(
            (Path(env["AUTORESEARCH_CACHE"]) / "manifest.json").read_text()))
        at = argv.index(str(repo / "train.py"))
        assert argv[at - 1] == str(run_dir / sandbox.SOURCE)  # the copy, never the work tree's
    finally:
        os.environ.clear()
        os.environ.update(old)


def test_putting_train_py_back_keeps_the_file_a_confined_agent_has_bound(tmp_path):
    """Red team (round 2): a discard or a control put train.py back with `git checkout`, which replaces the file;
    a confined agent's sandbox binds that file (confine.wrap_agent), and the kernel dissolves a bind whose file is
    unlinked: the agent's next edit failed with "Read-only file system". The file is now rewritten in place."""
    import subprocess

    from autoresearch import git

    def sh(*args):
        return subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    sh("git", "init", "-q")
    (tmp_path / "train.py").write_text("a = 1\n")
    sh("git", "add", "train.py")
    sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    first = sh("git", "rev-parse", "HEAD")
    (tmp_path / "train.py").write_text("a = 2\n")
    sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "b")
    inode = (tmp_path / "train.py").stat().st_ino
    git.reset_to(tmp_path, first, "train.py")
    assert (tmp_path / "train.py").read_text() == "a = 1\n" and (tmp_path / "train.py").stat().st_ino == inode
    assert sh("git", "rev-parse", "HEAD") == first and sh("git", "status", "--porcelain") == ""
    # a link left in its place is replaced, never written through
    (tmp_path / "elsewhere").write_text("not train.py\n")
    (tmp_path / "train.py").unlink()
    (tmp_path / "train.py").symlink_to(tmp_path / "elsewhere")
    git.reset_to(tmp_path, first, "train.py")
    assert not (tmp_path / "train.py").is_symlink() and (tmp_path / "elsewhere").read_text() == "not train.py\n"
    assert (tmp_path / "train.py").read_text() == "a = 1\n"


# --- the agent's world: an allowlist, not the host's `/` with masks (issue 51) -------------------------------

LATE = textwrap.dedent(r'''
    import json, os, time
    from pathlib import Path
    home = Path(os.environ["HOME"])
    Path("train.py").write_text("started\n")  # the bound file: the test outside sees it
    deadline = time.monotonic() + 300
    while "go" not in Path("train.py").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    def read(path):
        try:
            return path.read_text()
        except OSError as e:
            return e.strerror
    def write(path):
        try:
            with open(path, "a") as f:
                f.write("inside\n")
            return "written"
        except OSError as e:
            return e.strerror
    print("SEEN " + json.dumps({
        "late": read(home / ".newdir" / "token"), "ssh": read(home / ".ssh" / "id_ed25519"),
        "listing": sorted(os.listdir(home)), "credentials": read(home / ".claude" / ".credentials.json"),
        "write_credentials": write(home / ".claude" / ".credentials.json"),
        "write_settings": write(home / ".claude" / "settings.json"),
        "write_home": write(home / "written-inside")}))
''')


@pytest.fixture
def home():
    """A home of the test's own, outside /tmp (an agent's /tmp is private whatever else it sees, so a home under it
    would hide what a real one shows); nothing of the user's is touched."""
    import shutil
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="autoresearch-home-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_agent_sees_no_file_of_your_home_but_its_own_not_even_one_made_after_it_started(repo, env, home,
                                                                                              bwrap_or_skip):
    """Attack: the agent saw the host's `/` read-only, masked where sensitive paths existed when it started. A
    directory made under home later (~/.ray with Ray's token, at a machine's first `loop --workers N`; Jupyter's
    runtime files) was readable inside, and so was any file of home nobody thought to mask (an ssh key). Now its
    home is private: its own credentials and settings at their paths, nothing else of yours."""
    import subprocess
    import time
    bwrap_or_skip()
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (home / ".claude").mkdir()
    (home / ".claude" / ".credentials.json").write_text("{}\n")
    (home / ".claude" / "settings.json").write_text("{}\n")
    (repo / "late.py").write_text(LATE)
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write("late.py\n")
    proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "agent", "--", sys.executable, "late.py"],
                            cwd=repo, env=dict(env, HOME=str(home)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while (repo / "train.py").read_text() != "started\n":
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        (home / ".newdir").mkdir()  # after the agent started
        (home / ".newdir" / "token").write_text("LATE TOKEN\n")
        (repo / "train.py").write_text("go\n")  # in place: the agent's bind holds
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    seen = json.loads(out.split("SEEN ", 1)[1])
    assert seen["late"] == "No such file or directory" and seen["ssh"] == "No such file or directory", seen
    assert ".newdir" not in seen["listing"] and ".ssh" not in seen["listing"], seen
    # its own credentials, as before: readable and writable, the write kept; its settings read-only
    assert seen["credentials"] == "{}\n" and seen["write_credentials"] == "written", seen
    assert (home / ".claude" / ".credentials.json").read_text() == "{}\ninside\n"
    assert seen["write_settings"] == "Read-only file system", seen
    # what it writes in its home stays in its session
    assert seen["write_home"] == "written" and not (home / "written-inside").exists(), seen


def test_allow_opens_only_a_new_empty_directory_the_harness_creates(repo, env, tmp_path, home, bwrap_or_skip):
    """Attack: `--allow ~/.aider` was accepted; the agent wrote git settings into a file aider loads at start, and
    git's fsmonitor ran a payload as the user, outside any sandbox. `--allow` now takes only a path that does not
    exist (and none in home's hidden directories, where programs keep what they load): the harness creates it
    empty, and binds it writable."""
    bwrap_or_skip()
    (home / ".aider").mkdir(parents=True)
    fenv = dict(env, HOME=str(home))
    plant = ["--", "sh", "-c", 'echo "GIT_CONFIG_COUNT=1" > "$HOME/.aider/oauth-keys.env"']
    proc = cli(repo, "agent", "--allow", str(home / ".aider"), *plant, env=fenv)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "choose a path that does not exist" in proc.stderr and str(home / ".aider") in proc.stderr, proc.stderr
    assert not (home / ".aider" / "oauth-keys.env").exists()
    (home / ".aider").rmdir()  # not there yet: made by the harness, aider would still load what the agent left
    proc = cli(repo, "agent", "--allow", str(home / ".aider"), *plant, env=fenv)
    assert proc.returncode == 2 and "--allow" in proc.stderr and not (home / ".aider").exists(), proc.stderr
    notes = tmp_path / "agent-notes" / "night1"
    proc = cli(repo, "agent", "--allow", str(notes), "--", "sh", "-c", f'ls -A "{notes}"; echo kept > "{notes}/n"',
               env=fenv)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr[-2000:]  # created empty
    assert (notes / "n").read_text() == "kept\n"


def test_an_agent_installed_under_home_runs_with_its_package_and_nothing_else_of_home(repo, env, home,
                                                                                      bwrap_or_skip):
    """Claude Code's installer puts `claude` in ~/.local/bin, a link into its package; npm's and pipx's do the
    same. The agent's empty root shows that package (read-only) and the link on PATH, not the rest of ~/.local
    (keyrings, every program's data)."""
    bwrap_or_skip()
    package = home / ".local" / "lib" / "node_modules" / "fake-agent"
    package.mkdir(parents=True)
    (package / "package.json").write_text("{}\n")
    (package / "vendor.txt").write_text("vendored\n")
    (package / "cli.py").write_text(f"#!{sys.executable}\n" + textwrap.dedent('''
        import os
        here = os.path.dirname(os.path.realpath(__file__))
        print("AGENT", open(os.path.join(here, "vendor.txt")).read().strip(),
              os.path.exists(os.path.expanduser("~/.local/share/keyrings/login.keyring")))
    '''))
    (package / "cli.py").chmod(0o755)
    (home / ".local" / "bin").mkdir()
    (home / ".local" / "bin" / "fake-agent").symlink_to("../lib/node_modules/fake-agent/cli.py")
    (home / ".local" / "share" / "keyrings").mkdir(parents=True)
    (home / ".local" / "share" / "keyrings" / "login.keyring").write_text("secret\n")
    fenv = dict(env, HOME=str(home), PATH=f"{home / '.local' / 'bin'}:{env['PATH']}")
    proc = cli(repo, "agent", "--", "fake-agent", env=fenv)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.split() == ["AGENT", "vendored", "False"], proc.stdout


def test_a_cache_inside_the_repository_shows_the_agent_its_training_files_only(tmp_path, monkeypatch,
                                                                                bwrap_or_skip):
    """AUTORESEARCH_CACHE=./cache in the work tree: the agent's repository, bound after the caches were hidden,
    showed the whole cache again (validation and test tokens, the secret draw beside it)."""
    import subprocess

    from conftest import prepare_small
    bwrap_or_skip()
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("")
    manifest = prepare_small(repo / "cache", tmp_path / "corpus")
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(repo / "cache"))
    from autoresearch import confine
    listing = [sys.executable, "-c", "import os; print(sorted(os.path.relpath(os.path.join(d, f), 'cache') "
               "for d, _, fs in os.walk('cache') for f in fs), os.listdir('cache-secrets'))"]
    proc = subprocess.run(confine.wrap_agent(listing, repo), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from autoresearch.sandbox import training_files
    assert proc.stdout.strip() == f"{sorted(['manifest.json', 'tokenizer.json', *training_files(manifest)])} []"
    assert any("/val." in rel for rel in manifest["files"])  # there outside


def test_the_agents_train_py_is_put_back_when_its_session_ends_and_kept_where_the_user_sees_it(repo, env,
                                                                                               bwrap_or_skip):
    """The attack: a session plants a payload in train.py and runs nothing; left in the work tree, the next
    `python train.py` or test that imports it runs it as the user (docs/integrity.md). When the session ends,
    train.py is the branch's committed one again and the agent's text is saved under the state directory, named."""
    bwrap_or_skip()
    committed = (repo / "train.py").read_text()
    proc = cli(repo, "agent", "--", "sh", "-c", "echo 'import os; os.system(\"id\")  # PAYLOAD' >> train.py", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (repo / "train.py").read_text() == committed and not sh(repo, "git", "status", "--porcelain")
    saved = list((repo / ".autoresearch" / "agent-sessions").glob("*/train.py"))
    assert len(saved) == 1 and saved[0].read_text() == committed + 'import os; os.system("id")  # PAYLOAD\n'
    assert str(saved[0]) in proc.stderr and "untrusted" in proc.stderr
    # a session that leaves train.py as committed: nothing saved, nothing said
    proc = cli(repo, "agent", "--", "true", env=env)
    assert proc.returncode == 0 and "agent-sessions" not in proc.stderr, proc.stderr[-3000:]
    assert len(list((repo / ".autoresearch" / "agent-sessions").glob("*/train.py"))) == 1
    # a payload grown to a sparse 200 GB (4 KB of disk) made the put-back read it whole and fail (MemoryError),
    # leaving it in the work tree (the red team's); a file of mode 000 did the same for a user other than root
    proc = cli(repo, "agent", "--", "sh", "-c", "echo 'import os  # PAYLOAD' > train.py && truncate -s 200G "
               "train.py && chmod 000 train.py", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (repo / "train.py").read_text() == committed and not sh(repo, "git", "status", "--porcelain")
    assert "could not keep" in proc.stderr and "more than the" in proc.stderr, proc.stderr[-3000:]


# --- the agent's network: a namespace of its own, its model's API through the harness's proxy (issue 51) -------

NET_PROBE = textwrap.dedent(r'''
    import json, os, socket, sys
    local, api = int(sys.argv[1]), int(sys.argv[2])
    out = {}
    def direct(port):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:  # a stalled machine's service
                return s.recv(64).decode()
        except OSError as e:
            return e.strerror or str(e)
    def through_proxy(port):
        proxy = os.environ.get("HTTPS_PROXY", "")
        if not proxy:
            return "no proxy"
        host, _, pport = proxy.rsplit("/", 1)[1].partition(":")
        with socket.create_connection((host, int(pport)), timeout=60) as s:
            s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(4096):  # the head and the service's bytes come in any number of reads, up
                data += chunk             # to the end the service (or the proxy's refusal) closes
            head, _, body = data.decode().partition("\r\n\r\n")
            head = head.split("\r\n", 1)[0]
            return head + (" " + body if " 200 " in head else "")
    out["local_service"] = direct(local)
    out["local_via_proxy"] = through_proxy(local)
    out["api_via_proxy"] = through_proxy(api)
    try:
        a = socket.socket(socket.AF_UNIX)
        a.connect("\0autoresearch-test-abstract")
        out["abstract"] = a.recv(64).decode()
    except OSError as e:
        out["abstract"] = e.strerror or str(e)
    print("NET " + json.dumps(out))
''')


def test_the_agent_reaches_its_model_s_api_and_no_service_of_the_host(repo, env, bwrap_or_skip):
    """Attack: with the host's network an agent reached every service on localhost (a Jupyter server runs code on
    request) and the host's abstract Unix sockets. Now it has a namespace of its own: nothing of the host's
    loopback, only what the harness's proxy allows (its model's API: here a stand-in on the loopback, allowed with
    AUTORESEARCH_AGENT_HOSTS), and the proxy refuses the rest. The same probe with the host's network, asked for
    with AUTORESEARCH_AGENT_HOSTS=*, reaches all of it: the attack as it was."""
    import socket
    import threading
    bwrap_or_skip()

    def serve(sock, greeting):
        def run():
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(greeting)
        threading.Thread(target=run, daemon=True).start()

    local, api = socket.socket(), socket.socket()
    abstract = socket.socket(socket.AF_UNIX)
    for s in (local, api):
        s.bind(("127.0.0.1", 0))
        s.listen()
    abstract.bind("\0autoresearch-test-abstract")
    abstract.listen()
    serve(local, b"LOCAL SERVICE")
    serve(api, b"MODEL API")
    serve(abstract, b"ABSTRACT")
    try:
        (repo / "netprobe.py").write_text(NET_PROBE)
        with open(repo / ".git" / "info" / "exclude", "a") as f:
            f.write("netprobe.py\n")
        argv = ["agent", "--", sys.executable, str(repo / "netprobe.py"), str(local.getsockname()[1]),
                str(api.getsockname()[1])]
        allowed = dict(env, AUTORESEARCH_AGENT_HOSTS=f"127.0.0.1:{api.getsockname()[1]}")
        proc = cli(repo, *argv, env=allowed, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        seen = json.loads(proc.stdout.split("NET ", 1)[1])
        assert seen["local_service"] != "LOCAL SERVICE" and seen["abstract"] != "ABSTRACT", seen
        assert seen["local_via_proxy"].startswith("HTTP/1.1 403"), seen
        assert seen["api_via_proxy"] == "HTTP/1.1 200 Connection established MODEL API", seen
        assert "its own network" in proc.stderr and f"127.0.0.1:{local.getsockname()[1]}" in proc.stderr
        host = cli(repo, *argv, env=dict(env, AUTORESEARCH_AGENT_HOSTS="*"), timeout=300)
        seen = json.loads(host.stdout.split("NET ", 1)[1])
        assert seen["local_service"] == "LOCAL SERVICE" and seen["abstract"] == "ABSTRACT", seen
    finally:
        for s in (local, api, abstract):
            s.close()
