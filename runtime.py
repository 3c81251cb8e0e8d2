"""
The runtime train.py uses, fixed like prepare.py (DO NOT CHANGE; an agent need not read it): which device, dtype
and compiler to use and why, the budget's clock, the step lines the harness and the dashboard read, and the peak
FLOP/s behind MFU. train.py's loop uses two things of it:

    run = setup(USE_COMPILE)            # the seed (torch seeded), device, dtype and compiler, with reasons
    budget = Budget(run, ...)           # the budget's clock starts; then, in the loop:
    while budget.running():  ...  budget.step(loss, epoch)
    finish(model, budget.stats(), EVAL_BATCH_SIZE)

Kept out of prepare.py so that it holds what an agent reads; the harness fingerprints, mounts and hands a clean
copy of this file to every run exactly as it does prepare.py (autoresearch/fixed.py).
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# ---------------------------------------------------------------------------
# Where the prepared data is, the budget, the compile phase and the run's seed, as the harness sets them
# ---------------------------------------------------------------------------

DEFAULT_TIME_BUDGET = 300  # seconds of wall clock per experiment, compilation included
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 3          # 3: a held-out pool the scored rows are drawn from; 2: a test split


class PrepareError(RuntimeError):
    """A problem the user can fix; the message says how."""


def cache_dir() -> Path:
    return Path(os.environ.get("AUTORESEARCH_CACHE") or Path.home() / ".cache" / "autoresearch")


COMPILE_ONLY_ENV = "AUTORESEARCH_COMPILE_ONLY"  # set by the harness for the compile phase (autoresearch/compiled.py)
COMPILE_ONLY_BUDGET = 1e-9  # in the compile phase the loop ends after its first step, which compiles


def compile_only() -> bool:
    """Whether this is the harness's compile phase: random tokens, one step, no export (finish does nothing)."""
    return os.environ.get(COMPILE_ONLY_ENV) == "1"


def time_budget() -> int | float:
    """The budget in seconds, exactly as given (AUTORESEARCH_TIME_BUDGET may only shorten it)."""
    if compile_only():
        return COMPILE_ONLY_BUDGET
    raw = os.environ.get("AUTORESEARCH_TIME_BUDGET", "").strip()
    if not raw:
        return DEFAULT_TIME_BUDGET
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and 0 < value <= DEFAULT_TIME_BUDGET):
        raise PrepareError(f"AUTORESEARCH_TIME_BUDGET={raw!r} is not a budget: give a number of seconds in "
                           f"(0, {DEFAULT_TIME_BUDGET}] (it may only shorten the budget, for smoke runs and tests), "
                           f"or unset it for the standard {DEFAULT_TIME_BUDGET} s.")
    return int(value) if value == int(value) else value


MANIFEST_KEYS = ("version", "profile", "dataset", "vocab_size", "max_seq_len", "eval_tokens", "data_dir", "files")


def load_manifest(root: Path | None = None) -> dict | None:
    """The manifest of the prepared data, None if there is none; a damaged or outdated one is a clear error."""
    path = (root or cache_dir()) / MANIFEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PrepareError(f"{path} is unreadable ({e}); run `python prepare.py --force` to prepare again.") from None
    try:
        manifest = json.loads(text)
        missing = [k for k in MANIFEST_KEYS if k not in manifest]
    except (json.JSONDecodeError, TypeError):
        manifest, missing = None, ["valid JSON"]
    if missing:
        raise PrepareError(f"{path} is damaged (no {', '.join(missing)}); run `python prepare.py --force` "
                           "to prepare the data again.")
    if manifest["version"] != MANIFEST_VERSION:
        raise PrepareError(f"{path} was written by another version of prepare.py (manifest version "
                           f"{manifest['version']}, this one reads {MANIFEST_VERSION}); run "
                           "`python prepare.py --force` to prepare the data again.")
    return manifest


