"""Speed of the llm_train workload: one 512-die DeepSeek-V3.2 iteration per library.

    python benchmarks/bench_llm_train.py [iteration ...]

Prints model-preparation time (cost measurement, cached per process), trace build time, op count
and simulation wall time per library. Target: < 30 s wall per library per iteration.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from stratacl.comm.library import LibraryModel
from stratacl.config import to_object
from stratacl.engine.replay import simulate
from stratacl.fabric import Fabric
from workloads.llm_train import iteration_trace, prepare

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def main(iterations: list[int]) -> None:
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = to_object(compose("config", overrides=["workload=llm_train"]))
    fabric = Fabric(cfg.fabric)
    t0 = time.perf_counter()
    prep = prepare(cfg.workload, fabric)
    print(f"prepare (model costs, activations, plan): {time.perf_counter() - t0:.2f} s")
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
            print(f"  {name:10s} simulated {res.makespan_s:8.3f} s in {wall:6.2f} s wall "
                  f"({res.events} events, {res.solves} fluid solves)")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [0, 2000])
