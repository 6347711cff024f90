"""Iteration time split from the simulated op timeline.

Every op of the trace spans all ranks, so each rank sees the same intervals and any rank is the
critical one. Iteration i's window runs from the end of iteration i−1's last op to the end of its
own last op; inside it, `compute_s` is the time some compute op runs, `exposed_comm_s` the rest
(communication, cache-miss traffic or waiting that no compute hides), and `exposed_cache_miss_s`
the part of that in which a cache-miss fetch or write-back is in flight.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def _covered(mask_intervals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For elementary segments [lo, hi): does any interval in `mask_intervals` cover it?"""
    if len(mask_intervals) == 0:
        return np.zeros(len(lo), dtype=bool)
    s, e = mask_intervals[:, 0][:, None], mask_intervals[:, 1][:, None]
    return ((s <= lo[None, :]) & (e >= hi[None, :])).any(axis=0)


def iteration_split(ops: pd.DataFrame, iteration_of: list[int], role_of: list[str]) -> pd.DataFrame:
    ops = ops.assign(iteration=iteration_of, role=role_of)
    ends = ops.groupby("iteration")["end_s"].max().sort_index()
    iv = {role: ops.loc[ops["role"] == role, ["start_s", "end_s"]].to_numpy() for role in ("compute", "cache")}
    rows = []
    prev = 0.0
    for it, end in ends.items():
        pts = np.unique(np.concatenate([[prev, end], ops["start_s"], ops["end_s"]]))
        pts = pts[(pts >= prev) & (pts <= end)]
        lo, hi = pts[:-1], pts[1:]
        width = hi - lo
        comp = _covered(iv["compute"], lo, hi)
        cache = _covered(iv["cache"], lo, hi)
        sub = ops[ops["iteration"] == it]
        window = float(end - prev)
        compute_s = float(width[comp].sum())
        rows.append({
            "iteration": int(it),
            "start_s": float(prev),
            "end_s": float(end),
            "iteration_time_s": window,
            "compute_s": compute_s,
            "exposed_comm_s": window - compute_s,
            "exposed_cache_miss_s": float(width[cache & ~comp].sum()),
            "cache_traffic_s": float((sub.loc[sub["role"] == "cache", "end_s"]
                                      - sub.loc[sub["role"] == "cache", "start_s"]).sum()),
            "comm_ops_s": float((sub.loc[sub["role"] == "comm", "end_s"]
                                 - sub.loc[sub["role"] == "comm", "start_s"]).sum()),
            "wire_s": float(sub["wire_s"].sum()),
            "copy_s": float(sub["copy_s"].sum()),
            "sync_s": float(sub["sync_s"].sum()),
        })
        prev = float(end)
    return pd.DataFrame(rows)
