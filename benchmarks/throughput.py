"""Packing throughput next to training throughput, and where a training step's time goes, for the prepared
profile's default model, with or without each speed-up train.py makes by default.

    python benchmarks/throughput.py [--steps 30] [--repeats 3] [--arms fp32-eager bf16-eager fp32-compiled bf16-compiled]

Prints the dataloader's packing rate (tokens/s, batches of train.py's DEVICE_BATCH_SIZE x MAX_SEQ_LEN), then per
arm (dtype: autocast bf16 or float32; eager or torch.compile, the model and Muon's Newton-Schulz as train.py
compiles them) the first step (compilation, from the cache when it is warm), the steady training rate (tokens/s
and MFU against the probed peak of that dtype, median over --repeats of --steps steps) and the milliseconds
of a step by part: data, forward, backward, gradient clipping, AdamW, Muon. Arms take turns within each
repeat, so a slow minute of the machine hits all of them. Run it alone.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from autoresearch import untrusted  # noqa: E402
import tempfile  # noqa: E402

# the reviewed train.py, imported from a scratch directory: never the work tree's (docs/integrity.md)
REVIEWED = untrusted.write(Path(__file__).resolve().parent.parent, Path(tempfile.mkdtemp()))
sys.path.insert(0, str(REVIEWED.parent))
import train  # noqa: E402  (sets flush-denormal first)
import runtime  # noqa: E402
from prepare import MAX_SEQ_LEN, Tokenizer, make_dataloader  # noqa: E402

PARTS = ("data", "forward", "backward", "clip", "adamw", "muon")


def packing_rate(tok, n_batches):
    loader = make_dataloader(tok, train.DEVICE_BATCH_SIZE, MAX_SEQ_LEN, seed=123)
    next(loader)
    t = time.perf_counter()
    for _ in range(n_batches):
        next(loader)
    return n_batches * train.DEVICE_BATCH_SIZE * MAX_SEQ_LEN / (time.perf_counter() - t)


class Arm:
    def __init__(self, tok, name):
        dtype_name, mode = name.split("-")
        self.name, self.dtype, self.compiled = name, getattr(torch, {"fp32": "float32"}.get(dtype_name, "bfloat16")), \
            mode == "compiled"
        cfg = train.GPTConfig(tok.get_vocab_size(), MAX_SEQ_LEN, train.DEPTH, train.MODEL_DIM, train.HEAD_DIM,
                              train.WINDOW_PATTERN, train.SOFTCAP)
        torch.manual_seed(0)
        self.model = train.GPT(cfg)
        self.model.init_weights()
        self.adamw, self.muon = train.make_optimizers(self.model, self.dtype, self.compiled)
        self.step_model = torch.compile(self.model, dynamic=False) if self.compiled else self.model
        self.loader = make_dataloader(tok, train.DEVICE_BATCH_SIZE, MAX_SEQ_LEN, seed=1)
        self.accum = train.TOTAL_BATCH_SIZE // (train.DEVICE_BATCH_SIZE * MAX_SEQ_LEN)
        self.autocast = torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype != torch.float32)
        self.peak = runtime.peak_flops(torch.device("cpu"), self.dtype)
        t = time.perf_counter()
        self.step({})
        self.first = time.perf_counter() - t
        self.rates, self.parts = [], {p: [] for p in PARTS}

    def step(self, parts):
        def tick(name, t):
            now = time.perf_counter()
            parts[name] = parts.get(name, 0.0) + now - t
            return now

        t = time.perf_counter()
        for _ in range(self.accum):
            x, y, _ = next(self.loader)
            t = tick("data", t)
            with self.autocast:
                loss = self.step_model(x, y)
            t = tick("forward", t)
            (loss / self.accum).backward()
            t = tick("backward", t)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        t = tick("clip", t)
        self.adamw.step()
        t = tick("adamw", t)
        self.muon.step()
        self.model.zero_grad(set_to_none=True)
        loss.item()
        tick("muon", t)

    def measure(self, steps):
        parts = {}
        t = time.perf_counter()
        for _ in range(steps):
            self.step(parts)
        self.rates.append(steps * train.TOTAL_BATCH_SIZE / (time.perf_counter() - t))
        for p in PARTS:
            self.parts[p].append(1000 * parts[p] / steps)

    def row(self):
        rate = statistics.median(self.rates)
        mfu = 100 * rate * self.model.flops_per_token() / self.peak
        ms = {p: statistics.median(v) for p, v in self.parts.items()}
        return (f"| {self.name} | {self.first:.1f} | {rate:,.0f} | {mfu:.1f} | {sum(ms.values()):.0f} | "
                + " | ".join(f"{ms[p]:.1f}" for p in PARTS) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arms", nargs="+", default=["fp32-eager", "bf16-eager", "fp32-compiled", "bf16-compiled"],
                        choices=["fp32-eager", "bf16-eager", "fp32-compiled", "bf16-compiled"])
    args = parser.parse_args()
    tok = Tokenizer.from_directory()
    print(f"profile={train.PROFILE} threads={torch.get_num_threads()} DEPTH={train.DEPTH} MODEL_DIM={train.MODEL_DIM} "
          f"vocab={tok.get_vocab_size()} seq={MAX_SEQ_LEN} batch={train.TOTAL_BATCH_SIZE} tokens/step "
          f"peak fp32 {runtime.peak_flops(torch.device('cpu'), torch.float32) / 1e9:,.0f} GFLOP/s, "
          f"bf16 {runtime.peak_flops(torch.device('cpu'), torch.bfloat16) / 1e9:,.0f} GFLOP/s (train.py's probe)")
    packing = [packing_rate(tok, 200) for _ in range(args.repeats)]
    print(f"packing: {statistics.median(packing):,.0f} tok/s (median of {args.repeats})\n")
    arms = [Arm(tok, name) for name in args.arms]
    for _ in range(args.repeats):
        for arm in arms:
            arm.measure(args.steps)
    print("| arm | first step s | tok/s | MFU % | step ms | " + " | ".join(PARTS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(PARTS))
    for arm in arms:
        print(arm.row())
    base = statistics.median(arms[0].rates)
    for arm in arms[1:]:
        print(f"{arm.name}: {statistics.median(arm.rates) / base:.2f}x the tokens/s of {arms[0].name}")


if __name__ == "__main__":
    main()
