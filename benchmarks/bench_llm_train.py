"""Speed of the llm_train workload: one iteration per library, of the 512-die DeepSeek-V3.2 layout
(default) or of an experiment's layout.

    python benchmarks/bench_llm_train.py [iteration ...]
    python benchmarks/bench_llm_train.py --experiment llm_train_deepseek_v3 [iteration ...]

Prints model-preparation time (cost measurement, cached per process), trace build time, op count
and simulation wall time per library, and the step breakdown's own time (report.step_breakdown:
one pass over the ops plus one interval union per collective family) beside it. Budgets: < 30 s wall per library per iteration for the
512-die layout and for the 2,048-die DeepSeek-V3 layout (PP16 DualPipeV, the published batch: 120
micro-batches per data-parallel rank, ≈ 164k ops: one op spans a stage's 128 dies, so events follow
ops, not ops × dies or data-parallel replicas). `--overrides` adds Hydra overrides (e.g.
`workload.microbatches=32 workload.global_batch=4096`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from stratacl.comm.library import LibraryModel
from stratacl.config import to_object
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from workloads.llm_train.report import step_breakdown
from workloads.llm_train.workload import iteration_trace, prepare

CONF = str(Path(__file__).resolve().parents[1] / "conf")
BUDGET_S = 30.0


def main(iterations: list[int], experiment: str, libraries: str, extra: list[str]) -> None:
    overrides = [f"+experiment={experiment}"] if experiment else ["workload=llm_train"]
    if libraries:
        overrides.append(f"library=[{libraries}]")
    overrides += extra
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = to_object(compose("config", overrides=overrides))
    fabric = Fabric(cfg.fabric)
    t0 = time.perf_counter()
    prep = prepare(cfg.workload, fabric)
    print(f"prepare (model costs, activations, plan): {time.perf_counter() - t0:.2f} s; "
          f"{cfg.workload.dies} dies, pp {cfg.workload.pp}")
    for it in iterations:
        t0 = time.perf_counter()
        trace, s, imb = iteration_trace(prep, it, seed=0)
        build = time.perf_counter() - t0
        print(f"iteration {it}: zipf {s:.3f}, EP imbalance {imb:.2f}, {len(trace.ops)} ops, "
              f"built in {build:.2f} s")
        for name, lib_cfg in cfg.library.items():
            t0 = time.perf_counter()
            res = simulate(trace, LibraryModel(name, lib_cfg, fabric))
            wall = time.perf_counter() - t0
            t0 = time.perf_counter()
            step_breakdown(trace, res, fabric, res.makespan_s)
            report = time.perf_counter() - t0
            flag = "" if wall + report < BUDGET_S else f"  OVER the {BUDGET_S:.0f} s budget"
            print(f"  {name:22s} simulated {res.makespan_s:8.3f} s in {wall:6.2f} s wall "
                  f"({res.events} events, {res.solves} fluid solves), step breakdown {report * 1e3:.0f} ms{flag}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("iterations", nargs="*", type=int)
    ap.add_argument("--experiment", default="", help="e.g. llm_train_deepseek_v3")
    ap.add_argument("--libraries", default="", help="comma-separated subset of the libraries")
    ap.add_argument("--overrides", nargs="*", default=[], help="further Hydra overrides")
    a = ap.parse_args()
    main(a.iterations or ([2000] if a.experiment else [0, 2000]), a.experiment, a.libraries, a.overrides)
