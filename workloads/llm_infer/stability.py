"""Whether a served run keeps up with its arrival rate: the share of the arrival rate it serves,
from the trend of its backlog over the measured window.

A finite window hides a slow overload from a TTFT SLO (a backlog growing at ε of the rate adds ε·t
of TTFT), so the deployment search counts a rate only if the run keeps up with it. Counting what
was served inside the window against what arrived in it reads the backlog at the window's two ends
only: 1 − (B(t1) − B(t0)) ÷ arrivals. That estimate is only as steady as the backlog at one instant.
On a bursty trace a burst just before t1 reads as a shortfall (azure_conv over a 30 s window: 0.937-
0.949 while P99 TTFT stayed at half its SLO). The backlog's least-squares slope over the whole window
reads the same quantity in a steady state and under a steady overload (slope ε·λ exactly), but it
weighs an instant by its distance from the window's middle: a burst of height h lasting d at the end
moves it by 6·h·d ÷ T², against h ÷ T for the two-ends count — 6·d ÷ T of it (a tenth for a 1 s burst in
a 60 s window).
"""

from __future__ import annotations

import numpy as np

SAMPLES_PER_S = 4  # backlog samples per second of the window (finer than a prefill iteration)


def backlog(enter_s: np.ndarray, leave_s: np.ndarray, weight: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Weight of the items entered (enter ≤ t) and not yet left (leave > t; NaN: never left) at each
    time in `t`, by two cumulative counts."""
    def count(times: np.ndarray) -> np.ndarray:
        ok = np.isfinite(times)
        order = np.argsort(times[ok], kind="stable")
        cum = np.concatenate([[0.0], np.cumsum(weight[ok][order])])
        return cum[np.searchsorted(times[ok][order], t, side="right")]
    return count(enter_s) - count(leave_s)


def served_rate_fraction(enter_s: np.ndarray, leave_s: np.ndarray, weight: np.ndarray, t0: float,
                         t1: float) -> float:
    """The share of the arrival rate served in [t0, t1): 1 − the backlog's least-squares growth
    rate ÷ the weight arriving per second in the window (NaN: nothing arrived). 1 in a steady
    state, 1 − ε under an overload by ε; above 1 while a backlog from before t0 drains."""
    enter_s, leave_s, weight = (np.asarray(x, float) for x in (enter_s, leave_s, weight))
    arriving = weight[(enter_s >= t0) & (enter_s < t1)].sum()
    if t1 <= t0 or not arriving:
        return float("nan")
    t = np.linspace(t0, t1, max(3, int(np.ceil((t1 - t0) * SAMPLES_PER_S)) + 1))
    slope = np.polyfit(t, backlog(enter_s, leave_s, weight, t), 1)[0]
    return float(1.0 - slope / (arriving / (t1 - t0)))


def window_served_fraction(enter_s: np.ndarray, leave_s: np.ndarray, weight: np.ndarray, t0: float,
                           t1: float) -> float:
    """What left in [t0, t1) ÷ what entered in it: the two-ends reading (diagnostic)."""
    enter_s, leave_s, weight = (np.asarray(x, float) for x in (enter_s, leave_s, weight))
    arrived = weight[(enter_s >= t0) & (enter_s < t1)].sum()
    left = weight[(leave_s >= t0) & (leave_s < t1)].sum()
    return float(left / arrived) if arrived else float("nan")
