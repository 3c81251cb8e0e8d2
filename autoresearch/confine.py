"""Every agent's confinement: the loop's agent (`loop --agent`) and one a user starts by hand (`autoresearch
agent`), in one bubblewrap profile (wrap_agent): an empty root that shows only what an agent needs, read-only
(the system, Python, its own program), a network of its own reaching only its model's API (netproxy.py), a
private home holding only its own settings and
credentials, train.py writable, and of the data cache the training files only (docs/integrity.md, the threat
model). Also which paths a user may open to an agent (allow_problem, allow) and the registry of prepared caches
that every agent's view hides (record_cache)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from autoresearch import heldout, netproxy
from autoresearch.sandbox import (CONFINED, PROC_READ_ONLY, bwrap_record, in_system, python_dirs, system_binds,
                                  training_files)


# What of your home an agent sees, read-only, in a home of its own (a tmpfs, gone when it ends): its settings,
# instructions and install. Nothing else of yours: a path made under your home after the agent started (~/.ray
# with Ray's token at a machine's first `loop --workers N`, Jupyter's runtime files) was visible inside while the
# agent saw the host's `/` with masks fixed at its start.
AGENT_CONFIG = (".claude", ".codex", ".aider", ".aider.conf.yml")
# What agents keep writable beside train.py: their credentials and prompt history, nothing they run, source or
# obey. Their state directories are otherwise read-only: a SessionStart hook written into ~/.claude/settings.json
# from inside (created where none existed) copied the held-out files out when the user next started Claude Code
# outside the sandbox; ~/.claude also holds its statusLine scripts and its own install (~/.claude/local).
AGENT_DATA = (".claude/.credentials.json", ".claude/history.jsonl", ".codex/auth.json", ".codex/history.jsonl")
# What they write during a session and may keep only for it (an empty private directory each time): Claude Code
# sources its shell snapshots before every command and loads a project's memory/MEMORY.md into every session, so
# written from inside, either ran or instructed the agent started later outside
AGENT_SCRATCH = (".claude/projects", ".claude/todos", ".claude/shell-snapshots", ".claude/session-env",
                 ".claude/statsig", ".claude/ide", ".claude/file-history", ".claude/debug", ".claude/plans",
                 ".codex/sessions", ".codex/log")
# Of those, where Claude Code and Codex record a session's tokens: given a private directory (wrap_agent), they are
# written into it, outside the sandbox, so that the harness reads the tokens when the session ends (tokens.py)
TOKEN_SCRATCH = (".claude/projects", ".codex/sessions")
PRIVATE_STATE = (".claude.json",)
# Hidden wherever a directory the agent sees holds them (a Python installation under home, say), besides the
# caches: services on localhost whose tokens live under home run code on request (Jupyter's runtime files), and
# Ray's token
HIDDEN_HOME = (".npm", ".ray", ".local/share/jupyter/runtime")
REGISTRY = "autoresearch-caches.json"  # in ~/.cache: every data cache the harness prepared (data.py), all hidden
BROKER_DIR = "/tmp/autoresearch-broker"  # inside an agent's sandbox: the broker's socket (broker.py)


def wrap_agent(argv: list[str], workdir: Path, writable: list[Path] = (), broker: Path | None = None,
               private: Path | None = None, network: Path | None = None) -> list[str]:
    """The one confinement of every agent: the loop's (`loop --agent`) and one a user starts by hand
    (`autoresearch agent`). An empty root showing, read-only: the system's directories, the Python installation,
    the harness's code (so that `autoresearch` runs inside), the agent's program where it is installed outside
    the system (py), the files `argv` names, `workdir`, and of the data cache the manifest, the
    tokenizer and the training files (no validation or test tokens, no downloads, no other prepared cache). Its
    home is a private tmpfs at your home's path holding only AGENT_CONFIG (read-only), its credentials and history
    (AGENT_DATA, writable), its session's scratch (AGENT_SCRATCH) and a copy of PRIVATE_STATE; its /tmp is
    private. Writable besides: `workdir`'s train.py and `writable` (`--allow`'s new directories). The network is
    the host's (its model's API). Its own process namespace and /proc (no /proc/PID/root or fd/ of the
    harness's), no capability, a new session (no TIOCSTI into the user's terminal), no host socket under /run.
    `broker`: the directory of the broker's socket (broker.py), bound at BROKER_DIR. `private`: a directory of
    the caller's for the session's copies of PRIVATE_STATE and its TOKEN_SCRATCH (scratch_home), which the
    caller reads for its tokens (tokens.py) and removes. `network`: the directory of the harness's proxy socket
    (netproxy.Proxy): the agent then has a network namespace of its own, reaching only what the proxy allows,
    through netproxy.py's relay (None: the host's network, asked for by the user). The data cache is this process's
    (runtime.cache_dir()), prepared (runtime.require_manifest() says how, if not)."""
    import runtime  # not prepare: prepare's entry point imports the harness (autoresearch.data)
    cache, manifest, home = runtime.cache_dir().resolve(), runtime.require_manifest(), Path.home()
    args = _empty_root(home)
    shown, binds = _shown(argv, home)
    args += binds
    hidden = _hidden(cache, manifest, home)
    trees = shown + [Path(d) for d in ("/usr", "/etc", "/opt/conda") if os.path.isdir(d)]
    args += mask([p for p in hidden if any(p.is_relative_to(t.resolve()) for t in trees)])
    args += ["--unsetenv", "RAY_AUTH_TOKEN", "--unsetenv", "RAY_AUTH_TOKEN_PATH"]
    # after the masks (a parallel loop's agent works under the caches), and masked itself where it holds one (a
    # cache in the repository)
    args += ["--ro-bind", str(workdir.resolve()), str(workdir)]
    args += mask([p for p in hidden if p.is_relative_to(workdir.resolve()) and p != workdir.resolve()])
    for name in ("manifest.json", "tokenizer.json"):
        args += ["--ro-bind", str(cache / name), str(cache / name)]
    for rel in training_files(manifest):
        args += ["--ro-bind", str((cache / rel).resolve()), str(cache / rel)]
    args += _writable(home, private, writable)
    args += ["--bind", str((workdir / "train.py").resolve()), str(workdir / "train.py")]
    if broker is not None:
        args += ["--ro-bind", str(broker), BROKER_DIR]  # a socket connects through a read-only bind
    if network is not None:  # its own namespace: loopback only; the relay inside hands connections to the proxy
        proxy = f"http://127.0.0.1:{netproxy.RELAY_PORT}"
        args += ["--unshare-net", "--ro-bind", str(network), netproxy.NET_DIR]  # nothing written there
        for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
            args += ["--setenv", name, proxy]
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            args += ["--unsetenv", name]
        argv = [sys.executable, "-I", str(Path(netproxy.__file__)),
                f"{netproxy.NET_DIR}/{netproxy.SOCKET_NAME}", str(netproxy.RELAY_PORT), "--", *argv]
    return args + ["--remount-ro", "/", "--chdir", str(workdir), "--", *argv]


def _empty_root(home: Path) -> list[str]:
    """bubblewrap's start: no capability, its own session, process and IPC namespaces, /dev, /proc (a few of
    its entries read-only), the system's directories, private /tmp and /run (the host's sockets there hidden,
    DNS's stub kept), and a tmpfs at your home's path."""
    args = ["bwrap", *CONFINED, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
            "--dev", "/dev", "--proc", "/proc"]
    for entry in PROC_READ_ONLY:
        args += ["--ro-bind-try", f"/proc/{entry}", f"/proc/{entry}"]
    # the host's sockets under /run (a user's systemd bus, docker, screen, ssh-agent run commands outside as you)
    # hidden, DNS's stub kept
    args += system_binds() + ["--tmpfs", "/tmp", "--tmpfs", "/run"]
    for keep in ("/run/systemd/resolve",):
        if os.path.isdir(keep):
            args += ["--ro-bind", keep, keep]
    if home != Path("/"):
        args += ["--tmpfs", str(home)]
    return args


def _shown(argv: list[str], home: Path) -> tuple[list[Path], list[str]]:
    """The read-only trees (parents first: what a parent shows is not bound again): Python, the harness, the
    agent's program and what its first line runs, the files the command names (a script), its settings; and
    the binds that show them, with the agent's command made again where PATH finds it."""
    harness = Path(__file__).resolve().parent.parent
    installs, entries = needed(argv[0]) if argv else ([], [])
    named = [Path(a) for a in argv[1:] if a.startswith("/") and os.path.isfile(a)]
    config = [home / rel for rel in AGENT_CONFIG if (home / rel).exists()]
    shown: list[Path] = []
    args: list[str] = []
    for d in sorted({*python_dirs(), harness, *installs, *named, *config}, key=lambda d: len(d.parts)):
        # never one that holds your home (a PYTHONPATH of ~): the agent would see all of it
        if in_system(d) or any(d.is_relative_to(p) for p in shown) or home.resolve().is_relative_to(d.resolve()):
            continue
        args += ["--ro-bind", str(d.resolve()), str(d)]
        shown.append(d)
    for path, real in entries:  # ~/.local/bin/claude, the name PATH finds, made again: a link to its file
        # not where the system's directories show it already (/bin/sh through merged /usr's /bin -> usr/bin)
        if not any(path.is_relative_to(parent) for parent in shown) and not in_system(path.parent.resolve()):
            args += ["--symlink", str(real), str(path)]
    return shown, args


