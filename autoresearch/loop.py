"""`autoresearch loop`: experiments one after another, each proposed by an agent and run exactly like
`autoresearch run`, until stopped (Ctrl-C, --max-experiments, --hours, the dashboard's stop button).

What runs next is study.next_run's answer, the same function the parallel driver (driver.py) asks; this
module also holds what both loops show: the progress bar, the line per finished run, the stop button's check."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from autoresearch import agents, decide, git, ledger, proposer, record, run, sandbox, state, study, tags, tokens, verify
from autoresearch.errors import HarnessError, MachineBusy


def ensure_data(log=print) -> None:
    import prepare

    from autoresearch import data
    if prepare.load_manifest() is None:
        log("no prepared data yet: preparing the default for this machine (python prepare.py)")
        data.prepare(log=log)


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
    if r.status in ("crash", "refused", "pruned"):
        why = f"  ({r.decision})" if r.status == "pruned" else ""
        return f"#{n:<3d} {r.status:8s} {'':8s}  {r.wall_s:4.0f}s  {who}{r.description}{why}"
    mean = f"mean {r.mean:.6f}" + (f" +- {r.sem:.4f}" if r.sem is not None else "") + f" n={r.n}"
    p = f" P={r.p_better:.3f}" if r.p_better is not None else ""
    return f"#{n:<3d} {r.status:8s} {r.val_bpb:.6f}  {mean}{p}  {r.wall_s:4.0f}s  {who}{r.description}  ({r.decision})"


def parallel(args) -> bool:
    """Whether the loop runs on Ray workers (cluster.py): --workers, --ray-address or RAY_ADDRESS."""
    return (getattr(args, "workers", None) is not None or bool(getattr(args, "ray_address", None))
            or bool(os.environ.get("RAY_ADDRESS")))


def main(repo: Path, args, log=print) -> int:
    """The sequential loop: the one-worker case of the parallel driver (study.py decides for both), each run
    executed in the repository by run.run_once. Its exit status: 0 done, 1 stopped by a failure, 130 Ctrl-C."""
    return Night(repo, args, log).run()


class Night:
    """One `autoresearch loop`: its tag, rule and agent, and what the night has done so far (experiments begun,
    proposals failed in a row, whether it is stopping)."""

    def __init__(self, repo: Path, args, log=print):
        self.repo, self.args, self.log = repo, args, log
        self.config, protection = begin(repo, args, log)
        self.rule = self.config.rule(args.decision)
        self.agent = agents.proposer_for(args.agent, repo, self.config.tag, args.agent_timeout)
        self.deadline = time.time() + args.hours * 3600 if args.hours else None
        self.begun, self.failures, self.stopping = 0, 0, False
        self.turn = None  # the record of the agent's turn that proposed the experiment running (tokens.py)
        self.reserved = None  # --verify with --hours: the seconds kept for the verification, once said
        self.stop = dashboard_stop(repo)
        log(f"loop on {self.config.branch} with agent {self.agent.name}, training protected by {protection}; "
            "Ctrl-C stops after recording the experiment in flight")

    def rows(self) -> list[ledger.Row]:
        return ledger.read(state.results(self.repo), self.config.tag)

    def in_time(self) -> bool:
        """Whether --hours leaves time for an experiment, and with --verify for the morning's verification after
        it (cli.py runs it once the loop ends)."""
        if self.deadline is None:
            return True
        if not getattr(self.args, "verify", False):
            return time.time() < self.deadline
        needed = verify.seconds(self.repo, self.config,
                                ledger.read(state.results(self.repo), self.config.tag, verification=True))
        if time.time() + needed >= self.deadline and self.reserved is None and time.time() < self.deadline:
            self.reserved = needed
            self.log(f"stopping: the verification (--verify) needs about {needed / 60:.0f} min of the hours left; "
                     "no new experiment begins")
        return time.time() + needed < self.deadline

    def may_begin(self) -> bool:
        return (not self.stopping and (self.args.max_experiments is None or self.begun < self.args.max_experiments)
                and self.in_time())

    def give_up(self) -> bool:  # while waiting for a quiet machine: the stop button and --hours still count
        return self.stopping or self.stop.pending() or (self.deadline is not None and time.time() >= self.deadline)

    def run(self) -> int:
        while True:
            if not self.stopping and self.stop():
                self.log("stopping: asked to from the dashboard (.autoresearch/stop); an unfinished series "
                         "finishes first")
                self.stopping = True
            step = study.next_run(self.rows(), [], self.rule, self.may_begin(),
                                  tags.config_of(self.repo, git.head(self.repo)))
            if step.kind == "stop":
                self.log(step.reason)
                return 1
            if step.kind == "wait":  # nothing is in flight here: nothing more to run
                return 0
            description = self.propose() if step.kind == "propose" else step.description
            if description is None:  # the agent failed: ask again, or stop after three failures in a row
                if self.failures >= 3:
                    self.log("three failed proposals in a row: stopping")
                    return 1
                continue
            if step.kind == "baseline":
                self.turn = None
            self.begun += step.new
            try:
                outcome = self.patiently(description)
            except KeyboardInterrupt:
                record.recover(self.repo, self.log, reason="interrupted by Ctrl-C")
                self.log("stopped; the experiment in flight is recorded as interrupted")
                return 130
            if outcome is None:
                return 0
            self.recorded(outcome)

    def patiently(self, description: str) -> run.Outcome | None:
        """run.run_once with its progress bar, waiting again while the machine is busy (AUTORESEARCH_LOAD_WAIT ran
        out); None when the night ends while it waits (give_up)."""
        progress = Progress(self.config.budget_s, description)
        try:
            while True:
                try:
                    return run.run_once(self.repo, description, run.Options(
                        rule=self.args.decision, sandbox_mode=self.args.sandbox, on_progress=progress, log=self.log,
                        give_up=self.give_up))
                except MachineBusy as e:  # a busy machine delays the night
                    if self.give_up():
                        progress.close()
                        why = "asked to (.autoresearch/stop)" if self.stopping or self.stop() else "--hours reached"
                        self.log(f"stopping while waiting for a quiet machine: {why}; nothing ran (train.py keeps "
                                 "the proposed change, uncommitted)")
                        return None
                    self.log(f"still busy ({e}); waiting again")
        finally:
            progress.close()

    def propose(self) -> str | None:
        """The agent's next experiment (its description); None: it failed (counted in self.failures)."""
        try:
            description = self.agent.propose()
        except (agents.AgentError, RuntimeError) as e:
            self.failures += 1
            self.log(f"agent failed to propose ({e})")
            return None
        self.failures = 0
        self.turn = getattr(self.agent, "session", None)  # an external agent's: what its turn cost
        return description

    def recorded(self, outcome: run.Outcome) -> None:
        """A finished run: its line, and the agent told once its experiment is decided."""
        tokens.add_run(self.turn, outcome.row.run_id)  # the experiment's runs (repeats, controls) pay for its turn
        self.log(line(len(self.rows()), outcome.row))
        if outcome.row.status == "crash":
            self.log("  " + "\n  ".join(outcome.log_tail.splitlines()[-5:] + [run.crash_hint(outcome.row.commit)]))
        if outcome.row.status != "confirm" and not decide.latest_unfinished(self.rows()):
            self.agent.observe(outcome)  # the experiment is decided