def require_manifest() -> dict:
    manifest = load_manifest()
    if manifest is None:
        raise PrepareError(f"No prepared data in {cache_dir()}. Run `python prepare.py` (or `autoresearch prepare`) "
                           f"first; set AUTORESEARCH_CACHE if your data lives elsewhere.")
    return manifest


def default_profile() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            return "gpu"
    except ImportError:
        pass
    return "cpu"


SEED_ENV = "AUTORESEARCH_SEED"   # the run's seed, set by the harness: each run of a series gets its own


def harness_seed() -> int | None:
    """The run's seed when the harness runs train.py (None by hand)."""
    raw = os.environ.get(SEED_ENV, "").strip()
    return int(raw) if raw.lstrip("-").isdigit() else None

# ---------------------------------------------------------------------------
# The budget's clock
# ---------------------------------------------------------------------------

BUDGET_CLOCKS = ("wall", "cpu")


def budget_clock_kind() -> str:
    """What the budget's seconds are: wall (the default, and what the public project means) or cpu."""
    kind = os.environ.get("AUTORESEARCH_BUDGET_CLOCK", "").strip() or "wall"
    if kind not in BUDGET_CLOCKS:
        raise PrepareError(f"AUTORESEARCH_BUDGET_CLOCK={kind!r}: use wall (the default: seconds of wall clock) or "
                           "cpu (seconds of compute the training process received, for shared machines).")
    return kind


def cpu_threads() -> int:
    """The threads the cpu clock divides by: OMP_NUM_THREADS (the harness sets it), else the usable cores."""
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def budget_clock():
    """The clock train.py's budget runs on, a function returning seconds. wall: time.perf_counter. cpu: the CPU
    seconds of this process (all its threads) divided by its thread count, so that time the machine gave to
    other processes does not count: on a shared machine the same train.py then reaches the same step.
    Meant with OMP_WAIT_POLICY=PASSIVE (the harness sets it), else threads waiting for a descheduled peer spin
    and bill the budget for it."""
    if budget_clock_kind() == "wall":
        return time.perf_counter
    threads = cpu_threads()
    return lambda: time.process_time() / threads


# ---------------------------------------------------------------------------
# Device measurements: the peak FLOP/s behind MFU and the CPU dtype choice. Under the harness they are the
# tag's, measured by the harness once at setup and handed to every run read-only (PEAK_FILE in the data view),
# so no run can change what a later one reads; by hand they are probed once and cached.
# ---------------------------------------------------------------------------

PEAK_FILE = "peak_flops.json"
# Dense peak FLOP/s of known GPUs: (bf16 tensor cores, fp32).
GPU_PEAK_FLOPS = {
    "H200": (989e12, 67e12), "H100": (989e12, 67e12), "GH200": (989e12, 67e12), "B200": (2250e12, 80e12),
    "A100": (312e12, 19.5e12), "A10G": (70e12, 31e12), "L40S": (362e12, 91e12), "L4": (121e12, 30e12),
    "RTX 4090": (165e12, 83e12), "RTX 3090": (71e12, 36e12), "A6000": (155e12, 39e12),
}


def peak_key(device_type: str, dtype_name: str, threads: int) -> str:
    import platform
    return f"{device_type}|{platform.processor() or platform.machine()}|{threads}|{dtype_name}"


def probe_flops(device, dtype, seconds: float = 0.25) -> float:
    """A matmul's best FLOP/s, growing the size from 256 (to 2048 at most) while the next size's product would
    take under `seconds`: bounded, because a bf16 matmul without bf16 units is slow (1 GFLOP/s on a 2-core AMD
    EPYC, where the fixed 2048 probe this replaces took 12 minutes)."""
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
        elif device.type == "mps":
            torch.mps.synchronize()

    n, best = 256, float("inf")
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        a @ a
        best = float("inf")
        for _ in range(3):
            sync()
            t = time.perf_counter()
            a @ a
            sync()
            best = min(best, time.perf_counter() - t)
        if best * 8 >= seconds or n >= 2048:
            return 2 * n**3 / best
        n *= 2