def _hidden(cache: Path, manifest: dict, home: Path) -> list[Path]:
    """What a tree shown holds and an agent may not see: every prepared cache (a second profile's beside the
    default one), the compile caches, the tags' secret draws (made first if missing: one made later in a tree
    shown would be visible), the local corpus and npm's cache (gutenberg's raw books), Ray's token."""
    for prepared in {cache, *prepared_caches()}:
        heldout.secrets_dir(prepared).mkdir(mode=0o700, parents=True, exist_ok=True)
    hidden = {cache, *cache.parent.glob(cache.name + "*"), *(home / ".cache").glob("autoresearch*"),
              *(home / rel for rel in HIDDEN_HOME)}
    for other in prepared_caches():  # a second profile's cache elsewhere, its secrets beside it
        hidden |= {other, *other.parent.glob(other.name + "*")}
    source, ray = manifest.get("source", {}).get("path"), os.environ.get("RAY_AUTH_TOKEN_PATH")
    hidden |= {Path(p) for p in (source, ray) if p}
    return sorted({p.resolve() for p in hidden if p.exists()})


def _writable(home: Path, private: Path | None, writable) -> list[str]:
    """The agent's writable places in its home: its session's scratch (the token files kept for the harness,
    tokens.py), its credentials and history, `--allow`'s new directories, a copy of PRIVATE_STATE."""
    args: list[str] = []
    for rel in AGENT_SCRATCH:
        # kept for the harness where the agent can make it: it exists, or its parent is in the home's tmpfs
        if private is not None and rel in TOKEN_SCRATCH and ((home / rel).is_dir()
                                                              or not (home / rel).parent.exists()):
            kept = scratch_home(private) / rel
            kept.mkdir(mode=0o700, parents=True, exist_ok=True)
            args += ["--bind", str(kept), str(home / rel)]
        elif (home / rel).is_dir():
            args += ["--tmpfs", str(home / rel)]
    for path in [home / rel for rel in AGENT_DATA] + [Path(w) for w in writable]:
        if path.exists():
            args += ["--bind", str(path.resolve()), str(path)]
    for rel in PRIVATE_STATE:
        if (home / rel).is_file() and private is not None:
            copy = private / rel.lstrip(".")
            shutil.copyfile(home / rel, copy)
            args += ["--bind", str(copy), str(home / rel)]
    return args


