"""Per-iteration figures from a replay: time split, exposed communication."""

from __future__ import annotations

import pandas as pd

from stratacl.metrics import union_length

COMM_SPLIT = ("wire_s", "copy_s", "sync_s", "register_s", "launch_s")


def iteration_figures(ops: pd.DataFrame) -> dict[str, float]:
    """Iteration time, the compute it contains and the communication left exposed.

    Compute runs on the main stream, so its intervals are the critical path's compute; whatever
    of the iteration they do not cover is communication nobody hid (inline TP/EP collectives and
    FSDP gathers that were not prefetched in time).
    """
    t0, t1 = float(ops["start_s"].min()), float(ops["end_s"].max())
    comp = ops[(ops["kind"] == "compute") & (ops["end_s"] > ops["start_s"])]
    compute = union_length(comp["start_s"].to_numpy(), comp["end_s"].to_numpy())
    coll = ops[ops["kind"] == "collective"]
    out = {"iteration_time_s": t1 - t0, "compute_s": compute, "exposed_comm_s": t1 - t0 - compute}
    for col in COMM_SPLIT:
        out[f"comm_{col}"] = float(coll[col].sum())
    out["comm_time_s"] = float((coll["end_s"] - coll["start_s"]).sum())
    return out