def peak_flops(device, dtype) -> float:
    """The peak of the device in use for dtype: the table for known GPUs, else the tag's measurement (under the
    harness), else a probe, cached in the data cache (by hand)."""
    import torch
    dtype_name = str(dtype).removeprefix("torch.")
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
        for key, (bf16, fp32) in GPU_PEAK_FLOPS.items():
            if key in name:
                return bf16 if dtype == torch.bfloat16 else fp32
    key = peak_key(device.type, dtype_name, torch.get_num_threads())
    path = cache_dir() / PEAK_FILE
    known = json.loads(path.read_text()) if path.is_file() else {}
    if key not in known:
        known[key] = probe_flops(device, dtype)
        if harness_seed() is None:  # by hand: remember it; under the harness the view is read-only
            path.write_text(json.dumps(known, indent=1))
    return float(known[key])


def measure_peaks(threads: int) -> dict:
    """The harness's measurement at setup (a fresh process with `threads` threads): every key a run on this
    machine's CPU may ask for."""
    import torch
    torch.set_num_threads(threads)
    cpu = torch.device("cpu")
    return {peak_key("cpu", name, threads): probe_flops(cpu, dtype)
            for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}

# ---------------------------------------------------------------------------
# What the harness and the dashboard read from the log: the step line and FAST_FAIL, defined here once.
# ---------------------------------------------------------------------------

FAST_FAIL = "FAST_FAIL"   # a log line starting with this: the loss diverged, the run is a crash
# One line every 1/LOG_LINES of the budget: the progress bar, the dashboard's loss curve and `status` read it.
STEP_RE = re.compile(r"^step=\s*(?P<step>\d+) \| loss=(?P<loss>[\d.naninf+-]+) \| tok/s=(?P<tok_per_sec>\d+) "
                     r"\| mfu=(?P<mfu>[\d.]+)% \| elapsed=(?P<elapsed>\d+)s", re.M)


def step_line(step: int, loss: float, tok_per_sec: float, mfu: float, elapsed: float, epoch: int) -> str:
    return (f"step={step:6d} | loss={loss:.4f} | tok/s={tok_per_sec:.0f} | mfu={mfu:.1f}% | elapsed={elapsed:.0f}s "
            f"| epoch={epoch}")


def check_loss(step: int, loss: float) -> None:
    """End the run at once when the loss is NaN, infinite or above 100: nothing after it is worth the budget."""
    if not math.isfinite(loss) or loss > 100:
        print(f"{FAST_FAIL} step={step} loss={loss} (NaN, infinite or above 100)", flush=True)
        sys.exit(1)

# ---------------------------------------------------------------------------
# Which seed, device, dtype and compiler, and why
# ---------------------------------------------------------------------------


def run_seed(default: int = 42) -> int:
    """The run's seed: the harness's (SEED_ENV, a new one for every run of a series), or `default` by hand. A
    result.json with another seed is refused."""
    raw = os.environ.get(SEED_ENV, "").strip()
    if raw and harness_seed() is None:
        raise PrepareError(f"{SEED_ENV}={raw!r} is not a whole number (the harness sets it; by hand, unset it)")
    seed = harness_seed()
    return default if seed is None else seed


def pick_device():
    import torch
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(device):
    """The matmul dtype (bf16 autocast or float32) and why. bf16 only where the hardware does it well: CUDA
    sm80+, and CPUs whose measured bf16 matmul is at least twice their fp32 one. That holds with AMX (a 2-core
    Sapphire-Rapids-class Xeon: 2,016 against 340 GFLOP/s); without bf16 units (a 2-core AMD EPYC) a bf16
    matmul was ~5x slower than fp32. On MPS float32 is the reliable choice."""
    import torch
    if device.type == "cuda":
        if torch.cuda.get_device_capability()[0] >= 8:
            return torch.bfloat16, "CUDA sm80+: bf16 tensor cores"
        return torch.float32, "CUDA before sm80: no fast bf16"
    if device.type == "cpu":
        fp32, bf16 = peak_flops(device, torch.float32), peak_flops(device, torch.bfloat16)
        verdict = (torch.bfloat16, "at least 2x") if bf16 >= 2 * fp32 else (torch.float32, "under 2x")
        return verdict[0], f"CPU bf16 matmul {bf16 / 1e9:,.0f} GFLOP/s against fp32 {fp32 / 1e9:,.0f}: {verdict[1]}"
    return torch.float32, f"{device.type}: float32 is the reliable choice"


