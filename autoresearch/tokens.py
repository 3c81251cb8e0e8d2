"""What the agent cost: the tokens Claude Code and Codex record in their session files (aider prints its own),
read by the harness when an agent's session ends, and joined to the experiments run in that stretch.

Every session of an agent the harness starts (a `loop --agent` turn, an `autoresearch agent` session) leaves a
record of the harness's own, .autoresearch/agent-tokens/<id>.json: its agent, start and end, its tokens (or
null, and why they are unknown) and, for a loop turn, the runs it proposed. A confined agent writes its session
files into a private directory of the harness's (confine.TOKEN_SCRATCH), read here before it is removed. Those
files are the agent's, untrusted: read bounded, never through a link, and a malformed one means "unknown", never
a number guessed. bill() joins the records to a tag's rows: tokens (and cost, with prices per million tokens in
AUTORESEARCH_TOKEN_PRICES or `report --prices`) per experiment, per keep and per night.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

from autoresearch import state
from autoresearch.evaluator.safe_read import Unsafe, read_regular

FIELDS = ("input", "output", "cache_read", "cache_write")
CLAUDE_DIR, CODEX_DIR = ".claude/projects", ".codex/sessions"  # under the agent's home: where each keeps a session
FILE_LIMIT = 256 << 20  # bytes of one session file read; a larger one is "unknown"
FILES_LIMIT = 1000      # session files looked at in one session's directory
ENTRIES_LIMIT = 20_000  # directory entries of every kind walked there (the agent makes them: bounded too)
TOTAL_LIMIT = 1 << 30   # bytes of them all: what the harness reads when a session ends is bounded
MAX_COUNT = 10 ** 13    # tokens one number may say; more is not a count
PRICES_ENV = "AUTORESEARCH_TOKEN_PRICES"
AIDER_LINE = re.compile(r"^Tokens: (.+?)\.(?: Cost:|\s*$)")


class Malformed(ValueError):
    """A session file that does not say what its format says."""


def _files(root: Path) -> list[Path]:
    """The *.jsonl files under root, no link followed, at most FILES_LIMIT of TOTAL_LIMIT bytes in all (more:
    Malformed)."""
    out, stack, size, seen = [], [root], 0, 0
    while stack:
        try:
            with os.scandir(stack.pop()) as listing:
                entries = []
                for e in listing:  # counted as listed: a directory of millions is refused, not walked
                    seen += 1
                    if seen > ENTRIES_LIMIT:
                        raise Malformed(f"more than {ENTRIES_LIMIT} entries in the session directories")
                    entries.append(e)
        except OSError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                stack.append(Path(e.path))
            elif e.name.endswith(".jsonl"):
                out.append(Path(e.path))
                size += e.stat(follow_symlinks=False).st_size
        if len(out) > FILES_LIMIT or size > TOTAL_LIMIT:
            raise Malformed(f"more than {FILES_LIMIT} session files or {TOTAL_LIMIT:,} bytes")
    return sorted(out)


def _entries(path: Path):
    """Each line of a JSONL session file as a dict; a last line without its newline (an agent killed mid-write)
    is left out, any other line that is not a JSON object is Malformed."""
    name = ascii(path.name)  # the agent chose it: never a terminal's escape sequence in a message
    try:
        data = read_regular(path, FILE_LIMIT)
    except (Unsafe, OSError) as e:
        raise Malformed(f"{name}: {ascii(str(e))}") from None
    start, n = 0, 0
    while (end := data.find(b"\n", start)) != -1:  # one line at a time: memory is the file and one line
        line, start, n = data[start:end], end + 1, n + 1
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; `[` * 1001 a RecursionError
            raise Malformed(f"{name} line {n} is not JSON") from None
        if not isinstance(entry, dict):
            raise Malformed(f"{name} line {n} is not a JSON object")
        yield entry


def _count(usage: dict, name: str) -> int:
    value = usage.get(name, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_COUNT:
        raise Malformed(f"{name} is {value!r}, not a count of tokens")
    return value


def claude(root: Path) -> dict | None:
    """Claude Code's tokens under `root` (its projects directory): every assistant message's `message.usage`,
    once per message id (Claude Code writes a line per content block, each repeating the message's usage)."""
    messages: dict[str, dict] = {}
    files = _files(root)
    for path in files:
        for n, entry in enumerate(_entries(path)):
            message = entry.get("message")
            if not isinstance(message, dict) or not isinstance(message.get("usage"), dict):
                continue
            if message.get("model") == "<synthetic>":  # Claude Code's own placeholder, no API call
                continue
            usage = message["usage"]
            counts = {"input": _count(usage, "input_tokens"), "output": _count(usage, "output_tokens"),
                      "cache_read": _count(usage, "cache_read_input_tokens"),
                      "cache_write": _count(usage, "cache_creation_input_tokens")}
            key = str(message.get("id") or entry.get("uuid") or f"{path}:{n}")
            old = messages.get(key, counts)  # a repeated message: its largest counts (streaming grows them)
            messages[key] = {f: max(old[f], counts[f]) for f in FIELDS}
    return _sum(messages.values()) if files else None


def codex(root: Path) -> dict | None:
    """Codex's tokens under `root` (its sessions directory): each rollout file's last `token_count` event's
    `total_token_usage` (cumulative over the session). Its input_tokens include the cached ones, which are
    counted here as cache_read; its output_tokens include the reasoning tokens."""
    sessions = []
    files = _files(root)
    for path in files:
        last = None
        for entry in _entries(path):
            payload = entry.get("payload")
            if entry.get("type") == "event_msg" and isinstance(payload, dict) and payload.get("type") == "token_count":
                info = payload.get("info")
                if isinstance(info, dict) and isinstance(info.get("total_token_usage"), dict):
                    last = info["total_token_usage"]
        if last is not None:
            given, cached = _count(last, "input_tokens"), _count(last, "cached_input_tokens")
            if cached > given:
                raise Malformed(f"{ascii(path.name)}: more cached input tokens than input tokens")
            sessions.append({"input": given - cached, "output": _count(last, "output_tokens"), "cache_read": cached,
                             "cache_write": 0})
    return _sum(sessions) if files else None


def _number(text: str) -> int:
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kM]?)", text.strip())
    if m is None:
        raise Malformed(f"aider printed {text!r}, not a count")
    return round(float(m[1]) * {"": 1, "k": 1e3, "M": 1e6}[m[2]])


