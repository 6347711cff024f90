"""Engine speed: replay a synthetic 100 000-op trace over 768 ranks; compare with raw simpy.

    python benchmarks/bench_engine.py [--ops 100000] [--library stratacl] [--fidelity switch]
                                      [--fabric hgx_h100 --group 16]   # a multi-node GPU fabric

Reports ops/s of the replay next to raw simpy timeout events/s measured in the same process.
The trace mixes cube and vector compute, memory-bound kernels, per-group all-reduces and
all-gathers on a comm stream overlapping compute, p2p transfers between groups, local copies
and family-wide collectives over all 768 ranks, so the fluid solver has real sharing to do.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import simpy
from hydra import compose, initialize_config_dir

from stratacl.comm.library import LibraryModel
from stratacl.config import to_object
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from stratacl.trace import Trace

CONF = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "conf")


def synthetic_trace(n_ops: int, world: int = 768, group: int = 32, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    tr = Trace(world_size=world)
    groups = [tuple(range(g, g + group)) for g in range(0, world, group)]
    tr.add_family("grp", groups)
    ng = len(groups)
    last_comm = [-1] * ng
    while len(tr.ops) < n_ops:
        g = int(rng.integers(ng))
        ranks = groups[g]
        r = rng.random()
        if r < 0.35:
            tr.compute(ranks, flops=float(rng.uniform(1e10, 5e11)), hbm_bytes=float(rng.uniform(1e7, 2e8)),
                       stream="compute")
        elif r < 0.45:
            tr.compute(ranks, flops=float(rng.uniform(1e8, 1e10)), hbm_bytes=float(rng.uniform(1e7, 1e8)),
                       core="vector", stream="compute")
        elif r < 0.75:
            dep = [len(tr.ops) - 1] if tr.ops else []
            coll = "allreduce" if rng.random() < 0.5 else "allgather"
            last_comm[g] = tr.collective(coll, f"grp[{g}]", float(2 ** rng.integers(16, 27)),
                                         stream="comm", deps=dep)
        elif r < 0.85:
            h = (g + 1) % ng
            tr.add("p2p", sorted(set(ranks) | set(groups[h])), src=ranks, dst=groups[h],
                   nbytes=float(rng.uniform(1e5, 1e7)), stream="p2p")
        elif r < 0.95:
            tr.add("memcpy", ranks, nbytes=float(rng.uniform(1e6, 1e8)), stream="compute")
        else:
            tr.collective("allreduce", "grp", float(2 ** rng.integers(12, 22)), stream="comm")
    return tr


def simpy_events_per_s(n: int = 300_000) -> float:
    env = simpy.Environment()

    def proc():  # noqa: ANN202
        for _ in range(n):
            yield env.timeout(1.0)

    env.process(proc())
    t0 = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--library", default="stratacl")
    ap.add_argument("--fidelity", default="die_ports", choices=["die_ports", "switch"])
    ap.add_argument("--fabric", default="", help="a conf/fabric preset (default: the config's)")
    ap.add_argument("--group", type=int, default=0,
                    help="ranks per group (divides the fabric's dies, at least two groups; default 32, or half "
                         "the dies on a fabric of fewer than 64)")
    args = ap.parse_args()
    fab = [f"fabric={args.fabric}"] if args.fabric else []
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = to_object(compose("config", overrides=[*fab, f"library=[{args.library}]", f"baseline={args.library}",
                                                     f"fabric.fidelity={args.fidelity}"]))
    fabric = Fabric(cfg.fabric)
    lib = LibraryModel(args.library, cfg.library[args.library], fabric)
    t0 = time.perf_counter()
    group = args.group or min(32, fabric.world // 2)
    if fabric.world % group or fabric.world // group < 2:
        ap.error(f"--group {group}: must divide the fabric's {fabric.world} dies into at least two groups")
    trace = synthetic_trace(args.ops, fabric.world, group)
    trace.validate()
    t_build = time.perf_counter() - t0
    res = simulate(trace, lib)
    ev = simpy_events_per_s()
    print(f"trace: {len(trace.ops)} ops over {trace.world_size} ranks (built+validated in {t_build:.2f} s)")
    print(f"replay ({args.library}, {args.fidelity}): {res.wall_s:.2f} s wall, {len(trace.ops) / res.wall_s:,.0f} ops/s, "
          f"{res.events:,} phases, {res.solves:,} fluid solves, simulated makespan {res.makespan_s * 1e3:.2f} ms")
    print(f"raw simpy: {ev:,.0f} timeout events/s (same process)")
    print(f"conservation: max |work-1| = {res.work_error:.2e}")


if __name__ == "__main__":
    main()
