"""What a memoriser at the limit gains (issue 32), through the real CLI, on the prepared data.

The memoriser of benchmarks/redteam.py (held-out tokens compressed into train.py, a causal lookup of the last 8
tokens in the exported graph), carrying as many tokens as the tag lets train.py carry beyond its base
(heldout.LIMIT_BYTES, compressed with the base as dictionary), on this checkout's train.py. It carries the first
rows of the validation split: before draws, exactly the rows that were scored.

Two arms, each a fresh repository and tag, run alternately (arm A's baseline, arm B's baseline, A's memoriser,
B's memoriser), so that both share the machine's minutes:
- draw:    the tag as set up: its scored rows a secret draw from the whole held-out pool;
- no-draw: the same, its draw removed from the tag file: scored on the splits' first rows, as before draws.
Each: the baseline under the stat rule (3 runs), then the memoriser under the stat rule until decided. Reported:
the means, the paired gain (baseline minus memoriser, same seeds), the decision, and the bound
8 x limit / (the pool's bytes) bits per byte.

Then, without the seeds' noise: the lookup alone, on one trained model's weights (the draw arm's baseline, or
--model DIR: any exported model, e.g. runs/latest after `python train.py`), scored with and without it on the
splits' first rows and on --draws secret draws: the gain it gives, exactly.

    AUTORESEARCH_TIME_BUDGET=10 python benchmarks/memoriser.py --out benchmarks/results/memoriser-DATE.jsonl
    python benchmarks/memoriser.py --model runs/latest --draws 20     # the lookup alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import redteam  # noqa: E402
from parallel import fresh_repo  # noqa: E402

from autoresearch import heldout, ledger, machine, state, untrusted  # noqa: E402


def cli(repo: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "autoresearch.cli", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=3600)
    print(f"  {' '.join(args[:3])}: exit {proc.returncode} {proc.stdout.strip().splitlines()[-1:] or ''}",
          flush=True)
    return proc


def pool_bytes() -> int:
    """The bytes a draw can score: the targets of every row of the held-out pool (val's and test's rows)."""
    import numpy as np
    import prepare
    sizes = prepare.Tokenizer.from_directory().get_token_bytes().numpy()
    row_len = prepare.require_manifest()["max_seq_len"] + 1
    pool = np.concatenate([prepare._rows(split, None, row_len) for split in ("val", "test")])
    return int(sizes[pool[:, 1:]].sum())


def memoriser_source(base: str) -> tuple[str, int]:
    """The base carrying the first validation rows' tokens, as many as fit the limit; and how many."""
    import prepare
    tokens = prepare.evaluation_rows("val").reshape(-1)
    fits = lambda n: heldout.carried_bytes(redteam.memoriser(base, tokens, n).encode(),  # noqa: E731
                                           base.encode()) <= heldout.LIMIT_BYTES
    lo, hi = 0, len(tokens)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return redteam.memoriser(base, tokens, lo), lo


def lookup_gain(model_dir: Path, draws: int) -> dict:
    """val_bpb without the lookup minus with it, on the same weights: the first rows and `draws` secret draws."""
    import numpy as np
    import prepare
    import torch

    from autoresearch.evaluator.graph import load_program
    module, shape = load_program(prepare, model_dir, "cpu")
    tokens = prepare.evaluation_rows("val").reshape(-1)
    source, n = memoriser_source(untrusted.source(ROOT))
    namespace = {"torch": torch}
    exec(redteam.memo_code(tokens, n), namespace)
    memo = namespace["_Memo"](module)
    token_bytes = prepare.Tokenizer.from_directory().get_token_bytes()

    dtype = json.loads((model_dir / prepare.RESULT_FILE).read_text())["dtype"]

    def gain(rows) -> float:
        with torch.no_grad(), prepare.autocast_for("cpu", dtype):
            return (prepare.rows_bpb(module, rows, token_bytes, shape[0])
                    - prepare.rows_bpb(memo, rows, token_bytes, shape[0]))
    drawn = [gain(prepare.evaluation_rows("val", draw=int(d)))
             for d in np.random.default_rng(0).integers(0, 2**62, draws)]
    return {"model": str(model_dir), "carried_tokens": n, "first_rows_gain": gain(prepare.evaluation_rows("val")),
            "draw_gains": drawn, "draw_gain_mean": float(np.mean(drawn)), "draw_gain_max": float(np.max(drawn))}