def pick_compile(device, wanted: bool = True):
    """Whether torch.compile can run here, and why. Inductor builds C++ on CPUs, so it needs a compiler; MPS
    support is incomplete. The harness points TORCHINDUCTOR_CACHE_DIR at a cache that outlives the run, so an
    unchanged graph (most experiments change only constants) compiles in ~3 s instead of ~30 s on 2 cores."""
    import shutil
    if not wanted:
        return False, "USE_COMPILE is off"
    if device.type == "mps":
        return False, "mps: inductor support is incomplete"
    if device.type == "cpu":
        compiler = next((c for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c and shutil.which(c)), None)
        if compiler is None:
            return False, "no C++ compiler (g++, c++, clang++ or $CXX) for inductor's CPU kernels"
        return True, f"inductor with {compiler}"
    return True, "inductor"


def load_flash_attention_3():
    """FA3 from the `kernels` hub on Hopper; None (use SDPA) whenever it can't be had."""
    import torch
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        return None
    try:
        from kernels import get_kernel
        fa3 = get_kernel("varunneal/flash-attention-3").flash_attn_interface
        q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
        fa3.flash_attn_func(q, q, q, causal=True)  # prove it runs before relying on it
        return fa3
    except Exception as e:  # no network, no wheel for this torch, ...: fall back quietly
        print(f"flash attention 3 unavailable ({type(e).__name__}); using PyTorch SDPA")
        return None


def peak_memory_gb(device) -> float:
    import resource

    import torch
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 1e9
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
    return rss / (1e9 if sys.platform == "darwin" else 1e6)


@dataclass
class Setup:
    """What a run trains with, each choice made (and printed with its reason) by setup()."""
    seed: int
    device: object            # torch.device
    dtype: object             # torch.dtype of the matmuls: bf16 autocast or float32
    compiled: bool            # whether torch.compile runs
    fa3: object = None        # flash attention 3's interface on Hopper, else None (SDPA)
    started: float = 0.0      # time.time() at setup: the start-up time is counted from here

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def autocast(self):
        """The autocast context of the training's forward passes (none in float32)."""
        import torch
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)


def setup(use_compile: bool = True) -> Setup:
    """The run's seed (torch is seeded with it), device, dtype and compiler, each chosen and printed with why."""
    import torch
    started = time.time()
    seed = run_seed()
    torch.manual_seed(seed)
    device = pick_device()
    dtype, dtype_reason = pick_dtype(device)
    compiled, compile_reason = pick_compile(device, use_compile)
    fa3 = None
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        fa3 = load_flash_attention_3()
    print(f"dtype: {dtype_reason}\ncompile: {compile_reason}")
    return Setup(seed, device, dtype, compiled, fa3, started)

# ---------------------------------------------------------------------------
# The training loop's budget
# ---------------------------------------------------------------------------


