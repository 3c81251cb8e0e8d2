"""`autoresearch agent`: any agent a user starts by hand (Claude Code, Codex, aider, a shell), confined the way
the loop's agent is (confine.wrap_agent), with the harness's commands still working from inside.

The agent cannot run an experiment itself: it sees no validation or test rows, and the harness's state, code and
repository are read-only to it. So the harness keeps a broker outside the sandbox, a Unix socket in a private
directory bound into it (confine.BROKER_DIR). Inside, `autoresearch run/wait/status/best/...` finds BROKER_ENV
and sends its arguments there (forward); outside, the broker checks them against BROKERED and runs the command as
the user's own harness process in the repository, under the harness's training sandbox, and streams its output
back. What the agent controls is train.py's text and the arguments of those commands, nothing the harness
executes: no `--sandbox off`, no tag without bubblewrap, no path the harness would write. While any command
trains in the repository, the agent's whole sandbox is paused (pause.py), so nothing it runs shares the machine
with a run it is judged by. When it ends, its train.py (untrusted code) is put back to the committed one and
kept under the state directory (untrusted.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from autoresearch import agentcgroup, confine, errors, netproxy, pause, sandbox, state, tokens, untrusted

BROKER_ENV = "AUTORESEARCH_BROKER"   # inside an agent's confinement: the broker's socket
SOCKET_NAME = "harness.sock"
# the commands an agent drives the harness with, and the options it may give each; `setup` always gets
# `--sandbox on`, and `run` needs a tag whose protection is bubblewrap
BROKERED = {
    "setup": {"tag", "decision", "timeout", "sandbox"},
    "run": {"message", "decision", "timeout", "sandbox", "detach"},  # never --seed: an agent that saw every run's
    # seed and val_bpb (status --json) would start a candidate on seeds that were lucky for others
    "wait": {"timeout"},
    "status": {"json"},
    "best": set(),
    "stop": set(),
    "ideas": {"apply"},
    "sample": {"prompt", "tokens", "temperature", "seed", "run_id"},
    "report": {"tag", "json"},
}


# brokered commands that compute (`sample` runs the model, `report` draws): each holds the repository's lock, so
# none runs beside a run, which the agent could otherwise start just before its own `autoresearch run` (pause.py)
LOCKED = ("sample", "report", "best", "ideas")


class BrokerError(errors.HarnessError):
    pass


def check(argv: list[str], repo: Path, parser: argparse.ArgumentParser) -> list[str]:
    """The command line the broker runs for an agent's `argv`, or BrokerError saying what it may ask. The line is
    rebuilt from what the harness's own parser made of `argv` (every option by its full name, `--name=value`):
    an abbreviation, a value that looks like an option or a repeated option means to the harness exactly what
    was checked."""
    from autoresearch import git, state, tags
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            args, rest = parser.parse_known_args(argv)
    except SystemExit:
        raise BrokerError(f"`autoresearch {' '.join(argv)}`: {said.getvalue().strip().splitlines()[-1:]}") from None
    allowed = BROKERED.get(args.command)
    if allowed is None:
        raise BrokerError(f"`autoresearch {args.command}` does not run inside `autoresearch agent`; the agent may "
                          f"use {', '.join(BROKERED)}. The user runs the others outside the confinement.")
    actions = [a for a in parser._subparsers._group_actions[0].choices[args.command]._actions
               if a.dest != "help"]
    given = {a.dest: getattr(args, a.dest) for a in actions if getattr(args, a.dest) != a.default}
    extra = sorted(set(given) - allowed)
    if rest or extra:
        raise BrokerError(f"`autoresearch {args.command}` inside `autoresearch agent` takes only "
                          f"{', '.join('--' + a.replace('_', '-') for a in sorted(allowed)) or 'no options'}"
                          f" (not {' '.join(rest) or ', '.join(extra)}).")
    if args.command in ("setup", "run") and getattr(args, "sandbox", None) not in (None, "auto", "on"):
        raise BrokerError("an agent's experiments always run under bubblewrap: leave out --sandbox (or say on).")
    if args.command == "setup":
        if git.branch(repo).startswith(state.BRANCH_PREFIX):  # its base would be a commit the agent made
            raise BrokerError("an agent sets up a tag from the user's branch, not from an experiment branch: what a "
                              "train.py may carry is counted from its tag's base (heldout.py). Ask the user to "
                              "check out their branch, or continue this tag.")
        given["sandbox"] = "on"
    if args.command == "run":
        protection = tags.load_tag(repo).protection
        if protection != "bwrap":
            raise BrokerError(f"this tag's runs have protection {protection!r}: an agent in `autoresearch agent` "
                              "runs experiments only on a tag set up under bubblewrap (`autoresearch setup --tag "
                              "NEW` from inside does that).")
    line = [args.command]
    for action in actions:
        if action.dest not in given:
            continue
        name, value = max(action.option_strings, key=len), given[action.dest]
        if action.nargs == 0:  # a flag
            line.append(name)
        else:
            # a list's values never start with "-": the parser would have taken them for options
            line += [name, *value] if isinstance(value, list) else [f"{name}={value}"]
    return line


# What the agent can make the harness hold outside its memory limit (agentcgroup.py), bounded: a red team held 201 MiB
# in the broker with one request that never ended its line, and 302 MiB with 8 `wait`s (a harness process each)
MAX_REQUEST = 64 << 10  # bytes of one request line: an argv of the CLI's is far shorter
MAX_COMMANDS = 4        # commands in flight at once (an agent runs one, with a `wait` or `status` beside it)


class Broker:
    """The broker of one `autoresearch agent`: serve() in a thread, close() at the end. Every request is a JSON
    line {"argv": [...]}; the answer is JSON lines {"out": text} and a last {"rc": exit status}."""

    def __init__(self, repo: Path, parser: argparse.ArgumentParser):
        self.repo, self.parser = repo, parser
        self.dir = Path(tempfile.mkdtemp(prefix="autoresearch-broker-"))  # 0700: the user's (and the sandbox's)
        (self.dir / "socket").mkdir()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.dir / "socket" / SOCKET_NAME))
        self.sock.listen(8)
        self.ready = threading.Event()  # set once the agent's sandbox is registered (start)
        self.slots = threading.BoundedSemaphore(MAX_COMMANDS)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            if not self.slots.acquire(blocking=False):
                with conn, contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"out": f"error: the broker runs at most {MAX_COMMANDS} commands at once; "
                                                    "wait for one to end\n"}).encode() + b"\n"
                                 + json.dumps({"rc": 2}).encode() + b"\n")
                continue
            threading.Thread(target=self._answer_in_slot, args=(conn,), daemon=True).start()

    def _answer_in_slot(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        except OSError:  # the agent hung up
            pass
        finally:
            self.slots.release()

    def _answer(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            def send(obj) -> None:
                try:
                    stream.write(json.dumps(obj).encode() + b"\n")
                    stream.flush()
                except OSError:  # the agent stopped listening (its tool timed out): the command goes on
                    pass
            try:
                line = stream.readline(MAX_REQUEST + 1)
                if len(line) > MAX_REQUEST:
                    raise BrokerError(f"a request is one JSON line of at most {MAX_REQUEST} bytes")
                request = json.loads(line or b"{}")
                argv = request.get("argv")
                if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                    raise BrokerError("a request is one JSON line {\"argv\": [strings]}")
                command = check(argv, self.repo, self.parser)
            except (BrokerError, errors.HarnessError, ValueError) as e:
                send({"out": f"error: {e}\n"})
                send({"rc": 2})
                return
            # git's and Python's per-user start-up files are not read: an agent that could write one (an --allow
            # too wide) would run code here, outside its sandbox
            env = {k: v for k, v in os.environ.items() if k != BROKER_ENV} | {
                "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "PYTHONNOUSERSITE": "1"}
            self.ready.wait()  # the agent's sandbox is registered, so a run pauses it (pause.py)
            try:
                held = state.RepoLock(state.state_dir(self.repo), f"autoresearch {command[0]} (for the agent)") \
                    if command[0] in LOCKED else contextlib.nullcontext()
                with held:
                    self._run(command, env, send)
            except state.LockHeld as e:
                send({"out": f"error: {e}\n"})
                send({"rc": 1})

    def _run(self, command: list[str], env: dict, send) -> None:
        proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", *command], cwd=self.repo, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        # read apart from the sending: the agent is paused while a run trains and reads nothing, and a full socket
        # must not stop the run at its next line of output
        chunks: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [chunks.put(c) for c in iter(lambda: proc.stdout.read1(4096), b"")]
                         + [chunks.put(None)], daemon=True).start()
        for chunk in iter(chunks.get, None):
            send({"out": chunk.decode(errors="replace")})
        send({"rc": proc.wait()})

    def close(self) -> None:
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def forward(argv: list[str]) -> int:
    """Inside the confinement: send `autoresearch argv` to the broker, print what it answers, return its status."""
    path = os.environ[BROKER_ENV]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(path)
        except OSError as e:
            print(f"error: the harness's broker at {path} does not answer ({e}); `autoresearch agent` that started "
                  "this shell has ended. Start the agent again.", file=sys.stderr)
            return 2
        stream = conn.makefile("rwb")
        stream.write(json.dumps({"argv": argv}).encode() + b"\n")
        stream.flush()
        for line in stream:
            message = json.loads(line)
            if "rc" in message:
                return int(message["rc"])
            sys.stdout.write(message.get("out", ""))
            sys.stdout.flush()
    print("error: the broker closed the connection without an exit status", file=sys.stderr)
    return 1


def checked(repo: Path, command: list[str], writable: list[str]) -> tuple[list[str], list[Path]]:
    """The agent's command (default: the user's shell) and `--allow`'s directories, made, once everything it
    needs is there: bubblewrap (never unconfined), prepared data, the program, only new directories."""
    import prepare
    if not sandbox.bwrap_works():  # never unconfined
        raise errors.HarnessError("`autoresearch agent` confines the agent with bubblewrap, which is missing or "
                                  f"cannot create namespaces here: {sandbox.failure()}. "
                                  + ("" if sandbox.bwrap_expected() else
                                     "Without it, `autoresearch loop --agent NAME` on a tag set up without it still "
                                     "runs an agent, checked afterwards instead of confined (docs/integrity.md)."))
    prepare.require_manifest()  # not prepared: say how before anything starts
    command = command or [os.environ.get("SHELL") or "bash"]
    if shutil.which(command[0]) is None:
        raise errors.HarnessError(f"`{command[0]}` is not on PATH; give the agent's full path.")
    for w in writable:  # only new directories, made here (confine.allow_problem)
        problem = confine.allow_problem(Path(w), repo, prepare.cache_dir())
        if problem:
            raise errors.HarnessError(problem)
    return command, [confine.allow(Path(w)) for w in writable]


def start(repo: Path, command: list[str], writable: list[str], parser: argparse.ArgumentParser) -> int:
    """`autoresearch agent`: run `command` (default: the user's shell) confined, with a broker checking what it
    asks with `parser` (the CLI's); its exit status."""
    command, allowed = checked(repo, command, writable)
    cap = agentcgroup.Cap("broker")  # what it holds while paused is bounded (agentcgroup.py)
    frozen = agentcgroup.Freezer("broker", v2=cap.prefix[:1] != ["systemd-run"])  # a pause it cannot undo (pause.py)
    broker = Broker(repo, parser)
    stack, hosts, proxy = contextlib.ExitStack(), None, None
    try:
        private = broker.dir / "state"
        private.mkdir()
        hosts = netproxy.allowlist(command)
        if hosts is not None:  # its own network: only its model's API, through the harness's proxy (netproxy.py)
            (broker.dir / "net").mkdir()
            proxy = netproxy.Proxy(broker.dir / "net", hosts)
            stack.callback(proxy.close)
        argv = confine.wrap_agent(command, repo, allowed, broker=broker.dir / "socket", private=private,
                                  network=broker.dir / "net" if hosts is not None else None)
        net = proxy.describe() if hosts is not None else f"the host's network ({netproxy.ENV}=*)"
        inside = f"{confine.BROKER_DIR}/{SOCKET_NAME}"
        argv[argv.index("--"):argv.index("--")] = ["--setenv", BROKER_ENV, inside]
        print(f"autoresearch agent: {' '.join(command)} confined (docs/integrity.md): it sees the system, Python, "
              f"its program and the repository read-only, and a private home with only its settings and "
              f"credentials of yours; writable are train.py, its credentials"
              f"{''.join(', ' + str(w) + ' (new, empty)' for w in allowed)}, its home and /tmp (both gone when it "
              f"ends); no validation or test rows; {net}; {cap.how}; {frozen.how}. Inside, "
              f"`autoresearch {'/'.join(BROKERED)}` work as outside.", file=sys.stderr)
        began = state.now()
        sandbox_proc = subprocess.Popen(cap.wrap(frozen.wrap(argv)))
        entry = pause.register(repo, sandbox_proc.pid, frozen.dir)
        watchdog = pause.Watchdog(repo)
        broker.ready.set()
        try:
            rc = sandbox_proc.wait()
            if rc and cap.reached():
                print(f"autoresearch agent: the agent reached its memory limit ({cap.how}); give it more with "
                      f"{agentcgroup.ENV}=8G (or `none`) if it needs it", file=sys.stderr)
            return rc
        finally:
            if sandbox_proc.poll() is None:  # interrupted: the agent ends before its train.py is put back
                sandbox_proc.kill()
                sandbox_proc.wait()
            watchdog.close()
            entry.unlink(missing_ok=True)
            untrusted.put_back(repo)  # its train.py is untrusted code: the committed one goes back (untrusted.py)
            # what the session cost, from the session files it left in its private scratch (gone at close())
            tokens.record(repo, "session", " ".join(command)[:200], began, confine.scratch_home(private))
    finally:
        stack.close()
        if proxy is not None and proxy.refused:
            print(f"autoresearch agent: refused the agent's network requests for "
                  f"{', '.join(sorted(set(proxy.refused))[:5])}; allow a host with {netproxy.ENV}=HOST",
                  file=sys.stderr)
        broker.close()
        frozen.close()
        cap.close()
