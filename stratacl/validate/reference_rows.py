"""REFERENCE §3/§5 operator-level rows as validation rows with a numeric target.

Each published operator figure (a busbw ratio, a latency change, a slowdown) becomes one `RefRow`:
its target, the harness's value, a role (`calibrate`: a parameter in conf/ was fitted on it;
`check`: nothing was), and when it is off, the mechanism believed missing. A row passes when it is
within `TOLERANCE` of its target: absolute for ratios (busbw or time ratios: "ratios within 0.15 of
their target", issue 35), relative for everything else — GB/s, and fractions such as a slowdown or a
latency change, where 0.15 absolute would pass a 13 % slowdown read as 0 % or 28 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TOLERANCE = 0.15
ROLES = ("calibrate", "check")


@dataclass(frozen=True)
class RefRow:
    id: str
    group: str  # e.g. "sdma offload", "interference", "collectives 32 ranks"
    role: str  # calibrate | check
    target: float
    harness: float
    unit: str  # "ratio" compares absolutely; anything else ("fraction", "GB/s") relatively
    what: str  # the published statement, with its source
    missing: str = ""  # when off: the mechanism believed missing
    sets: str = ""  # calibrate rows: the conf/ parameter fitted on it
    relation: str = "="  # "=": within tolerance of target; ">=" / "<=": a bound, met or within tolerance

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"{self.id}: role {self.role!r} not in {ROLES}")
        if self.relation not in ("=", ">=", "<="):
            raise ValueError(f"{self.id}: relation {self.relation!r} not one of =, >=, <=")

    @property
    def absolute(self) -> bool:
        return self.unit == "ratio"

    @property
    def error(self) -> float:
        """harness − target for ratios, harness / target − 1 otherwise."""
        if self.absolute:
            return self.harness - self.target
        return self.harness / self.target - 1.0 if self.target else math.nan

    @property
    def ok(self) -> bool:
        e = self.error
        if self.relation == ">=":
            return e >= -TOLERANCE
        if self.relation == "<=":
            return e <= TOLERANCE
        return abs(e) <= TOLERANCE


def table(rows: list[RefRow]) -> str:
    """The rows, calibration rows first, then check rows, each group together."""
    head = f"{'REFERENCE row':34s} {'group':22s} {'role':9s} {'unit':8s} {'target':>10s} {'harness':>8s} {'error':>8s}  "
    lines = [head + "ok"]
    for role in ROLES:
        for r in sorted((r for r in rows if r.role == role), key=lambda r: r.group):
            err = f"{r.error:+8.3f}" if r.absolute else f"{r.error:+8.1%}"
            note = "ok" if r.ok else f"OFF ({r.missing or 'mechanism not named'})"
            target = f"{'' if r.relation == '=' else r.relation}{r.target:.3f}"
            lines.append(f"{r.id:34s} {r.group:22s} {r.role:9s} {r.unit:8s} {target:>10s} {r.harness:8.3f} {err}  {note}")
    return "\n".join(lines)
