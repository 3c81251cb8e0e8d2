"""Every agent's confinement: the loop's agent (`loop --agent`) and one a user starts by hand (`autoresearch
agent`), in one bubblewrap profile (wrap_agent): the machine read-only with the network, train.py writable, every
data cache the harness prepared hidden but its training files (docs/integrity.md, the threat model). Also which
paths a user may open to an agent (allow_problem) and the registry of prepared caches that every agent's view
hides (record_cache)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from autoresearch import heldout
from autoresearch.sandbox import CONFINED, PROC_READ_ONLY, bwrap_record, python_dirs, training_files

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
                 ".codex/sessions", ".codex/log", ".local/state/claude", ".cache/claude", ".cache/codex")
PRIVATE_STATE = (".claude.json",)
# Hidden from agents besides the caches: services on localhost whose tokens live under home run code on request
# (Jupyter's runtime files), and Ray's token
HIDDEN_HOME = (".npm", ".ray", ".local/share/jupyter/runtime")
REGISTRY = "autoresearch-caches.json"  # in ~/.cache: every data cache the harness prepared (data.py), all hidden
BROKER_DIR = "/tmp/autoresearch-broker"  # inside an agent's sandbox: the broker's socket (broker.py)


def wrap_agent(argv: list[str], workdir: Path, writable: list[Path] = (), broker: Path | None = None,
               private: Path | None = None) -> list[str]:
    """The one confinement of every agent: the loop's (`loop --agent`) and one a user starts by hand
    (`autoresearch agent`). The machine read-only, with the network (its model's API) and the user's programs;
    writable only: `workdir`'s train.py, the agents' credentials and history (AGENT_DATA), their session's
    scratch (AGENT_SCRATCH: private, gone when it ends), `writable`,
    a private /tmp and
    ~/.npm. The data cache shows the manifest, the tokenizer and the training files only (no validation or test
    tokens, no downloads); every other prepared cache, the compile caches, the local corpus and npm's cache
    (gutenberg's raw books) are hidden. Its own process namespace and /proc (no other process, and
    so no /proc/PID/root or fd/ of the harness's), no capability, a new session (no TIOCSTI into the user's
    terminal), no host socket under /run. `broker`: the directory of the broker's socket (broker.py), bound at
    BROKER_DIR. `private`: a directory of the caller's for the session's copies of PRIVATE_STATE. The data
    cache is this process's (prepare.cache_dir()), prepared (prepare.require_manifest() says how, if not)."""
    import prepare
    cache, manifest, home = prepare.cache_dir().resolve(), prepare.require_manifest(), Path.home()
    args = ["bwrap", *CONFINED, "--ro-bind", "/", "/", "--die-with-parent", "--new-session", "--unshare-pid",
            "--unshare-ipc", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    # back where /tmp's tmpfs hid them: a venv or checkout there, the harness's own code (so that `autoresearch`
    # runs inside), and the files the command names (a script)
    named = [Path(a) for a in argv if a.startswith("/tmp/") and os.path.isfile(a)]
    harness = Path(__file__).resolve().parent.parent
    shown: list[Path] = []
    for d in sorted({d for d in python_dirs() + [workdir.resolve(), harness] + named if d.is_relative_to("/tmp")},
                    key=lambda d: len(d.parts)):  # parents first; what a parent shows is not bound again
        if not any(d.is_relative_to(parent) for parent in shown):
            args += ["--ro-bind", str(d), str(d)]
            shown.append(d)
    # every prepared cache (a second profile's AUTORESEARCH_CACHE beside the default one), the compile caches and
    # the tags' secret draws, made first if missing: a directory created later, under the read-only root, would
    # be visible (the first `setup`, run through the broker, creates the secrets' directory)
    for prepared in {cache, *prepared_caches()}:
        heldout.secrets_dir(prepared).mkdir(mode=0o700, parents=True, exist_ok=True)
    caches = {cache, *cache.parent.glob(cache.name + "*"), *(home / ".cache").glob("autoresearch*")}
    for other in prepared_caches():  # a second profile's cache elsewhere, its secrets beside it
        caches |= {other, *other.parent.glob(other.name + "*")}
    for other in sorted(c.resolve() for c in caches if c.is_dir()):
        args += ["--tmpfs", str(other)]
    args += ["--ro-bind", str(workdir.resolve()), str(workdir)]  # a parallel loop's agent works under the caches
    for entry in PROC_READ_ONLY:
        args += ["--ro-bind-try", f"/proc/{entry}", f"/proc/{entry}"]
    for name in ("manifest.json", "tokenizer.json"):
        args += ["--ro-bind", str(cache / name), str(cache / name)]
    for rel in training_files(manifest):
        args += ["--ro-bind", str((cache / rel).resolve()), str(cache / rel)]
    source = manifest.get("source", {}).get("path")
    # the local corpus and npm's cache (gutenberg's raw books); Ray's token (~/.ray/auth_token, 0644): a parallel
    # loop's local runtime runs any task it is sent with it, outside every sandbox
    for hidden in (source, *(home / rel for rel in HIDDEN_HOME)):
        if hidden and Path(hidden).is_dir():
            args += ["--tmpfs", str(hidden)]
        elif hidden and Path(hidden).is_file():
            args += ["--ro-bind", "/dev/null", str(hidden)]
    args += ["--unsetenv", "RAY_AUTH_TOKEN", "--unsetenv", "RAY_AUTH_TOKEN_PATH"]
    for path in [home / rel for rel in AGENT_DATA] + [Path(w).resolve() for w in writable]:
        if path.exists():
            args += ["--bind", str(path), str(path)]
    for rel in AGENT_SCRATCH:
        if (home / rel).is_dir():
            args += ["--tmpfs", str(home / rel)]
    for rel in PRIVATE_STATE:
        if (home / rel).is_file() and private is not None:
            copy = private / rel.lstrip(".")
            shutil.copyfile(home / rel, copy)
            args += ["--bind", str(copy), str(home / rel)]
    # the host's sockets under /run (a user's systemd bus, docker, screen, ssh-agent run commands outside as you),
    # DNS's stub kept
    args += ["--tmpfs", "/run"]
    for keep in ("/run/systemd/resolve",):
        if os.path.isdir(keep):
            args += ["--ro-bind", keep, keep]
    if os.environ.get("RAY_AUTH_TOKEN_PATH") and os.path.isfile(os.environ["RAY_AUTH_TOKEN_PATH"]):
        args += ["--ro-bind", "/dev/null", os.environ["RAY_AUTH_TOKEN_PATH"]]
    args += ["--bind", str((workdir / "train.py").resolve()), str(workdir / "train.py")]
    if broker is not None:
        args += ["--bind", str(broker), BROKER_DIR]
    return args + ["--chdir", str(workdir), "--", *argv]


# The system's programs, libraries and start-up files (cron.d, profile.d)
SYSTEM_WRITE_GUARDED = ("/etc", "/usr", "/opt", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/var/spool")
# What your shell, git or Python read and run at their next start, outside any sandbox (a core.fsmonitor in
# ~/.config/git/config ran at the broker's next `git status`)
STARTUP_FILES = (".config", ".local", ".gitconfig", ".bashrc", ".bash_profile", ".profile", ".zshrc", ".zprofile",
                 ".ssh", ".pyenv", ".claude", ".codex", ".claude.json")


def allow_problem(path: Path, repo: Path, cache: Path) -> str | None:
    """Why `path` may not be writable in an agent's sandbox (`autoresearch agent --allow`), or None: it may not
    be, hold or lie inside the repository (its .git: a core.fsmonitor ran outside at the broker's next git
    call), a prepared or compile cache, the secrets, Ray's token, the Python installation, what runs at a shell's,
    git's or an agent's next start (STARTUP_FILES), a directory on PATH or of the system (a `git` planted in one
    ran at the broker's next call), Hugging Face's cache (every training mounts it), or be your home."""
    path, home = path.resolve(), Path.home().resolve()
    guarded = [repo.resolve(), *cache.resolve().parent.glob(cache.resolve().name + "*"),
               *(home / ".cache").glob("autoresearch*"), *prepared_caches(), *python_dirs(),
               *(home / rel for rel in HIDDEN_HOME + STARTUP_FILES), *map(Path, SYSTEM_WRITE_GUARDED),
               *(Path(d) for d in os.environ.get("PATH", "").split(os.pathsep) if d),  # a `git` planted there
               Path(os.environ.get("HF_HOME") or home / ".cache" / "huggingface"),  # mounted into every training
               bwrap_record().parent]  # the record that bubblewrap worked here (sandbox.protection fails closed)
    guarded += [g.resolve() for g in guarded]  # a dotfile that is a link (a dotfile manager's)
    for g in guarded:
        if path == g or path.is_relative_to(g) or g.is_relative_to(path):
            return f"--allow {path}: it is, holds or lies inside {g}, which an agent may not write"
    if home.is_relative_to(path):
        return f"--allow {path}: it holds your home directory; allow the agent's own directories only"
    return None


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
