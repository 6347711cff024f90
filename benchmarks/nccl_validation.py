"""NCCL's documented performance next to the harness (a view of `python -m stratacl.validate`'s
NCCL rows: stratacl/data/operators/nccl.csv, stratacl/validate/operators.py).

    python benchmarks/nccl_validation.py            # documented rows, time and busbw
    python benchmarks/nccl_validation.py --grid     # busbw at 1-2-4 nodes: forced ring / algorithm=nccl
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's stratacl

from stratacl.validate import operators as vo  # noqa: E402

RING = ("library.nccl.algorithm=ring",)  # one flat ring over all ranks (the preset before algorithm=nccl)
GRID_FABRICS = ("hgx_h100", "hgx_h200", "dgx_b200")
GRID_COLLS = ("allreduce", "allgather", "alltoall")


def grid(size: float = 2.0**30) -> None:
    """busbw (GB/s) at 1, 2, 4 nodes of 8 GPUs: one flat ring -> algorithm=nccl (algorithm chosen)."""
    print(f"size {size / 2**20:.0f} MiB; busbw GB/s flat ring -> algorithm=nccl (algorithm chosen)")
    for fab in GRID_FABRICS:
        for coll in GRID_COLLS:
            cells = []
            for nodes in (1, 2, 4):
                _, b, _ = vo.nccl_op(fab, coll, 8 * nodes, size, extra=RING)
                _, a, algo = vo.nccl_op(fab, coll, 8 * nodes, size)
                cells.append(f"{nodes}n {b:6.1f} -> {a:6.1f} ({algo.removeprefix('nccl:')})")
            print(f"{fab:9s} {coll:10s} " + " | ".join(cells))


def main() -> None:
    print(vo.report(vo.evaluate(vo.load_nccl()), vo.nccl_relations()))


if __name__ == "__main__":
    grid() if "--grid" in sys.argv else main()
