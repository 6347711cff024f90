"""Errors raised by modelcost: one clear message naming the bad field (defined in
`workloads.common.errors`, which routing shares)."""

from workloads.common.errors import CostInputError, ModelConfigError

__all__ = ["CostInputError", "ModelConfigError"]
