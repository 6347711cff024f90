"""NCCL's documented performance next to the harness (benchmarks/nccl_validation.csv).

    python benchmarks/nccl_validation.py            # documented rows
    python benchmarks/nccl_validation.py --grid     # busbw at 1-2-4 nodes, before (ring) / after

Each row: one collective on an idle fabric through the engine (as the `collectives` workload
times it), busbw in the nccl-tests convention, next to the documented figure and its source.
Rows without a number state a relation (the default choice beats the forced ring).
"""

from __future__ import annotations

import csv
from pathlib import Path

from hydra import compose, initialize_config_dir

from stratacl.comm.library import LibraryModel
from stratacl.config import to_object
from stratacl.engine.replay import simulate
from stratacl.fabric import Fabric
from stratacl.metrics import busbw_factor
from stratacl.trace import Trace

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "benchmarks" / "nccl_validation.csv"
BEFORE = ("library.nccl.algorithm=ring",)  # the nccl preset before algorithm=nccl: one flat ring


def harness_busbw(fabric: str, coll: str, n: int, size: float, algos: str = "",
                  extra: tuple[str, ...] = ()) -> tuple[float, str]:
    """(busbw GB/s, algorithm) of one op of the `nccl` preset on `fabric`."""
    over = [f"fabric={fabric}", "library=[nccl]", "baseline=nccl", *extra]
    if algos:
        over.append(f"library.nccl.nccl_algos=[{algos}]")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = to_object(compose("config", overrides=over))
    fab = Fabric(cfg.fabric)
    lib = LibraryModel("nccl", cfg.library["nccl"], fab)
    tr = Trace(world_size=n)
    tr.add_family("g", [range(n)])
    tr.collective(coll, "g", size)
    res = simulate(tr, lib)
    t = float(res.end[0] - res.start[0])
    return size / t / 1e9 * busbw_factor(coll, n), lib.chosen_algorithm(coll, size, tuple(range(n)))


def rows() -> list[dict[str, str]]:
    with TABLE.open() as f:
        return list(csv.DictReader(f))


def main() -> None:
    print(f"{'id':34s} {'before':>7s} {'harness':>8s} {'documented':>16s} {'error':>7s}  algorithm")
    for r in rows():
        n, size = int(r["ranks"]), float(r["size_bytes"])
        bw, algo = harness_busbw(r["fabric"], r["collective"], n, size, r["nccl_algos"])
        if r["documented_busbw_GBps"]:
            doc = float(r["documented_busbw_GBps"])
            before, _ = harness_busbw(r["fabric"], r["collective"], n, size, extra=BEFORE)
            rng = f"{doc:.0f} ({float(r['documented_low_GBps']):.0f}-{float(r['documented_high_GBps']):.0f})"
            print(f"{r['id']:34s} {before:7.1f} {bw:8.1f} {rng:>16s} {bw / doc - 1:+7.1%}  {algo}")
        else:
            ring, _ = harness_busbw(r["fabric"], r["collective"], n, size, "ring")
            holds = "holds" if bw > ring else "FAILS"
            print(f"{r['id']:34s} {'':7s} {bw:8.1f} {'> ring ' + f'{ring:.0f}':>16s} {holds:>7s}  {algo}")


GRID_FABRICS = ("hgx_h100", "hgx_h200", "dgx_b200")
GRID_COLLS = ("allreduce", "allgather", "alltoall")


def grid(size: float = 2.0**30) -> None:
    """busbw (GB/s) at 1, 2, 4 nodes of 8 GPUs: before (one flat ring) and after (algorithm=nccl)."""
    print(f"size {size / 2**20:.0f} MiB; busbw GB/s before -> after (algorithm chosen)")
    for fab in GRID_FABRICS:
        for coll in GRID_COLLS:
            cells = []
            for nodes in (1, 2, 4):
                b, _ = harness_busbw(fab, coll, 8 * nodes, size, extra=BEFORE)
                a, algo = harness_busbw(fab, coll, 8 * nodes, size)
                cells.append(f"{nodes}n {b:6.1f} -> {a:6.1f} ({algo.removeprefix('nccl:')})")
            print(f"{fab:9s} {coll:10s} " + " | ".join(cells))


if __name__ == "__main__":
    import sys

    grid() if "--grid" in sys.argv else main()