def begin(repo: Path, args, log) -> tuple:
    """The night's tag (set up if it is new) and the protection its runs get, never less than the tag's; what a
    dead harness left is finished first (record.py)."""
    if args.agent not in proposer.BUILTINS:
        agents.command_for(args.agent)  # a missing agent binary is an error before the loop starts
    config = tags.ensure(repo, args.tag, log, sandbox_mode=args.sandbox, rule=args.decision)
    try:  # --sandbox on without bubblewrap: an error before any run
        protection = sandbox.protection(args.sandbox or config.sandbox_mode())
    except sandbox.SandboxError as e:
        raise HarnessError(str(e)) from None
    if config.protection == "bwrap" and protection != "bwrap":  # never a night with less than the tag's protection
        raise HarnessError(f"tag {config.tag} runs every training and its agent under bubblewrap: "
                           + (sandbox.failure() if args.sandbox != "off" else "--sandbox off is refused for it"))
    record.recover(repo, log)
    return config, protection


def dashboard_stop(repo: Path):
    """A check for the dashboard's stop button: a stop file left from before this loop is forgotten."""
    path = state.stop_file(repo)
    path.unlink(missing_ok=True)

    def requested() -> bool:
        if path.exists():
            path.unlink(missing_ok=True)
            return True
        return False
    requested.pending = path.exists  # asked, without consuming it
    return requested