def aider(lines: list[str]) -> dict | None:
    """aider's tokens from what it printed, one line a message: "Tokens: 4.3k sent, 1.2k cache write, 2.0k cache
    hit, 171 received." (its counts, rounded to three digits)."""
    found = [m[1] for m in (AIDER_LINE.match(line.strip()) for line in lines) if m]
    if not found:
        return None
    names = {"sent": "input", "received": "output", "cache hit": "cache_read", "cache write": "cache_write"}
    total = dict.fromkeys(FIELDS, 0)
    for parts in found:
        for part in parts.split(","):
            value, _, name = part.strip().partition(" ")
            if name not in names:
                raise Malformed(f"aider printed {part.strip()!r}")
            total[names[name]] += _number(value)
    return total


def _sum(items) -> dict:
    return {f: sum(i[f] for i in items) for f in FIELDS}


def usage(home: Path | None, printed: list[str] = ()) -> tuple[dict | None, str]:
    """(tokens, where they come from) of one session: from the session files Claude Code and Codex wrote under
    `home` (the agent's private scratch; None: the agent was not confined, and its files, if any, are among the
    user's own), else from aider's printed lines. (None, why) when nothing tells them."""
    try:
        found = {}
        if home is not None:
            found = {name: n for name, n in (("Claude Code", claude(home / CLAUDE_DIR)),
                                             ("Codex", codex(home / CODEX_DIR))) if n is not None}
        if not found and printed:
            found = {name: n for name, n in (("aider (as it printed them, rounded)", aider(printed)),) if n}
    except Malformed as e:
        return None, f"unknown: its session record is malformed ({e})"
    except Exception as e:  # noqa: BLE001 - whatever the agent's files do, its tokens are unknown, never a crash
        return None, f"unknown: its session record could not be read ({type(e).__name__})"
    if found:
        return _sum(found.values()), " + ".join(found)
    if home is None:
        return None, ("unknown: the agent ran unconfined, so its session files are among your own and the harness "
                      "does not pick them out")
    return None, "unknown: the agent left no session record the harness reads (Claude Code's, Codex's, aider's output)"


