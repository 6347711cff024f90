"""Where a replay's time goes, by counterfactual: without its communication, and with it as plain delays.

Three replays of one trace with one library (engine/replay.py `comm`): as is (T); every
communication op at zero cost (T0, the compute critical path: the library's core limits kept);
every communication phase a plain delay of its standalone time (Td: no port, HBM or core sharing).
A window's time then splits exactly as

    T = T0  +  (Td − T0)  +  (T − Td)
        compute path   exposed communication   contention (ports / HBM / cores shared)

and the exposed part is apportioned among the phase categories (wire, sync, copy, register,
launch, host) by their share of the communication time in the `delays` replay. A difference of two
libraries' times is the difference of their splits, term by term, so it sums to it. Contention may
be negative (a shifted schedule can overlap better than the idle-fabric one).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stratacl.directions import CF_TERMS as TERMS
from stratacl.directions import cf_metric
from stratacl.engine.accounting import COMM_KINDS
from stratacl.engine.replay import SimResult, simulate
from stratacl.machine.lowering import CommLowering
from stratacl.trace import Trace

# the exposed-communication terms (the phase categories of communication ops)
EXPOSED = tuple(t for t in TERMS if t not in ("compute", "contention"))

# the time a window measures, from a replay's op end times (end_of: the last end of selected ops)
Span = Callable[[np.ndarray], float]


@dataclass(frozen=True)
class Split:
    """One replay's time by term (seconds); `total_s` = the as-is time = the sum of the terms."""

    total_s: float
    terms: dict[str, float]

    def minus(self, other: Split) -> Split:
        return Split(self.total_s - other.total_s, {t: self.terms[t] - other.terms[t] for t in TERMS})

    def metrics(self, whole: str) -> dict[str, float]:
        """The terms as `<whole>_cf_<term>_s` metrics (directions.cf_metric); none when the split
        was not made (`output.counterfactual=false`: nan terms)."""
        if math.isnan(self.total_s):
            return {}
        return {cf_metric(whole, t): v for t, v in self.terms.items()}


def end_of(mask: np.ndarray | None) -> Span:
    """The window's time: the last end of the ops `mask` selects (all when None)."""
    def span(end: np.ndarray) -> float:
        return float((end if mask is None else end[mask]).max(initial=0.0))
    return span


class NoCommMemo:
    """The op end times of `comm="none"` replays, shared by the libraries whose compute runs the
    same (same trace object, fabric and per-stream core limits): that replay does not depend on
    the library otherwise."""

    def __init__(self) -> None:
        self._ends: dict[tuple[object, ...], tuple[weakref.ref[Trace], np.ndarray]] = {}

    def end(self, trace: Trace, library: CommLowering) -> np.ndarray:
        key = (id(trace), id(library.fabric), tuple(sorted(library.core_limits(trace).items())))
        hit = self._ends.get(key)
        if hit is None or hit[0]() is not trace:  # a new object (an id can be reused after GC)
            hit = self._ends[key] = (weakref.ref(trace), simulate(trace, library, comm="none").end)
        return hit[1]


def split(trace: Trace, library: CommLowering, as_is: SimResult | float, span: Span,
          memo: NoCommMemo | None = None) -> Split:
    """The counterfactual split of `as_is` (a replay of `trace` with `library`, or the time it
    measured over `span`) over `span`."""
    t = as_is if isinstance(as_is, float) else span(as_is.end)
    t0 = span((memo or NoCommMemo()).end(trace, library))
    delays = simulate(trace, library, comm="delays")
    td = span(delays.end)
    comm = np.isin(delays.kinds, COMM_KINDS)
    by_cat = {c: float(delays.split[c][comm].sum()) for c in EXPOSED}
    whole = sum(by_cat.values())
    exposed = td - t0
    terms = {"compute": t0, "contention": t - td}
    for c in EXPOSED:
        terms[c] = exposed * by_cat[c] / whole if whole > 0 else 0.0
    if whole <= 0:  # no communication time at all: whatever is exposed is the schedule's
        terms["contention"] += exposed
    return Split(t, terms)


def mean(splits: list[Split]) -> Split:
    """Term-by-term mean (an empty list: all zero)."""
    if not splits:
        return Split(0.0, dict.fromkeys(TERMS, 0.0))
    n = len(splits)
    return Split(sum(s.total_s for s in splits) / n, {t: sum(s.terms[t] for s in splits) / n for t in TERMS})
