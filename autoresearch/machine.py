"""What machine a tag's experiments run on: the hardware that decides how many steps fit in the budget.

Results are only comparable on the same hardware (an AVX-512 Xeon trains about twice as fast as an AVX2 EPYC
with the same 2 cores), so a tag records this at setup and a run on other hardware is refused. It is read
without importing torch, so every command stays fast.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

KEYS = ("device", "name", "cores", "torch")


def _cpu_name() -> str:
    """The model name, plus family/model and the widest vector unit: a VM often names only "Intel(R) Xeon(R)
    Processor", which says nothing about the generation."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if not line.strip():
                    break  # the first processor is enough
    except OSError:
        pass
    if "model name" in fields:
        flags = set(fields.get("flags", "").split())
        isa = next((name for name, flag in (("amx", "amx_tile"), ("avx512", "avx512f"), ("avx2", "avx2"))
                    if flag in flags), "no avx2")
        return f"{fields['model name']} (family {fields.get('cpu family')} model {fields.get('model')}, {isa})"
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() or platform.machine()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """The names of this machine's NVIDIA GPUs, one per device (none without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _gpu_name() -> str | None:
    names = gpu_names()
    return names[0] if names else None


def hardware() -> dict:
    """device (cuda, mps or cpu), its name, the cores this process may use, and the torch version."""
    gpu = _gpu_name()
    if gpu:
        device, name = "cuda", gpu
    elif sys.platform == "darwin" and platform.machine() == "arm64":
        device, name = "mps", _cpu_name()
    else:
        device, name = "cpu", _cpu_name()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return {"device": device, "name": name, "cores": cores, "torch": torch}


def describe(hw: dict) -> str:
    return f"{hw['device']} {hw['name']} ({hw['cores']} cores, torch {hw['torch']})"


def differences(recorded: dict, current: dict, ignore: tuple = ()) -> list[str]:
    return [f"{k} {recorded.get(k)!r} -> {current.get(k)!r}" for k in KEYS
            if k not in ignore and recorded.get(k) != current.get(k)]
