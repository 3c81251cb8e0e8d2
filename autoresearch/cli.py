"""autoresearch: autonomous research on train.py under a fixed time budget.

  autoresearch prepare [...]            prepare data and tokenizer (same as `python prepare.py`)
  autoresearch setup --tag TAG          start an experiment branch autoresearch/TAG and results.tsv
  autoresearch run -m "what it tries"   one experiment: commit train.py, train, record, keep or discard
                                        (--detach: in the background, for agents; then `autoresearch wait`)
  autoresearch wait                     until the run in the background ends (at most --timeout s)
  autoresearch try                      train.py once in the training sandbox, scored; nothing recorded (never
                                        `python train.py`: an agent's train.py is untrusted code)
  autoresearch status                   best result, counts and the last rows of this tag
  autoresearch agent [COMMAND]          any agent (claude, codex, a shell) confined, the commands above working
  autoresearch loop [--agent NAME]      experiments one after another, proposed by an agent
  autoresearch loop --workers N         N experiments side by side on Ray workers (--ray-address: a cluster)
  autoresearch stop                     the loop stops after the experiment in flight (the dashboard's button)
  autoresearch verify                   the morning's check of the champion: what each keep contributes, and
                                        the gain at a longer budget (or --scale: a larger model); docs/verify.md
  autoresearch best                     the champion: mean +- sem, test_bpb, its diff, its exported model
  autoresearch sample                   text written by the champion's exported model
  autoresearch clean                    what can be deleted and how much (--yes deletes it)
  autoresearch ideas                    the idea catalog and what this tag tried (--apply NAME k=v: write one)
  autoresearch report                   progress.png and a text summary (--html FILE, --json)
  autoresearch dashboard                a live page in the browser: progress, the run in flight, every diff

exit status: 0 ok; 1 an experiment was refused or failed (or a loop stopped on an error); 2 a usage or
environment error (nothing ran; the message names the fix); 3 `wait`: still running; 130 interrupted.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

OK, FAILED, USAGE = 0, 1, 2


SANDBOX_HELP = ("run every training under bubblewrap: auto (where it works, default), on (required), off (no "
                "enforcement, detection only)")
DECISION_HELP = ("stat (default): the baseline runs 3 times, a candidate repeats with new seeds until P(better "
                 "than the champion's mean) >= 0.98 or it is rejected; control: the same, each repeat beside a run "
                 "of the tag's base train.py on its seed, and only those pairs decide (for a machine whose speed drifts); "
                 "naive: one run, kept when below the best single run (the public project's rule)")


def checked(name: str, kind, ok, what: str):
    """An argument type: `kind` of the text, if ok() says so; else a usage error naming what it must be (argparse
    names `name` for text that is not a number at all)."""
    def parse(text: str):
        value = kind(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text}: {what}")
        return value
    parse.__name__ = name
    return parse


# a seed of 4,000 digits reached the training whole (1.8 KB carried per run beside train.py's checked bytes); a NaN
# timeout never killed a run, -1 killed every one at once
seed = checked("seed", int, lambda v: 0 <= v < 2**31, f"a seed is between 0 and {2**31 - 1}")
seconds = checked("seconds", float, lambda v: 0 < v < 1e9, "give a number of seconds above 0")
tokens = checked("tokens", int, lambda v: 1 <= v <= 100_000, "between 1 and 100,000 tokens")


def build_parser() -> argparse.ArgumentParser:
    """The command line, defined once: main() parses with it, the broker (broker.py) checks an agent's with it."""
    from autoresearch import __version__
    parser = argparse.ArgumentParser(prog="autoresearch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"autoresearch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="prepare data and tokenizer", add_help=False)
    _one_run(sub)
    _nights(sub)
    _readers(sub)
    return parser


