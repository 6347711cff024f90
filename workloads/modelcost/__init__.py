"""Model costs from real transformers model definitions.

Configs are built offline from transformers' config classes; per-layer FLOPs and bytes are
measured by running the real modules on fake tensors under a dispatch counter; sizes come
from the modules' own parameters; `recorder` lists the collectives real PyTorch
parallelism issues on the fake process group.
"""

from workloads.common.routing import RoutingModel

from .config import load_model_config, load_model_yaml
from .costs import ATTENTION_CORE_FORMAT, LayerCost, ModelCosts
from .errors import CostInputError, ModelConfigError
from .mlp import mlp_cost

__all__ = [
    "ATTENTION_CORE_FORMAT",
    "CostInputError",
    "LayerCost",
    "ModelConfigError",
    "ModelCosts",
    "RoutingModel",
    "load_model_config",
    "load_model_yaml",
    "mlp_cost",
]
