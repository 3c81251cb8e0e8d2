"""The parallel driver: experiments side by side on Ray workers (`autoresearch loop --workers N`, cluster.py).

One driver (this process, holding the repository's lock) owns the truth:
- only it writes results.tsv and moves the tag's branch. A candidate travels to a worker as its train.py, its
  parent commit and its seed; the driver records it as a commit object off its parent (git.commit_with), and
  only a keep moves the branch: fast-forward when the branch is still on the parent, else a new commit of the
  kept train.py on top of the branch, its second parent the candidate's own commit (what it was made from). So
  the branch's first-parent line holds kept commits only;
- it holds the proposer (the built-in one: Optuna TPE with constant_liar, the runs in flight as running
  trials; or one external agent per worker, each in its own working copy) and the decision rule. A candidate's
  confirmation repeat goes to the next free worker before any new proposal; one repeat of a candidate is in
  flight at a time, so the rule looks at its runs in order exactly as `autoresearch run` does. The baseline's
  runs go out side by side;
- before a run is dispatched it is written to .autoresearch/inflight/<run_id>.json. A driver killed at any
  moment takes its workers with it (Ray ends the actors of a dead driver, and trainings die with their worker:
  processes.tied_to_parent), and the next `autoresearch loop` or `run` records each unrecorded run as interrupted
  (record.recover_inflight). A worker killed mid-run, or a node leaving the cluster, surfaces here as an
  ActorDiedError: the run is recorded as interrupted, a replacement worker is started, the others go on.

Workers (worker.py) are identical by construction: same device type, same threads per run (the tag records
them; a tag never mixes two), checked against the tag's fingerprint and hardware when they join.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import asdict, replace
from pathlib import Path

from autoresearch import (agents, audit, decide, descriptions, errors, execute, fixed, git, heldout, ledger, loop,
                          proposer, record, run, sandbox, state, study, supervise, tags, tokens)
from autoresearch.record import Trial
from autoresearch.worker import Worker, keep_on_branch
from autoresearch.tagconfig import Tag

JOIN_TIMEOUT = 300      # seconds for the first worker to start and check its machine
JOIN_WAIT = 30          # seconds the loop waits for all its workers before it starts with those that joined
NO_WORKER_TIMEOUT = 300  # seconds the loop waits for a replacement when every worker is gone


class Stop(Exception):
    """The loop cannot go on; the message says why."""


class Driver:
    def __init__(self, repo: Path, config: Tag, args, ray, gpu: bool, log=print):
        self.repo, self.config, self.args, self.ray, self.log = repo, config, args, ray, log
        self.rule = config.rule(args.decision)
        pins = config.pin_problems("bwrap" if config.protection == "bwrap" else "none", self.rule, None)
        if pins:
            raise errors.HarnessError("; ".join(pins) + ": a tag's rules are fixed at setup; set up a new tag for others")
        self.results = state.results(repo)
        self.threads = config.threads_per_run()
        self.actor_class = ray.remote(Worker).options(
            num_cpus=self.threads, num_gpus=1 if gpu else 0, max_restarts=0, scheduling_strategy="SPREAD")
        self.workers: dict[str, tuple] = {}   # name -> (actor, join info)
        self.free: list[str] = []
        self.joining: dict = {}                # join ref -> (name, actor, since)
        self.running: dict = {}                # run ref -> Trial
        self.proposing: dict = {}              # future -> worker name
        self.spawned = 0                       # workers started, replacements included (their names)
        self.started = 0                       # experiments begun by this loop (the baseline counts once)
        self.failures = 0
        self.stopping = False
        self.deadline = time.time() + args.hours * 3600 if args.hours else None
        self.proposers = agents.WorkerProposers(repo, config.tag, args.agent, args.agent_timeout)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1 if args.agent in proposer.BUILTINS else 64)

    # --- workers -------------------------------------------------------------------------------------

    def spawn(self, n: int) -> None:
        for _ in range(n):
            self.spawned += 1
            name = f"w{self.spawned}"
            # the tag's secret draw travels with the workers' copy of the tag, never into the repository (heldout.py)
            actor = self.actor_class.remote(str(self.repo), replace(self.config, draw=heldout.draw(self.config)), name,
                                            self.args.sandbox or self.config.sandbox_mode())
            self.joining[actor.join.remote()] = (name, actor, time.time())

    def joined(self, ref) -> None:
        name, actor, _ = self.joining.pop(ref)
        try:
            info = self.ray.get(ref)
        except self.ray.exceptions.RayError as e:
            info = {"error": short_error(e), "host": "?"}
        if "error" in info:
            self.log(f"worker {name} on {info.get('host', '?')} did not join: {info['error']}")
            self.ray.kill(actor)
            return
        self.workers[name] = (actor, info)
        self.free.append(name)
        self.log(f"worker {name} joined on {info['host']}: {info['device']}, training protected by "
                 f"{info['protection']}, working copy {info['copy']}")

    def lost(self, name: str) -> None:
        actor, _ = self.workers.pop(name)
        self.ray.kill(actor)
        if name in self.free:
            self.free.remove(name)
        self.spawn(1)  # a replacement, wherever the cluster has room; it joins when it can

    # --- what to run next -----------------------------------------------------------------------------

    def may_begin(self) -> bool:
        limit = self.args.max_experiments
        return ((limit is None or self.started < limit) and (self.deadline is None or time.time() < self.deadline)
                and not self.stopping)

    def next_job(self, rows: list[ledger.Row], name: str):
        """A Trial for worker `name`, "propose" when a new candidate is due, or None when nothing is (study.py)."""
        head = git.head(self.repo)
        running = [study.in_flight(job.config, job.description) for job in self.running.values()]
        step = study.next_run(rows, running, self.rule, self.may_begin(), tags.config_of(self.repo, head))
        if step.kind == "stop":
            raise Stop(step.reason)
        if step.kind == "wait":
            return None
        self.started += step.new
        if step.kind == "propose":
            return "propose"
        commit = parent = head  # the baseline
        if step.kind in ("series", "control"):
            commit = git.git(self.repo, "rev-parse", step.commit)
            parent = git.git(self.repo, "rev-parse", f"{commit}^", check=False) or commit
        return self.job(rows, commit, parent, step, name)

    def job(self, rows, commit: str, parent: str, step: study.Next, name: str) -> Trial:
        """The Trial of `commit` (train.py as committed there) for worker `name`: the run the schedule asked for
        (step: its description, its place in the series, a control's seed), or a new proposal's first run."""
        source = git.git(self.repo, "show", f"{commit}:{state.EDITABLE}", strip=False)
        config_id = tags.config_of(self.repo, commit)
        info = self.workers[name][1]
        plan = study.Study(self.repo, self.config, self.rule, rows).plan(
            step, config_id, [(job.config, job.seed) for job in self.running.values()])
        return Trial(state.new_run_id(), self.config.tag, parent, step.description, seed=plan.seed,
                     repeat=plan.repeat, run_no=plan.run_no, test_threshold=plan.test_threshold,
                     protection=info["protection"], commit=commit, config=config_id, worker=name, host=info["host"],
                     device=info["device"], started=state.now(),
                     compile_from=tags.config_of(self.repo, self.config.base_commit), source=source,
                     pruning=asdict(plan.pruning) if plan.pruning is not None else None)

    def propose(self, name: str) -> None:
        """A new candidate for worker `name`, in a thread: external agents think side by side."""
        head = git.head(self.repo)
        # read here, on the driver's thread: the proposal's thread must not iterate what the driver changes
        sources = [job.source for job in self.running.values()]
        descriptions = [job.description for job in self.running.values()]
        future = self.pool.submit(lambda: (head, *self.proposers.propose(name, head, sources, descriptions)))
        self.proposing[future] = name
        if self.args.agent in proposer.BUILTINS:  # quick: done before the next proposal, which must know of this one
            concurrent.futures.wait([future])
            self.proposed(future)

    def proposed(self, future) -> None:
        name = self.proposing.pop(future)
        turn = self.proposers.session(name)  # what the agent's turn cost: its runs are the configuration's (tokens.py)
        try:
            parent, source, description = future.result()
        except (agents.AgentError, RuntimeError, git.GitError, OSError) as e:
            self.started -= 1
            self.failures += 1
            self.log(f"agent failed to propose ({e})")
            if self.failures >= 3:
                raise Stop("three failed proposals in a row: stopping") from None
            self.free.append(name)
            return
        self.failures = 0
        if name not in self.workers:  # its worker died meanwhile: the proposal waits for the next free one
            name = self.free.pop(0) if self.free else None
            if name is None:
                self.started -= 1
                return
        description = descriptions.clean(description)
        base = git.git(self.repo, "show", f"{self.config.base_commit}:{state.EDITABLE}", strip=False).encode()
        problem = run.train_py_problem(source.encode(errors="replace"), self.config, base)
        if not problem:  # a commit object off its parent; the branch moves only on a keep
            commit = git.commit_with(self.repo, parent, state.EDITABLE, source, description)
            rows = ledger.read(self.results, self.config.tag)
            config_id = tags.config_of(self.repo, commit)
            if self.rule in decide.REPEATING:  # nothing new: ran before, or running now (copies side by side)
                problem = study.Study(self.repo, self.config, self.rule, rows).rerun_problem(config_id) or (
                    f"{state.EDITABLE} as it is is running now on another worker: propose something else"
                    if any(job.config == config_id for job in self.running.values()) else None)
        if problem:  # recorded as `autoresearch run` records it, an experiment like any other; the worker is free
            self.free.append(name)
            row = record.make_row(self.config, parent, descriptions.noted(description, descriptions.REFUSED, problem),
                                  state.new_run_id(), "refused", worker=name)
            ledger.append(self.results, row)
            tokens.add_run(turn, row.run_id)
            self.log(loop.line(len(ledger.read(self.results, self.config.tag)), row))
            return
        tokens.add_run(turn, config=config_id)
        self.dispatch(self.job(rows, commit, parent, study.Next("propose", description), name))

    def dispatch(self, job: Trial) -> None:
        state.atomic_json(state.inflight_file(self.repo, job.run_id), job.to_json())
        actor = self.workers[job.worker][0]
        self.running[actor.run.remote(asdict(job))] = job
        self.log(f"   {job.worker}: {job.description}")

    # --- results ----------------------------------------------------------------------------------------

    def finished(self, ref) -> None:
        job = self.running.pop(ref)
        try:
            res = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as e:  # the worker is alive; its harness code failed
            row = job.interrupted(self.config, f"{job.worker} failed: {short_error(e)}")
            row.decision = ""  # not an interruption: its series closes, and a baseline counts it as a crash
            self.recorded(job, row)
            self.free.append(job.worker)
            return
        except self.ray.exceptions.RayError as e:  # the worker died: killed, out of memory, its node left
            self.recorded(job, job.interrupted(self.config, f"worker {job.worker} on {job.host} died: "
                                               f"{short_error(e)}"))
            if job.worker in self.workers:
                self.lost(job.worker)
            return
        rows = ledger.read(self.results, self.config.tag)
        ex = execute.Execution(res["status"], res["reason"], res["result"], res["evaluation"],
                               supervise.Training(**res["training"]))
        ran = replace(job, protection=res["protection"], **{k: res[k] for k in ("worker", "host", "device")})
        judge, series = study.Study(self.repo, self.config, self.rule, rows).judge, decide.series_of(rows, job.config)
        ex, row = judge(ex, series, ran)
        if row.status == "keep" and (problem := self.audit_begun_series(rows, job.config)):
            ex, row = judge(replace(ex, status="refused", reason=problem), series, ran)
        run_dir = state.run_dir(self.repo, job.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        if ex.status == "ok":
            state.atomic_json(run_dir / state.EVALUATION, dict(ex.evaluation, worker_run_dir=res["run_dir"]))
        (run_dir / state.RUN_LOG).write_text(res["log"])
        if row.status == "keep" and job.config != tags.config_of(self.repo, git.head(self.repo)):
            row.commit = keep_on_branch(self.repo, job)[:7]
        self.recorded(job, row, run_dir)
        if res.get("retire"):
            self.log(f"worker {job.worker} on {job.host} no longer matches the tag: replaced")
            self.lost(job.worker)
            return
        self.free.append(job.worker)
        self.proposers.observe(job.worker, run.Outcome(row, None, state.tail(run_dir / state.RUN_LOG), run_dir,
                                                       ex.result, ex.evaluation))

    def audit_begun_series(self, rows: list[ledger.Row], config_id: str) -> str | None:
        """Before a keep: the audits of a series `autoresearch run` began (its runs are in this repository, their
        audit left for the keep: study.Study.audit_at_keep), made here. This loop's own runs were audited when
        scored. Why the keep is refused, or None."""
        waiting = audit.owed(self.repo, rows, config_id)
        if not waiting:
            return None
        try:
            ctx = execute.Context(self.repo, self.config, sandbox.protection(self.config.sandbox_mode()),
                                  fixed.of_tag(self.repo, self.config))
        except Exception as e:
            return f"the audit its series' earlier runs wait for could not be made here ({e})"
        return audit.series(ctx, waiting, None, self.log)

    def recorded(self, job: Trial, row: ledger.Row, run_dir: Path | None = None) -> None:
        """Record a job's row (record.py, as `autoresearch run` does), then forget it was in flight."""
        record.record(self.repo, row, run_dir)
        state.inflight_file(self.repo, job.run_id).unlink(missing_ok=True)
        self.log(loop.line(len(ledger.read(self.results, self.config.tag)), row))

    # --- the loop -------------------------------------------------------------------------------------

    def main(self, workers: int) -> int:
        self.spawn(workers)
        start = time.time()
        # All of them, or after JOIN_WAIT s whoever is there (the others join when the cluster has room)
        while self.joining and (not self.workers or time.time() - start < JOIN_WAIT):
            ready, _ = self.ray.wait(list(self.joining), num_returns=1, timeout=1)
            for ref in ready:
                self.joined(ref)
            if time.time() - start > JOIN_TIMEOUT and not self.workers:
                raise Stop(f"no worker joined within {JOIN_TIMEOUT} s: see the messages above")
        if not self.workers:
            raise Stop("no worker could join (see above); fix those machines and run the loop again")
        self.log(f"loop on {self.config.branch} with {len(self.workers)} worker(s) of {self.threads} thread(s) "
                 f"each, agent {self.args.agent}; Ctrl-C stops and records the runs in flight as interrupted")
        idle_since = None
        stop = loop.dashboard_stop(self.repo)
        try:
            while True:
                if not self.stopping and stop():
                    self.log("asked to stop from the dashboard: no new experiments; the runs in flight finish")
                    self.stopping = True
                rows = ledger.read(self.results, self.config.tag)
                while self.free:
                    what = self.next_job(rows, self.free[0])
                    if what is None:
                        break
                    name = self.free.pop(0)
                    if what == "propose":
                        self.propose(name)
                    else:
                        self.dispatch(what)
                    rows = ledger.read(self.results, self.config.tag)
                if not self.running and not self.proposing:
                    if self.workers or not self.joining:
                        return 0
                    idle_since = idle_since or time.time()
                    if time.time() - idle_since > NO_WORKER_TIMEOUT:
                        raise Stop(f"every worker is gone and none rejoined within {NO_WORKER_TIMEOUT} s")
                else:
                    idle_since = None
                refs = list(self.running) + list(self.joining)
                ready, _ = self.ray.wait(refs, num_returns=1, timeout=0.5) if refs else ([], [])
                for ref in ready:
                    if ref in self.joining:
                        self.joined(ref)
                    else:
                        self.finished(ref)
                for future in [f for f in self.proposing if f.done()]:
                    self.proposed(future)
                if not refs:
                    time.sleep(0.2)
        except KeyboardInterrupt:
            self.interrupt("interrupted by Ctrl-C")
            self.log("stopped; the runs in flight are recorded as interrupted")
            return 130
        except BaseException:
            self.interrupt("the driver stopped on an error")
            raise

    def interrupt(self, reason: str) -> None:
        """Record every run in flight as interrupted and stop every worker and agent."""
        self.proposers.stop()
        for job in self.running.values():
            record.record(self.repo, job.interrupted(self.config, reason))
            state.inflight_file(self.repo, job.run_id).unlink(missing_ok=True)
        self.running.clear()

    def close(self) -> None:
        for actor, _ in self.workers.values():
            self.ray.kill(actor)
        for _, actor, _ in self.joining.values():
            self.ray.kill(actor)
        self.pool.shutdown(wait=False, cancel_futures=True)


def short_error(e: BaseException) -> str:
    text = str(e)
    if "node has died" in text or "node was" in text:
        return "its node left the cluster"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:300] if lines else type(e).__name__


