"""Where a replay's time went: compute, exposed communication and the communication split.

One definition for every workload: inside a window, `compute_s` is the length of the union of the
intervals in which some compute op runs (on any stream or rank: SPMD ops span their ranks), and
`exposed_comm_s` is the rest of the window — communication, copies, registration or waiting that
no compute hides. The split (wire / copy / sync / register / launch) sums the phase time of the
communication ops (collective, p2p) the caller selects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stratacl.metrics import union_length

COMM_KINDS = ("collective", "p2p")
COMM_CATEGORIES = ("wire", "copy", "sync", "register", "launch", "host")


@dataclass(frozen=True)
class Exposure:
    time_s: float  # the window's length
    compute_s: float  # time some compute op runs
    exposed_comm_s: float  # time_s − compute_s
    comm_ops_s: float  # summed durations of the selected communication ops
    wire_s: float  # summed phase time of the selected communication ops, by category
    copy_s: float
    sync_s: float
    register_s: float
    launch_s: float
    vector_core_s: float  # vector-core-seconds the selected communication ops held
    exposed_while_s: float = 0.0  # exposed time during which some `while_ops` op is in flight
    host_s: float = 0.0  # device→host round trips the selected operators waited for


def _clipped(start: np.ndarray, end: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    s, e = np.clip(start, lo, hi), np.clip(end, lo, hi)
    keep = e > s
    return s[keep], e[keep]


def exposure(start: np.ndarray, end: np.ndarray, kinds: np.ndarray, split: dict[str, np.ndarray],
             core_s: np.ndarray, window: tuple[float, float] | None = None,
             ops: np.ndarray | None = None, while_ops: np.ndarray | None = None) -> Exposure:
    """Accounting of one replay. `window` defaults to [first start, last end]; `ops` (a boolean
    mask) selects the ops whose split is summed (default: all); `while_ops` (a mask) asks how much
    of the exposed time has one of those ops in flight (e.g. cache-miss fetches)."""
    if window is None:
        window = (float(start.min(initial=0.0)), float(end.max(initial=0.0)))
    lo, hi = window
    comp = kinds == "compute"
    cs, ce = _clipped(start[comp], end[comp], lo, hi)
    compute_s = union_length(cs, ce)
    sel = (np.isin(kinds, COMM_KINDS)) & (ops if ops is not None else True)
    exposed_while = 0.0
    if while_ops is not None:
        ws, we = _clipped(start[while_ops], end[while_ops], lo, hi)
        exposed_while = union_length(np.concatenate([ws, cs]), np.concatenate([we, ce])) - compute_s
    return Exposure(
        time_s=hi - lo, compute_s=compute_s, exposed_comm_s=max(0.0, hi - lo - compute_s),
        comm_ops_s=float((end[sel] - start[sel]).sum()),
        **{f"{c}_s": float(split[c][sel].sum()) for c in COMM_CATEGORIES},
        vector_core_s=float(core_s[sel].sum()), exposed_while_s=max(0.0, exposed_while))
