"""DLRM workload speed: build and replay one (or more) 128-die iterations per library.

    python benchmarks/bench_dlrm.py [--iterations 1] [--batch 1024] [--repeat 3]

Target: one 128-die iteration simulated in under 10 s wall per library.
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
from workloads.dlrm_train.workload import library_run, prepare

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = to_object(compose("config", overrides=[
            "workload=dlrm_train", f"workload.iterations={args.iterations}",
            f"workload.batch_per_worker={args.batch}"]))
    fabric = Fabric(cfg.fabric)
    t0 = time.perf_counter()
    setup = prepare(cfg.workload, fabric, cfg.seed)  # first call measures the dense part in torch
    print(f"prepare (tables, plan, dense costs, traffic): {time.perf_counter() - t0:.2f} s")
    for name, lib_cfg in cfg.library.items():
        lib = LibraryModel(name, lib_cfg, fabric)
        best_build = best_sim = float("inf")
        for _ in range(args.repeat):
            t1 = time.perf_counter()
            lr = library_run(setup, lib, cfg.seed)
            t2 = time.perf_counter()
            res = simulate(lr.built.trace, lib)
            t3 = time.perf_counter()
            best_build, best_sim = min(best_build, t2 - t1), min(best_sim, t3 - t2)
        print(f"{name:9s} ranks={cfg.workload.ranks} iterations={args.iterations} ops={len(lr.built.trace.ops)} "
              f"events={res.events} solves={res.solves}  build {best_build:.3f} s  replay {best_sim:.3f} s  "
              f"total {best_build + best_sim:.3f} s  (simulated {res.makespan_s * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
