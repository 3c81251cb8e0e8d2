"""
The fixed half of autoresearch, what an agent reads: the constants, the tokenizer, the packing dataloader, the
val_bpb metric and `finish`, the contract between train.py and the harness.

    TIME_BUDGET = 300 s of wall clock per experiment, compilation included (runtime.DEFAULT_TIME_BUDGET)
    PROFILE, MAX_SEQ_LEN, VOCAB_SIZE, EVAL_TOKENS: the prepared data's, read from its manifest

Agents never edit this file, nor runtime.py below it (where the data lives, the budget's clock, the device,
dtype and compiler choices, the step lines the harness reads). The harness fingerprints both with the prepared
data's manifest, checks every result against that fingerprint, and evaluates every model with a clean copy of
them in its own process.

    python prepare.py                      # prepare the right default for this machine
    python prepare.py --dataset climbmix   # the public project's data (needs Hugging Face)
    python prepare.py --dataset local --path my_texts/

(Preparing itself, downloads, cleaning and tokenizer training, lives in autoresearch/data.py.)
"""

from __future__ import annotations

import base64
import bisect
import inspect
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from runtime import (PrepareError, cache_dir, compile_only, default_profile, harness_seed, load_manifest,
                     require_manifest, time_budget)

# ---------------------------------------------------------------------------
# Constants and profiles (DO NOT CHANGE)
# ---------------------------------------------------------------------------

# A profile is chosen when data is prepared and written into the manifest, so training and evaluation
# always read the same values.
PROFILES = {
    # The public project's values, sized for an H100.
    "gpu": dict(dataset="climbmix", vocab_size=8192, max_seq_len=2048, eval_tokens=40 * 524288),
    # Sized for 2 CPU cores: the evaluation takes a few seconds, see BENCHMARKS.md.
    "cpu": dict(dataset="gutenberg", vocab_size=4096, max_seq_len=256, eval_tokens=64 * 1024),
}

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|reserved_0|>", "<|reserved_1|>",
                  "<|reserved_2|>", "<|reserved_3|>", "<|reserved_4|>"]
BOS_TOKEN = "<|bos|>"

SPLITS = ("train", "val", "test")  # test is read by the harness alone
CHECK_SEED = 1234             # the fixed training rows both train.py and the harness score (see finish)
# A tag's scored rows are drawn from at most this many held-out tokens per split: all of the cpu profile's; on gpu
# the scored rows alone are 20M tokens (86 MB, against 3 KB train.py may carry), and a larger pool adds nothing.
POOL_TOKENS = 2**20


def __getattr__(name: str):
    """TIME_BUDGET, PROFILE, MAX_SEQ_LEN, ... read lazily, when train.py imports them: importing this file never
    fails, so `python prepare.py --force` repairs a damaged manifest, and never reads a manifest prepared later."""
    if name == "TIME_BUDGET":
        return time_budget()
    if name == "MANIFEST":
        return load_manifest()
    settings_keys = {"DATASET": "dataset", "VOCAB_SIZE": "vocab_size", "MAX_SEQ_LEN": "max_seq_len",
                     "EVAL_TOKENS": "eval_tokens"}
    if name == "PROFILE" or name in settings_keys:
        manifest = load_manifest()
        profile = manifest["profile"] if manifest else default_profile()
        if name == "PROFILE":
            return profile
        return (manifest or PROFILES[profile])[settings_keys[name]]
    raise AttributeError(f"module 'prepare' has no attribute {name!r}")

# ---------------------------------------------------------------------------
# Tokenizer: trained with rustbpe when the data is prepared, used through tiktoken, stored as plain JSON
# (no pickle, no torch.load).
# ---------------------------------------------------------------------------