def _one_run(sub) -> None:
    """setup, run, try, wait, stop, best, sample, clean, status."""
    p = sub.add_parser("setup", help="create the experiment branch and results.tsv")
    p.add_argument("--tag", required=True, help="name of this run, e.g. the date: nov29")
    p.add_argument("--decision", help=DECISION_HELP + "; fixed for the tag")
    p.add_argument("--timeout", type=seconds, help="seconds before a run is killed (default 2 x budget + 120); fixed "
                   "for the tag")
    p.add_argument("--sandbox", choices=["auto", "on", "off"], default="auto", help=SANDBOX_HELP)
    p = sub.add_parser("run", help="run one experiment")
    p.add_argument("-m", "--message", required=True, help="what this experiment tries (the commit message)")
    p.add_argument("--seed", type=seed, default=42,
                   help="seed of every configuration's first run; under the stat rule its k-th run adds k - 1, so "
                        "that runs of two configurations pair up: use one value for a whole tag")
    p.add_argument("--decision", help="default: the tag's (set at setup)")
    p.add_argument("--timeout", type=seconds, help="seconds before the run is killed (default: the tag's; never more)")
    p.add_argument("--sandbox", choices=["auto", "on", "off"], help="default: the tag's (set at setup); a run "
                   "that asks for less protection than its tag is refused")
    p.add_argument("--detach", action="store_true", help="start it in the background and return (for agents whose "
                   "shell tool times out); `autoresearch wait` returns when it ends")
    p = sub.add_parser("try", help="train the work tree's train.py once inside the training sandbox and score it; "
                       "nothing committed or recorded (instead of `python train.py`, which runs an agent's code as you)")
    p.add_argument("--seed", type=seed, default=42)
    p.add_argument("--timeout", type=seconds, help="seconds before it is killed (default 2 x budget + 120)")
    p = sub.add_parser("wait", help="wait until the experiment in the background (or a loop) ends")
    p.add_argument("--timeout", type=seconds, default=240, help="seconds to wait at most (default 240, under agents' "
                   "shell timeouts); exit status 3 if it is still running then")
    sub.add_parser("stop", help="the loop stops after the experiment in flight (the dashboard's stop button)")
    sub.add_parser("best", help="the champion: mean +- sem, test_bpb, its diff against the base, its exported model")
    p = sub.add_parser("sample", help="text written by the champion's exported model")
    p.add_argument("--prompt", default="", help="text to continue (default: a new document)")
    p.add_argument("--tokens", type=tokens, default=200, help="tokens to generate (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="0: always the likeliest token (default 0.8)")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--run", dest="run_id", help="a kept run's id (default: the champion's newest kept run)")
    p = sub.add_parser("clean", help="what can be deleted, and how much; nothing is deleted without --yes")
    p.add_argument("--yes", action="store_true", help="delete it (records, logs and champion models always stay)")
    p = sub.add_parser("status", help="best result and recent experiments")
    p.add_argument("--json", action="store_true", help="the same facts as JSON, for agents and scripts")


def _nights(sub) -> None:
    """loop, verify, agent: a night, its verification, an agent confined."""
    p = sub.add_parser("loop", help="run experiments proposed by an agent, until stopped")
    p.add_argument("--agent", default="builtin", help="builtin (default: the researcher), random or tpe (built-in references), claude, codex, aider, "
                   "or a command line")
    p.add_argument("--max-experiments", type=int, help="stop after this many experiments")
    p.add_argument("--hours", type=float, help="stop after this many hours")
    p.add_argument("--tag", help="tag to create (or continue) if not on an experiment branch")
    p.add_argument("--agent-timeout", type=float, default=1800, help="seconds an external agent may take")
    p.add_argument("--workers", type=int, help="run this many experiments side by side on Ray workers (a local "
                   "runtime, or the cluster of --ray-address); default on a cluster: as many as fit")
    p.add_argument("--ray-address", help="join this Ray cluster (`ray start --head` prints it; default: "
                   "RAY_ADDRESS) instead of starting a local runtime")
    p.add_argument("--threads", type=int, help="threads per worker's run (default: the cores divided by the "
                   "workers; a tag keeps the count it started with)")
    p.add_argument("--decision", help=DECISION_HELP + "; a new tag's, else the tag's")
    p.add_argument("--sandbox", choices=["auto", "on", "off"], help=SANDBOX_HELP + "; a new tag's, else the tag's")
    p.add_argument("--verify", action="store_true", help="when the loop ends (--hours, --max-experiments, the stop "
                   "button), verify its champion (`autoresearch verify` with its defaults)")
    p = sub.add_parser("verify", help="the champion without each keep, and beside the tag's base at a longer budget: "
                       "which keeps carry the gain and whether it transfers; runs recorded as verification, resumable")
    p.add_argument("--seeds", type=int, help="ablation: seeds per keep (default: the champion's own, at least 2)")
    p.add_argument("--transfer-seeds", type=int, default=2, help="transfer: fresh seeds per pair (default 2)")
    p.add_argument("--budget", type=seconds, help="transfer: the longer budget in seconds (default 2x the tag's, at "
                   "most the fixed half's 300 s)")
    p.add_argument("--scale", metavar="NAME=VALUE", default="", help="transfer: also both train.py with this "
                   "constant (a larger model, e.g. DEPTH=12), at the longer budget")
    p.add_argument("--no-ablation", dest="ablation", action="store_false", help="skip the ablation")
    p.add_argument("--no-transfer", dest="transfer", action="store_false", help="skip the transfer")
    p = sub.add_parser("agent", help="start any agent (default: your shell) confined: no validation or test rows "
                       "within its reach, only train.py writable; `autoresearch run/wait/status/best` work inside")
    p.add_argument("--allow", action="append", default=[], metavar="PATH",
                   help="a new directory, writable inside: PATH must not exist; the harness creates it empty "
                        "(not in the repository, nor in a hidden directory of your home); repeatable")
    p.add_argument("agent_command", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="the agent and its arguments, e.g. claude, codex, aider train.py (default: $SHELL)")


