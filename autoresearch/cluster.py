"""`autoresearch loop --workers N` / `--ray-address ADDR`: experiments side by side on Ray workers.

This module starts (or joins) the Ray runtime and sizes the workers; driver.py runs the night on them, with the
scheduler and the recorder `autoresearch run` uses (study.py, record.py), and worker.py executes each run.
See docs/parallel.md.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from autoresearch import agents, errors, fixed, git, machine, proposer, record, tags
from autoresearch.driver import Driver, Stop


def plan(args, hw: dict, tag_threads: int | None) -> tuple[int | None, int]:
    """(workers, threads per worker) for a local runtime or a cluster; None workers: as many as fit."""
    workers = args.workers
    if workers is not None and workers < 1:
        raise errors.HarnessError(f"--workers {workers}: give at least 1.")
    threads = args.threads or tag_threads
    if threads is None:
        devices = len(machine.gpu_names()) if hw["device"] == "cuda" else hw["cores"]
        threads = max(1, hw["cores"] // (workers or devices))
    if threads < 1:
        raise errors.HarnessError(f"--threads {threads}: give at least 1.")
    return workers, threads


def reachable(address: str, timeout: float = 10.0) -> None:
    """A clear error at once when nothing listens at host:port (ray.init would retry for minutes)."""
    import socket
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto":
        return
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        raise errors.HarnessError(f"no Ray cluster answers at {address} ({e}). Start one with `ray start --head` "
                               "(docs/parallel.md) and give the address it prints, or drop "
                               "--ray-address/RAY_ADDRESS for a local runtime.") from None


def start_ray(address: str | None, workers: int | None, threads: int, hw: dict, log):
    """Join the cluster at `address`, or start a local runtime sized for the workers. (ray, workers, gpu)."""
    try:
        import ray
    except ImportError:
        raise errors.HarnessError("--workers needs Ray: `pip install -e .` installs it (it is a dependency).") from None
    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=True)
    if address:
        reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as e:
            raise errors.HarnessError(
                f"cannot join the Ray cluster at {address} ({str(e).splitlines()[0]}). A head started by `ray start "
                "--head` requires its token (Ray 2.59 and later): set RAY_AUTH_MODE=token here and give this machine "
                "the head's token (`ray get-auth-token` on the head prints it; put it in ~/.ray/auth_token or "
                "RAY_AUTH_TOKEN). docs/parallel.md.") from None
        resources = ray.cluster_resources()
        gpu = resources.get("GPU", 0) >= 1
        fit = int(resources.get("GPU", 0)) if gpu else int(resources.get("CPU", 0) // threads)
        workers = workers or fit
        if workers > fit or workers < 1:
            ray.shutdown()
            raise errors.HarnessError(f"the cluster at {address} has room for {fit} worker(s) of {threads} thread(s)"
                                   f"{' and one GPU' if gpu else ''} ({resources.get('CPU', 0):g} CPUs, "
                                   f"{resources.get('GPU', 0):g} GPUs), not {workers}. Use --workers {max(fit, 1)} "
                                   "or --threads, or add machines.")
        return ray, workers, gpu
    gpu = hw["device"] == "cuda"
    gpus = len(machine.gpu_names()) if gpu else 0
    workers = workers or (gpus if gpu else max(1, hw["cores"] // threads))
    if workers * threads > hw["cores"]:
        raise errors.HarnessError(f"{workers} workers of {threads} thread(s) need {workers * threads} cores; this "
                               f"machine has {hw['cores']}. Use fewer workers (--workers {hw['cores'] // threads}) or "
                               "fewer threads each (--threads), or join a cluster (--ray-address).")
    if gpu and workers > gpus:
        raise errors.HarnessError(f"{workers} workers need a GPU each; this machine has {gpus}. Use --workers {gpus}.")
    ray.init(num_cpus=workers * threads, num_gpus=gpus, **quiet)
    return ray, workers, gpu


def main(repo: Path, args, log=print) -> int:
    """The parallel loop (the CLI has prepared the data and holds the lock)."""
    if args.agent not in proposer.BUILTINS:
        agents.command_for(args.agent)
    if git.changed_files(repo):
        raise errors.HarnessError("uncommitted changes in " + ", ".join(git.changed_files(repo)[:5]) + ": the driver's "
                               "work tree holds the champion while workers run candidates. Commit or stash them.")
    fixed.check_contract()
    hw = machine.hardware()
    existing = tags.existing(repo, args.tag)
    workers, threads = plan(args, hw, existing.threads_per_run() if existing else None)
    if existing and existing.threads_per_run() != threads:
        raise errors.HarnessError(f"tag {existing.tag} runs every experiment with {existing.threads_per_run()} "
                               f"thread(s), and rows with other resources are never compared: use --threads "
                               f"{existing.threads_per_run()}, or a new tag (--tag NEWTAG).")
    address = args.ray_address or os.environ.get("RAY_ADDRESS") or None
    ray, workers, gpu = start_ray(address, workers, threads, hw, log)
    try:
        config = tags.ensure(repo, args.tag, log, threads=threads, sandbox_mode=args.sandbox, rule=args.decision)
        record.recover(repo, log, parallel=True)
        driver = Driver(repo, config, args, ray, gpu, log)
        try:
            return driver.main(workers)
        except Stop as e:
            log(str(e))
            return 1
        finally:
            driver.close()
    finally:
        ray.shutdown()
