"""Iteration time split from the replay, with the engine's one accounting (`SimResult.exposure`).

Iteration i's window runs from the end of iteration i−1's last op to the end of its own last op;
inside it, `compute_s` is the time some compute op runs, `exposed_comm_s` the rest (communication,
cache-miss traffic or waiting that no compute hides), and `exposed_cache_miss_s` the part of that
in which a cache-miss fetch or write-back is in flight. `cache_fetch_s` / `cache_writeback_s`:
how long the iteration's host->device fetch and device->host write-back took (start to end).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from stratacl.metrics import union_length


def iteration_split(res: Any, iteration_of: list[int], role_of: list[str],
                    names: list[str] | None = None) -> pd.DataFrame:
    """`res` is the replay (`SimResult`) of a trace whose ops are tagged with iteration and role
    (and named: `names`, for the fetch / write-back times)."""
    it_of, role = np.asarray(iteration_of), np.asarray(role_of)
    name = np.asarray(names if names is not None else [""] * len(role_of))
    cache = role == "cache"
    rows = []
    prev = 0.0
    for it in np.unique(it_of):
        mine = it_of == it
        end = float(res.end[mine].max())
        exp = res.exposure(window=(prev, end), ops=mine, while_ops=cache)
        rows.append({
            "iteration": int(it),
            "start_s": prev,
            "end_s": end,
            "iteration_time_s": exp.time_s,
            "compute_s": exp.compute_s,
            "exposed_comm_s": exp.exposed_comm_s,
            "exposed_cache_miss_s": exp.exposed_while_s,
            "cache_traffic_s": union_length(res.start[mine & cache], res.end[mine & cache]),
            "cache_fetch_s": _span(res, mine & (name == "cache_miss_fetch")),
            "cache_writeback_s": _span(res, mine & (name == "cache_writeback")),
            "comm_ops_s": res.exposure(window=(prev, end), ops=mine & (role == "comm")).comm_ops_s,
            "wire_s": exp.wire_s,
            "copy_s": exp.copy_s,
            "sync_s": exp.sync_s,
        })
        prev = end
    return pd.DataFrame(rows)


def _span(res: Any, sel: np.ndarray) -> float:
    return float((res.end[sel] - res.start[sel]).sum()) if sel.any() else 0.0
