"""Run-size budgets: a workload estimates its size from the config, before building anything.

A run that would not fit the machine (a trace of a hundred million ops, ten million requests)
is refused in a second with the estimate and the knob to raise, instead of growing until the
machine swaps. Estimates are upper bounds computed from the config alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from stratacl.errors import ConfigError

BYTES_PER_OP = 4096  # measured: a trace op plus its replay arrays (benchmarks/bench_engine.py RSS)
# ASSUMPTION (only sizes the error message's GiB estimate; the limit counts requests): request
# rows plus the serving iterations they cause (llm_infer)
BYTES_PER_REQUEST = 1500


@dataclass(frozen=True)
class RunSize:
    trace_ops: int = 0  # ops of the largest single trace
    replayed_ops: int = 0  # op replays summed over traces (per library)
    requests: int = 0  # serving requests summed over the request sets (per library)


class Budgets(Protocol):
    """The budget fields read here (config.LimitsConfig), so this module needs no config import."""

    @property
    def max_trace_ops(self) -> int: ...
    @property
    def max_replayed_ops(self) -> int: ...
    @property
    def max_requests(self) -> int: ...


def check(size: RunSize, limits: Budgets, libraries: int) -> None:
    """Raise ConfigError naming the budget a run exceeds, with the estimate."""
    if size.trace_ops > limits.max_trace_ops:
        raise ConfigError("limits.max_trace_ops", f"the run needs a trace of about {size.trace_ops:,} ops "
                          f"(≈ {size.trace_ops * BYTES_PER_OP / 2**30:.1f} GiB), more than the "
                          f"{limits.max_trace_ops:,} allowed", "shrink the run (iterations, sizes) or raise "
                          "limits.max_trace_ops if the machine has the memory")
    replays = size.replayed_ops * libraries
    if replays > limits.max_replayed_ops:
        raise ConfigError("limits.max_replayed_ops", f"the run replays about {replays:,} ops over {libraries} "
                          f"libraries, more than the {limits.max_replayed_ops:,} allowed (hours at ≈ 10k ops/s)",
                          "fewer iterations or sizes, or raise limits.max_replayed_ops")
    reqs = size.requests * libraries
    if reqs > limits.max_requests:
        raise ConfigError("limits.max_requests", f"the run serves about {reqs:,} requests over {libraries} "
                          f"libraries (≈ {reqs * BYTES_PER_REQUEST / 2**30:.1f} GiB of rows), more than the "
                          f"{limits.max_requests:,} allowed", "a lower rate or shorter duration_s, or raise "
                          "limits.max_requests")