class Tokenizer:
    def __init__(self, mergeable_ranks: dict[bytes, int], pattern: str, special_tokens: list[str]):
        import tiktoken

        n = len(mergeable_ranks)
        self.special_tokens = {tok: n + i for i, tok in enumerate(special_tokens)}
        self.enc = tiktoken.Encoding(name="autoresearch", pat_str=pattern, mergeable_ranks=mergeable_ranks,
                                     special_tokens=self.special_tokens)
        self.bos_token_id = self.special_tokens[BOS_TOKEN]
        # Bytes per token from each token's raw bytes: a token that is not valid UTF-8 on its own
        # (half of a multi-byte character) still counts its true length, not 3 bytes of U+FFFD.
        lengths = np.zeros(n + len(special_tokens), dtype=np.int32)
        for token, rank in mergeable_ranks.items():
            lengths[rank] = len(token)
        self.token_byte_lengths = lengths  # special tokens: 0 bytes, excluded from the metric

    @classmethod
    def from_json(cls, text: str) -> "Tokenizer":
        data = json.loads(text)
        ranks = {base64.b64decode(t): i for i, t in enumerate(data["tokens"])}
        return cls(ranks, data["pattern"], data["special_tokens"])

    @classmethod
    def from_directory(cls, root: Path | None = None) -> "Tokenizer":
        path = (root or cache_dir()) / "tokenizer.json"
        if not path.exists():
            raise PrepareError(f"No tokenizer at {path}. Run `python prepare.py` first.")
        return cls.from_json(path.read_text())

    def get_vocab_size(self) -> int:
        return len(self.token_byte_lengths)

    def get_bos_token_id(self) -> int:
        return self.bos_token_id

    def encode(self, text: str | list[str], prepend_bos: bool = False, num_threads: int = 8):
        if isinstance(text, str):
            ids = self.enc.encode_ordinary(text)
            return [self.bos_token_id] + ids if prepend_bos else ids
        batch = self.enc.encode_ordinary_batch(text, num_threads=num_threads)
        return [[self.bos_token_id] + ids for ids in batch] if prepend_bos else batch

    def decode(self, ids) -> str:
        return self.enc.decode(list(ids))

    def get_token_bytes(self, device="cpu"):
        import torch
        return torch.tensor(self.token_byte_lengths, dtype=torch.int64, device=device)

# ---------------------------------------------------------------------------
# Dataloader: BOS-aligned best-fit packing. Every row starts with BOS; whole documents are packed where they
# fit (the largest that fits first) and the shortest one is cropped to fill the row exactly: no padding.
# ---------------------------------------------------------------------------


class _Documents:
    """All documents of a split as (tokens, offsets) arrays, memory-mapped."""

    def __init__(self, prefixes: list[Path]):
        self.tokens, starts, lengths = [], [], []
        for p in prefixes:
            offsets = np.load(p.with_name(p.name + ".offsets.npy"))
            self.tokens.append(np.load(p.with_name(p.name + ".tokens.npy"), mmap_mode="r"))
            starts.append(offsets[:-1])
            lengths.append(np.diff(offsets))
        self.shard = np.concatenate([np.full(len(s), i, dtype=np.int32) for i, s in enumerate(starts)])
        self.start = np.concatenate(starts)
        self.length = np.concatenate(lengths)

    def __len__(self):
        return len(self.length)

    def get(self, i: int, n: int) -> np.ndarray:
        s = self.start[i]
        return self.tokens[self.shard[i]][s:s + n]


def pack_rows(docs: _Documents, order, row_len: int, n_rows: int, state: dict, buffer_size: int = 1000):
    """Fill n_rows rows of row_len tokens from documents in `order`, continuing from `state`
    (the position in `order` and the buffer of waiting documents). Returns an int64 array."""
    out = np.empty((n_rows, row_len), dtype=np.int64)
    buf_len, buf_idx = state["buf_len"], state["buf_idx"]  # sorted by length, parallel lists
    for r in range(n_rows):
        while len(buf_len) < buffer_size and state["pos"] < len(order):
            d = int(order[state["pos"]])
            state["pos"] += 1
            k = bisect.bisect_left(buf_len, docs.length[d])
            buf_len.insert(k, int(docs.length[d]))
            buf_idx.insert(k, d)
        if not buf_len:
            raise StopIteration
        filled = 0
        while filled < row_len:
            remaining = row_len - filled
            k = bisect.bisect_right(buf_len, remaining) - 1
            if k >= 0:  # the largest document that fits whole
                n = buf_len.pop(k)
                d = buf_idx.pop(k)
            else:  # nothing fits: crop the shortest
                if not buf_len:
                    raise StopIteration
                n = remaining
                buf_len.pop(0)
                d = buf_idx.pop(0)
            out[r, filled:filled + n] = docs.get(d, n)
            filled += n
            if not buf_len and filled < row_len:
                if state["pos"] >= len(order):
                    raise StopIteration
                d = int(order[state["pos"]])
                state["pos"] += 1
                buf_len.append(int(docs.length[d]))
                buf_idx.append(d)
    return out


