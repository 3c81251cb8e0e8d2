"""The read model: what happened, as one JSON-able dict, for `status --json`, `report --json`, `report --html`
and the live dashboard (dashboard.py serves it).

facts() gathers it from results.tsv, the tag files, the runs in flight and git; attach_details adds each row's
diff and log for a page that cannot ask for them. Everything here only reads.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from statistics import fmean

from autoresearch import (decide, descriptions, errors, fixed, git, ledger, machine, record, state, tagconfig, tokens,
                          verified)


class BadQuery(ValueError):
    """A commit or run id that is not one (from the dashboard's URL)."""


def parse_log(text: str) -> dict:
    """A training log's curve and its latest tok/s, MFU and elapsed seconds."""
    curve, last = [], None
    pattern = getattr(fixed.runtime(), "STEP_RE", None)  # None: an experiment branch older than the contract
    for m in pattern.finditer(text) if pattern else ():
        step, loss, tok, mfu, elapsed = m["step"], m["loss"], m["tok_per_sec"], m["mfu"], m["elapsed"]
        try:
            curve.append([int(step), float(loss), int(elapsed)])
        except ValueError:
            continue
        last = {"tok_per_sec": int(tok), "mfu": float(mfu), "elapsed": int(elapsed), "step": int(step)}
    return {"curve": curve, **(last or {})}


def in_flight(repo: Path) -> list[dict]:
    """The runs in flight: `autoresearch run`'s pending.json with its live log, and a parallel driver's
    dispatched runs (their logs are on the workers)."""
    out = []
    try:
        pending = record.read_pending(repo)
    except errors.HarnessError:
        pending = None
    if pending is not None:
        trial = pending.trial
        log = state.run_dir(repo, trial.run_id) / state.RUN_LOG
        try:
            text = log.read_text(errors="replace")
        except OSError:
            text = ""
        out.append(dict(run_id=trial.run_id, tag=trial.tag, description=trial.description, started=trial.started,
                        budget_s=trial.budget_s, worker="",
                        **parse_log(text)))
    for path in sorted(state.inflight_dir(repo).glob("*.json")):
        try:
            job = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        entry = {k: job.get(k) for k in ("run_id", "tag", "description", "started", "worker", "host")}
        try:  # a worker on this machine: its log is in its working copy (worker.py)
            from autoresearch.worker import workers_dir
            log = state.run_dir(workers_dir(job["tag"], repo) / job["worker"], job["run_id"]) / state.RUN_LOG
            entry.update(parse_log(log.read_text(errors="replace")))
        except (OSError, KeyError, TypeError):
            pass  # on another machine
        out.append(entry)
    return out


def tag_facts(tag: str, rows: list[ledger.Row], config: tagconfig.Tag | None, repo: Path | None = None) -> dict:
    """One tag: its champion and noise, per-hour rates, and every row with its delta to the champion; its
    verification's table (verified.py), whose rows are listed but never counted as experiments."""
    every, rows = rows, [r for r in rows if r.status != "verify"]
    values = decide.samples(rows)
    noise = decide.pooled_noise(values)
    champ = decide.champion(rows)
    champ_values = values.get(champ.key, []) if champ else []
    champion = None
    if champ_values:
        champion = {"commit": champ.commit, "config": champ.config, "mean": fmean(champ_values), "n": len(champ_values),
                    "sem": decide.sem(champ_values, noise) if noise else None,
                    "description": descriptions.base_description(champ.description)}
    times = [t for t in (state.parse_time(r.time) for r in rows) if t is not None]
    first = min(times) - (rows[0].wall_s or 0) if times else None
    hours = (max(times) - first) / 3600 if times else 0.0
    configs = {r.key for r in rows if r.status != "refused"}
    decided = {}
    for r in rows:  # a configuration's verdict is its last keep or discard (pruned: discarded early)
        if r.status in ("keep", "discard", "pruned") and not r.decision.startswith("baseline"):
            decided[r.key] = "discard" if r.status == "pruned" else r.status
    frontier = []
    for i, r in enumerate(every, 1):  # numbered as the table's rows are
        if r.status == "keep" and r.mean is not None:
            frontier.append({"run": i, "mean": r.mean, "sem": r.sem, "commit": r.commit})
    table = []
    for i, r in enumerate(every, 1):
        row = {c: getattr(r, c) for c in ledger.COLUMNS}
        row["index"] = i
        # a verification's run is at its own seeds and budget: no difference to the night's champion to show
        row["delta"] = (r.val_bpb - champion["mean"]) if champion and r.val_bpb > 0 and r.status != "verify" else None
        table.append(row)
    return {
        "tag": tag,
        "budget_s": config.budget_s if config else (rows[0].budget_s if rows else None),
        "clock": config.clock if config else (rows[0].clock if rows else None),
        "hardware": machine.describe(config.hardware) if config and config.hardware else None,
        "threads": config.threads_per_run() if config else None,
        "champion": champion,
        "flagged": [{"run_id": r.run_id, "commit": r.commit, "status": r.status, "flags": r.flags}
                    for r in rows if r.flags],
        "noise": {"sigma": noise.sigma, "df": noise.df} if noise else None,
        "counts": {s: sum(r.status == s for r in every) for s in ledger.STATUSES},
        "runs": len(rows), "experiments": len(configs),
        "hours": round(hours, 3),
        "experiments_per_hour": round(len(configs) / hours, 2) if hours > 0 else None,
        "keep_rate": round(sum(v == "keep" for v in decided.values()) / len(decided), 3) if decided else None,
        "training_hours": round(sum(r.wall_s for r in rows) / 3600, 3),
        "frontier": frontier,
        "rows": table,
        "verification": verification(tag, every, repo),
    }


def verification(tag: str, rows: list[ledger.Row], repo: Path | None) -> dict | None:
    """The verification's table, its progress (verify.py's state file) and its text."""
    progress = verified.read_state(repo, tag)
    data = verified.table(rows, progress.get("notes"))
    if data is None and not progress:
        return None
    data = data or {"champion": progress.get("champion"), "runs": 0, "ablation": [], "transfer": [],
                    "notes": progress.get("notes", [])}
    return dict(data, planned=progress.get("planned"), finished=progress.get("finished"), text=verified.text(data))


def _tag_configs(repo: Path | None) -> dict[str, tagconfig.Tag]:
    out = {}
    if repo is None:
        return out
    for path in sorted(state.tags_dir(repo).glob("*.json")):
        try:
            out[path.stem] = tagconfig.read(path)
        except errors.HarnessError:
            continue
    return out


def facts(path: Path, repo: Path | None, tag: str | None = None, prices: dict | None = None) -> dict:
    """Everything the dashboard shows, as plain JSON: every tag of the ledger (or the one asked for), each with
    its agent's tokens (tokens.bill; costs at `prices`, else at AUTORESEARCH_TOKEN_PRICES)."""
    damaged: list[str] = []
    rows, problem = [], None
    if path.exists():  # no ledger yet: no experiments yet, not an error
        try:
            rows = ledger.read(path, None, damaged=damaged, old_ok=True, verification=True)
        except ledger.LedgerError as e:
            problem = str(e)
    configs = _tag_configs(repo)
    names = [tag] if tag else list(dict.fromkeys([r.tag for r in rows]))
    current = None
    if repo is not None:
        try:
            branch = git.branch(repo)
            current = branch[len(state.BRANCH_PREFIX):] if branch.startswith(state.BRANCH_PREFIX) else None
        except git.GitError:
            pass
    prices = prices if prices is not None else tokens.prices_or_none(warnings=damaged)
    tables = []
    for t in names:
        mine = [r for r in rows if r.tag == t]
        tables.append(tag_facts(t, mine, configs.get(t), repo))
        experiments = [r for r in mine if r.status != "verify"]  # what an agent's session proposed and ran
        tables[-1]["agent_tokens"] = tokens.bill(repo, t, experiments, prices) if repo is not None else None
    return {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "results": str(path),
        "current_tag": current,
        "tags": tables,
        "in_flight": in_flight(repo) if repo is not None else [],
        "stop_requested": repo is not None and state.stop_file(repo).exists(),
        "warnings": damaged + ([problem] if problem else []),
    }


def diff(repo: Path, commit: str) -> str:
    """train.py of a commit against its (first) parent's: for a keep re-committed on a moved branch, what it changed
    in the champion before it."""
    if not re.fullmatch(r"[0-9a-f]{4,40}", commit):
        raise BadQuery(f"not a commit: {commit!r}")
    return git.git(repo, "show", "-m", "--first-parent", "--format=%h %s%n", commit, "--", state.EDITABLE,
                   check=False, strip=False)


def log_tail(repo: Path, run_id: str) -> str:
    if not re.fullmatch(r"[0-9A-Za-z-]+", run_id):
        raise BadQuery(f"not a run id: {run_id!r}")
    return state.tail(state.run_dir(repo, run_id) / state.RUN_LOG, 40)


def attach_details(data: dict, repo: Path | None) -> dict:
    """For a static report: each row's diff, and each crash's log tail, inside the facts."""
    if repo is None:
        return data
    for tag in data["tags"]:
        for row in tag["rows"]:
            if row["status"] != "refused":
                row["diff"] = diff(repo, row["commit"]) if re.fullmatch(r"[0-9a-f]{4,40}", row["commit"]) else ""
            if row["status"] == "crash":
                row["log_tail"] = log_tail(repo, row["run_id"])
    return data
