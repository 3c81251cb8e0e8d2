"""`autoresearch agent`: an agent started by hand, confined like the loop's, through the real CLI. Inside it the
held-out rows cannot be reached (by path, through the cache, through /proc), nothing the harness executes can be
written, and the harness's commands still work: the broker runs them outside, and refuses what would lower the
protection. Fast: a probe instead of an agent, no training (the night through the broker is in test_night)."""

import json
import sys
import textwrap

from conftest import ROOT, cli, sh

PROBE = textwrap.dedent(r'''
    import json, os, subprocess, sys
    from pathlib import Path
    cache = Path(os.environ["AUTORESEARCH_CACHE"])
    manifest = json.load(open(cache / "manifest.json"))
    held_out = [rel for rel in manifest["files"] if "/val." in rel or "/test." in rel]
    out = {"held_out_by_path": [rel for rel in held_out if os.path.exists(cache / rel)],
           "cache": sorted(os.listdir(cache)),
           "data": sorted(os.listdir(cache / manifest["data_dir"])),
           "other_processes": [p for p in os.listdir("/proc") if p.isdigit() and int(p) > 3]}
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
    out["run_off"] = harness("run", "-m", "x", "--sandbox", "off")
    out["loop"] = harness("loop")
    out["report_out"] = harness("report", "--out", "/tmp/x.png")
    print("PROBE " + json.dumps(out))
''')


def test_an_agent_started_by_hand_reaches_no_held_out_row_and_drives_the_harness(repo, env, tmp_path, bwrap_or_skip):
    bwrap_or_skip()
    (repo / "probe.py").write_text(PROBE)  # where the agent sees it: /tmp is its own
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write("probe.py\n")
    proc = cli(repo, "agent", "--", sys.executable, "probe.py", str(ROOT / "autoresearch" / "cli.py"),
               env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "confined" in proc.stderr
    seen = json.loads(proc.stdout.split("PROBE ", 1)[1])
    assert seen["held_out_by_path"] == [] and seen["other_processes"] == [], seen
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
    for key, fix in (("run_off", "bubblewrap"), ("loop", "does not run inside"), ("report_out", "takes only")):
        rc, text = seen[key]
        assert rc == 2 and fix in text, (key, text)


def test_agent_without_data_or_with_a_missing_command_is_a_clear_error(repo, env, bwrap_or_skip):
    bwrap_or_skip()
    proc = cli(repo, "agent", "--", "no-such-agent-xyz", env=env)
    assert proc.returncode == 2 and "not on PATH" in proc.stderr
    proc = cli(repo, "agent", "--allow", "/no/such/dir", "--", "true", env=env)
    assert proc.returncode == 2 and "--allow /no/such/dir" in proc.stderr
