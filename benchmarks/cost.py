"""How the cost of an experiment grows with the model, the vocabulary and the evaluation, on this machine.

    python benchmarks/cost.py [--steps 30] [--shapes 4x128 4x192 6x128 4x256 8x256] [--vocabs 2048 8192]

For each configuration, in this process, the way train.py runs it (its GPT, its optimizers, torch.compile and
the autocast dtype train.py picks): the first step (a cold torch.compile when the shape is new to the cache,
which the budget pays), the steady tokens per second and MFU over --steps steps, and then what lies outside
the budget and grows with the model: the export (prepare.finish's torch.export) and one evaluation pass of the
exported model over the prepared validation rows (65,536 tokens for the cpu profile). Vocabulary rows reuse
the prepared tokens (a larger vocabulary costs the same for any ids; for a smaller one the ids are folded
into it): the cost is the embedding, the lm_head and the softmax. The evaluation rows time the default
model's pass over 1/4 to 2x the prepared validation tokens (rows repeated past 1x). The fixed parts (imports,
the harness) are in benchmarks/overhead.py. Run it alone.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from autoresearch import untrusted  # noqa: E402

# the reviewed train.py, imported from a scratch directory: never the work tree's (docs/integrity.md)
REVIEWED = untrusted.write(Path(__file__).resolve().parent.parent, Path(tempfile.mkdtemp()))
sys.path.insert(0, str(REVIEWED.parent))
import train  # noqa: E402  (sets flush-denormal first)
import runtime  # noqa: E402
import prepare  # noqa: E402
from prepare import MAX_SEQ_LEN, Tokenizer, make_dataloader  # noqa: E402


def build(depth, width, vocab, compiled, dtype):
    cfg = train.GPTConfig(vocab, MAX_SEQ_LEN, depth, width, train.HEAD_DIM, train.WINDOW_PATTERN, train.SOFTCAP)
    torch.manual_seed(0)
    model = train.GPT(cfg)
    model.init_weights()
    return model, train.make_optimizers(model, dtype, compiled)


def measure(tok, depth, width, vocab, steps, compiled, dtype):
    torch._dynamo.reset()  # one process compiles many shapes: past dynamo's 8 recompiles a function runs eager
    model, optimizers = build(depth, width, vocab, compiled, dtype)
    step_model = torch.compile(model, dynamic=False) if compiled else model
    loader = make_dataloader(tok, train.DEVICE_BATCH_SIZE, MAX_SEQ_LEN, seed=1)
    accum = train.TOTAL_BATCH_SIZE // (train.DEVICE_BATCH_SIZE * MAX_SEQ_LEN)
    autocast = torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32)

    def step():
        for _ in range(accum):
            x, y, _ = next(loader)
            x, y = x % vocab, y % vocab
            with autocast:
                loss = step_model(x, y)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)

    t = time.perf_counter()
    step()
    first = time.perf_counter() - t
    step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    rate = steps * train.TOTAL_BATCH_SIZE / (time.perf_counter() - t)
    mfu = 100 * rate * model.flops_per_token() / runtime.peak_flops(torch.device("cpu"), dtype)
    export_s, program = export(model, dtype)
    rows = prepare.evaluation_rows("val") % vocab
    eval_s = evaluate(program, rows, vocab, dtype)
    return dict(params=model.num_params(), first=first, rate=rate, mfu=mfu, export=export_s, eval=eval_s,
                program=program)


def export(model, dtype):
    model.eval()
    x = torch.from_numpy(prepare.check_rows(train.EVAL_BATCH_SIZE)[:, :-1])
    autocast = torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32)
    t = time.perf_counter()
    with torch.no_grad(), autocast, tempfile.TemporaryDirectory() as tmp:
        program = torch.export.export(model, (x,), strict=False)
        prepare.save_exported(program, Path(tmp))
    return time.perf_counter() - t, program.module()


def evaluate(module, rows, vocab, dtype):
    token_bytes = torch.ones(vocab, dtype=torch.int64)  # the cost does not depend on the byte counts
    autocast = torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32)
    with torch.no_grad(), autocast:
        prepare.rows_bpb(module, rows[:train.EVAL_BATCH_SIZE], token_bytes, train.EVAL_BATCH_SIZE)  # warm-up
        t = time.perf_counter()
        prepare.rows_bpb(module, rows, token_bytes, train.EVAL_BATCH_SIZE)
        return time.perf_counter() - t


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--shapes", nargs="*", default=["4x128", "4x192", "6x128", "4x256", "8x256"])
    parser.add_argument("--vocabs", type=int, nargs="*", default=[2048, 8192])
    parser.add_argument("--eval-fractions", type=float, nargs="*", default=[0.25, 0.5, 1, 2])
    args = parser.parse_args()
    tok = Tokenizer.from_directory()
    device = torch.device("cpu")
    dtype, dtype_reason = runtime.pick_dtype(device)
    compiled, compile_reason = runtime.pick_compile(device, train.USE_COMPILE)
    vocab = tok.get_vocab_size()
    print(f"profile={train.PROFILE} threads={torch.get_num_threads()} seq={MAX_SEQ_LEN} vocab={vocab} "
          f"batch={train.TOTAL_BATCH_SIZE} tokens/step eval rows={train.EVAL_BATCH_SIZE}\n"
          f"dtype: {dtype_reason}\ncompile: {compile_reason}\n")
    print("| configuration | parameters | first step s | tok/s | MFU % | export s | evaluation s |")
    print("|---|---|---|---|---|---|---|")
    default = None
    rows = [(f"{s} (depth x width)", *map(int, s.split("x")), vocab) for s in args.shapes]
    rows += [(f"vocabulary {v}", train.DEPTH, train.MODEL_DIM, v) for v in args.vocabs]
    for name, depth, width, v in rows:
        m = measure(tok, depth, width, v, args.steps, compiled, dtype)
        if (depth, width, v) == (train.DEPTH, train.MODEL_DIM, vocab):
            default = m["program"]
        print(f"| {name} | {m['params']:,} | {m['first']:.1f} | {m['rate']:,.0f} | {m['mfu']:.1f} | "
              f"{m['export']:.2f} | {m['eval']:.2f} |", flush=True)
    if default is None:
        default = measure(tok, train.DEPTH, train.MODEL_DIM, vocab, 1, compiled, dtype)["program"]
    val = prepare.evaluation_rows("val")
    print(f"\n| evaluation tokens | rows of {MAX_SEQ_LEN} | evaluation s (median of 3) |")
    print("|---|---|---|")
    for fraction in args.eval_fractions:
        n = max(train.EVAL_BATCH_SIZE, int(round(val.shape[0] * fraction)))
        subset = np.resize(val, (n, val.shape[1]))  # repeats the rows past 1x
        seconds = statistics.median(evaluate(default, subset, vocab, dtype) for _ in range(3))
        print(f"| {n * MAX_SEQ_LEN:,} | {n} | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
