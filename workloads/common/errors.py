"""Errors of the model-cost queries, shared so routing and cost code raise the same types."""


class ModelConfigError(ValueError):
    """A model type, override key or config file that cannot be turned into a config."""


class CostInputError(ValueError):
    """A bad argument to a cost query (layer type, phase, shape, parallel layout)."""
