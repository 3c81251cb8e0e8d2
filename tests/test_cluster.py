"""`autoresearch loop --workers N` on a real local Ray runtime and a real two-node Ray cluster (ray.cluster_utils):
workers killed mid-run, the driver killed and resumed, a node leaving. Budget 2 s, two workers of 1 thread."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import psutil
import pytest

from conftest import ROOT, cli, sh
from test_loop import AGENT

from autoresearch import decide, git, ledger, tags
from autoresearch.record import Trial
from autoresearch.worker import Worker, WorkerRefused, keep_on_branch


pytestmark = [pytest.mark.slow, pytest.mark.serial]  # every test here trains through the real harness, on Ray's cores

def trainings(under) -> list[psutil.Process]:
    """Training processes (python train.py, not the bubblewrap around them) running in a folder under `under`."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmd = p.info["cmdline"] or []
        if cmd[-1:] == ["train.py"] and "python" in os.path.basename(cmd[0]) and "-c" not in cmd \
                and str(p.info["cwd"] or "").startswith(str(under)):
            found.append(p)
    return found


def wait_for(condition, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def ray_processes(since: float) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["name", "cmdline", "create_time"]):
        text = " ".join(p.info["cmdline"] or [])[:300]
        if p.info["create_time"] >= since and ("raylet" in text or "gcs_server" in text or text.startswith("ray::")) \
                and p.status() != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


class BranchWatch:
    """Every commit the branch was seen on, read from its ref file 20 times a second."""

    def __init__(self, repo, branch):
        self.path, self.seen, self.stop = repo / ".git" / "refs" / "heads" / branch, set(), False
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.stop:
            try:
                self.seen.add(self.path.read_text().strip())
            except OSError:
                pass
            time.sleep(0.05)

    def close(self):
        self.stop = True
        self.thread.join()
        return self.seen


def loop_process(repo, env, *args, log):
    return subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "loop", *args], cwd=repo, env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def check_ledger(repo, tag, seen_heads):
    """Every run once, every series' n consistent, the branch only ever on a kept commit (or the base)."""
    rows = ledger.read(repo / "results.tsv", tag)
    ids = [r.run_id for r in rows]
    assert len(ids) == len(set(ids)), "a run recorded twice"
    assert not list((repo / ".autoresearch" / "inflight").glob("*.json")), "a dispatched run never recorded"
    for key, values in decide.samples(rows).items():
        last = [r for r in rows if r.key == key and r.val_bpb > 0][-1]
        assert last.n == len(values)
    config = json.loads((repo / ".autoresearch" / "tags" / f"{tag}.json").read_text())
    kept = {git.git(repo, "rev-parse", r.commit) for r in rows if r.status == "keep"} | {config["base_commit"]}
    assert seen_heads and seen_heads <= kept, f"the branch was on {seen_heads - kept}, which no keep row holds"
    head = git.git(repo, "rev-parse", f"autoresearch/{tag}")
    assert head == tags.last_kept_commit(repo, config, rows)
    for commit in git.git(repo, "rev-list", "--first-parent", f"{config['base_commit']}..{head}").split():
        assert commit in kept, "the branch's history holds a commit that was not kept"
    return rows