def sessions_dir(repo: Path) -> Path:
    return state.state_dir(repo) / "agent-tokens"


def record(repo: Path, kind: str, agent: str, start: str, home: Path | None, tag: str | None = None,
           printed: list[str] = ()) -> Path:
    """Write the harness's record of one agent session that began at `start` and ends now; its path. kind: "turn"
    (a `loop --agent` proposal: the loop adds its runs, add_run), "parallel-turn" (a parallel loop's: the driver
    adds the configuration it proposed, whose runs are its) or "session" (`autoresearch agent`: its runs are
    those recorded between its start and end)."""
    tokens, source = usage(home, printed)
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10 ** 9:09d}"  # in order within a second too
    path = sessions_dir(repo) / f"{stamp}-{uuid.uuid4().hex[:4]}.json"
    state.atomic_json(path, {"kind": kind, "agent": agent, "tag": tag, "start": start, "end": state.now(),
                             "tokens": tokens, "source": source, "run_ids": [] if kind == "turn" else None})
    return path


def add_run(path: Path | None, run_id: str | None = None, config: str | None = None) -> None:
    """A run of the loop turn recorded at `path` (the loop's experiment, its repeats, its controls), or the
    configuration a parallel loop's turn proposed (its runs, controls aside, are the turn's)."""
    if path is None:
        return
    entry = json.loads(path.read_text())
    entry["run_ids"] = (entry.get("run_ids") or []) + ([run_id] if run_id else [])
    entry["config"] = config or entry.get("config")
    state.atomic_json(path, entry)


def sessions(repo: Path) -> list[dict]:
    """Every session record, oldest first; one that cannot be read is left out."""
    out = []
    for path in sorted(sessions_dir(repo).glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("start"), str) and isinstance(entry.get("end"), str):
            out.append(entry)
    return out


def prices_or_none(text: str | None = None, warnings: list | None = None) -> dict | None:
    """prices(), or None (and why, in `warnings`) when they are malformed: a report never fails for them."""
    try:
        return prices(text)
    except ValueError as e:
        if warnings is not None:
            warnings.append(f"{e}: costs are not shown")
        return None


def prices(text: str | None = None) -> dict | None:
    """Prices in dollars per million tokens, from `text` or AUTORESEARCH_TOKEN_PRICES:
    "input=3,output=15,cache_read=0.3,cache_write=3.75". None when none are given; ValueError when malformed."""
    text = os.environ.get(PRICES_ENV, "") if text is None else text
    if not text.strip():
        return None
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in FIELDS:
            raise ValueError(f"prices: {name.strip()!r} is not one of {', '.join(FIELDS)} (e.g. input=3,output=15)")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"prices: {part.strip()!r} is not KIND=DOLLARS") from None
        if not 0 <= out[name.strip()] < 1e6:
            raise ValueError(f"prices: {part.strip()!r} is not a price per million tokens")
    return out


def cost(tokens: dict | None, price: dict | None) -> float | None:
    """Dollars for `tokens` at `price`; None without prices, or when a kind of token it used has no price."""
    if tokens is None or price is None or any(tokens[f] and f not in price for f in FIELDS):
        return None
    return sum(tokens[f] * price.get(f, 0.0) for f in FIELDS) / 1e6


def _item(entry: dict, mine: list) -> dict:
    experiments = list(dict.fromkeys(r.key for r in mine if r.status != "control"))
    kept = {r.key for r in mine if r.status == "keep" and not r.decision.startswith("baseline")}
    tokens = entry.get("tokens")
    if not isinstance(tokens, dict) or any(not isinstance(tokens.get(f), int) for f in FIELDS):
        tokens = None
    return {"kind": entry.get("kind"), "agent": str(entry.get("agent")), "start": entry["start"], "end": entry["end"],
            "tokens": tokens, "total": sum(tokens.values()) if tokens else None, "source": str(entry.get("source")),
            "runs": [r.run_id for r in mine], "experiments": len(experiments), "keeps": len(kept),
            "commit": mine[0].commit if mine else None, "status": mine[-1].status if mine else None,
            "description": mine[0].description.split(" [")[0] if mine else None}


