"""`autoresearch verify`: which of a tag's keeps carry the champion's gain, and whether the gain holds at a longer
budget (or a larger model). docs/verify.md says what it answers and what it does not.

- Ablation: for each keep the champion carries, the champion's train.py with that keep's change reverted
  (`git diff keep^ keep -- train.py`, applied in reverse; a keep whose change does not revert cleanly is named and
  skipped), run on the champion's paired seeds, the champion itself beside it on each (never its runs of the
  night: hours apart, a machine's drift would be in the difference). A keep's contribution is the mean over seeds
  of (without it - the champion): positive, the keep lowers val_bpb.
- Transfer: the tag's base train.py and the champion side by side on fresh seeds (TRANSFER_FIRST_SEED up), at
  the night's budget and at a longer one (2x by default, --budget sets it; the fixed half runs at most
  runtime.DEFAULT_TIME_BUDGET), and with --scale NAME=VALUE also both with that constant at the longer budget.
  The gain is the mean over seeds of (base - champion).

Every run goes through the path an experiment's does (execute.execute, recorded by record.record) on a commit
made beside the branch (git.commit_with, kept reachable under REF_PREFIX), never moving it; its row has status
`verify` (ledger.py), which no rule, proposer or count of experiments reads. What runs is a plan derived from the
ledger and git alone, so a killed verification continues where it stopped (record.py records the run in flight
as interrupted and puts train.py back; a recorded run is never run again).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from autoresearch import (compiled, decide, descriptions, execute, fixed, git, ledger, record, run, sites, state, study,
                          tagconfig, tags, verified)
from autoresearch.errors import HarnessError
from autoresearch.tagconfig import Tag

EDITABLE = state.EDITABLE
TRANSFER_FIRST_SEED = 1000  # fresh seeds: a night's seeds count up from study.FIRST_SEED (42)
TRANSFER_SEEDS = 2          # seeds of each transfer pair (base and champion)
MIN_SEEDS = 2               # the ablation's seeds at least: one difference has no standard error
REF_PREFIX = "refs/autoresearch/verify/"  # the verification's commits, reachable (the ledger names them)


@dataclass(frozen=True)
class Planned:
    description: str  # descriptions.verification()'s: what runs
    source: str       # its train.py
    seed: int
    budget: float


@dataclass
class Plan:
    champion: str                                     # the champion's commit
    runs: list[Planned] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)    # what could not be verified, and why


@dataclass(frozen=True)
class Options:
    seeds: int | None = None        # the ablation's seeds (default: the champion's, at least MIN_SEEDS)
    transfer_seeds: int = TRANSFER_SEEDS
    budget: float | None = None     # the transfer's longer budget (default 2x the tag's)
    scale: str = ""                 # NAME=VALUE: the transfer also with this constant, in both train.py
    ablation: bool = True
    transfer: bool = True


# --- the plan: from the ledger and git ---------------------------------------------------------------------------

def plan(repo: Path, config: Tag, rows: list[ledger.Row], options: Options = Options()) -> Plan:
    champ = decide.champion(rows)
    if champ is None or decide.unfinished(rows):
        raise HarnessError("nothing to verify yet: " + ("no keep" if champ is None else "an experiment's series is "
                           "unfinished (finish it first: `autoresearch run -m resume`, or the loop)"))
    champion = git.git(repo, "rev-parse", f"{champ.commit}^{{commit}}")
    keeps = kept_changes(repo, rows, champion)
    if not keeps:
        raise HarnessError(f"tag {config.tag} kept nothing beyond its baseline: nothing to verify")
    out = Plan(champion)
    source = show(repo, champion)
    if options.ablation:
        ablation(repo, rows, keeps, options, out)
    if options.transfer:
        transfer(repo, config, source, options, out)
    return out


def show(repo: Path, commit: str) -> str:
    return git.git(repo, "show", f"{commit}:{EDITABLE}", strip=False)


def kept_changes(repo: Path, rows: list[ledger.Row], champion: str) -> list[ledger.Row]:
    """The first keep row of each configuration the champion carries: kept, not the baseline, its commit the
    champion's or an ancestor of it."""
    out, seen = [], set()
    for r in rows:
        if r.status != "keep" or descriptions.is_baseline(r.description) or r.decision.startswith("baseline") \
                or r.key in seen:
            continue
        seen.add(r.key)
        try:
            git.git(repo, "merge-base", "--is-ancestor", r.commit, champion)
        except git.GitError:
            continue  # not on the champion's history (or gone)
        out.append(r)
    return out