def test_workers_side_by_side_survive_a_killed_worker_and_a_killed_driver(repo, env, tmp_path):
    t0 = time.time()
    watch = BranchWatch(repo, "autoresearch/par")
    log = tmp_path / "loop1.log"
    proc = loop_process(repo, env, "--workers", "2", "--tag", "par", "--max-experiments", "4", log=log)
    workers_root = None
    try:
        def two_trainings():
            found = [p for p in trainings("/") if "par-" in str(p.cwd())]
            return found if len(found) == 2 else None
        running = wait_for(two_trainings, 120, "two trainings side by side")
        workers_root = os.path.dirname(os.path.dirname(running[0].cwd()))
        # 1. kill one worker (the Ray actor process) mid-run
        victim = next(a for a in running[0].parents() if (a.cmdline() or [""])[0].startswith("ray::"))
        victim.kill()
        wait_for(lambda: not running[0].is_running() or running[0].status() == psutil.STATUS_ZOMBIE, 15,
                 "the killed worker's training to end")
        results = repo / "results.tsv"
        wait_for(lambda: any("died" in r.description for r in ledger.read(results, "par")), 60,
                 "the killed worker's run to be recorded")
        # 2. the loop goes on with the replacement; kill the driver while runs are in flight
        wait_for(lambda: len(ledger.read(results, "par")) >= 3 and two_trainings(), 180,
                 "more results and two runs in flight")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        try:
            wait_for(lambda: not trainings(workers_root) and not ray_processes(t0), 30,
                     "every training and Ray process to end with the driver")
        except AssertionError:
            left = trainings(workers_root) + ray_processes(t0)
            raise AssertionError(f"left running: {[(p.pid, p.cmdline()[:4]) for p in left]}") from None
        inflight = [json.loads(p.read_text())["run_id"]
                    for p in (repo / ".autoresearch" / "inflight").glob("*.json")]
        assert inflight, "the killed driver had runs in flight"
        status = cli(repo, "status", env=env)
        assert status.returncode == 0 and status.stdout.count("interrupted on w") == len(inflight), status.stdout
        # 3. the next loop records them and goes on, now with an external agent in its own working copy
        (tmp_path / "agent.py").write_text(AGENT)
        agent = f"{sys.executable} {tmp_path / 'agent.py'} --sneaky"
        done = cli(repo, "loop", "--workers", "2", "--max-experiments", "1", "--agent", agent, env=env, timeout=400)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    rows = check_ledger(repo, "par", watch.close())
    by_id = {r.run_id: r for r in rows}
    for run_id in inflight:
        assert decide.is_interruption(by_id[run_id]) and "the driver died" in by_id[run_id].description
    died = [r for r in rows if "died:" in r.description]
    assert len(died) == 1 and decide.is_interruption(died[0]) and died[0].worker
    assert {r.device for r in rows} == {"cpu x1"} and {r.worker for r in rows} >= {"w1", "w2", "w3"}
    finished = [r for r in rows if r.val_bpb > 0]
    log_text = (repo / ".autoresearch" / "runs" / finished[0].run_id / "run.log").read_text()
    assert "threads=1" in log_text and "val_bpb=" in log_text  # set explicitly, whatever Ray's default
    assert sum(r.status == "keep" and r.decision.startswith("baseline") for r in rows) == 3
    assert not trainings(workers_root) and not ray_processes(t0)
    assert "worker w3 joined" in log.read_text()  # the replacement
    proposed = [r for r in rows if r.description.startswith("shorter warmdown (0.3)")]
    from autoresearch import sandbox
    assert proposed and (("reverted" not in proposed[0].description) if sandbox.bwrap_works() else
                         ("agent also edited prepare.py: reverted" in proposed[0].description))  # confined: it failed
    assert sh(repo, "git", "status", "--porcelain") == ""  # the agent worked in its own copy
    # what its turn cost (tokens.py): unknown (this agent records none), and its turn the proposal's runs
    bill = json.loads(cli(repo, "report", "--tag", "par", "--json", env=env).stdout)["tags"][0]["agent_tokens"]
    turns = [s for s in bill["sessions"] if s["runs"]]
    assert len(turns) == 1 and turns[0]["runs"] == [r.run_id for r in proposed] and turns[0]["total"] is None
    assert (repo / "prepare.py").read_text() == (ROOT / "prepare.py").read_text()


