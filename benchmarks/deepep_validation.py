"""DeepEP's own published tables (benchmarks/deepep_validation.csv: docs/legacy.md @dd758ca, H800 +
CX7, normal and low-latency kernels, EP 8-64) next to the harness, time and every convention.

    python benchmarks/deepep_validation.py                      # run the harness (deepep preset)
    python benchmarks/deepep_validation.py --summaries DIR      # read runs DIR/<mode>_ep<ep>/summary.json
    python benchmarks/deepep_validation.py --csv out.csv        # also write the table

Each (mode, EP) is one `workload=moe` run on `hgx_h800` grown to 8 nodes (64 GPUs), the row's shape
(tokens per rank, hidden 7168, top-8 of 256, FP8 dispatch / BF16 combine bytes, routing limited to
min(nodes, 4) node groups as DeepEP's tests/legacy/test_internode.py does). The README states
bandwidths (HT) or bandwidths and latencies (LL) in DeepEP's conventions; `readme_time_us` for HT
rows is the time the README's bandwidth implies for the harness's own byte count in that
convention (the same routing), so times compare directly. README times are kernel-only (DeepEP's
bench_kineto of the dispatch / combine kernel); the harness op time also holds the notify step and,
for HT dispatch, the CPU wait for the received counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TABLE = ROOT / "benchmarks" / "deepep_validation.csv"
FABRIC = ["fabric=hgx_h800", "fabric.topology.nodes=8", "fabric.topology.supernodes=8"]
COLS = ("time_us", "algbw_GBps", "busbw_GBps", "deepep_logical_GBps", "deepep_rdma_GBps")


def overrides(row: pd.Series, rows: pd.DataFrame, library: str) -> list[str]:
    both = rows.set_index("kind")["bytes_per_token"]
    tok = "tokens_ht" if row["mode"] == "ht" else "tokens_ll"
    return [*FABRIC, "workload=moe", f"library=[{library}]", f"baseline={library}",
            f"workload.ep={row['ep']}", f"workload.modes=[{row['mode']}]", f"workload.{tok}={row['tokens']}",
            f"workload.hidden={row['hidden']}", f"workload.top_k={row['top_k']}",
            f"workload.experts={row['experts']}", f"workload.n_group={row['n_group']}",
            f"workload.topk_group={row['topk_group']}",
            f"workload.dispatch_bytes_per_token={both['dispatch']}",
            f"workload.combine_bytes_per_token={both['combine']}", "output.timeline=false",
            "output.progress=false"]


def harness_row(summary: dict, library: str, kind: str, mode: str, rows: pd.DataFrame,
                group_limit: bool) -> dict[str, float]:
    """The run's time and bandwidths; a summary without the convention columns (one written
    before they existed) gets them from its time and the routing's bytes, recomputed with the
    run's seed (`group_limit` False: the routing such a run used, without node groups)."""
    m = summary["libraries"][library]
    out = {c: m.get(f"{kind}_{mode}_{c}", float("nan")) for c in COLS}
    if pd.isna(out["busbw_GBps"]) or f"{kind}_{mode}_algbw_GBps" not in m:
        from workloads import moe
        from workloads.moe import _CONVENTIONS

        cfg = moe_config(rows, mode, group_limit)
        pts = pd.DataFrame(moe.build_trace(cfg, moe.MoeMode(mode), summary.get("seed", 0), 8)[1])
        pts = pts[(pts["kind"] == kind) & pts["measured"]]
        t = out["time_us"] * 1e-6
        for col, nbytes, factor in _CONVENTIONS:
            out[col] = float(pts[nbytes].mean()) * factor(cfg.ep) / t / 1e9
        if mode == "ll":
            out["deepep_rdma_GBps"] = float("nan")
    return out


def moe_config(rows: pd.DataFrame, mode: str, group_limit: bool):  # noqa: ANN201 - MoeConfig
    from stratacl.schemas.moe import MoeConfig

    r = rows.iloc[0]
    both = rows.set_index("kind")["bytes_per_token"]
    return MoeConfig(ep=int(r["ep"]), tokens_ht=int(r["tokens"]), tokens_ll=int(r["tokens"]), hidden=int(r["hidden"]),
                     experts=int(r["experts"]), top_k=int(r["top_k"]),
                     n_group=int(r["n_group"]) if group_limit else 0,
                     topk_group=int(r["topk_group"]) if group_limit else 0,
                     dispatch_bytes_per_token=int(both["dispatch"]), combine_bytes_per_token=int(both["combine"]))


def table(library: str, summaries: Path | None, group_limit: bool = True) -> pd.DataFrame:
    from stratacl.run import run_overrides

    ref = pd.read_csv(TABLE)
    out = []
    for (mode, ep), rows in ref.groupby(["mode", "ep"], sort=False):
        if summaries is None:
            run_dir = Path(tempfile.mkdtemp(prefix=f"deepep_{mode}{ep}_"))
            code, err = run_overrides(overrides(rows.iloc[0], rows, library), run_dir)
            if code:
                raise SystemExit(f"{mode} EP{ep}: {err}")
        else:
            run_dir = summaries / f"{mode}_ep{ep}"
        summary = json.loads((run_dir / "summary.json").read_text())
        for _, row in rows.iterrows():
            h = harness_row(summary, library, row["kind"], mode, rows, group_limit)
            conv = row["convention"]
            readme_t = row["readme_time_us"]
            if pd.isna(readme_t):  # the README's bandwidth over the harness's bytes in that convention
                readme_t = h["time_us"] * h[conv] / row["readme_GBps"]
            out.append({"mode": mode, "kind": row["kind"], "ep": ep, **h, "convention": conv,
                        "harness_GBps": h[conv], "readme_GBps": row["readme_GBps"], "readme_time_us": readme_t,
                        "time_ratio": h["time_us"] / readme_t})
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--library", default="deepep")
    ap.add_argument("--summaries", type=Path, help="read <dir>/<mode>_ep<ep>/summary.json instead of running")
    ap.add_argument("--csv", type=Path, help="write the comparison here")
    ap.add_argument("--no-group-limit", action="store_true",
                    help="summaries of runs that routed without node groups (before the option existed)")
    args = ap.parse_args()
    df = table(args.library, args.summaries, not args.no_group_limit)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.round(1).to_string(index=False))
    if args.csv:
        df.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