def reverted(repo: Path, keep: str, source: str) -> tuple[str | None, str]:
    """The champion's train.py (source) with keep's change to train.py undone, or None and why not. A keep
    re-committed on a moved branch (git.commit_with's `merged`) made its change in its second parent."""
    parents = git.git(repo, "rev-list", "--parents", "-n1", keep).split()[1:]
    mine = parents[1] if len(parents) > 1 else keep
    patch = git.git(repo, "diff", f"{mine}^", mine, "--", EDITABLE, strip=False)
    if not patch.strip():
        return None, "it changed nothing in train.py"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, EDITABLE).write_text(source)
        Path(tmp, "keep.patch").write_text(patch)
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(Path(tmp).parent))  # plain files: no repository's paths
        proc = subprocess.run(["git", "apply", "-R", "keep.patch"], cwd=tmp, env=env, capture_output=True, text=True)
        if proc.returncode:
            why = (proc.stderr.strip().splitlines() or ["git apply -R failed"])[0]
            return None, f"its change does not revert on the champion's train.py ({why})"
        return Path(tmp, EDITABLE).read_text(), ""


def ablation(repo: Path, rows, keeps, options: Options, out: Plan) -> None:
    """Each keep reverted, on the champion's seeds (interleaved, seed by seed, so drift spreads over all)."""
    champ, source = decide.champion(rows), show(repo, out.champion)
    mine = sorted({r.seed for r in decide.finished(rows) if r.key == champ.key})
    want = options.seeds or max(len(mine), MIN_SEEDS)
    seeds = (mine + [s for s in range(study.FIRST_SEED, study.FIRST_SEED + want + len(mine))
                     if s not in mine])[:want]
    variants = []
    for keep in keeps:
        text, why = reverted(repo, keep.commit, source)
        if text is None:
            out.notes.append(f"keep {keep.commit} ({descriptions.base_description(keep.description)}) not "
                             f"verified: {why}")
        else:
            variants.append(Planned(descriptions.verification(out.champion, "ablate", keep.commit, keep.description),
                                    text, 0, champ.budget_s))
    for s in seeds:  # the champion beside, on each seed: never against its runs of the night (a machine drifts)
        if variants:
            out.runs.append(Planned(descriptions.verification(out.champion, "champion"), source, s, champ.budget_s))
        out.runs += [dataclasses.replace(v, seed=s) for v in variants]


def transfer(repo: Path, config: Tag, source: str, options: Options, out: Plan) -> None:
    """The tag's base and the champion, pair by pair on fresh seeds, at the night's budget and a longer one."""
    cap = fixed.runtime().DEFAULT_TIME_BUDGET
    longer = options.budget or min(2 * config.budget_s, cap)
    if longer > cap:
        raise HarnessError(f"--budget {longer:g}: the fixed half (runtime.py) runs at most {cap:g} s")
    if longer == config.budget_s:
        out.notes.append(f"no longer budget: the tag's {config.budget_s:g} s is the fixed half's longest; the "
                         "transfer runs at the night's budget only" + (" (and scaled)" if options.scale else ""))
    base = show(repo, config.base_commit)
    arms = [(b, "", base, source) for b in dict.fromkeys([config.budget_s, longer])]
    if options.scale:
        arms.append((longer, options.scale, scaled(base, options.scale), scaled(source, options.scale)))
    seeds = range(TRANSFER_FIRST_SEED, TRANSFER_FIRST_SEED + options.transfer_seeds)
    for budget, scale, base_text, champ_text in arms:
        for s in seeds:
            for arm, text in (("base", base_text), ("champion", champ_text)):
                out.runs.append(Planned(descriptions.verification(out.champion, "transfer", arm, scale=scale),
                                        text, s, budget))


