"""What happened, for people and programs: `status --json`, `report --json`, `report --html FILE` and the live
`autoresearch dashboard`.

facts() gathers one JSON-able dict from results.tsv, the tag files, the runs in flight and git; the dashboard
serves it (and each row's diff and log on demand) to a page that polls it, and `report --html` writes the same
page with the facts and the plotting library inline, one file to share. Everything here only reads, with one
exception: the dashboard's stop button writes .autoresearch/stop, which `autoresearch loop` reads between
experiments (and deletes when it starts), to stop after the experiment in flight.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from statistics import fmean

from autoresearch import decide, errors, fixed, git, ledger, machine, recovery, state, tags

PAGE = Path(__file__).with_name("dashboard.html")


class DashboardError(RuntimeError):
    pass


def plotly_js() -> str:
    """The plotting library, from its pip package (no network: the page loads it from the dashboard)."""
    import plotly
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path.read_text(encoding="utf-8")


def parse_log(text: str) -> dict:
    """A training log's curve and its latest tok/s, MFU and elapsed seconds."""
    curve, last = [], None
    for m in fixed.contract().STEP_RE.finditer(text):
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
        pending = recovery.read_pending(repo)
    except errors.HarnessError:
        pending = None
    if pending is not None:
        log = state.run_dir(repo, pending["run_id"]) / state.RUN_LOG
        try:
            text = log.read_text(errors="replace")
        except OSError:
            text = ""
        out.append(dict({k: pending.get(k) for k in ("run_id", "tag", "description", "started")}, worker="",
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


def _seconds(stamp: str) -> float | None:
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except (TypeError, ValueError):
        return None


def tag_facts(tag: str, rows: list[ledger.Row], config: dict | None) -> dict:
    """One tag: its champion and noise, per-hour rates, and every row with its delta to the champion."""
    values = decide.samples(rows)
    noise = decide.pooled_noise(values)
    champ = decide.champion(rows)
    champ_values = values.get(champ.key, []) if champ else []
    champion = None
    if champ_values:
        champion = {"commit": champ.commit, "config": champ.config, "mean": fmean(champ_values), "n": len(champ_values),
                    "sem": decide.sem(champ_values, noise) if noise else None,
                    "description": decide.base_description(champ.description)}
    times = [t for t in (_seconds(r.time) for r in rows) if t is not None]
    first = min(times) - (rows[0].wall_s or 0) if times else None
    hours = (max(times) - first) / 3600 if times else 0.0
    configs = {r.key for r in rows if r.status != "refused"}
    decided = {}
    for r in rows:  # a configuration's verdict is its last keep or discard
        if r.status in ("keep", "discard") and not r.decision.startswith("baseline"):
            decided[r.key] = r.status
    frontier = []
    for i, r in enumerate(rows, 1):
        if r.status == "keep" and r.mean is not None:
            frontier.append({"run": i, "mean": r.mean, "sem": r.sem, "commit": r.commit})
    table = []
    for i, r in enumerate(rows, 1):
        row = {c: getattr(r, c) for c in ledger.COLUMNS}
        row["index"] = i
        row["delta"] = (r.val_bpb - champion["mean"]) if champion and r.val_bpb > 0 else None
        table.append(row)
    return {
        "tag": tag,
        "budget_s": config.get("budget_s") if config else (rows[0].budget_s if rows else None),
        "clock": config.get("clock", "wall") if config else (rows[0].clock if rows else None),
        "hardware": machine.describe(config["hardware"]) if config and "hardware" in config else None,
        "threads": tags.threads_per_run(config) if config else None,
        "champion": champion,
        "flagged": [{"run_id": r.run_id, "commit": r.commit, "status": r.status, "flags": r.flags}
                    for r in rows if r.flags],
        "noise": {"sigma": noise.sigma, "df": noise.df} if noise else None,
        "counts": {s: sum(r.status == s for r in rows) for s in ledger.STATUSES},
        "runs": len(rows), "experiments": len(configs),
        "hours": round(hours, 3),
        "experiments_per_hour": round(len(configs) / hours, 2) if hours > 0 else None,
        "keep_rate": round(sum(v == "keep" for v in decided.values()) / len(decided), 3) if decided else None,
        "training_hours": round(sum(r.wall_s for r in rows) / 3600, 3),
        "frontier": frontier,
        "rows": table,
    }


def _tag_configs(repo: Path | None) -> dict[str, dict]:
    out = {}
    if repo is None:
        return out
    for path in sorted(state.tags_dir(repo).glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return out


def facts(path: Path, repo: Path | None, tag: str | None = None) -> dict:
    """Everything the dashboard shows, as plain JSON: every tag of the ledger (or the one asked for)."""
    damaged: list[str] = []
    rows, problem = [], None
    if path.exists():  # no ledger yet: no experiments yet, not an error
        try:
            rows = ledger.read(path, None, damaged=damaged, old_ok=True)
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
    return {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "results": str(path),
        "current_tag": current,
        "tags": [tag_facts(t, [r for r in rows if r.tag == t], configs.get(t)) for t in names],
        "in_flight": in_flight(repo) if repo is not None else [],
        "stop_requested": repo is not None and state.stop_file(repo).exists(),
        "warnings": damaged + ([problem] if problem else []),
    }


def diff(repo: Path, commit: str) -> str:
    """train.py of a commit against its parent's."""
    if not re.fullmatch(r"[0-9a-f]{4,40}", commit):
        raise DashboardError(f"not a commit: {commit!r}")
    return git.git(repo, "show", "--format=%h %s%n", commit, "--", state.EDITABLE, check=False, strip=False)


def log_tail(repo: Path, run_id: str) -> str:
    if not re.fullmatch(r"[0-9A-Za-z-]+", run_id):
        raise DashboardError(f"not a run id: {run_id!r}")
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


def page(data: dict | None = None) -> str:
    """The dashboard page: live (data None: it polls /api/facts, loads /plotly.min.js) or static (the facts and
    the library inline)."""
    html = PAGE.read_text(encoding="utf-8")
    if data is None:
        return (html.replace("<!--PLOTLY-->", '<script src="/plotly.min.js"></script>')
                .replace("/*FACTS*/null", "null"))
    script = "<script>" + plotly_js().replace("</script", "<\\/script") + "</script>"
    facts_json = json.dumps(data).replace("</", "<\\/")
    return html.replace("<!--PLOTLY-->", script).replace("/*FACTS*/null", facts_json)


# --- the live server ---------------------------------------------------------------------------------------


def serve(repo: Path, host: str = "127.0.0.1", port: int = 8080, log=print):
    """Serve the dashboard until Ctrl-C. Raises DashboardError when the port is taken."""
    import errno
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    results = state.results(repo)
    library = plotly_js().encode()

    class Handler(BaseHTTPRequestHandler):
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
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            try:
                if url.path == "/":
                    self.send(200, page().encode(), "text/html; charset=utf-8")
                elif url.path == "/plotly.min.js":
                    self.send(200, library, "application/javascript")
                elif url.path == "/api/facts":
                    body = json.dumps(facts(results, repo, query.get("tag"))).encode()
                    self.send(200, body, "application/json")
                elif url.path == "/api/diff":
                    self.send(200, diff(repo, query.get("commit", "")).encode(), "text/plain; charset=utf-8")
                elif url.path == "/api/log":
                    self.send(200, log_tail(repo, query.get("run_id", "")).encode(), "text/plain; charset=utf-8")
                else:
                    self.send(404, b"not found", "text/plain")
            except DashboardError as e:
                self.send(400, str(e).encode(), "text/plain")

        def do_POST(self):
            if urlparse(self.path).path != "/api/stop":
                self.send(404, b"not found", "text/plain")
                return
            path = state.stop_file(repo)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + " from the dashboard\n")
            self.send(200, b'{"stop_requested": true}', "application/json")

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise DashboardError(f"port {port} on {host} is in use (another dashboard?): use --port N, e.g. "
                                 f"--port {port + 1}.") from None
        raise DashboardError(f"cannot listen on {host}:{port} ({e.strerror}).") from None
    server.daemon_threads = True
    bound = server.server_address[1]
    log(f"dashboard on http://{host}:{bound}/ (read-only; Ctrl-C stops it). From another machine: "
        f"ssh -L {bound}:localhost:{bound} THIS_HOST, then open http://localhost:{bound}/")
    return server