def scratch_home(private: Path) -> Path:
    """Where a session given the private directory `private` (wrap_agent) leaves its TOKEN_SCRATCH, as under a
    home: the harness reads its tokens there (tokens.usage) before removing it."""
    return private / "home"


def mask(paths: list[Path]) -> list[str]:
    """bwrap's arguments that hide `paths` where a directory shown holds them: an empty tmpfs, /dev/null."""
    return [a for p in paths for a in (("--tmpfs", str(p)) if p.is_dir() else ("--ro-bind", "/dev/null", str(p)))]


# The system's programs, libraries and start-up files (cron.d, profile.d)
SYSTEM_WRITE_GUARDED = ("/etc", "/usr", "/opt", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/var/spool")
CREATE = "choose a path that does not exist; the harness creates it empty and binds it writable"


def allow_problem(path: Path, repo: Path, cache: Path) -> str | None:
    """Why `path` may not be opened to an agent (`autoresearch agent --allow`), or None. Only a new directory
    is: one that does not exist yet (an existing one may hold what a program loads at start: `--allow ~/.aider`
    let an agent write git settings aider loads, and git's fsmonitor then ran its payload outside any sandbox).
    Nor may it lie in a hidden directory of your home (~/.config, ~/.aider, ...: where programs keep what they
    load, made or not), be or lie inside the repository (its .git: a core.fsmonitor ran outside at the broker's
    next git call), a prepared or compile cache, the secrets, the Python installation, a directory on PATH or of
    the system (a `git` planted in one ran at the broker's next call), or Hugging Face's cache (every training
    mounts it); links resolved."""
    given, home = Path(os.path.abspath(os.path.expanduser(path))), Path.home().resolve()
    if os.path.lexists(given):
        return f"--allow {given}: it exists; {CREATE}"
    path = given.resolve()
    guarded = [repo.resolve(), *cache.resolve().parent.glob(cache.resolve().name + "*"),
               *(home / ".cache").glob("autoresearch*"), *prepared_caches(), *python_dirs(),
               *map(Path, SYSTEM_WRITE_GUARDED),
               *(Path(d) for d in os.environ.get("PATH", "").split(os.pathsep) if d),  # a `git` planted there
               Path(os.environ.get("HF_HOME") or home / ".cache" / "huggingface"),  # mounted into every training
               bwrap_record().parent]  # the record that bubblewrap worked here (sandbox.protection fails closed)
    dotted = [e for e in home.iterdir() if e.name.startswith(".")] if home.is_dir() else []
    guarded += [g.resolve() for g in guarded + dotted]  # a dotfile that is a link (a dotfile manager's)
    for g in guarded:
        if path == g or path.is_relative_to(g) or g.is_relative_to(path):
            return f"--allow {given}: it is, holds or lies inside {g}, which an agent may not write; {CREATE}"
    for p in (given, path):
        if p.is_relative_to(home) and p != home and p.relative_to(home).parts[0].startswith("."):
            return (f"--allow {given}: it lies in {home / p.relative_to(home).parts[0]}, a hidden directory of your "
                    f"home, where programs keep what they load at start; {CREATE}, outside those")
    return None


def allow(path: Path) -> Path:
    """Create `path` (allow_problem said None), empty and yours, with its parents: what `--allow` binds writable."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    path.mkdir(mode=0o700, parents=True)  # exists by now (a race): FileExistsError, never bound
    return path


def registry() -> Path:
    return Path.home() / ".cache" / REGISTRY


def prepared_caches() -> list[Path]:
    """Every data cache the harness prepared on this machine (data.py records each), as directories."""
    try:
        return [Path(p) for p in json.loads(registry().read_text()) if Path(p).is_dir()]
    except (OSError, ValueError, TypeError):
        return []


def record_cache(cache: Path) -> None:
    """Note a prepared cache, so that every agent's sandbox hides it (and its secrets) wherever it lives."""
    known = {str(p) for p in prepared_caches()} | {str(cache.resolve())}
    registry().parent.mkdir(parents=True, exist_ok=True)
    tmp = registry().with_suffix(f".{os.getpid()}.tmp")  # two prepares at once: the last write wins, whole
    tmp.write_text(json.dumps(sorted(known), indent=1))
    os.replace(tmp, registry())


# --- where an agent's program lives -------------------------------------------------------------------------------
# Where a command's program lives, for an agent's empty root (confine.wrap_agent), which shows the system's
# directories and nothing of home: the directory an agent is installed in outside them (Claude Code under
# ~/.local, a pipx venv, node under nvm) and the interpreter its first line names, read-only.
# 
# An install's directory: a script's nearest package (package.json) or venv (pyvenv.cfg), a program's prefix (the
# directory above its bin/), else the file's directory. Never home itself or a directory right in it (~/.local
# holds keyrings and every program's data) but a conda or a version manager's root: there, the next narrower.

MARKERS = ("package.json", "pyvenv.cfg")
DEPTH = 3  # a script's interpreter's interpreter, at most


def needed(command: str) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """What running `command` (a name on PATH, or a path) needs outside the system's directories: the
    directories to show read-only, and the paths it is named by, each with the file it leads to (a link on PATH,
    ~/.local/bin/claude, made again inside)."""
    dirs: list[Path] = []
    entries: list[tuple[Path, Path]] = []
    _add(command, dirs, entries, DEPTH)
    return dirs, entries


def _add(command: str, dirs: list, entries: list, depth: int) -> None:
    found = shutil.which(command)
    if depth == 0 or found is None:
        return
    named = Path(os.path.abspath(found))
    real = named.resolve()
    if not in_system(real):
        dirs.append(install_dir(real))
    if not in_system(named):
        entries.append((named, real))
    interpreter = shebang(real)
    if interpreter:
        _add(interpreter, dirs, entries, depth - 1)


def install_dir(real: Path) -> Path:
    """The directory `real` (a resolved file) is installed in, or the file alone: the first that may be shown of
    its script's package or venv, its prefix (above bin/ or a version manager's shims/), its directory."""
    home = Path.home().resolve()
    candidates = []
    if shebang(real) is not None:  # a script: its package or venv
        candidates += [p for p in real.parents
                       if not home.is_relative_to(p) and any((p / m).is_file() for m in MARKERS)][:1]
    if real.parent.name in ("bin", "shims"):  # python's lib/, node's lib/node_modules, pyenv's versions
        candidates.append(real.parent.parent)
    return next((d for d in candidates + [real.parent] if may_show(d, home)), real)


def may_show(directory: Path, home: Path) -> bool:
    """Not home nor a directory right in it (~/.local holds keyrings, ~/.cargo a registry token), but a
    conda's or a version manager's root (pyenv's, rbenv's: libexec/ and versions/)."""
    if directory == home or home.is_relative_to(directory):
        return False
    if directory.parent != home:
        return True
    return (directory / "conda-meta").is_dir() or all((directory / d).is_dir() for d in ("libexec", "versions"))


def shebang(path: Path) -> str | None:
    """The program a script's first line runs (`#!/usr/bin/env node`: node), or None (a binary, unreadable)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return words[0] if words else None
