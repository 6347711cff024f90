"""Wall time of the deployment search: the analytic search over the
default space (+experiment=deployment_search) for two libraries on 192 dies, serve checks off,
then optionally with them. Prints candidates, wall time and the per-candidate cost.

    python benchmarks/bench_search.py [--check] [--libraries hccl,stratacl] [extra overrides...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, not an installed copy
from stratacl.run.cli import run_overrides  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--libraries", default="hccl,stratacl")
    ap.add_argument("--check", action="store_true", help="also serve-check the finalists")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench_search_")) / "run"
    ov = ["+experiment=deployment_search", f"library=[{a.libraries}]", f"baseline={a.libraries.split(',')[0]}",
          f"workload.search.serve_check={str(a.check).lower()}", *a.overrides]
    t0 = time.perf_counter()
    code, msg = run_overrides(ov, out)
    wall = time.perf_counter() - t0
    if code:
        raise SystemExit(f"run failed ({code}): {msg}")
    libs = json.loads((out / "summary.json").read_text())["libraries"]
    timing = pd.read_parquet(out / "timing.parquet").set_index("library")  # host wall time per library
    n = sum(m["candidates"] for m in libs.values())
    print(f"{len(libs)} libraries, {int(n)} candidate layouts, wall {wall:.1f} s "
          f"(incl. model costs and start-up), {wall / n * 1e3:.2f} ms per candidate")
    for lib, m in libs.items():
        t = timing.loc[lib]
        print(f"  {lib}: search {t['search_s']:.1f} s, {int(m['candidates'])} candidates, "
              f"{int(m['iteration_traces_simulated'])} iteration traces, analytic best "
              f"{m['analytic_capacity_req_per_s']:.1f} req/s" + (f", check {t['check_s']:.1f} s" if a.check else ""))
    print(f"run directory: {out}")


if __name__ == "__main__":
    main()
