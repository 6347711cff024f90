"""DeepEP's own published tables (normal and low-latency kernels, EP 8-64, H800 + CX7) next to the
harness, time and every convention: a view of `python -m stratacl.validate --operators`'s DeepEP rows
(stratacl/data/operators/deepep.csv, stratacl/validate/operators.py; each (mode, EP) one `moe` run in
process).

    python benchmarks/deepep_validation.py                      # the deepep preset
    python benchmarks/deepep_validation.py --library cann_ep_hierarchy
    python benchmarks/deepep_validation.py --summaries DIR      # metrics of runs DIR/<mode>_ep<ep>/summary.json
    python benchmarks/deepep_validation.py --csv out.csv        # also write the table
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stratacl.validate import operators as vo  # noqa: E402


def from_summaries(root: Path, library: str) -> vo.MetricsFn:
    """Metrics of `library` in root/<mode>_ep<ep>/summary.json (runs of `deepep_overrides`)."""
    def metrics(overrides: tuple[str, ...]) -> dict[str, float]:
        kv = dict(o.split("=", 1) for o in overrides if o.startswith("workload."))
        run = root / f"{kv['workload.modes'].strip('[]')}_ep{kv['workload.ep']}"
        return json.loads((run / "summary.json").read_text())["libraries"][library]
    return metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--library", default="deepep")
    ap.add_argument("--summaries", type=Path, help="read <dir>/<mode>_ep<ep>/summary.json instead of running")
    ap.add_argument("--csv", type=Path, help="write the comparison here")
    args = ap.parse_args()
    metrics = from_summaries(args.summaries, args.library) if args.summaries else vo.moe_metrics
    results = vo.evaluate(vo.load_deepep(), metrics, args.library)
    print(vo.report(results))
    if args.csv:
        with args.csv.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "convention", "public_GBps", "harness_GBps", "error", "public_time_us",
                        "harness_time_us", *vo.CONVENTIONS])
            for r, h, e in results:
                w.writerow([r.id, r.convention, r.measured, h, e, r.times[1], r.times[0],
                            *(dict(r.bandwidths).get(c, "") for c in vo.CONVENTIONS)])


if __name__ == "__main__":
    main()
