"""Per-iteration figures of a training replay, from the engine's one accounting."""

from __future__ import annotations

from stratacl.workload_api import Exposure

COMM_SPLIT = ("wire", "copy", "sync", "register", "launch")


def iteration_figures(exp: Exposure) -> dict[str, float]:
    """Iteration time, the compute it contains and the communication left exposed (inline TP/EP
    collectives and FSDP gathers that were not prefetched in time), from `SimResult.exposure()`."""
    out = {"iteration_time_s": exp.time_s, "compute_s": exp.compute_s, "exposed_comm_s": exp.exposed_comm_s}
    for cat in COMM_SPLIT:
        out[f"comm_{cat}_s"] = getattr(exp, f"{cat}_s")
    out["comm_time_s"] = exp.comm_ops_s
    return out
