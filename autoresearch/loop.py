"""`autoresearch loop`: experiments one after another, each proposed by an agent and run exactly like
`autoresearch run`, until stopped (Ctrl-C, --max-experiments, --hours)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from autoresearch import agents, decide, git, ledger, run, sandbox


def ensure_data(log=print) -> None:
    import prepare

    from autoresearch import data
    if prepare.load_manifest() is None:
        log("no prepared data yet: preparing the default for this machine (python prepare.py)")
        data.prepare(log=log)


def existing_tag(repo: Path, tag: str | None) -> dict | None:
    """The tag the loop would continue (see ensure_tag), or None when it would create one."""
    current = git.branch(repo)
    if current.startswith(run.BRANCH_PREFIX) and (tag is None or current == run.BRANCH_PREFIX + tag):
        return run.load_tag(repo)
    if tag is None or not git.branch_exists(repo, run.BRANCH_PREFIX + tag):
        return None
    path = run.state_dir(repo) / "tags" / f"{tag}.json"
    return json.loads(path.read_text()) if path.exists() else None


def ensure_tag(repo: Path, tag: str | None, log=print, threads: int | None = None, sandbox_mode: str | None = None,
               rule: str | None = None) -> dict:
    """Stay on the current experiment branch; else continue or create the given tag (default: today's date).
    `threads`: the threads per run of a new tag (parallel workers); sandbox_mode and rule: a new tag's pins."""
    current = git.branch(repo)
    if current.startswith(run.BRANCH_PREFIX) and (tag is None or current == run.BRANCH_PREFIX + tag):
        return run.load_tag(repo)
    tag = tag or time.strftime("%b%d").lower()
    if git.branch_exists(repo, run.BRANCH_PREFIX + tag):
        if (run.state_dir(repo) / "tags" / f"{tag}.json").exists():
            git.git(repo, "checkout", "-q", run.BRANCH_PREFIX + tag)
            log(f"continuing tag {tag}")
            return run.load_tag(repo)
        n = 2
        while git.branch_exists(repo, f"{run.BRANCH_PREFIX}{tag}-{n}"):
            n += 1
        tag = f"{tag}-{n}"
    config = run.setup(repo, tag, threads, sandbox_mode or "auto", rule or "stat")
    log(f"new tag {tag}: branch {config['branch']}")
    return config


def make_agent(repo: Path, config: dict, spec: str, agent_timeout: float):
    if spec == "builtin":
        import prepare
        from autoresearch.proposer import BuiltinProposer
        manifest = prepare.require_manifest()
        return BuiltinProposer(repo, config["tag"], manifest["profile"], manifest["max_seq_len"])
    return agents.ExternalAgent(repo, config["tag"], spec, agent_timeout)


class Progress:
    """The running experiment's progress over its budget: a bar on a terminal; plain lines otherwise (a log file,
    `| tee`), one per step line the training logs, instead of a bar's carriage returns."""

    def __init__(self, budget: float, label: str):
        self.budget, self.label = budget, label
        # the bar on stderr when both streams are a terminal; else plain lines with the loop's own, on stdout
        self.plain = not (sys.stdout.isatty() and sys.stderr.isatty())
        self.stream = sys.stdout if self.plain else sys.stderr
        self.restart()

    def restart(self):
        """A fresh bar for the next run of the experiment (a repeat)."""
        self.last = None
        if self.plain:
            return
        from tqdm import tqdm
        self.bar = tqdm(total=round(self.budget), desc=self.label[:40], unit="s", leave=False, file=self.stream,
                        bar_format="{desc} |{bar}| {n:.0f}/{total:.0f}s")

    def __call__(self, elapsed, step_line=None):
        if elapsed is None:
            return
        if self.plain:
            if step_line and step_line != self.last:
                self.last = step_line
                print(f"  {step_line}", file=self.stream, flush=True)
            return
        self.bar.n = min(self.bar.total, elapsed)
        self.bar.refresh()

    def close(self):
        if not self.plain:
            self.bar.close()


def line(n: int, r: ledger.Row) -> str:
    """One finished run, as the loop prints it."""
    who = f"[{r.worker}] " if r.worker else ""
    if r.status in ("crash", "refused"):
        return f"#{n:<3d} {r.status:8s} {'':8s}  {r.wall_s:4.0f}s  {who}{r.description}"
    mean = f"mean {r.mean:.6f}" + (f" +- {r.sem:.4f}" if r.sem is not None else "") + f" n={r.n}"
    p = f" P={r.p_better:.3f}" if r.p_better is not None else ""
    return f"#{n:<3d} {r.status:8s} {r.val_bpb:.6f}  {mean}{p}  {r.wall_s:4.0f}s  {who}{r.description}  ({r.decision})"


BASELINE_TRIES = 3


def parallel(args) -> bool:
    """Whether the loop runs on Ray workers (cluster.py): --workers, --ray-address or RAY_ADDRESS."""
    return (getattr(args, "workers", None) is not None or bool(getattr(args, "ray_address", None))
            or bool(os.environ.get("RAY_ADDRESS")))


def main(repo: Path, args, log=print) -> int:
    ensure_data(log)
    if parallel(args):
        from autoresearch import cluster
        return cluster.main(repo, args, log)
    if args.agent != "builtin":
        agents.command_for(args.agent)  # a missing agent binary is an error before the loop starts
    config = ensure_tag(repo, args.tag, log, sandbox_mode=args.sandbox, rule=args.decision)
    try:
        protection = sandbox.protection(args.sandbox or run.tag_sandbox_mode(config))  # --sandbox on without bubblewrap: an error before any run
    except sandbox.SandboxError as e:
        raise run.HarnessError(str(e)) from None
    run.recover(repo, log)
    agent = make_agent(repo, config, args.agent, args.agent_timeout)
    deadline = time.time() + args.hours * 3600 if args.hours else None
    done, failures = 0, 0
    stop = dashboard_stop(repo)
    log(f"loop on {config['branch']} with agent {agent.name}, training protected by {protection}; Ctrl-C stops "
        "after recording the experiment in flight")
    while (args.max_experiments is None or done < args.max_experiments) and (deadline is None or time.time() < deadline):
        rows = ledger.read(repo / "results.tsv", config["tag"])
        series = decide.open_series(rows)
        if series is not None:  # repeats a killed harness left unfinished come first
            description = series.description
            log(f"resuming the {series.kind} series of {series.commit} ({series.runs} run(s) so far)")
        elif not any(r.status == "keep" for r in rows):  # no baseline yet, or it crashed: run it (again)
            tries = sum(r.description.startswith("baseline") and r.status == "crash" and "[interrupted" not in
                        r.description for r in rows)  # a killed harness is not the baseline's failure
            if tries >= BASELINE_TRIES:
                log(f"the baseline crashed {tries} times (see the log tails above and `autoresearch status`): "
                    "fix train.py on the branch's base commit, or the machine, then run the loop again")
                return 1
            description = "baseline" if not tries else f"baseline (try {tries + 1})"
        else:
            try:
                description = agent.propose({})
            except (agents.AgentError, RuntimeError) as e:
                failures += 1
                log(f"agent failed to propose ({e})")
                if failures >= 3:
                    log("three failed proposals in a row: stopping")
                    return 1
                continue
        failures = 0
        progress = Progress(config["budget_s"], description)

        def report(outcome):
            progress.close()
            log(line(len(ledger.read(repo / "results.tsv", config["tag"])), outcome.row))
            if outcome.row.status == "crash":
                log("  " + "\n  ".join(outcome.log_tail.splitlines()[-5:] + [run.crash_hint(outcome.row.commit)]))
            progress.restart()

        def give_up() -> bool:  # while waiting for a quiet machine: the stop button and --hours still count
            return stop.pending() or (deadline is not None and time.time() >= deadline)

        try:
            while True:
                try:
                    outcomes = run.experiment(repo, description, rule=args.decision, on_outcome=report,
                                              on_progress=progress, log=log, sandbox_mode=args.sandbox,
                                              give_up=give_up)
                    break
                except run.MachineBusy as e:  # AUTORESEARCH_LOAD_WAIT ran out: a busy machine delays the night
                    if give_up():
                        progress.close()
                        log("stopping while waiting for a quiet machine: " + (
                            "asked to (.autoresearch/stop)" if stop() else "--hours reached") +
                            "; nothing ran (train.py keeps the proposed change, uncommitted)")
                        return 0
                    log(f"still busy ({e}); waiting again")
        except KeyboardInterrupt:
            progress.close()
            run.recover(repo, log, reason="interrupted by Ctrl-C")
            log("stopped; the experiment in flight is recorded as interrupted")
            return 130
        finally:
            progress.close()
        done += 1
        agent.observe(outcomes[-1])
        if stop():
            log("stopping: asked to from the dashboard (.autoresearch/stop)")
            return 0
    return 0


def dashboard_stop(repo: Path):
    """A check for the dashboard's stop button: a stop file left from before this loop is forgotten."""
    from autoresearch.dashboard import stop_path
    path = stop_path(repo)
    path.unlink(missing_ok=True)

    def requested() -> bool:
        if path.exists():
            path.unlink(missing_ok=True)
            return True
        return False
    requested.pending = path.exists  # asked, without consuming it
    return requested
