"""What every schema shares: the workload base class and declared numeric bounds.

A numeric field states its admissible range where it is defined, `rate: float = knob(10.0, gt=0)`;
`check_ranges` walks a whole config tree (nested dataclasses, dicts and lists of them, dicts and
lists of numbers) and rejects NaN, ±inf and values outside the declared bounds with a ConfigError
naming the full dotted path. Schemas therefore carry no hand-written sign checks; cross-field
checks (a tier's β under its plane's port rate, a layout fitting the fabric) stay with the code
that knows both fields.

Numbers without a declared bound (e.g. inside free-form model overrides) are still required to be
finite. tests/test_config_validation.py fails when a numeric schema field declares no bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cache
from typing import Any, get_args, get_type_hints

from omegaconf import MISSING

from stratacl.errors import ConfigError

BOUND = "stratacl.bound"  # dataclass field metadata key


@dataclass(frozen=True, slots=True)
class Bound:
    """Admissible range of a numeric field (of each element for lists and dicts of numbers)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def admits(self, x: float) -> bool:
        return (math.isfinite(x)
                and (self.ge is None or x >= self.ge) and (self.gt is None or x > self.gt)
                and (self.le is None or x <= self.le) and (self.lt is None or x < self.lt))

    def describe(self) -> str:
        parts = [f"{op} {_num(v)}" for op, v in (("≥", self.ge), (">", self.gt), ("≤", self.le), ("<", self.lt))
                 if v is not None]
        return " and ".join(parts)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def knob(default: Any = MISSING, *, factory: Any = None, ge: float | None = None, gt: float | None = None,
         le: float | None = None, lt: float | None = None) -> Any:
    """A dataclass field with a declared range: `knob(0.85, ge=0, le=1)`, `knob(factory=list, ge=1)`."""
    meta = {BOUND: Bound(ge=ge, gt=gt, le=le, lt=lt)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class WorkloadConfig:
    """Base of every workload schema (`workloads/<name>/schema.py`); `name` selects the workload."""

    name: str = MISSING

    def check(self, prefix: str = "workload") -> None:
        """Cross-field checks of this workload's own fields (measurement windows), run with the
        range checks before anything is written; a schema overrides it where fields interact."""

    def check_inputs(self, prefix: str = "workload") -> None:
        """Inputs the workload will load (a model's config), checked after `check` and before any
        work; a schema that references such inputs overrides it."""


# --------------------------------------------------------------------------- the walker


@cache
def _integer_fields(cls: type) -> frozenset[str]:
    """Fields typed int, list[int] or dict[..., int]: their values must be whole numbers."""
    hints = get_type_hints(cls)
    return frozenset(f.name for f in fields(cls) if int in (hints[f.name], *get_args(hints[f.name])))


def check_ranges(obj: Any, prefix: str = "") -> None:
    """Reject non-finite and out-of-range numbers anywhere under the dataclass `obj`.

    `prefix` is obj's dotted path in the run config ("" for the root, "library.hccl", …).
    """
    cls: type = type(obj)
    ints = _integer_fields(cls)
    for f in fields(obj):
        path = f"{prefix}.{f.name}" if prefix else f.name
        _check(getattr(obj, f.name), path, f.metadata.get(BOUND), f.name in ints)


def _check(value: Any, path: str, bound: Bound | None, integer: bool) -> None:
    if is_dataclass(value):
        check_ranges(value, path)
    elif isinstance(value, dict):
        for key, v in value.items():
            _check(v, f"{path}.{key}", bound, integer)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check(v, f"{path}[{i}]", bound, integer)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(value, path, bound, integer)


def _check_number(x: float, path: str, bound: Bound | None, integer: bool) -> None:
    want = ("an integer" if integer else "a finite number") + (f" {bound.describe()}" if bound else "")
    if not math.isfinite(x) or (integer and not float(x).is_integer()) or (bound and not bound.admits(x)):
        raise ConfigError(path, f"must be {want}, got {x!r}", f"set {path} to {want}")