def split_prefixes(split: str, root: Path | None = None) -> list[Path]:
    """The token-file prefixes of a split. The training process sees the training split only."""
    root = root or cache_dir()
    manifest = load_manifest(root) or require_manifest()
    data_dir = root / manifest["data_dir"]
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    if split == "train":
        prefixes = sorted(p.with_name(p.name[:-len(".tokens.npy")]) for p in data_dir.glob("train_*.tokens.npy"))
        if not prefixes:
            raise PrepareError(f"No training shards in {data_dir}; run `python prepare.py --force`.")
    else:
        prefixes = [data_dir / split]
        if not (data_dir / f"{split}.tokens.npy").exists() and f"{manifest['data_dir']}/{split}.tokens.npy" in \
                manifest["files"]:
            raise PrepareError(f"The {split} split is not visible here: the training process sees the training "
                               "split only, and the harness evaluates the model (see program.md).")
    for p in prefixes:
        if not p.with_name(p.name + ".tokens.npy").exists():
            raise PrepareError(f"{p.name} is not tokenized; run `python prepare.py --force`.")
    return prefixes


_data_seed: list[int] = []       # the seed make_dataloader actually used, recorded by finish() in result.json


def make_dataloader(tokenizer: Tokenizer, batch_size: int, seq_len: int, split: str = "train",
                    device="cpu", seed: int = 0):
    """Infinite iterator of (inputs, targets, epoch): int64 tensors of shape (batch_size, seq_len).
    Deterministic for a seed; documents are reshuffled every epoch. Under the harness the data order is the
    harness's: its seed (AUTORESEARCH_SEED) wins over the one passed, so repeats of a configuration are
    independent samples whatever train.py does."""
    import torch

    if harness_seed() is not None:
        seed = harness_seed()
    _data_seed.append(seed)
    if compile_only():  # the compile phase sees no data: random tokens of the same shape
        gen = torch.Generator().manual_seed(seed)
        while True:
            batch = torch.randint(0, tokenizer.get_vocab_size(), (batch_size, seq_len + 1), generator=gen)
            batch = batch.to(device)
            yield batch[:, :-1], batch[:, 1:], 1
    docs = _Documents(split_prefixes(split))
    if len(docs) == 0:
        raise PrepareError(f"The {split} split has no documents; run `python prepare.py --force`.")
    device = torch.device(device)
    pin = device.type == "cuda"
    epoch = 1
    order = np.random.default_rng([seed, epoch]).permutation(len(docs))
    state = {"pos": 0, "buf_len": [], "buf_idx": []}
    while True:
        try:
            rows = pack_rows(docs, order, seq_len + 1, batch_size, state)
        except StopIteration:
            epoch += 1
            order = np.random.default_rng([seed, epoch]).permutation(len(docs))
            state = {"pos": 0, "buf_len": [], "buf_idx": []}
            continue
        batch = torch.from_numpy(rows)
        if pin:
            batch = batch.pin_memory()
        batch = batch.to(device, non_blocking=pin)
        yield batch[:, :-1], batch[:, 1:], epoch

# ---------------------------------------------------------------------------
# Evaluation (DO NOT CHANGE): the rows every model is scored on, and bits per byte.
# ---------------------------------------------------------------------------


