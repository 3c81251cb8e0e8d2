"""What the harness asks of the evaluator (Request): the run's model and how it was trained, on the script's
command line (Request.argv, parse) or, from a script started early, as one JSON line on its stdin."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .probes import AUDIT_PROBES, CAUSAL_PROBES


@dataclass(frozen=True)
class Request:
    """What the harness hands the evaluator, on its command line: the run's model and how it was trained."""
    run_dir: str
    dtype: str
    device: str
    check_bpb: float
    test_below: float = float("inf")  # also score the test split (and audit deeper) when val_bpb is below this
    probes: int = CAUSAL_PROBES
    audit_probes: int = AUDIT_PROBES
    draw: int | None = None  # the tag's secret draw of scored rows (heldout.py; prepare.evaluation_rows)

    def argv(self) -> list[str]:
        return ["--run-dir", self.run_dir, "--dtype", self.dtype, "--device", self.device, "--check-bpb",
                repr(float(self.check_bpb)), "--test-below", repr(min(float(self.test_below), 1e308)),
                "--causal-probes", str(self.probes), "--audit-probes", str(self.audit_probes)] + \
            ([] if self.draw is None else ["--draw", str(self.draw)])


def parse(argv: list[str]):
    """The script's arguments: (the parsed namespace, the Request; None with --wait, which reads it later)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--prepare-dir", required=True, help="a directory holding the clean prepare.py alone")
    parser.add_argument("--path", action="append", default=[],
                        help="a directory of packages to import from (the harness's PYTHONPATH; -I drops it)")
    parser.add_argument("--wait", action="store_true", help="import everything, then read the Request as one JSON "
                        "line from stdin (only in a sandbox whose training cannot reach this process)")
    parser.add_argument("--run-dir")
    parser.add_argument("--dtype")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--check-bpb", type=float)
    parser.add_argument("--test-below", type=float, default=float("inf"),
                        help="also score the test split, and audit deeper, when val_bpb is below this")
    parser.add_argument("--causal-probes", type=int, default=CAUSAL_PROBES,
                        help="probes of the causality check on the validation rows (CausalProbes)")
    parser.add_argument("--audit-probes", type=int, default=AUDIT_PROBES,
                        help="probes when val_bpb is below --test-below (a run that may be kept)")
    parser.add_argument("--draw", type=int, help="the tag's secret draw of scored rows (prepare.evaluation_rows)")
    args = parser.parse_args(argv)
    if args.wait:
        return args, None
    if args.run_dir is None or args.dtype is None or args.check_bpb is None:
        parser.error("--run-dir, --dtype and --check-bpb are required (or --wait)")
    return args, Request(args.run_dir, args.dtype, args.device, args.check_bpb, args.test_below, args.causal_probes,
                         args.audit_probes, args.draw)