def _readers(sub) -> None:
    """ideas, report, dashboard."""
    p = sub.add_parser("ideas", help="the idea catalog and what this tag tried; --apply writes one into train.py")
    p.add_argument("--apply", nargs="+", metavar=("NAME", "KEY=VALUE"),
                   help="set idea NAME's parameters in train.py, e.g. --apply qk_norm norm=True")
    p = sub.add_parser("report", help="progress.png and a summary of this tag")
    p.add_argument("--results", help="results.tsv to read (default: the repository's)")
    p.add_argument("--tag", help="tag to report (default: the current branch's, else all rows)")
    p.add_argument("--out", default="progress.png")
    p.add_argument("--html", metavar="FILE", help="write the dashboard as one self-contained page to share")
    p.add_argument("--json", action="store_true", help="print every fact as JSON instead (no plot)")
    p.add_argument("--prices", metavar="KIND=USD,...", help="the agent's prices in dollars per million tokens, e.g. "
                   "input=3,output=15,cache_read=0.3,cache_write=3.75 (default: $AUTORESEARCH_TOKEN_PRICES)")
    p = sub.add_parser("dashboard", help="a live dashboard in the browser (read-only)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free one)")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get("AUTORESEARCH_BROKER"):  # inside `autoresearch agent`: the harness outside runs it
        from autoresearch import broker
        return broker.forward(argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.argv = argv
    if args.command == "prepare":
        from autoresearch import data
        return data.main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    from autoresearch import background, processes
    if args.command in ("run", "loop", "try", "verify"):  # they start trainings, which may run as this user (docs/integrity.md)
        processes.not_dumpable()
    code = FAILED
    try:
        code = _checked(args)
    finally:  # a detached run's exit status, for `autoresearch wait` (background.py)
        background.record_status(code)
    return code


def _checked(args) -> int:
    from autoresearch import errors, facts, git, ledger, machine, state
    from autoresearch.facts import DashboardError
    import prepare
    try:
        check_environment()
        return _command(args)
    except (errors.Refused, errors.MachineBusy) as e:
        print(f"error: {e}", file=sys.stderr)
        return FAILED
    except (errors.HarnessError, ledger.LedgerError, prepare.PrepareError, errors.AgentError, git.GitError,
            state.LockHeld, DashboardError, facts.BadQuery, machine.Settings) as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def check_environment() -> None:
    """Every AUTORESEARCH_* setting, checked before any command does anything: a malformed one is a usage error
    naming the variable, not a failure at the next run."""
    from autoresearch import baseline, fixed, machine, tags
    fixed.budget()
    fixed.clock()
    tags.compile_cache_mode()
    machine.check_settings()
    baseline.enabled()


def _command(args) -> int:
    from autoresearch import background, pause, state, tags
    if args.command == "report":
        from autoresearch import report
        print(report.main(args))
        return OK
    repo = tags.repo_root()
    if args.command == "dashboard":
        from autoresearch import facts
        with facts.serve(repo, args.host, args.port) as server, contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
        return OK
    if args.command == "run" and args.detach and not os.environ.get(background.RC_ENV):  # detach once, not again
        code, text = background.detach(repo, args.argv)
        print(text, file=sys.stdout if code == OK else sys.stderr)
        return code
    if args.command in ("setup", "run", "loop", "try", "verify"):
        with state.RepoLock(state.state_dir(repo), f"autoresearch {args.command}"):
            # an agent started with `autoresearch agent` is paused while anything here trains (pause.py)
            with pause.paused(repo) if args.command != "setup" else contextlib.nullcontext():
                return _change_state(repo, args)
    if args.command == "wait":
        code, text = background.wait(repo, args.timeout)
        print(text)
        return code
    if args.command == "stop":
        return _stop(repo)
    if args.command == "agent":
        from autoresearch import broker
        command = args.agent_command[1:] if args.agent_command[:1] == ["--"] else args.agent_command
        return broker.start(repo, command, args.allow, build_parser())
    return _small_command(repo, args)


def _stop(repo: Path) -> int:
    """`autoresearch stop`: a loop or a verification running here stops after its experiment (or run) in flight."""
    from autoresearch import state
    held, holder = state.is_held(state.state_dir(repo)), state.holder(state.state_dir(repo) / state.LOCK_NAME)
    if not held or not ("autoresearch loop" in holder or "autoresearch verify" in holder):
        print("no loop is running here; nothing to stop" + (
            f" ({holder} ends after its experiment anyway)" if held else ""))
        return OK
    state.stop_file(repo).parent.mkdir(parents=True, exist_ok=True)
    state.stop_file(repo).touch()
    print(f"asked {holder} to stop after the experiment in flight (a loop reads it between experiments, a "
          "verification between runs; Ctrl-C in its terminal stops it now)")
    return OK


def _small_command(repo: Path, args) -> int:
    """ideas, best, sample, clean and status: each prints what commands.py returns."""
    from autoresearch import commands, state, tags
    if args.command == "ideas":
        print(commands.ideas(repo, args.apply))
        return OK
    if args.command == "best":
        print(commands.best(repo))
        return OK
    if args.command == "sample":
        print(commands.sample(repo, args.prompt, args.tokens, args.temperature, args.seed, args.run_id))
        return OK
    if args.command == "clean":
        if not args.yes:
            print(commands.text(commands.plan(repo), deleted=False))
            return OK
        with state.RepoLock(state.state_dir(repo), "autoresearch clean"):  # never under a running loop
            items = commands.plan(repo)
            commands.delete(items)
        print(commands.text(items, deleted=True))
        return OK
    if args.command == "status" and args.json:
        import json

        from autoresearch import facts
        config = tags.load_tag(repo)
        out = facts.facts(state.results(repo), repo, config.tag)
        out["carried"] = commands.carried(repo, config)  # what train.py may still carry (heldout.headroom)
        print(json.dumps(out, indent=1))
    elif args.command == "status":
        print(commands.status(repo))
    return OK


def _change_state(repo: Path, args) -> int:
    """setup, run, loop and try: called with the repository's lock held."""
    from autoresearch import run, state, tags
    if args.command == "try":
        from autoresearch import background
        return OK if background.run(repo, args.seed, args.timeout) else FAILED
    if args.command == "setup":
        config = tags.setup(repo, args.tag, sandbox_mode=args.sandbox, rule=args.decision, timeout=args.timeout)
        print(f"on branch {config.branch}; results go to {state.results(repo)}")
        print(f"fixed half fingerprint {config.fingerprint[:12]}, budget {config.budget_s:g} s, protection "
              f"{config.protection}, decision {config.decision}, {config.allowance_s:g} s allowed outside "
              f"the budget")
        print('next: `autoresearch run -m "baseline"` (or point your agent at program.md)')
        return OK
    if args.command == "run":
        options = run.Options(rule=args.decision, sandbox_mode=args.sandbox, timeout=args.timeout, seed=args.seed)
        outcomes = run.run_series(repo, args.message, options, on_outcome=lambda o: print(run.summary(o), flush=True))
        return FAILED if outcomes[-1].row.status in ("crash", "refused") else OK
    from autoresearch import loop
    if args.command == "verify":
        return verify(repo, args)
    loop.ensure_data()
    if loop.parallel(args):
        from autoresearch import cluster
        code = cluster.main(repo, args)
    else:
        code = loop.main(repo, args)
    return verify(repo, None) if code == OK and args.verify else code


def verify(repo: Path, args) -> int:
    """`autoresearch verify`, or its defaults at the end of `loop --verify` (args None)."""
    from autoresearch import errors, loop, verify
    options = verify.Options() if args is None else verify.Options(
        seeds=args.seeds, transfer_seeds=args.transfer_seeds, budget=args.budget, scale=args.scale,
        ablation=args.ablation, transfer=args.transfer)
    if (options.seeds is not None and options.seeds < 1) or options.transfer_seeds < 1:
        raise errors.HarnessError("--seeds and --transfer-seeds: at least 1")
    return verify.main(repo, options, progress=loop.Progress)


if __name__ == "__main__":
    sys.exit(main())