def evaluation_rows(split: str = "val", root: Path | None = None, draw: int | None = None) -> np.ndarray:
    """The rows of a held-out split (val or test) a model is scored on: eval_tokens // max_seq_len packed rows of
    max_seq_len + 1 tokens. `draw` is the tag's secret, which the harness keeps where neither the training nor a
    confined agent can read it: the rows are then drawn from the held-out pool (the rows of val and test, at most
    POOL_TOKENS of each; val's and test's rows disjoint), the same rows for every run of the tag. A train.py that
    carries held-out text cannot know which of it is scored, and carries little of the pool (docs/integrity.md:
    the arithmetic).
    Without a draw (a tag set up before it, or by hand): the split's first rows, documents in file order."""
    manifest = load_manifest(root) or require_manifest()
    seq_len, eval_tokens = manifest["max_seq_len"], manifest["eval_tokens"]
    n_rows = max(1, eval_tokens // seq_len)
    if draw is None:
        rows = _rows(split, root, seq_len + 1, n_rows)
    else:
        if split not in ("val", "test"):
            raise ValueError(f"split must be val or test, not {split!r}")
        per_split = max(n_rows, POOL_TOKENS // (seq_len + 1))
        pool = np.concatenate([_rows(s, root, seq_len + 1, per_split) for s in ("val", "test")])
        if len(pool) < 2 * n_rows:
            raise PrepareError(f"The held-out pool has {len(pool)} rows, too few for two draws of {n_rows}; "
                               "add data or prepare with a smaller --eval-tokens.")
        order = np.random.default_rng(draw).permutation(len(pool))
        rows = pool[np.sort(order[:n_rows] if split == "val" else order[n_rows:2 * n_rows])]
    if len(rows) < n_rows:
        raise PrepareError(f"The {split} split is too small for eval_tokens={eval_tokens}; add data or prepare "
                           "with a smaller --eval-tokens.")
    return rows


def _rows(split: str, root: Path | None, row_len: int, n_rows: int | None = None) -> np.ndarray:
    """A split's documents in file order, packed into rows: the first n_rows, or as many as it fills."""
    docs, state, rows = _Documents(split_prefixes(split, root)), {"pos": 0, "buf_len": [], "buf_idx": []}, []
    order = np.arange(len(docs))
    while n_rows is None or len(rows) < n_rows:
        try:
            rows.append(pack_rows(docs, order, row_len, 1, state)[0])
        except StopIteration:
            break
    return np.array(rows, dtype=np.int64).reshape(-1, row_len)


def check_rows(n_rows: int) -> np.ndarray:
    """n_rows fixed training rows (seed CHECK_SEED). train.py and the harness both score the model on them: the
    harness's number must reproduce train.py's, which proves the exported model is the trained one."""
    manifest = require_manifest()
    docs = _Documents(split_prefixes("train"))
    order = np.random.default_rng(CHECK_SEED).permutation(len(docs))
    try:
        return pack_rows(docs, order, manifest["max_seq_len"] + 1, n_rows, {"pos": 0, "buf_len": [], "buf_idx": []})
    except StopIteration:
        raise PrepareError(f"The training split is too small for {n_rows} check rows.") from None


def rows_bpb(logits_fn, rows: np.ndarray, token_bytes, batch_size: int, device="cpu") -> float:
    """Bits per byte of rows[:, 1:] given rows[:, :-1]: the sum of per-token cross-entropy (nats) over the
    sum of the targets' raw UTF-8 bytes, converted to bits. Special tokens (0 bytes) count in neither sum.
    logits_fn maps (batch_size, T) int64 tokens to (batch_size, T, vocab) logits; a short last batch is
    padded with its own rows, so a graph exported for a fixed batch size takes every batch. Sums are kept in
    float64 on the CPU (MPS has no float64)."""
    import torch
    import torch.nn.functional as F

    vocab = int(token_bytes.shape[0])
    total_nats, total_bytes = 0.0, 0
    for i in range(0, rows.shape[0], batch_size):
        batch = torch.from_numpy(rows[i:i + batch_size])
        n = batch.shape[0]
        if n < batch_size:
            batch = batch[torch.arange(batch_size) % n]
        x, y = batch[:, :-1], batch[:n, 1:]
        logits = logits_fn(x.to(device))
        if tuple(logits.shape) != (batch_size, x.shape[1], vocab):
            raise PrepareError(f"The model returned logits of shape {tuple(logits.shape)} for inputs of shape "
                               f"{tuple(x.shape)}; expected {(batch_size, x.shape[1], vocab)}.")
        loss = F.cross_entropy(logits[:n].float().reshape(-1, vocab), y.reshape(-1).to(logits.device),
                               reduction="none").cpu().double()
        nbytes = token_bytes[y.reshape(-1)]
        total_nats += loss[nbytes > 0].sum().item()
        total_bytes += int(nbytes.sum())
    return total_nats / (math.log(2) * total_bytes)


def autocast_for(device_type: str, dtype_name: str):
    """The autocast context a model was trained (and exported, and is evaluated) under."""
    import torch
    dtypes = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype_name not in dtypes:
        raise PrepareError(f"dtype {dtype_name!r} is not one of {sorted(dtypes)}.")
    return nullcontext() if dtypes[dtype_name] is None else torch.autocast(device_type, dtype=dtypes[dtype_name])


def evaluate_bpb(model, batch_size: int, split: str = "val", dtype: str = "float32") -> float:
    """val_bpb of a live model (model(idx) -> logits), as train.py reports it when run by hand. Under the
    harness the validation split is not visible to train.py, and the harness scores the exported model."""
    import torch

    device = next(model.parameters()).device
    token_bytes = Tokenizer.from_directory().get_token_bytes()
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast_for(device.type, dtype):
        bpb = rows_bpb(model, evaluation_rows(split), token_bytes, batch_size, device)
    model.train(was_training)
    return bpb

# ---------------------------------------------------------------------------
# The contract between train.py and the harness (DO NOT CHANGE). train.py ends by calling
# finish(model, stats, batch_size). It saves the exported forward pass (torch.export) as a JSON graph and
# its tensors as safetensors: no pickle, and nothing of train.py's code is needed to run it.
# ---------------------------------------------------------------------------

RESULT_FILE = "result.json"
GRAPH_FILE = "model.graph.json"         # torch.export's serialized graph (JSON)
TENSORS_FILE = "model.safetensors"      # the graph's parameters and buffers, then "constant/"-prefixed constants
CONSTANT_PREFIX = "constant/"
# What result.json must hold, and of what type; train.py may add more.
RESULT_SCHEMA = {"memory_gb": (int, float), "num_steps": int, "training_seconds": (int, float),
                 "time_budget": (int, float), "check_bpb": (int, float), "device": str, "dtype": str,
                 "seed": int}


def final_line(val_bpb: float, memory_gb: float, steps: int) -> str:
    return f"val_bpb={val_bpb:.4f} | memory_gb={memory_gb:.1f} | steps={steps}"


def save_exported(program, run_dir: Path) -> None:
    from safetensors.torch import save_file
    from torch._export.serde.serialize import serialize

    # The weights go to safetensors below; torch 2.11 (and older) has no switch and pickles them into the artifact too
    skip = {k: False for k in ("serialize_state_dict", "serialize_constants", "serialize_example_inputs")
            if k in inspect.signature(serialize).parameters}
    artifact = serialize(program, **skip)
    tensors = {k: v.detach().cpu().contiguous() for k, v in program.state_dict.items()}
    tensors.update({CONSTANT_PREFIX + k: v.detach().cpu().contiguous() for k, v in program.constants.items()})
    save_file(tensors, str(run_dir / TENSORS_FILE))
    (run_dir / GRAPH_FILE).write_bytes(artifact.exported_program)


def finish(model, stats: dict, batch_size: int) -> dict:
    """End a training run: export model's forward pass (tokens (batch_size, max_seq_len) -> logits) with its
    weights, score it on the fixed check rows, write result.json and, when the validation split is visible
    (a run by hand), print val_bpb. stats (runtime.Budget.stats(), and what train.py adds) must hold the
    RESULT_SCHEMA keys but those finish fills itself: check_bpb, and seed, device, time_budget where missing.
    Pass the plain module, not a torch.compile wrapper."""
    import torch

    if compile_only():  # the compile phase ends here: the cache is filled, nothing is exported or scored
        print("compile phase done", flush=True)
        return dict(stats)
    run_dir = Path(os.environ.get("AUTORESEARCH_RUN_DIR") or "runs/latest")
    run_dir.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    autocast = autocast_for(device.type, stats["dtype"])
    model.eval()
    rows = check_rows(batch_size)
    x = torch.from_numpy(rows[:, :-1]).to(device)
    result = dict(stats)
    result.setdefault("seed", harness_seed() if harness_seed() is not None else 0)
    result.setdefault("device", device.type)
    result.setdefault("time_budget", time_budget())
    result.setdefault("profile", __getattr__("PROFILE"))
    result["data_seed"] = _data_seed[-1] if _data_seed else None  # what the data order used, not train.py's word
    t0 = time.time()
    try:
        with torch.no_grad(), autocast:
            program = torch.export.export(model, (x,), strict=False)
        save_exported(program, run_dir)
    except Exception as e:  # reported by the harness as the run's crash reason
        result["export_error"] = f"{type(e).__name__}: {e}"[:2000]
    result["export_seconds"] = time.time() - t0
    token_bytes = Tokenizer.from_directory().get_token_bytes()
    with torch.no_grad(), autocast:
        result["check_bpb"] = rows_bpb(model, rows, token_bytes, batch_size, device)
    try:
        t0 = time.time()
        result["val_bpb"] = evaluate_bpb(model, batch_size, "val", stats["dtype"])
        result["eval_seconds"] = time.time() - t0
    except PrepareError:
        result["val_bpb"] = None  # under the harness: it evaluates the exported model itself
    tmp = run_dir / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, run_dir / RESULT_FILE)
    if result.get("export_error"):
        print(f"EXPORT_FAILED {result['export_error']}", flush=True)
    if result["val_bpb"] is not None:
        print(final_line(result["val_bpb"], result["memory_gb"], result["num_steps"]), flush=True)
    else:
        print(f"training done: check_bpb={result['check_bpb']:.6f}; the harness evaluates val_bpb", flush=True)
    return result


if __name__ == "__main__":  # `python prepare.py`: preparing is the harness's (autoresearch/data.py); this file,
    # imported, never imports the harness
    from autoresearch.data import main
    sys.exit(main())