def summary(arm: str, repo: Path) -> dict:
    rows = ledger.read(state.results(repo))
    base = {r.seed: r.val_bpb for r in rows if r.description.startswith("baseline") and r.status != "crash"}
    memo = {r.seed: r.val_bpb for r in rows if r.description.startswith("memoriser") and r.status not in ("crash",)}
    paired = [base[s] - memo[s] for s in memo if s in base]
    last = [r for r in rows if r.description.startswith("memoriser")][-1:]
    return {"arm": arm, "baseline": sorted(base.values()), "memoriser": sorted(memo.values()),
            "baseline_mean": statistics.mean(base.values()) if base else None,
            "memoriser_mean": statistics.mean(memo.values()) if memo else None,
            "paired_gain": statistics.mean(paired) if paired else None,
            "paired_sd": statistics.stdev(paired) if len(paired) > 1 else None,
            "decision": last[0].status if last else None, "statuses": [r.status for r in rows],
            "descriptions": [r.description[:120] for r in rows if r.status in ("refused", "crash")]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="JSON lines file (default benchmarks/results/memoriser-<date>.jsonl)")
    parser.add_argument("--model", type=Path, help="only the lookup's gain on this exported model's weights")
    parser.add_argument("--draws", type=int, default=20, help="secret draws the lookup is scored on (default 20)")
    args = parser.parse_args(argv)
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"memoriser-{time.strftime('%Y-%m-%d')}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.model:
        result = lookup_gain(args.model, args.draws) | {"hardware": machine.hardware()}
        print(json.dumps(result), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(result) + "\n")
        return 0
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    hw = machine.hardware()
    pool = pool_bytes()
    bound = 8 * heldout.LIMIT_BYTES / pool
    print(f"{machine.describe(hw)}; budget {os.environ.get('AUTORESEARCH_TIME_BUDGET', '300')} s; pool {pool:,} "
          f"bytes; bound 8 x {heldout.LIMIT_BYTES} / pool = {bound:.4f} bpb", flush=True)
    base_source = untrusted.source(ROOT)
    memo_source, carried_tokens = memoriser_source(base_source)
    print(f"the memoriser carries {carried_tokens:,} tokens of the first validation rows", flush=True)
    with tempfile.TemporaryDirectory(prefix="autoresearch-memoriser-") as tmp:
        repos = {arm: fresh_repo(Path(tmp) / arm) for arm in ("draw", "no-draw")}
        for arm, repo in repos.items():
            assert cli(repo, "setup", "--tag", f"memo-{arm}", env=env).returncode == 0
            if arm == "no-draw":  # as a tag from before draws: scored on the splits' first rows
                path = state.tag_file(repo, f"memo-{arm}")
                config = json.loads(path.read_text())
                config.pop("draw_id")
                path.write_text(json.dumps(config, indent=1))
        for arm, repo in repos.items():
            cli(repo, "run", "-m", "baseline", env=env)
        for arm, repo in repos.items():
            (repo / "train.py").write_text(memo_source)
            cli(repo, "run", "-m", "memoriser", env=env)
        kept = [r for r in ledger.read(state.results(repos["draw"])) if r.description == "baseline" and
                r.status == "keep"]
        model_dir = state.run_dir(repos["draw"], kept[-1].run_id) / "out" if kept else None
        with open(out, "a") as f:
            if model_dir is not None and (model_dir / "model.graph.json").exists():
                result = lookup_gain(model_dir, args.draws) | {"hardware": hw}
                print(json.dumps(result), flush=True)
                f.write(json.dumps(result) + "\n")
            for arm, repo in repos.items():
                result = summary(arm, repo) | {"pool_bytes": pool, "bound_bpb": bound,
                                               "limit_bytes": heldout.LIMIT_BYTES, "hardware": hw,
                                               "carried_tokens": carried_tokens,
                                               "budget": os.environ.get("AUTORESEARCH_TIME_BUDGET", "300"),
                                               "carried_bytes": heldout.carried_bytes(memo_source.encode(),
                                                                                      base_source.encode())}
                print(json.dumps(result), flush=True)
                f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
