"""Whether a served run keeps up with its arrival rate: the share of the arrival rate it serves,
from how the floor of its backlog moves over the measured window.

A finite window hides a slow overload from a TTFT SLO (a backlog growing at ε of the rate adds ε·t
of TTFT), so the deployment search counts a rate only if the run keeps up with it. Counting what
was served inside the window against what arrived in it reads the backlog at the window's two ends
only: 1 − (B(t1) − B(t0)) ÷ arrivals, so a burst just before t1 reads as a shortfall (azure_conv over a
30 s window: 0.924 while every request met its SLO), and a least-squares trend of the backlog still
moves by 6·h·d ÷ T² for a burst of h lasting d at the end (azure_code, whose scaled trace brings half
of a light window's requests in its last 2 s: 0.93 at a tenth of capacity). What an overload moves
and a burst does not is the backlog's floor — the level it drains back to between bursts: under an
overload by ε it rises at ε·λ, so from the window's first third to its last it rises by ε·λ·2T/3,
while a burst lifts the backlog only until it is served. The floor of each third is read on a grid
of SAMPLES_PER_S samples a second.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

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
    """The share of the arrival rate served in [t0, t1): 1 − the rise of the backlog's floor from
    the window's first third to its last ÷ the weight arriving in two thirds of it (NaN: nothing
    arrived). 1 in a steady state whatever its bursts, 1 − ε under an overload by ε; above 1 while
    a backlog from before t0 drains."""
    enter_s, leave_s, weight = (np.asarray(x, float) for x in (enter_s, leave_s, weight))
    arriving = weight[(enter_s >= t0) & (enter_s < t1)].sum()
    if t1 <= t0 or not arriving:
        return float("nan")
    t = np.linspace(t0, t1, max(6, int(np.ceil((t1 - t0) * SAMPLES_PER_S)) + 1))
    b = backlog(enter_s, leave_s, weight, t)
    third = (t1 - t0) / 3
    rise = b[t >= t1 - third].min() - b[t <= t0 + third].min()
    return float(1.0 - rise / (arriving * 2 / 3))


def window_served_fraction(enter_s: np.ndarray, leave_s: np.ndarray, weight: np.ndarray, t0: float,
                           t1: float) -> float:
    """What left in [t0, t1) ÷ what entered in it: the two-ends reading (diagnostic)."""
    enter_s, leave_s, weight = (np.asarray(x, float) for x in (enter_s, leave_s, weight))
    arrived = weight[(enter_s >= t0) & (enter_s < t1)].sum()
    left = weight[(leave_s >= t0) & (leave_s < t1)].sum()
    return float(left / arrived) if arrived else float("nan")


def served_fractions(req: pd.DataFrame, t0: float, t1: float) -> dict[str, float]:
    """A served run's two queues over [t0, t1) from its request frame: prefill's (prompt tokens
    from arrival to first token) and decode's (a decoding request from its first token to a decode
    slot — a full decode side admits only as sequences complete), each read both ways
    (`<role>_served_fraction`, `<role>_window_served_fraction`), and `served_fraction`, the lesser
    of the two floor readings (NaN: neither queue had arrivals)."""
    dec = req[req["output_tokens"] > 1]
    queues = {"prefill": (req["arrival_s"], req["first_token_s"], req["input_tokens"]),
              "decode": (dec["first_token_s"], dec["decode_start_s"], np.ones(len(dec)))}
    out = {}
    for role, (enter, leave, weight) in queues.items():
        args = (np.asarray(enter, float), np.asarray(leave, float), np.asarray(weight, float), t0, t1)
        out[f"{role}_served_fraction"] = served_rate_fraction(*args)
        out[f"{role}_window_served_fraction"] = window_served_fraction(*args)
    both = [out["prefill_served_fraction"], out["decode_served_fraction"]]
    out["served_fraction"] = float(np.nanmin(both)) if np.isfinite(both).any() else float("nan")
    return out
