"""What the agent cost (tokens.py): the tokens Claude Code, Codex and aider record, read from session files the
tests write in each format, joined to the experiments of the stretch, and shown by `report` and the dashboard's
facts through the real CLI; a confined agent's session files reach the harness, never the user's home."""

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, cli

from autoresearch import ledger, state, tokens


def claude_session(home: Path, messages: list[dict], name="0b6c.jsonl", project="-work-repo") -> Path:
    """A Claude Code session file: a user line, then each assistant message as Claude Code writes it, a line per
    content block, each repeating the message's usage; a last line cut short (the agent killed mid-write)."""
    path = home / ".claude" / "projects" / project / name
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"type": "user", "uuid": "u0", "timestamp": "2026-01-01T00:00:00Z", "message": {"role": "user",
                                                                                              "content": "go"}}]
    for i, m in enumerate(messages):
        usage = {"input_tokens": m["input"], "output_tokens": m["output"],
                 "cache_read_input_tokens": m["cache_read"], "cache_creation_input_tokens": m["cache_write"],
                 "service_tier": "standard"}
        for block in ("thinking", "text", "tool_use")[:m.get("blocks", 2)]:
            lines.append({"type": "assistant", "uuid": f"a{i}-{block}", "requestId": f"req_{i}",
                          "message": {"id": f"msg_{name}_{i}", "model": "claude-sonnet-4-5", "role": "assistant",
                                      "content": [{"type": block}], "usage": usage}})
    lines.append({"type": "assistant", "message": {"id": "synthetic", "model": "<synthetic>",
                                                   "usage": {"input_tokens": 999, "output_tokens": 999}}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"type": "assistant", "mess')
    return path


def codex_session(home: Path, turns: list[dict], name="rollout-2026-01-01T00-00-00-0199.jsonl") -> Path:
    """A Codex rollout file: session_meta, then after each turn a token_count event with the session's
    cumulative total_token_usage (its input_tokens include the cached ones)."""
    path = home / ".codex" / "sessions" / "2026" / "01" / "01" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"timestamp": "2026-01-01T00:00:00Z", "type": "session_meta", "payload": {"id": "0199", "cwd": "/r"}},
             {"timestamp": "2026-01-01T00:00:01Z", "type": "event_msg", "payload": {"type": "token_count",
                                                                                     "info": None}}]
    total = dict.fromkeys(("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens"), 0)
    for t in turns:
        last = {"input_tokens": t["input"] + t["cache_read"], "cached_input_tokens": t["cache_read"],
                "output_tokens": t["output"], "reasoning_output_tokens": t["output"] // 2}
        total = {k: total[k] + last[k] for k in total}
        lines.append({"timestamp": "2026-01-01T00:00:02Z", "type": "event_msg", "payload": {
            "type": "token_count", "info": {"total_token_usage": dict(total, total_tokens=sum(total.values())),
                                            "last_token_usage": last, "model_context_window": 272000}}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def added(*usages: dict) -> dict:
    return {f: sum(u[f] for u in usages) for f in tokens.FIELDS}


M1 = {"input": 12, "output": 340, "cache_read": 15000, "cache_write": 2100}
M2 = {"input": 3, "output": 1200, "cache_read": 17100, "cache_write": 800, "blocks": 3}
T1 = {"input": 5000, "output": 700, "cache_read": 20000, "cache_write": 0}
T2 = {"input": 800, "output": 2500, "cache_read": 24000, "cache_write": 0}


def test_claude_codes_session_files_count_each_message_once_subagents_included(tmp_path):
    claude_session(tmp_path, [M1, M2])
    claude_session(tmp_path, [M2], name="agent-1.jsonl", project="-work-repo/0b6c/subagents")
    got, source = tokens.usage(tmp_path)
    assert source == "Claude Code"
    assert got == added(M1, M2, M2)


def test_codexs_rollout_counts_the_last_cumulative_total_cached_input_apart(tmp_path):
    codex_session(tmp_path, [T1, T2])
    codex_session(tmp_path, [T1], name="rollout-2026-01-01T00-09-00-0200.jsonl")
    got, source = tokens.usage(tmp_path)
    assert source == "Codex"
    assert got == added(T1, T2, T1)


def test_aiders_printed_counts_are_summed_and_said_to_be_rounded():
    printed = ["Tokens: 4.3k sent, 171 received. Cost: $0.02 message, $0.02 session.",
               "Tokens: 1.2k sent, 2.0k cache write, 5.5k cache hit, 1.1k received. Cost: $0.01 message, $0.03 "
               "session."]
    got, source = tokens.usage(None, printed)
    assert got == {"input": 5500, "output": 1271, "cache_read": 5500, "cache_write": 2000}
    assert "aider" in source and "rounded" in source


@pytest.mark.parametrize("damage", ["not json", "negative", "link", "fifo", "too many", "deep", "entries",
                                    "escape in its name"])
def test_a_malformed_or_planted_session_file_means_unknown_never_a_crash_or_a_guess(tmp_path, damage):
    home = tmp_path / "home"
    path = claude_session(home, [M1])
    if damage == "not json":
        path.write_text(path.read_text().replace("\n", "\n{oops\n", 1))
    elif damage == "negative":
        path.write_text(path.read_text().replace('"output_tokens": 340', '"output_tokens": -340'))
    elif damage == "link":  # a link to a file of the user's: never followed
        secret = tmp_path / "secret.jsonl"
        path.rename(secret)
        path.symlink_to(secret)
    elif damage == "fifo":  # would block a reader forever
        path.unlink()
        os.mkfifo(path)
    elif damage == "deep":  # the red team's: json.loads raised RecursionError, the scratch stayed, no record
        path.write_text("[" * 1001 + "\n")
    elif damage == "entries":  # directories of every kind count, not only session files
        for i in range(tokens.ENTRIES_LIMIT + 1):
            (path.parent / f"d{i}").mkdir()
    elif damage == "escape in its name":  # the agent names its files: report printed the name to your terminal
        path.rename(path.with_name("\x1b]52;c;cGF5bG9hZA==\x07\udcff.jsonl"))
        path.with_name("\x1b]52;c;cGF5bG9hZA==\x07\udcff.jsonl").write_text("{oops\n")
    else:
        for i in range(tokens.FILES_LIMIT + 1):
            (path.parent / f"{i}.jsonl").write_text("")
    got, why = tokens.usage(home)
    assert got is None and why.startswith("unknown: its session record is malformed")
    assert "\x1b" not in why and why.encode("utf-8")  # nothing a terminal acts on; printable as UTF-8


def test_what_the_report_prints_of_a_session_is_printable_whatever_the_record_holds():
    """An older record, or an agent's description: the report's lines carry no escape sequence and no lone
    surrogate (print() raised UnicodeEncodeError on one, and `report` failed until the record was deleted)."""
    session = {"kind": "turn", "total": None, "cost": None, "source": "unknown: \x1b]52;c;eA==\x07 \udcff",
               "runs": [], "experiments": 0, "keeps": 0, "start": "", "commit": "", "status": "", "description": ""}
    bill = {"total": 0, "cost": None, "known": 0, "unknown": 1, "tokens": dict.fromkeys(tokens.FIELDS, 0),
            "priced": False, "per_experiment": None, "per_keep": None, "experiments": 0, "keeps": 0,
            "sessions": [session]}
    for line in tokens.lines(bill):
        assert "\x1b" not in line and "\x07" not in line and line.encode("utf-8")


def test_the_loop_keeps_the_lines_aider_prints_its_tokens_on_however_long_its_output():
    import io

    from autoresearch import agents
    said = ("Tokens: 4.3k sent, 171 received. Cost: $0.02 message, $0.02 session.\n" + "x" * agents.OUTPUT_TAIL
            + "\nTokens: 1.2k sent, 20 received.\nDESCRIPTION: wider\n")
    output = agents.Output(io.StringIO(said))
    assert "DESCRIPTION: wider" in output.text()
    assert tokens.usage(None, output.tokens)[0] == {"input": 5500, "output": 191, "cache_read": 0, "cache_write": 0}


def test_an_unknown_agent_is_said_to_be_unknown(tmp_path):
    assert tokens.usage(tmp_path) == (None, "unknown: the agent left no session record the harness reads "
                                            "(Claude Code's, Codex's, aider's output)")
    got, why = tokens.usage(None)
    assert got is None and "unconfined" in why


def row(commit, status, description, run_id, config, decision="naive: x"):
    return ledger.Row(commit=commit, val_bpb=1.5, memory_gb=0.1, status=status, description=description, tag="t",
                      run_id=run_id, time=state.now(), budget_s=2.0, steps=3, wall_s=3.0, fingerprint="f", seed=42,
                      config=config, decision=decision)


def harness_env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)  # this checkout's harness


def test_report_shows_tokens_per_experiment_per_keep_and_per_night_adding_up_to_the_session_files(repo, tmp_path):
    """A night of `loop --agent` turns as the loop records them: Claude Code's, Codex's, a failed proposal's
    (Claude Code's too: it cost tokens) and one whose agent left nothing; `report` and `report --json` through the
    real CLI."""
    results = state.results(repo)
    ledger.create(results)
    ledger.append(results, row("aaaaaaa", "keep", "baseline", "r0", "c0", decision="baseline"))
    homes = [tmp_path / f"h{i}" for i in range(4)]
    claude_session(homes[0], [M1, M2])
    codex_session(homes[1], [T1, T2])
    claude_session(homes[2], [M1], name="failed.jsonl")
    runs = [[("bbbbbbb", "confirm", "wider mlp", "r1", "c1"), ("bbbbbbb", "keep", "wider mlp [run 2]", "r2", "c1")],
            [("ccccccc", "discard", "shorter warmdown", "r3", "c2")], [], [("ddddddd", "keep", "qk norm", "r4", "c3")]]
    for home, turn in zip(homes, runs):  # the third turn failed: no run
        record = tokens.record(repo, "turn", "claude", state.now(), home, tag="t")
        for r in turn:
            ledger.append(results, row(*r))
            tokens.add_run(record, r[3])
    tokens.record(repo, "turn", "claude", state.now(), tmp_path / "h0", tag="other")  # another tag's
    expected = added(M1, M2, T1, T2, M1)
    night = sum(expected.values())

    out = cli(repo, "report", "--tag", "t", "--prices", "input=3,output=15,cache_read=0.3,cache_write=3.75",
              env=harness_env())
    assert out.returncode == 0, out.stderr
    dollars = (expected["input"] * 3 + expected["output"] * 15 + expected["cache_read"] * 0.3
               + expected["cache_write"] * 3.75) / 1e6
    assert f"agent tokens for the night: {night:,} ${dollars:,.2f} over 3 session(s)" in out.stdout
    assert "and 1 session(s) whose tokens are unknown" in out.stdout
    # two experiments and one keep of the sessions whose tokens are known (the baseline is no agent's)
    assert f"per experiment {night / 2:,.0f} ${dollars / 2:,.2f} (2); per keep {night:,} ${dollars:,.2f} (1)" \
        in out.stdout
    first = sum(added(M1, M2).values())
    assert f"{first:>12,} ${tokens.cost(added(M1, M2), tokens.prices('input=3,output=15,cache_read=0.3,cache_write=3.75')):,.2f}" \
           f"  bbbbbbb  keep     wider mlp  (from Claude Code)" in out.stdout
    assert "unknown  ddddddd  keep     qk norm  (unknown: the agent left no session record" in out.stdout
    assert "no run (the proposal failed, or its run is in flight)" in out.stdout

    facts = json.loads(cli(repo, "report", "--tag", "t", "--json", env=harness_env()).stdout)
    bill = facts["tags"][0]["agent_tokens"]
    assert bill["tokens"] == expected and bill["total"] == night and bill["cost"] is None
    assert [s["total"] for s in bill["sessions"]] == [first, sum(added(T1, T2).values()), sum(M1.values()), None]
    assert [s["runs"] for s in bill["sessions"]] == [["r1", "r2"], ["r3"], [], ["r4"]]
    assert bill["per_keep"] == night and bill["experiments"] == 2 and bill["unknown"] == 1
    priced = json.loads(cli(repo, "report", "--tag", "t", "--json", env=harness_env(
        AUTORESEARCH_TOKEN_PRICES="input=3,output=15,cache_read=0.3,cache_write=3.75")).stdout)
    assert priced["tags"][0]["agent_tokens"]["cost"] == pytest.approx(dollars)
    bad = cli(repo, "report", "--tag", "t", "--prices", "input=three", env=harness_env())
    assert bad.returncode != 0 and "input=three" in bad.stderr


def test_a_parallel_loops_turn_pays_for_its_configurations_runs_controls_aside(repo, tmp_path):
    """`loop --workers N --agent ...`: the driver notes the configuration a turn proposed (driver.proposed)."""
    results = state.results(repo)
    ledger.create(results)
    claude_session(tmp_path / "h", [M1])
    turn = tokens.record(repo, "parallel-turn", "claude", state.now(), tmp_path / "h", tag="t")
    tokens.add_run(turn, config="c1")
    for r in [("bbbbbbb", "confirm", "a", "r1", "c1"), ("aaaaaaa", "control", "control for c1", "r2", "c0"),
              ("ccccccc", "discard", "other worker's", "r3", "c2"), ("bbbbbbb", "keep", "a [run 2]", "r4", "c1")]:
        ledger.append(results, row(*r))
    bill = json.loads(cli(repo, "report", "--tag", "t", "--json", env=harness_env()).stdout)["tags"][0]["agent_tokens"]
    assert [s["runs"] for s in bill["sessions"]] == [["r1", "r4"]] and bill["keeps"] == 1
    assert bill["per_experiment"] == sum(M1.values())


def test_a_night_without_an_agent_the_harness_started_says_so(repo):
    ledger.create(state.results(repo))
    ledger.append(state.results(repo), row("aaaaaaa", "keep", "baseline", "r0", "c0", decision="baseline"))
    out = cli(repo, "report", "--tag", "t", env=harness_env())
    assert "agent tokens: no session of an agent the harness started" in out.stdout, out.stderr


def agent_script(tmp_path: Path) -> str:
    """An agent that writes, in its home, a Claude Code session (M1, M2) and a Codex one (T1, T2): the files the
    tests make, carried in the script (the agent's /tmp is private: it sees no file of the test's there)."""
    staged = tmp_path / "staged"
    files = [claude_session(staged, [M1, M2]), codex_session(staged, [T1, T2])]
    contents = {str(f.relative_to(staged)): f.read_text() for f in files}
    return textwrap.dedent(f'''
        import json, pathlib
        for rel, text in json.loads({json.dumps(json.dumps(contents))}).items():
            path = pathlib.Path.home() / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        print("wrote", sorted(json.loads({json.dumps(json.dumps(contents))})))
    ''')


@pytest.fixture
def home():
    """A home of the test's own, outside /tmp (the agent's /tmp is private)."""
    import shutil
    import tempfile
    path = Path(tempfile.mkdtemp(prefix="autoresearch-home-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("has_claude_dir", [False, True])
def test_a_confined_agents_session_files_reach_the_harness_and_never_your_home(repo, env, home, tmp_path,
                                                                               has_claude_dir, bwrap_or_skip):
    """`autoresearch agent` with an agent that writes Claude Code's and Codex's session files in its home: the
    harness records their tokens when it ends, and neither your home nor the state directory keeps the files."""
    bwrap_or_skip()
    if has_claude_dir:  # an installed Claude Code: its settings are read-only inside, its projects private
        (home / ".claude" / "projects" / "-mine").mkdir(parents=True)
        (home / ".claude" / "settings.json").write_text("{}")
    (tmp_path / "agent.py").write_text(agent_script(tmp_path))
    proc = cli(repo, "agent", "--", sys.executable, str(tmp_path / "agent.py"), env=dict(env, HOME=str(home)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ".claude/projects/-work-repo/0b6c.jsonl" in proc.stdout
    records = tokens.sessions(repo)
    assert len(records) == 1 and records[0]["kind"] == "session"
    assert records[0]["tokens"] == added(M1, M2, T1, T2) and records[0]["source"] == "Claude Code + Codex"
    assert not list(home.rglob("*.jsonl")) and not list(state.state_dir(repo).rglob("*.jsonl"))


@pytest.mark.slow
def test_loop_with_an_agent_bills_each_experiment_its_turn(repo, env, tmp_path, home, bwrap_or_skip):
    """`loop --agent` with an agent that records Claude Code's session: the change's row carries its turn's
    tokens in `report`, and `status` shows the night's."""
    bwrap_or_skip()
    from test_loop import AGENT as EDIT
    (tmp_path / "agent.py").write_text(agent_script(tmp_path) + EDIT)
    out = cli(repo, "loop", "--tag", "bill", "--agent", f"{sys.executable} {tmp_path / 'agent.py'}",
              "--max-experiments", "2", "--decision", "naive", env=dict(env, HOME=str(home)), timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    baseline, change = ledger.read(state.results(repo))
    night = sum(added(M1, M2, T1, T2).values())
    report = cli(repo, "report", env=env)
    assert f"agent tokens for the night: {night:,} over 1 session(s)" in report.stdout, report.stdout
    assert f"{night:>12,}  {change.commit}  {change.status:8s} shorter warmdown (0.3)" in report.stdout
    assert f"per experiment {night:,} (1)" in report.stdout
    status = cli(repo, "status", env=env)
    assert f"agent tokens for the night: {night:,}" in status.stdout, status.stdout + status.stderr


def test_an_agent_sessions_tokens_pay_for_the_runs_recorded_while_it_ran(repo, tmp_path):
    """`autoresearch agent`: the session's tokens go to the experiments recorded between its start and end, its
    mean per experiment; a run recorded before it started is not its."""
    results = state.results(repo)
    ledger.create(results)
    before = row("aaaaaaa", "keep", "baseline", "r0", "c0", decision="baseline")
    before.time = "2000-01-01T00:00:00"
    ledger.append(results, before)
    start = state.now()
    for r in [("bbbbbbb", "discard", "a", "r1", "c1"), ("ccccccc", "control", "control for c2", "r2", "c0"),
              ("ccccccc", "keep", "b", "r3", "c2")]:
        ledger.append(results, row(*r))
    codex_session(tmp_path / "h", [T1, T2])
    tokens.record(repo, "session", "codex", start, tmp_path / "h")
    out = cli(repo, "report", "--tag", "t", env=harness_env())
    night = sum(added(T1, T2).values())
    assert f"{night:>12,}  2 experiment(s), 1 keep(s): `autoresearch agent` {start}  (from Codex)" in out.stdout, \
        out.stdout + out.stderr
    assert f"per experiment {night / 2:,.0f} (2); per keep {night:,} (1)" in out.stdout
