"""External coding agents (Claude Code, Codex, aider, or any command line) as proposers for the loop.

The harness builds the prompt, runs the agent with its own timeout in the repository (under bubblewrap where it
works, without access to the validation and test files: confine.wrap_agent), and afterwards makes sure only
train.py changed: anything else is put back and the violation goes into the row's description.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from autoresearch import (agentcgroup, confine, descriptions, git, guard, ledger, netproxy, proposer, sandbox, state,
                          tokens)
from autoresearch.errors import AgentError  # defined there: cli.py catches it without importing this module

PRESETS = {
    "claude": ["claude", "-p", "{prompt}", "--permission-mode", "acceptEdits"],
    "codex": ["codex", "exec", "--full-auto", "{prompt}"],
    "aider": ["aider", "--yes-always", "--no-auto-commits", "--no-gitignore", "--message", "{prompt}", "train.py"],
}

TURN = """
## Your turn

`autoresearch loop` runs the experiments and records them; you propose them, one per turn. In this turn make
exactly ONE change to `train.py` for the next experiment, then stop: the loop runs it and asks you again with the
result. Do not run `train.py`, `autoresearch`, or any git command, and do not edit any other file (other edits
are reverted and recorded against you). End your answer with one line:

DESCRIPTION: <a short description of the change>
"""


def rules(program: str) -> str:
    """The rules from program.md (its section that starts with "## The rules"), the part that is the same whoever
    runs the experiments; the rest of program.md tells an agent how to drive the CLI, which the loop does."""
    start = program.find("## The rules")
    if start < 0:
        return ""
    end = program.find("\n## ", start + 1)
    return program[start:end if end > 0 else None].strip()


def command_for(spec: str) -> list[str]:
    """The argv of a preset name or a command line; a missing binary is an error before anything runs."""
    argv = list(PRESETS[spec]) if spec in PRESETS else shlex.split(spec)
    if not argv:
        raise AgentError("--agent is empty; use builtin, claude, codex, aider, or a command line.")
    if shutil.which(argv[0]) is None:
        raise AgentError(f"Agent {spec!r}: `{argv[0]}` is not on PATH. Install it, give a full path, or use "
                         "`--agent builtin` (no AI agent needed).")
    return argv


def build_prompt(repo: Path, tag: str, last_outcome=None, in_flight: list[str] = (),
                 source: str | None = None) -> str:
    """The agent's prompt: the rules, the last results, the champion, what was tried and what the idea catalog
    offers from `source` (the train.py it will edit; the repository's by default)."""
    import prepare

    from autoresearch import report
    rows = ledger.read(state.results(repo), tag)
    program = (repo / "program.md").read_text() if (repo / "program.md").exists() else ""
    lines = ["# autoresearch: you are the research agent, driven by `autoresearch loop`\n\nYour job: the lowest "
             "val_bpb a model trained by `train.py` reaches in a fixed time budget. `prepare.py` is the fixed half "
             "(data, metric, `finish`), `train.py` is yours; read both.", rules(program), TURN,
             "## Results so far (results.tsv, newest last; mean: the configuration's mean over its runs so far)",
             "commit\tval_bpb\tmean\tmemory_gb\tstatus\tdescription"]
    lines += [f"{r.commit}\t{r.val_bpb:.6f}\t{'' if r.mean is None else f'{r.mean:.6f}'}\t{r.memory_gb:.1f}\t"
              f"{r.status}\t{r.description}" for r in rows[-40:]]
    lines.append("\n" + report.champion_text(rows, report.configurations(rows, repo)))
    manifest = prepare.load_manifest()
    profile = manifest["profile"] if manifest else prepare.default_profile()
    source = source if source is not None else (repo / state.EDITABLE).read_text(errors="replace")
    lines.append("\nDo not repeat what was tried unless something it depends on has changed since.\n"
                 + proposer.knowledge(rows, source, profile, command=False, repo=repo))
    if in_flight:  # parallel workers (driver.py): propose something else
        lines += ["\n## Running now on other workers (do not propose these again)"] + [f"- {d}" for d in in_flight]
    if last_outcome is not None and last_outcome.row.status == "crash":
        lines += ["\n## The last experiment crashed; the end of its log:", last_outcome.log_tail]
    return "\n".join(lines)


OUTPUT_TAIL = 64 << 10  # characters of an agent's output kept (its end, and every DESCRIPTION line): an agent that
# prints 150 MiB grew the harness by 465 MiB when all of it was kept, outside the agent's memory limit (agentcgroup.py)


class Output:
    """What the harness keeps of an agent's output, read as it comes: its last OUTPUT_TAIL characters, its
    DESCRIPTION lines (the last 20) and the lines aider prints its tokens on (the last 1000: tokens.aider)."""

    def __init__(self, stream):
        self.tail, self.described, self.pending, self.tokens = "", [], "", []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for chunk in iter(lambda: stream.read(8192), ""):
            self.tail = (self.tail + chunk)[-OUTPUT_TAIL:]
            *lines, self.pending = (self.pending + chunk).split("\n")
            self.pending = self.pending[-OUTPUT_TAIL:]
            self.described = (self.described + [ln[:1000] for ln in lines if "DESCRIPTION:" in ln[:200]])[-20:]
            self.tokens = (self.tokens + [ln[:300] for ln in lines if ln.startswith("Tokens: ")])[-1000:]
        if "DESCRIPTION:" in self.pending[:200]:
            self.described = (self.described + [self.pending[:1000]])[-20:]

    def text(self) -> str:
        self.thread.join(timeout=10)
        return "\n".join(self.described) + "\n" + self.tail


def _give(stdin, prompt: str) -> None:
    """The prompt on the agent's stdin, then end of file (in a thread: one that reads none must not block us)."""
    with contextlib.suppress(OSError):  # an agent that reads no prompt, or has ended
        stdin.write(prompt)
        stdin.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


class ExternalAgent(proposer.Proposer):
    """An agent that edits train.py in `workdir`: the repository itself, or for parallel workers (driver.py)
    one working copy per agent. The prompt is always built from the repository's results.tsv."""

    def __init__(self, repo: Path, tag: str, spec: str, timeout: float, workdir: Path | None = None,
                 kind: str = "turn"):
        self.repo, self.tag, self.timeout, self.kind = repo, tag, timeout, kind
        self.workdir = workdir or repo
        self.proc = None
        self.printed: list[str] = []  # the last session's lines of aider's token counts
        self.session: Path | None = None  # the harness's record of the last session's tokens (tokens.record)
        self.argv = command_for(spec)
        self.name = spec
        self.last_outcome = None

    def propose(self, ask: proposer.Ask = proposer.Ask()) -> str:
        """One session of the agent: its change to train.py, described."""
        private = Path(tempfile.mkdtemp(prefix="autoresearch-agent-"))  # the session's private state, gone after it
        # confined, it holds no more memory than agentcgroup.Cap allows: in the parallel loop it proposes beside a training
        cap = agentcgroup.Cap(private.name) if self.confined() else None
        start, self.printed = state.now(), []
        try:
            return self._session(ask, private, cap)
        finally:
            if cap is not None:
                cap.close()
            try:  # what the session cost, read from its scratch before that goes (a failed proposal costs too)
                self.session = tokens.record(self.repo, self.kind, self.name, start,
                                             confine.scratch_home(private) if cap is not None else None, self.tag,
                                             self.printed)
            finally:
                shutil.rmtree(private, ignore_errors=True)

    def _session(self, ask: proposer.Ask, private: Path, cap: agentcgroup.Cap | None) -> str:
        prompt = build_prompt(self.repo, self.tag, self.last_outcome, ask.in_flight,
                              (self.workdir / state.EDITABLE).read_text(errors="replace"))
        uses_placeholder = any("{prompt}" in a for a in self.argv)
        argv = [a.replace("{prompt}", prompt) for a in self.argv]
        proxy = None
        if cap is not None:  # no validation or test tokens within its reach (confine.wrap_agent)
            hosts = netproxy.allowlist(self.argv)
            if hosts is not None:  # its own network: only its model's API, through the harness's proxy
                (private / "net").mkdir()
                proxy = netproxy.Proxy(private / "net", hosts)
            argv = cap.wrap(confine.wrap_agent(argv, self.workdir, private=private,
                                               network=private / "net" if proxy else None))
        try:
            return self._run(argv, prompt, uses_placeholder)
        except AgentError as e:
            if proxy is not None and proxy.refused:  # a model API it may not reach: say which, and how
                raise AgentError(f"{e}\n(its network requests for {', '.join(sorted(set(proxy.refused))[:5])} were "
                                 f"refused: allow a host with {netproxy.ENV}=HOST)") from None
            raise
        finally:
            if proxy is not None:
                proxy.close()

    def _run(self, argv: list[str], prompt: str, uses_placeholder: bool) -> str:
        # git status (below) sees what is tracked or untracked; the guard also sees the ignored record (results.tsv,
        # the tag files), .git's config and hooks, and bytecode, which an agent has no business touching either
        watch = guard.Guard(self.workdir, exclude=[self.workdir / "train.py"])
        proc = subprocess.Popen(argv, cwd=self.workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.proc = proc
        output = Output(proc.stdout)
        try:
            threading.Thread(target=_give, args=(proc.stdin, "" if uses_placeholder else prompt), daemon=True).start()
            proc.wait(timeout=self.timeout)
            out = output.text()
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out = output.text() + f"\n[agent timed out after {self.timeout:.0f} s]"
        except BaseException:  # Ctrl-C, or the harness stopping: the agent and its children stop with it
            _kill_group(proc)
            raise
        finally:
            self.printed = output.tokens
        notes = []
        changed = git.changed_files(self.workdir)
        others = [p for p in changed if p != "train.py"]
        if others:
            git.restore(self.workdir, others)
            notes.append(f"also edited {', '.join(others[:5])}: reverted")
        # what git status cannot see (ignored record files, .git, bytecode); its own `git add` shows as the index
        hidden = [c for c in watch.changes() if c.rsplit(" (", 1)[0] not in changed and not c.startswith(".git/index ")]
        if hidden:
            lost = watch.restore()
            notes.append(f"changed {', '.join(hidden[:5])}: restored" + (f" except {', '.join(lost[:3])}"
                                                                          if lost else ""))
        if "train.py" not in changed:
            raise AgentError(f"the agent made no change to train.py (exit {proc.returncode}); its output ended: "
                             + (out or "")[-500:])
        found = re.findall(r"^\s*DESCRIPTION:\s*(.+)$", out or "", re.M)
        description = found[-1].strip() if found else "change by " + os.path.basename(self.argv[0])
        return descriptions.agent_noted(description, notes)

    def confined(self) -> bool:
        """Whether the agent runs in its sandbox: where bubblewrap works, on a tag whose protection is bubblewrap
        (one set up with --sandbox off asked for no enforcement, and is checked afterwards only). Where bubblewrap
        is expected (the tag says bwrap, or it worked on this machine before: sandbox.bwrap_record) and fails
        now, AgentError: the agent is refused, never run unconfined."""
        try:
            protection = json.loads(state.tag_file(self.repo, self.tag).read_text()).get("protection")
        except (OSError, ValueError, AttributeError):
            protection = None
        if protection == "none":
            return False
        if sandbox.bwrap_works():
            return True
        if protection == "bwrap" or sandbox.bwrap_expected() is not None:
            raise AgentError("the agent is not started: its confinement cannot be built, and it never runs "
                             f"unconfined where bubblewrap is expected (tag {self.tag}: protection "
                             f"{protection or 'unpinned'}). {sandbox.failure()}")
        return False

    def observe(self, outcome) -> None:
        self.last_outcome = outcome

    def stop(self) -> None:
        """End the agent's process group if it is still thinking (a parallel loop stopping from another thread)."""
        if self.proc is not None and self.proc.poll() is None:
            _kill_group(self.proc)


def proposer_for(spec: str, repo: Path, tag: str, timeout: float, workdir: Path | None = None) -> proposer.Proposer:
    """The proposer `--agent spec` names: a built-in one (proposer.BUILTINS), else an external agent's command."""
    if spec not in proposer.BUILTINS:
        return ExternalAgent(repo, tag, spec, timeout, workdir)
    import prepare

    from autoresearch import researcher
    manifest = prepare.require_manifest()
    kind = {"builtin": researcher.Researcher, "random": researcher.RandomSearch, "tpe": proposer.TPEProposer}[spec]
    return kind(repo, tag, manifest["profile"], manifest["max_seq_len"])


class WorkerProposers:
    """The proposers of a parallel loop (driver.py): the built-in one, shared and told what is in flight, or one
    external agent per worker, each editing its own working copy beside the workers' copies, so that agents think
    side by side. propose() runs in a thread of the driver."""

    def __init__(self, repo: Path, tag: str, spec: str, timeout: float):
        self.repo, self.tag, self.spec, self.timeout = repo, tag, spec, timeout
        self.agents: dict[str, ExternalAgent] = {}
        self.builtin = None
        if spec in proposer.BUILTINS:
            self.builtin = proposer_for(spec, repo, tag, timeout)

    def propose(self, name: str, head: str, running_sources: list[str], in_flight: list[str]) -> tuple[str, str]:
        """(train.py, description) of a new candidate off `head` for worker `name`."""
        if self.builtin is not None:
            return self.builtin.propose_source(git.git(self.repo, "show", f"{head}:train.py", strip=False),
                                               running_sources, in_flight)
        agent = self.agents.get(name)
        if agent is None:
            from autoresearch.worker import workers_dir
            workdir = workers_dir(self.tag, self.repo) / f"agent-{name}"
            if not (workdir / ".git").exists():
                workdir.parent.mkdir(parents=True, exist_ok=True)
                git.git(self.repo, "clone", "-q", "--shared", "--no-checkout", str(self.repo), str(workdir))
            agent = self.agents[name] = ExternalAgent(self.repo, self.tag, self.spec, self.timeout, workdir,
                                                      kind="parallel-turn")
        git.git(agent.workdir, "checkout", "-q", "-f", "--detach", head)
        git.git(agent.workdir, "clean", "-q", "-f", "-d")
        description = agent.propose(proposer.Ask(in_flight=tuple(in_flight)))
        return (agent.workdir / "train.py").read_text(errors="replace"), description

    def session(self, name: str) -> Path | None:
        """The record of the tokens of worker `name`'s agent's last proposal (tokens.py), if an external one."""
        return self.agents[name].session if name in self.agents else None

    def observe(self, name: str, outcome) -> None:
        if name in self.agents:
            self.agents[name].observe(outcome)

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()
