"""The read model: what happened, as one JSON-able dict, for `status --json`, `report --json`, `report --html`
and the live `autoresearch dashboard`, and the page that shows it.

facts() gathers it from results.tsv, the tag files, the runs in flight and git; attach_details adds each row's
diff and log for a page that cannot ask for them. Everything here only reads, but for one thing: the dashboard
serves the facts (and each row's diff and log on demand) to a page that polls them, and `report --html` writes
the same page with the facts and the plotting library inline, one file to share; the page's stop button writes
.autoresearch/stop, which `autoresearch loop` reads between experiments (and deletes when it starts), to stop
after the experiment in flight.
"""

from __future__ import annotations

import errno
import json
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from statistics import fmean
from urllib.parse import parse_qs, urlparse

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


# --- the page --------------------------------------------------------------------------------------------------

PAGE = Path(__file__).with_name("dashboard.html")


class DashboardError(RuntimeError):
    pass


def plotly_js() -> str:
    """The plotting library, from its pip package (no network: the page loads it from the dashboard)."""
    import plotly
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path.read_text(encoding="utf-8")


def page(data: dict | None = None) -> str:
    """The dashboard page: live (data None: it polls /api/facts, loads /plotly.min.js) or static (the facts and
    the library inline)."""
    html = PAGE.read_text(encoding="utf-8")
    if data is None:
        return (html.replace("<!--PLOTLY-->", '<script src="/plotly.min.js"></script>')
                .replace("/*FACTS*/null", "null"))
    script = "<script>" + plotly_js().replace("</script", "<\\/script") + "</script>"
    facts_json = json.dumps(data).replace("<", "\\u003c")  # no `</script` nor `<!--` of a row's text in the page
    return html.replace("<!--PLOTLY-->", script).replace("/*FACTS*/null", facts_json)


# --- the live dashboard ---------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    """One request to the dashboard; the server (a Server) holds the repository and the plotting library."""

    def log_message(self, *args):  # quiet: a poll every two seconds would fill the terminal
        pass

    def send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        repo, url = self.server.repo, urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            if url.path == "/":
                self.send(200, page().encode(), "text/html; charset=utf-8")
            elif url.path == "/plotly.min.js":
                self.send(200, self.server.library, "application/javascript")
            elif url.path == "/api/facts":
                body = json.dumps(facts(state.results(repo), repo, query.get("tag"))).encode()
                self.send(200, body, "application/json")
            elif url.path == "/api/diff":
                self.send(200, diff(repo, query.get("commit", "")).encode(), "text/plain; charset=utf-8")
            elif url.path == "/api/log":
                self.send(200, log_tail(repo, query.get("run_id", "")).encode(), "text/plain; charset=utf-8")
            else:
                self.send(404, b"not found", "text/plain")
        except BadQuery as e:
            self.send(400, str(e).encode(), "text/plain")

    def do_POST(self):
        if urlparse(self.path).path != "/api/stop":
            self.send(404, b"not found", "text/plain")
            return
        path = state.stop_file(self.server.repo)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + " from the dashboard\n")
        self.send(200, b'{"stop_requested": true}', "application/json")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, repo: Path, library: bytes):
        self.repo, self.library = repo, library
        super().__init__(address, Handler)


def serve(repo: Path, host: str = "127.0.0.1", port: int = 8080, log=print):
    """The dashboard's server, listening (the caller serves it until Ctrl-C). Raises DashboardError when the port
    is taken."""
    library = plotly_js().encode()  # read before listening: a missing file is its own error, not the port's
    try:
        server = Server((host, port), repo, library)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise DashboardError(f"port {port} on {host} is in use (another dashboard?): use --port N, e.g. "
                                 f"--port {port + 1}.") from None
        raise DashboardError(f"cannot listen on {host}:{port} ({e.strerror}).") from None
    bound = server.server_address[1]
    log(f"dashboard on http://{host}:{bound}/ (read-only; Ctrl-C stops it). From another machine: "
        f"ssh -L {bound}:localhost:{bound} THIS_HOST, then open http://localhost:{bound}/")
    return server
