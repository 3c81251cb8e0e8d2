"""Packing throughput next to training throughput, for the default configuration of the prepared profile.

    python benchmarks/throughput.py [--steps 20] [--repeats 5] [--compile]

Prints the median over --repeats of: the dataloader's packing rate (tokens/s, batches of train.py's
DEVICE_BATCH_SIZE x MAX_SEQ_LEN), and the training rate of train.py's model and optimizer (tokens/s and MFU,
steady state, the first step excluded). With --compile, also the compiled model: the first step's time
(compilation) separately, then its steady rate.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import train  # noqa: E402  (sets flush-denormal first)
from prepare import MAX_SEQ_LEN, Tokenizer, make_dataloader  # noqa: E402


def packing_rate(tok, n_batches):
    loader = make_dataloader(tok, train.DEVICE_BATCH_SIZE, MAX_SEQ_LEN, seed=123)
    next(loader)
    t = time.perf_counter()
    for _ in range(n_batches):
        next(loader)
    return n_batches * train.DEVICE_BATCH_SIZE * MAX_SEQ_LEN / (time.perf_counter() - t)


def training_rate(tok, steps, compile_model):
    device = train.pick_device()
    dtype = train.pick_dtype(device)
    cfg = train.GPTConfig(tok.get_vocab_size(), MAX_SEQ_LEN, train.DEPTH, train.MODEL_DIM, train.HEAD_DIM,
                          train.WINDOW_PATTERN, train.SOFTCAP)
    model = train.GPT(cfg).to(device)
    model.init_weights()
    optimizers = train.make_optimizers(model)
    step_model = torch.compile(model, dynamic=False) if compile_model else model
    loader = make_dataloader(tok, train.DEVICE_BATCH_SIZE, MAX_SEQ_LEN, device=device)
    accum = train.TOTAL_BATCH_SIZE // (train.DEVICE_BATCH_SIZE * MAX_SEQ_LEN)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step():
        for _ in range(accum):
            x, y, _ = next(loader)
            with autocast:
                loss = step_model(x, y)
            (loss / accum).backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        train.sync(device)

    t = time.perf_counter()
    step()
    first = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(steps):
        step()
    rate = steps * train.TOTAL_BATCH_SIZE / (time.perf_counter() - t)
    mfu = 100 * rate * model.flops_per_token() / train.peak_flops(device, dtype)
    return first, rate, mfu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    tok = Tokenizer.from_directory()
    print(f"profile={train.PROFILE} threads={torch.get_num_threads()} DEPTH={train.DEPTH} MODEL_DIM={train.MODEL_DIM} "
          f"vocab={tok.get_vocab_size()} seq={MAX_SEQ_LEN} batch={train.TOTAL_BATCH_SIZE} tokens/step")
    packing = [packing_rate(tok, 200) for _ in range(args.repeats)]
    eager = [training_rate(tok, args.steps, False) for _ in range(args.repeats)]
    p = statistics.median(packing)
    e = statistics.median(r for _, r, _ in eager)
    print(f"packing:        {p:12,.0f} tok/s   (median of {args.repeats}: {', '.join(f'{x:,.0f}' for x in packing)})")
    print(f"training eager: {e:12,.0f} tok/s   mfu {statistics.median(m for *_, m in eager):.1f}%   "
          f"(median of {args.repeats}: {', '.join(f'{r:,.0f}' for _, r, _ in eager)})")
    print(f"packing / training: {p / e:.0f}x")
    if args.compile:
        first, rate, mfu = training_rate(tok, args.steps, True)
        print(f"training compiled: first step (compilation) {first:.1f} s, then {rate:,.0f} tok/s, mfu {mfu:.1f}%")


if __name__ == "__main__":
    main()