def bill(repo: Path, tag: str, rows: list, price: dict | None = None) -> dict | None:
    """The agent's tokens on `tag` (rows: its ledger rows): each session's, and per experiment, per keep and for
    the night (the sessions whose tokens are known); None when no agent session of the harness's touched it.
    A loop turn pays for the runs it proposed; an `autoresearch agent` session for the runs recorded while it
    ran."""
    items = []
    for entry in sessions(repo):
        if entry.get("kind") == "session":
            mine = [r for r in rows if entry["start"] <= r.time <= entry["end"]]
            if not mine:
                continue
        elif tag is None or entry.get("tag") == tag:
            ids, config = set(entry.get("run_ids") or []), entry.get("config")
            mine = [r for r in rows if r.run_id in ids or (config and r.config == config and r.status != "control")]
        else:
            continue
        items.append(_item(entry, mine))
    if not items:
        return None
    known = [i for i in items if i["tokens"] is not None]
    tokens = _sum([i["tokens"] for i in known])
    experiments, keeps = sum(i["experiments"] for i in known), sum(i["keeps"] for i in known)
    night = sum(tokens.values())
    for i in items:
        i["cost"] = cost(i["tokens"], price)
    return {"sessions": items, "tokens": tokens, "total": night, "cost": cost(tokens, price) if known else None,
            "known": len(known), "unknown": len(items) - len(known), "experiments": experiments, "keeps": keeps,
            "per_experiment": night / experiments if experiments else None,
            "per_keep": night / keeps if keeps else None,
            "cost_per_experiment": cost(tokens, price) / experiments if experiments and known and price else None,
            "cost_per_keep": cost(tokens, price) / keeps if keeps and known and price else None,
            "priced": price is not None}


def printable(text: str) -> str:
    """A line for a terminal: what a record or an agent wrote never acts on it (an escape sequence, a lone
    surrogate that print() cannot encode)."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _money(value: float | None) -> str:
    return "" if value is None else f" ${value:,.2f}"


def lines(b: dict | None, each: bool = True) -> list[str]:
    """bill() as `report` (each session too) and `status` (each=False) print it."""
    if b is None:
        return ["agent tokens: no session of an agent the harness started (loop --agent, autoresearch agent) on this tag"]
    t = b["tokens"]
    out = [f"agent tokens for the night: {b['total']:,}{_money(b['cost'])} over {b['known']} session(s) "
           f"(input {t['input']:,}, output {t['output']:,}, cache read {t['cache_read']:,}, cache write "
           f"{t['cache_write']:,})" + ("" if b["priced"] else f"; no prices ({PRICES_ENV}=input=3,output=15,...)")]
    if b["unknown"]:
        out.append(f"  and {b['unknown']} session(s) whose tokens are unknown: not counted above")
    per = [f"per experiment {b['per_experiment']:,.0f}{_money(b['cost_per_experiment'])} ({b['experiments']})"
           if b["per_experiment"] is not None else "no experiment yet",
           f"per keep {b['per_keep']:,.0f}{_money(b['cost_per_keep'])} ({b['keeps']})"
           if b["per_keep"] is not None else "no keep yet"]
    out.append("  " + "; ".join(per))
    for i in b["sessions"] if each else ():
        tokens = f"{i['total']:>12,}{_money(i['cost'])}" if i["total"] is not None else f"{'unknown':>12}"
        what = (f"{i['experiments']} experiment(s), {i['keeps']} keep(s): `autoresearch agent` {i['start']}"
                if i["kind"] == "session" else f"{i['commit']}  {i['status']:8s} {i['description']}" if i["runs"]
                else "no run (the proposal failed, or its run is in flight)")
        source = i["source"] if i["total"] is None else f"from {i['source']}"
        out.append(printable(f"  {tokens}  {what}  ({source})"))
    return out
