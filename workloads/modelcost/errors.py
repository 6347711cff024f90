"""Errors raised by modelcost: one clear message naming the bad field."""


class ModelConfigError(ValueError):
    """A model type, override key or config file that cannot be turned into a config."""


class CostInputError(ValueError):
    """A bad argument to a cost query (layer type, phase, shape, parallel layout)."""