def test_two_ray_nodes_and_a_node_that_leaves(repo, env, monkeypatch, tmp_path):
    from ray.cluster_utils import Cluster
    for key in ("AUTORESEARCH_CACHE", "AUTORESEARCH_TIME_BUDGET", "PYTHONPATH"):
        monkeypatch.setenv(key, env[key])  # the nodes' processes inherit the test's environment
    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    log = tmp_path / "loop.log"
    try:
        second = cluster.add_node(num_cpus=1)
        watch = BranchWatch(repo, "autoresearch/two")
        proc = loop_process(repo, env, "--ray-address", cluster.address, "--tag", "two", "--max-experiments", "1",
                            log=log)
        running = wait_for(lambda: len(found := [p for p in trainings("/") if "two-" in str(p.cwd())]) == 2 and found,
                           120, "a training on each node")
        raylets = {next(a.pid for a in p.parents() if "raylet" in " ".join(a.cmdline()[:1])) for p in running}
        assert len(raylets) == 2, "both runs under one node"
        cluster.remove_node(second)
        assert proc.wait(timeout=400) == 0, log.read_text()[-3000:]
    finally:
        if "proc" in locals() and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.shutdown()
    out = log.read_text()
    hosts = {line.split(" joined on ")[1].split(":")[1][:6] for line in out.splitlines() if " joined on " in line}
    assert len(hosts) == 2, out  # w1 and w2 on two nodes
    rows = check_ledger(repo, "two", watch.close())
    left = [r for r in rows if "its node left the cluster" in r.description]
    assert len(left) == 1 and decide.is_interruption(left[0])
    assert [r.status for r in rows if r.decision.startswith("baseline")] == ["keep"] * 3
    wait_for(lambda: not ray_processes(t0), 30, "every Ray process of the cluster to end")


# --- the parts, without Ray -------------------------------------------------------------------------


def test_a_keep_moves_the_branch_forward_even_after_another_keep(repo, env, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", env["AUTORESEARCH_CACHE"])
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", env["AUTORESEARCH_TIME_BUDGET"])
    config = tags.setup(repo, "k", threads=1)
    base = config.base_commit
    source = (repo / "train.py").read_text()
    a_src, b_src = source + "\n# change a\n", source + "\n# change b\n"
    a = git.commit_with(repo, base, "train.py", a_src, "a")
    b = git.commit_with(repo, base, "train.py", b_src, "b")
    assert git.head(repo) == base and not git.changed_files(repo)  # candidates never touch the branch

    def job(commit, src, text):
        return Trial("r", "k", base, text, commit=commit, source=src)

    assert keep_on_branch(repo, job(a, a_src, "a")) == a  # the branch was on its parent: fast-forward
    on_top = keep_on_branch(repo, job(b, b_src, "b"))   # kept after a: a new commit on top of a
    assert git.git(repo, "rev-parse", f"{on_top}^") == a and git.head(repo) == on_top
    assert git.git(repo, "rev-parse", f"{on_top}^2") == b  # what it was made from stays in the history
    assert (repo / "train.py").read_text() == b_src and not git.changed_files(repo)


def test_a_worker_on_a_machine_with_other_data_refuses_to_join(repo, env, monkeypatch):
    for key in ("AUTORESEARCH_CACHE", "AUTORESEARCH_TIME_BUDGET", "AUTORESEARCH_BUDGET_CLOCK", "OMP_NUM_THREADS"):
        monkeypatch.setenv(key, env.get(key, ""))  # restored afterwards: a worker sets them for itself
    config = tags.setup(repo, "w", threads=1, sandbox_mode="off")
    worker = Worker(str(repo), replace(config, fingerprint="0" * 64), "w1", "off")
    info = worker.join()
    assert "refuses to join" in info["error"] and "prepare.py --force" in info["error"]
    with pytest.raises(WorkerRefused, match="refuses to join"):
        worker.run({})
    good = Worker(str(repo), config, "w2", "off").join()
    assert "error" not in good and good["device"] == "cpu x1"
    assert sh(repo, "git", "status", "--porcelain") == ""  # its working copy is elsewhere
    missing = Worker(str(repo / "nowhere"), config, "w3", "off").join()
    assert "has no clone of the repository" in missing["error"] and "AUTORESEARCH_REPO" in missing["error"]