class Budget:
    """The loop's clock, started when made: compilation counts against the budget from here, torch.compile's
    own imports included (~1.3 s on 2 CPU cores). Everything long-lived exists by then, so the garbage collector
    is frozen and kept out of the loop. step() after each optimizer step counts it, ends a diverged run
    (FAST_FAIL) and prints `log_lines` step lines evenly spaced in budget time; running() turns False once the
    budget is spent; stats() is what prepare.finish records."""

    def __init__(self, run: Setup, tokens_per_step: int, flops_per_token: float, params: int, log_lines: int = 50):
        import torch
        self.run, self.tokens_per_step, self.flops_per_token = run, tokens_per_step, flops_per_token
        self.budget, self.log_every = time_budget(), time_budget() / log_lines
        self.peak = peak_flops(run.device, run.dtype)
        profile = (load_manifest() or {}).get("profile") or default_profile()
        print(f"device={run.device.type} dtype={run.dtype_name} compile={run.compiled} params={params:,} "
              f"budget={self.budget}s clock={budget_clock_kind()} profile={profile} seed={run.seed} "
              f"threads={torch.get_num_threads()}")
        gc.collect()
        gc.freeze()
        gc.disable()
        self.startup_seconds = time.time() - run.started
        # wall seconds, or on a shared machine (AUTORESEARCH_BUDGET_CLOCK=cpu) the compute this process received;
        # tok/s stays per wall second either way
        self.clock = budget_clock()
        self.steps, self.tokens, self.epoch, self.compile_seconds, self.elapsed = 0, 0, 0, 0.0, 0.0
        self.t0, self.c0 = time.time(), self.clock()
        self.first_step_wall, self.next_log, self.t_log, self.tokens_log = 0.0, 0.0, self.t0, 0

    @property
    def progress(self) -> float:
        """The fraction of the budget spent, in [0, 1]: what a schedule follows."""
        return min(self.elapsed / self.budget, 1.0)

    def running(self) -> bool:
        return self.elapsed < self.budget

    def mfu(self, tok_per_sec: float) -> float:
        return 100 * tok_per_sec * self.flops_per_token / self.peak

    def step(self, loss: float, epoch: int) -> None:
        """One optimizer step done, with its mean loss (a float: reading it syncs the device)."""
        self.steps += 1
        self.tokens += self.tokens_per_step
        self.epoch = epoch
        check_loss(self.steps, loss)
        now = time.time()
        self.elapsed = self.clock() - self.c0
        if self.steps == 1:
            self.compile_seconds = self.elapsed  # the first step carries compilation and warm-up
            self.first_step_wall = now - self.t0
            self.t_log, self.tokens_log = now, self.tokens
        if self.steps == 1 or self.elapsed >= self.next_log:
            self.next_log = (self.elapsed // self.log_every + 1) * self.log_every
            rate = ((self.tokens - self.tokens_log) / (now - self.t_log) if now > self.t_log and self.steps > 1
                    else self.tokens_per_step / max(now - self.t0, 1e-9))
            print(step_line(self.steps, loss, rate, self.mfu(rate), self.elapsed, epoch), flush=True)
            self.t_log, self.tokens_log = now, self.tokens

    def stats(self) -> dict:
        """The run's figures for result.json (prepare.RESULT_SCHEMA's keys but check_bpb, and more), printed as
        one summary line; the garbage collector runs again from here."""
        gc.enable()
        gc.unfreeze()
        wall = time.time() - self.t0
        steady = ((self.tokens - self.tokens_per_step) / max(wall - self.first_step_wall, 1e-9)
                  if self.steps > 1 else 0.0)
        print(f"training={self.elapsed:.1f}s compile={self.compile_seconds:.1f}s startup={self.startup_seconds:.1f}s "
              f"tok/s={steady:.0f} mfu={self.mfu(steady):.1f}%", flush=True)
        return {
            "memory_gb": peak_memory_gb(self.run.device), "num_steps": self.steps, "training_seconds": self.elapsed,
            "time_budget": self.budget, "device": self.run.device.type, "dtype": self.run.dtype_name,
            "seed": self.run.seed, "total_tokens": self.tokens, "startup_seconds": self.startup_seconds,
            "compile_seconds": self.compile_seconds, "tokens_per_second": steady, "mfu_percent": self.mfu(steady),
            "peak_flops": self.peak, "flops_per_token": self.flops_per_token, "compiled": self.run.compiled,
            "flash_attention_3": self.run.fa3 is not None, "epoch": self.epoch, "budget_clock": budget_clock_kind(),
            "training_wall_seconds": wall,
        }
