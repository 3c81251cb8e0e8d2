"""`autoresearch report`: progress.png (every experiment a dot, kept ones labelled, the running best as a step
line) and a short text summary, with each kept model's test_bpb: the held-out split that only the harness
reads, so that over-fitting the validation set through many keeps shows."""

from __future__ import annotations

import json
from pathlib import Path

from autoresearch import ledger


def test_scores(rows: list[ledger.Row], runs_dir: Path) -> dict[str, float]:
    """run_id -> test_bpb, from the harness's evaluation.json of each kept run that has one."""
    out = {}
    for r in rows:
        try:
            out[r.run_id] = float(json.loads((runs_dir / r.run_id / "evaluation.json").read_text())["test_bpb"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def configurations(rows: list[ledger.Row], repo: Path | None) -> dict[str, list[ledger.Row]]:
    """Finished runs grouped by configuration: the git blob of the train.py they ran (None without git)."""
    from autoresearch import git
    groups: dict[str, list[ledger.Row]] = {}
    blobs: dict[str, str] = {}
    for r in rows:
        if r.status not in ("keep", "discard") or repo is None:
            continue
        if r.commit not in blobs:
            try:
                blobs[r.commit] = git.git(repo, "rev-parse", f"{r.commit}:train.py")
            except git.GitError:
                blobs[r.commit] = r.commit  # a commit git no longer has: its own configuration
        groups.setdefault(blobs[r.commit], []).append(r)
    return groups


def noise_lines(groups: dict[str, list[ledger.Row]]) -> list[str]:
    """The pooled run-to-run noise, and every configuration that ran more than once as mean +- sem."""
    from autoresearch.decide import pooled_noise, sem
    noise = pooled_noise({k: [r.val_bpb for r in rs] for k, rs in groups.items()})
    if noise is None:
        return ["noise: no configuration ran more than once yet, so single-run differences cannot be judged"]
    lines = [f"noise: one run's val_bpb varies by {noise.sigma:.4f} (std, pooled over {noise.df} repeats); one "
             f"run against one other must differ by {2.33 * noise.sigma:.4f} to be 95% sure",
             "configurations run more than once (mean +- sem, runs, commits):"]
    repeated = sorted((rs for rs in groups.values() if len(rs) > 1), key=lambda rs: sum(r.val_bpb for r in rs) / len(rs))
    for rs in repeated:
        values = [r.val_bpb for r in rs]
        lines.append(f"  {sum(values) / len(values):.6f} +- {sem(values, noise):.6f}  n={len(values)}  "
                     f"{','.join(sorted({r.commit for r in rs}))}  {rs[0].description}")
    return lines


def summarize(rows: list[ledger.Row], tests: dict[str, float] | None = None,
              groups: dict[str, list[ledger.Row]] | None = None) -> str:
    counts = {s: sum(r.status == s for r in rows) for s in ledger.STATUSES}
    lines = [f"{len(rows)} experiments: " + ", ".join(f"{counts[s]} {s}" for s in ledger.STATUSES if counts[s])]
    kept = [r for r in rows if r.status == "keep"]
    if not kept:
        return "\n".join(lines + ["no kept result yet"])
    tests = tests or {}
    baseline, best = kept[0], min(kept, key=lambda r: r.val_bpb)
    gain = baseline.val_bpb - best.val_bpb
    lines.append(f"baseline val_bpb {baseline.val_bpb:.6f} -> best {best.val_bpb:.6f} at {best.commit} "
                 f"({gain:+.6f}, {100 * gain / baseline.val_bpb:.2f}% better)")
    if baseline.run_id in tests and best.run_id in tests:
        test_gain = tests[baseline.run_id] - tests[best.run_id]
        lines.append(f"held-out test_bpb {tests[baseline.run_id]:.6f} -> {tests[best.run_id]:.6f} ({test_gain:+.6f}); "
                     "a test gain well below the validation gain means the keeps fit the validation set")
    lines.append("kept changes, in order (commit, val_bpb, test_bpb, description):")
    lines += [f"  {r.commit}  {r.val_bpb:.6f}  " + (f"{tests[r.run_id]:.6f}" if r.run_id in tests else "       -") +
              f"  {r.description}" for r in kept]
    if groups is not None:
        lines += noise_lines(groups)
    return "\n".join(lines)


def plot(rows: list[ledger.Row], out: Path, title: str = "autoresearch progress") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 6), dpi=120)
    xs = list(range(1, len(rows) + 1))
    done = [(x, r) for x, r in zip(xs, rows) if r.status in ("keep", "discard") and r.val_bpb > 0]
    discarded = [(x, r.val_bpb) for x, r in done if r.status == "discard"]
    kept = [(x, r) for x, r in done if r.status == "keep"]
    if discarded:
        ax.scatter(*zip(*discarded), s=18, color="#b0b0b0", label="discarded", zorder=2)
    if kept:
        ax.scatter([x for x, _ in kept], [r.val_bpb for _, r in kept], s=42, color="#2a9d4a", label="kept", zorder=3)
        # the running best as a step line, carried to the last experiment
        steps_x, steps_y, best = [], [], None
        for x, r in kept:
            best = r.val_bpb if best is None else min(best, r.val_bpb)
            steps_x.append(x)
            steps_y.append(best)
        steps_x.append(xs[-1])
        steps_y.append(steps_y[-1])
        ax.step(steps_x, steps_y, where="post", color="#2a9d4a", linewidth=1.5, label="best so far", zorder=1)
        for x, r in kept:
            text = r.description if len(r.description) <= 40 else r.description[:37] + "..."
            ax.annotate(text, (x, r.val_bpb), xytext=(4, 6), textcoords="offset points", fontsize=7, rotation=20,
                        color="#1d6b33")
    crashes = [x for x, r in zip(xs, rows) if r.status == "crash"]
    if crashes and done:
        top = max(r.val_bpb for _, r in done)
        ax.scatter(crashes, [top] * len(crashes), marker="x", color="#d1495b", s=24, label="crash", zorder=2)
    if done:
        values = sorted(r.val_bpb for _, r in done)
        lo, hi = values[0], values[min(len(values) - 1, int(0.9 * len(values)))]  # outliers don't flatten the view
        pad = max(hi - lo, 1e-3) * 0.15
        ax.set_ylim(lo - pad, hi + 2 * pad)
    ax.set_xlabel("experiment")
    ax.set_ylabel("val_bpb (lower is better)")
    ax.set_title(f"{title}: {len(rows)} experiments, {len(kept)} kept")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def main(args) -> str:
    from autoresearch import run

    if args.results:
        path = Path(args.results)
        tag = args.tag
    else:
        repo = run.repo_root()
        path = repo / "results.tsv"
        tag = args.tag
        if tag is None:
            from autoresearch import git
            branch = git.branch(repo)
            tag = branch[len(run.BRANCH_PREFIX):] if branch.startswith(run.BRANCH_PREFIX) else None
    rows = ledger.read(path, tag)
    if not rows:
        raise run.HarnessError(f"{path} has no experiments" + (f" for tag {tag}" if tag else "") + ".")
    out = plot(rows, Path(args.out), f"autoresearch {tag}" if tag else "autoresearch")
    tests = test_scores([r for r in rows if r.status == "keep"], path.parent / run.STATE_DIR / "runs")
    repo = path.parent if (path.parent / ".git").exists() else None
    return summarize(rows, tests, configurations(rows, repo) if repo else None) + f"\nplot: {out}"
