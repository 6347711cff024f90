"""What a workload package declares about itself (`SPEC` in `workloads/<name>/__init__.py`).

The core knows a workload only through its spec: the typed schema Hydra composes
`conf/workload/<name>.yaml` against, where its `run` / `estimate` live (imported only when that
workload runs, so a collectives run never imports torch), and what its metrics mean for a verdict.
This module stays import-light: every workload package's `__init__` imports it, and the registry
imports every package's `__init__` when the config layer loads.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from stratacl.directions import MetricInfo
from stratacl.workload_config import WorkloadConfig

if TYPE_CHECKING:
    from stratacl.limits import RunSize
    from stratacl.workload_api import RunContext, WorkloadResult


def _frozen(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class WorkloadSpec:
    """One workload: its name (`workload=<name>`), schema and entry module, and its metrics.

    `entry` names the module holding `run(ctx) -> WorkloadResult` and, optionally,
    `estimate(cfg) -> RunSize` (the run-size check before any work). `metrics` adds the meaning of
    the workload's own metric names (direction, unit, label, mechanism); `headlines` are the
    metrics its verdict leads with, first present one first; `context` metrics are shown beside
    the headlines, never judged; `caveats` maps a flag metric (=1) to what it means for the verdict.
    """

    name: str
    schema: type[WorkloadConfig]
    entry: str
    metrics: Mapping[str, MetricInfo] = field(default_factory=dict)
    headlines: tuple[str, ...] = ()
    context: tuple[str, ...] = ()
    caveats: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", _frozen(self.metrics))
        object.__setattr__(self, "caveats", _frozen(self.caveats))

    def run(self) -> Callable[[RunContext], WorkloadResult]:
        """The workload's `run(ctx)` (imports its entry module)."""
        run: Callable[[RunContext], WorkloadResult] = importlib.import_module(self.entry).run
        return run

    def estimate(self) -> Callable[[Any], RunSize] | None:
        """The workload's `estimate(cfg)`, or None when it declares none."""
        est: Callable[[Any], RunSize] | None = getattr(importlib.import_module(self.entry), "estimate", None)
        return est
