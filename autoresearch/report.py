"""`autoresearch report`: progress.png (every experiment a dot, kept ones labelled, the running best as a step
line) and a short text summary, with each kept model's test_bpb: the held-out split that only the harness
reads, so that over-fitting the validation set through many keeps shows."""

from __future__ import annotations

import json
from pathlib import Path

from statistics import fmean

from autoresearch import decide, descriptions, errors, ledger, state, tags, tokens, verified


def test_scores(rows: list[ledger.Row], runs_dir: Path) -> dict[str, float]:
    """run_id -> test_bpb, from the harness's evaluation.json of each kept run that has one."""
    out = {}
    for r in rows:
        try:
            out[r.run_id] = float(json.loads((runs_dir / r.run_id / state.EVALUATION).read_text())["test_bpb"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def configurations(rows: list[ledger.Row], repo: Path | None) -> dict[str, list[ledger.Row]]:
    """Finished runs grouped by configuration: the git blob of the train.py they ran (the ledger's `config`;
    for rows written before it existed, looked up in git, or the commit itself without git)."""
    from autoresearch import git
    groups: dict[str, list[ledger.Row]] = {}
    blobs: dict[str, str] = {}
    for r in decide.finished(rows):
        key = r.config
        if not key:
            if r.commit not in blobs:
                blobs[r.commit] = r.commit
                if repo is not None:
                    try:
                        blobs[r.commit] = git.git(repo, "rev-parse", f"{r.commit}:train.py")[:12]
                    except git.GitError:
                        pass  # a commit git no longer has: its own configuration
            key = blobs[r.commit]
        groups.setdefault(key, []).append(r)
    return groups


def _values(groups: dict[str, list[ledger.Row]]) -> dict[str, list[float]]:
    return {k: [r.val_bpb for r in rs] for k, rs in groups.items()}


def _key_of(row: ledger.Row, groups: dict[str, list[ledger.Row]]) -> str | None:
    return next((k for k, rs in groups.items() if any(r.run_id == row.run_id for r in rs)), None)


def champion_text(rows: list[ledger.Row], groups: dict[str, list[ledger.Row]]) -> str:
    """The champion as mean +- sem over its runs, and the tag's noise."""
    champ = decide.champion(rows)
    if champ is None:
        return "champion: none yet"
    values = _values(groups)
    mine = values.get(_key_of(champ, groups) or "", [champ.val_bpb])
    noise = decide.pooled_noise(values)
    spread = f" +- {decide.sem(mine, noise):.6f}" if noise else ""
    noise_text = f" | noise {noise.sigma:.4f} per run ({noise.df} repeats)" if noise else " | noise: no repeats yet"
    return (f"champion: val_bpb {fmean(mine):.6f}{spread} over {len(mine)} run(s) at {champ.commit} "
            f"({descriptions.base_description(champ.description)}){noise_text}")


def noise_lines(groups: dict[str, list[ledger.Row]]) -> list[str]:
    """The pooled run-to-run noise, and every configuration that ran more than once as mean +- sem."""
    noise = decide.pooled_noise(_values(groups))
    if noise is None:
        return ["noise: no configuration ran more than once yet, so single-run differences cannot be judged"]
    lines = [f"noise: one run's val_bpb varies by {noise.sigma:.4f} (std, pooled over {noise.df} repeats); one "
             f"run against one other must differ by {2.33 * noise.sigma:.4f} to be 95% sure",
             "configurations run more than once (mean +- sem, runs, commits):"]
    repeated = sorted((rs for rs in groups.values() if len(rs) > 1), key=lambda rs: fmean(r.val_bpb for r in rs))
    for rs in repeated:
        values = [r.val_bpb for r in rs]
        lines.append(f"  {fmean(values):.6f} +- {decide.sem(values, noise):.6f}  n={len(values)}  "
                     f"{','.join(sorted({r.commit for r in rs}))}  {descriptions.base_description(rs[0].description)}")
    return lines


def kept_configurations(rows: list[ledger.Row], groups) -> list[tuple[str, ledger.Row]]:
    """Each configuration that was kept, once, in the order it was first kept: (its key, its first kept row)."""
    out, seen = [], set()
    for r in rows:
        if r.status == "keep":
            key = _key_of(r, groups) or r.run_id
            if key not in seen:
                seen.add(key)
                out.append((key, r))
    return out


def summarize(rows: list[ledger.Row], tests: dict[str, float] | None = None,
              groups: dict[str, list[ledger.Row]] | None = None) -> str:
    groups = groups if groups is not None else configurations(rows, None)
    counts = {s: sum(r.status == s for r in rows) for s in ledger.STATUSES}
    lines = [f"{len(rows)} runs: " + ", ".join(f"{counts[s]} {s}" for s in ledger.STATUSES if counts[s])]
    kept = kept_configurations(rows, groups)
    if not kept:
        return "\n".join(lines + ["no kept result yet"])
    tests = tests or {}
    values = _values(groups)
    noise = decide.pooled_noise(values)
    lines.append(champion_text(rows, groups))

    def mean(key):
        return fmean(values.get(key, [0.0]))

    def test_of(key):  # the test_bpb of the configuration's runs that have one, averaged
        scores = [tests[r.run_id] for r in groups.get(key, []) if r.run_id in tests]
        return fmean(scores) if scores else None

    (base_key, _), (champ_key, champ) = kept[0], (_key_of(decide.champion(rows), groups), decide.champion(rows))
    gain = mean(base_key) - mean(champ_key)
    lines.append(f"baseline val_bpb {mean(base_key):.6f} -> champion {mean(champ_key):.6f} at {champ.commit} "
                 f"({gain:+.6f}, {100 * gain / mean(base_key):.2f}% better; means over each one's runs)")
    if test_of(base_key) is not None and test_of(champ_key) is not None:
        lines.append(f"held-out test_bpb {test_of(base_key):.6f} -> {test_of(champ_key):.6f} "
                     f"({test_of(base_key) - test_of(champ_key):+.6f}); a test gain well below the validation gain "
                     "means the keeps fit the validation set")
    lines.append("kept configurations, in order (commit, mean val_bpb, +- sem, runs, test_bpb, description):")
    for key, r in kept:
        n = len(values.get(key, []))
        spread = f"{decide.sem(values[key], noise):.6f}" if noise and n else "       -"
        test = test_of(key)
        lines.append(f"  {r.commit}  {mean(key):.6f}  {spread}  n={n}  " + (f"{test:.6f}" if test is not None else "       -")
                     + f"  {descriptions.base_description(r.description)}")
    lines += noise_lines(groups)
    lines += flag_lines(rows)
    return "\n".join(lines)


def flag_lines(rows: list[ledger.Row]) -> list[str]:
    """The rows a reader should look at (decide.py's flags): a kept model whose test_bpb trails its val_bpb,
    repeats that came out identical."""
    return [f"FLAG {r.commit} ({r.status}, run {r.run_id}): {r.flags}" for r in rows if r.flags]


STYLES = {"discard": ("#b0b0b0", "discarded"), "confirm": ("#4a90c2", "confirming"), "keep": ("#2a9d4a", "kept"),
          "control": ("#d08c2a", "control (the base beside a candidate)")}


def champion_curve(rows: list[ledger.Row], key_of: dict[str, str]) -> tuple[list, list, list]:
    """The champion after each run (x: the run's place): its configuration's mean over the runs so far, and +- 1
    sem with the pooled noise."""
    cx, cm, cs = [], [], []
    seen_rows: list[ledger.Row] = []
    for x, r in enumerate(rows, 1):
        seen_rows.append(r)
        champ = decide.champion(seen_rows)
        if champ is None or champ.run_id not in key_of:
            continue
        so_far = {}
        for q in seen_rows:
            if q.run_id in key_of:
                so_far.setdefault(key_of[q.run_id], []).append(q.val_bpb)
        mine = so_far[key_of[champ.run_id]]
        noise = decide.pooled_noise(so_far)
        cx.append(x)
        cm.append(fmean(mine))
        cs.append(decide.sem(mine, noise) if noise else 0.0)
    return cx, cm, cs


def plot(rows: list[ledger.Row], out: Path, title: str = "autoresearch progress",
         groups: dict[str, list[ledger.Row]] | None = None) -> Path:
    """Every run a dot (repeats of a configuration hollow), the champion's mean as a step line with its +-1 sem
    band, kept configurations labelled, crashes as crosses."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = groups if groups is not None else configurations(rows, None)
    key_of = {r.run_id: k for k, rs in groups.items() for r in rs}
    fig, ax = plt.subplots(figsize=(12, 6), dpi=120)
    xs = list(range(1, len(rows) + 1))
    done = [(x, r) for x, r in zip(xs, rows) if r.run_id in key_of]
    seen: set[str] = set()
    repeat = {}  # run_id -> whether its configuration ran before it
    for _, r in done:
        repeat[r.run_id] = key_of[r.run_id] in seen
        seen.add(key_of[r.run_id])
    for status, (color, label) in STYLES.items():
        firsts = [(x, r.val_bpb) for x, r in done if r.status == status and not repeat[r.run_id]]
        repeats = [(x, r.val_bpb) for x, r in done if r.status == status and repeat[r.run_id]]
        if firsts:
            ax.scatter(*zip(*firsts), s=30 if status == "keep" else 18, color=color, label=label, zorder=3)
        if repeats:
            ax.scatter(*zip(*repeats), s=30 if status == "keep" else 18, facecolors="none", edgecolors=color,
                       label=f"{label} (repeat)", zorder=3)
    cx, cm, cs = champion_curve(rows, key_of)
    if cx:
        cx.append(xs[-1] + 0.5)
        cm.append(cm[-1])
        cs.append(cs[-1])
        ax.step(cx, cm, where="post", color="#1d6b33", linewidth=1.5, label="champion mean", zorder=2)
        ax.fill_between(cx, [m - s for m, s in zip(cm, cs)], [m + s for m, s in zip(cm, cs)], step="post",
                        color="#2a9d4a", alpha=0.18, label="champion +- 1 sem", zorder=1)
    for key, r in kept_configurations(rows, groups):
        x = xs[rows.index(r)]
        text = descriptions.base_description(r.description)
        text = text if len(text) <= 40 else text[:37] + "..."
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
    n_kept = len(kept_configurations(rows, groups))
    ax.set_xlabel("run")
    ax.set_ylabel("val_bpb (lower is better)")
    ax.set_title(f"{title}: {len(rows)} runs, {len(groups)} configurations, {n_kept} kept")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def main(args) -> str:

    if args.results:
        path = Path(args.results)
        tag = args.tag
    else:
        repo = tags.repo_root()
        path = state.results(repo)
        tag = args.tag
        if tag is None:
            from autoresearch import git
            branch = git.branch(repo)
            tag = branch[len(state.BRANCH_PREFIX):] if branch.startswith(state.BRANCH_PREFIX) else None
    repo = path.parent if (path.parent / ".git").exists() else None
    # --json and --html fail where the plot would: same facts, same errors
    rows = ledger.read(path, tag, old_ok=True, verification=True)
    try:
        price = tokens.prices(getattr(args, "prices", None))
    except ValueError as e:
        raise errors.HarnessError(str(e)) from None
    if not rows:
        raise errors.HarnessError(f"{path} has no experiments" + (f" for tag {tag}" if tag else "") + " yet.")
    if args.json or args.html:
        from autoresearch import facts
        data = facts.facts(path, repo, tag, price)
        if args.json:
            return json.dumps(data, indent=1)
        Path(args.html).write_text(facts.page(facts.attach_details(data, repo)), encoding="utf-8")
        return f"report: {args.html} ({sum(len(t['rows']) for t in data['tags'])} runs; open it in any browser)"
    every, rows = rows, [r for r in rows if r.status != "verify"]  # a verification's runs: its table alone
    groups = configurations(rows, repo)
    out = plot(rows, Path(args.out), f"autoresearch {tag}" if tag else "autoresearch", groups)
    tests = test_scores(decide.finished(rows), state.runs_dir(path.parent))
    bill = tokens.lines(tokens.bill(repo, tag, [r for r in rows if r.status != "verify"], price)) \
        if repo is not None else []
    tables = [verified.text(verified.table([r for r in every if r.tag == t],
                                           verified.read_state(repo, t).get("notes")))
              for t in dict.fromkeys(r.tag for r in every if r.status == "verify")]
    return "\n".join([summarize(rows, tests, groups), *bill, *tables, f"plot: {out}"])