def scaled(source: str, scale: str) -> str:
    """source with constant NAME set to VALUE (scale: NAME=VALUE, the value a Python literal)."""
    name, _, value = scale.partition("=")
    import prepare
    value = sites.literal(value)
    try:
        if value is sites.NOT_A_VALUE:
            raise sites.EditError(f"{scale.partition('=')[2]!r} is not a Python literal")
        return sites.set_constants(source, {name: value}, prepare.require_manifest()["profile"])
    except (sites.EditError, ValueError) as e:
        raise HarnessError(f"--scale {scale}: {e} (give NAME=VALUE, a constant of train.py and a literal)") from None


def seconds(repo: Path, config: Tag, rows: list[ledger.Row], options: Options = Options()) -> float:
    """About how long the champion's verification would take from now, and one more experiment's first two runs
    before it (what `loop --verify --hours` keeps free): each run at the tag's median seconds between two rows of
    the ledger (its training, start-up, evaluation), longer budgets in proportion; 0 with nothing to verify."""
    try:
        todo = [p for p in plan(repo, config, rows, options).runs if not done(rows, p)]
    except (HarnessError, git.GitError):
        return 0.0
    stamps = sorted(t for t in (state.parse_time(r.time) for r in rows) if t is not None)
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]) if b > a)
    per_run = gaps[len(gaps) // 2] if gaps else 1.5 * config.budget_s + 30
    return per_run * (2 + sum(max(1.0, p.budget / config.budget_s) for p in todo))


def done(rows: list[ledger.Row], p: Planned) -> bool:
    """Whether a planned run is recorded (a result, a crash or a refusal: never run twice); an interrupted one is
    not, and runs again."""
    return any(r.status == "verify" and r.decision != "interrupted" and r.seed == p.seed and r.budget_s == p.budget
               and descriptions.move_text(r.description) == p.description for r in rows)


# --- running it ----------------------------------------------------------------------------------------------------

def main(repo: Path, options: Options, log=print, progress=None) -> int:
    """Plan, then run every planned run not yet recorded, each like an experiment's; the table at the end.
    progress(budget, label): a run's progress bar (loop.Progress)."""
    config, protection, rule = run.begin(repo, run.Options(log=log))
    rows = ledger.read(state.results(repo), config.tag, verification=True)
    the_plan = plan(repo, config, rows, options)
    changed = git.changed_files(repo)
    if EDITABLE in changed:  # each run writes train.py, and puts the branch's back after it: an edit would be lost
        raise HarnessError(f"{EDITABLE} has changes not committed; the verification writes it for each run. Set them "
                           "aside (`git stash`), verify, then `git stash pop`")
    problem = run.admission(repo, config, protection, rule, None, changed)
    if problem:
        raise HarnessError(f"verification refused: {problem}")
    todo = [p for p in the_plan.runs if not done(rows, p)]
    for note in the_plan.notes:
        log(note)
    log(f"verifying champion {the_plan.champion[:7]}: {len(the_plan.runs)} runs planned, "
        f"{len(the_plan.runs) - len(todo)} already recorded")
    fixed_half = fixed.of_tag(repo, config)
    state.stop_file(repo).unlink(missing_ok=True)  # a stop asked before this verification began is forgotten
    for i, p in enumerate(todo, len(the_plan.runs) - len(todo) + 1):
        write_state(repo, config.tag, the_plan, i - 1)
        if state.stop_file(repo).exists():  # `autoresearch stop`, the dashboard's button: between two runs
            state.stop_file(repo).unlink(missing_ok=True)
            log(f"stopping: asked to (.autoresearch/stop) after {i - 1} of {len(the_plan.runs)} runs; "
                "`autoresearch verify` again continues")
            return 0
        log(f"verify {i}/{len(the_plan.runs)}: {p.description}, seed {p.seed}, {p.budget:g} s")
        if config.clock == "wall":
            run.wait_until_quiet(repo, log, None)
        bar = progress(p.budget, p.description) if progress else None
        try:
            row = run_one(execute.Context(repo, config, protection, fixed_half), the_plan.champion, p, bar, log)
        except KeyboardInterrupt:
            record.recover(repo, log, reason="interrupted by Ctrl-C")
            log("stopped; `autoresearch verify` again continues where this stopped")
            return 130
        finally:
            if bar:
                bar.close()
        log(f"  {row.val_bpb:.6f}" if row.val_bpb > 0 else f"  {row.description}")
    write_state(repo, config.tag, the_plan, len(the_plan.runs))
    log(verified.text(verified.table(ledger.read(state.results(repo), config.tag, verification=True), the_plan.notes)))
    return 0


def run_one(ctx: execute.Context, champion: str, p: Planned, on_progress, log) -> ledger.Row:
    """One planned run: its commit beside the branch, pending.json, train.py in the work tree, executed and
    recorded as an experiment's run is, with status verify; train.py put back after. ctx: the tag's, at its own
    budget (the run's own is p.budget)."""
    repo, config, protection, fixed_half = ctx.repo, ctx.config, ctx.protection, ctx.fixed_half
    commit = git.commit_with(repo, champion, EDITABLE, p.source, p.description)
    git.git(repo, "update-ref", f"{REF_PREFIX}{config.tag}/{commit}", commit)
    trial = record.Trial(state.new_run_id(), config.tag, champion, p.description, seed=p.seed,
                         test_threshold=float("-inf"), protection=protection, commit=commit,
                         config=tags.config_of(repo, commit), host=socket.gethostname(), device=config.device_label(),
                         started=state.now(), verify=True, budget_s=p.budget)
    run_dir = state.run_dir(repo, trial.run_id)
    pending = record.Pending(state.pending_file(repo), trial)
    pending.write()
    try:
        (repo / EDITABLE).write_text(p.source)
        state.fault_point("verify-written")
        run_dir.mkdir(parents=True)
        try:
            base = compiled.watched(repo, protection, lambda: run.compile_base(repo, config, fixed_half, protection, log))
        except compiled.Tampered as e:
            raise HarnessError(str(e)) from None
        at_budget = config if p.budget == config.budget_s else dataclasses.replace(
            config, budget_s=p.budget,
            timeout_s=max(config.timeout_s or 0, tagconfig.default_timeout(p.budget, config.clock)))
        ex = execute.execute(execute.Context(repo, at_budget, protection, fixed_half), execute.Attempt(
            run_dir, pending, compile_base=base, on_progress=on_progress))
        row = verification_row(at_budget, ex, trial)
        record.record(repo, row, run_dir)
        record.drop_model(run_dir)
        pending.path.unlink()
        return row
    finally:
        git.reset_to(repo, git.head(repo), EDITABLE)  # the branch's train.py back; the branch never moved


def verification_row(config: Tag, ex: execute.Execution, ran: record.Trial) -> ledger.Row:
    common = dict(load=ex.training.load, wall=ex.training.wall, decision="verification",
                  outside_s=execute.outside_seconds(config, ex.training) if ex.training.wall else None)
    if ex.status != "ok":
        kind = descriptions.REFUSED if ex.status == "refused" else descriptions.CRASH
        return ran.row(config, "verify", descriptions.noted(ran.description, kind, ex.reason), **common)
    return ran.row(config, "verify", val_bpb=ex.evaluation["val_bpb"], memory_gb=ex.result["memory_gb"],
                   steps=ex.result["num_steps"], **common)


def write_state(repo: Path, tag: str, the_plan: Plan, finished: int) -> None:
    """What status and the dashboard show of a verification: its champion, its progress and its notes."""
    path = verified.state_file(repo, tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    state.atomic_json(path, {"champion": the_plan.champion[:7], "planned": len(the_plan.runs), "finished": finished,
                             "notes": the_plan.notes, "updated": state.now()})
