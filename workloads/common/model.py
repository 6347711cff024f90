"""A model reference (`ModelRef`) to its transformers config and measured costs, for every workload.

A reference names a conf/model/<preset>.yaml (whose overrides the reference's own extend), or a
transformers model_type / config.json plus overrides. Costs come from `workloads.modelcost`
(real modules on fake tensors); one `ModelCosts` per (reference, routing, cache) is kept per
process, so repeated runs in one process measure each shape once.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf
from transformers import PretrainedConfig

from stratacl.errors import ConfigError
from workloads.common.model_schema import ModelRef
from workloads.common.quant import resolve
from workloads.common.routing import RoutingModel
from workloads.modelcost import ModelCosts, load_model_config
from workloads.modelcost.config import (
    CONF_MODEL_DIR,
    SUPPORTED_FAMILIES,
    UnsupportedFamilyError,
    config_from_node,
)

FIX = "use a conf/model preset, a transformers model_type or a config.json path, with overrides its config has"


def preset_path(name: str, field: str) -> Path:
    path = Path(CONF_MODEL_DIR) / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in Path(CONF_MODEL_DIR).glob("*.yaml"))
        raise ConfigError(field, f"no model preset '{name}'", f"use one of {names}")
    return path


def hf_config(ref: ModelRef, *, field: str = "workload.model",
              preset_field: str = "workload.model.preset") -> PretrainedConfig:
    """The transformers config `ref` names; bad input raises ConfigError on `field` (a missing
    preset on `preset_field`)."""
    overrides = dict(ref.overrides)
    try:
        if ref.preset:
            node = OmegaConf.to_container(OmegaConf.load(preset_path(ref.preset, preset_field)), resolve=True)
            node["overrides"] = {**(node.get("overrides") or {}), **overrides}
            return config_from_node(node, where=f"conf/model/{ref.preset}.yaml")
        return load_model_config(ref.model_type or None, overrides or None, ref.config_json or None,
                                 families=SUPPORTED_FAMILIES)
    except UnsupportedFamilyError as exc:
        raise ConfigError(f"{field}.{exc.key}", str(exc), "a config.json or model_type of a supported "
                          "family, or a conf/model preset (workload.model.preset=<name>)") from None
    except (FileNotFoundError, ValueError) as exc:  # ModelConfigError is a ValueError
        raise ConfigError(field, str(exc), FIX) from None


def model_name(ref: ModelRef, model_type: str = "") -> str:
    """What a note calls the model: its preset, its config.json (the checkpoint folder's name when
    the file is a folder's config.json, as downloaded) or its transformers model_type; then the
    model_type (`model_type`: the loaded config's) when it is not the name, and any overridden fields."""
    kind = ref.model_type or model_type
    if ref.preset:
        name = ref.preset
    elif ref.config_json:
        path = Path(ref.config_json)
        folder = path.parent.name if path.name == "config.json" else ""
        name = f"{folder or path.stem} ({kind + ', ' if kind else ''}{ref.config_json})"
        kind = ""
    else:
        name, kind = kind or "unnamed model", ""
    if kind and kind != name:
        name += f" ({kind})"
    if ref.overrides:
        keys = sorted(map(str, ref.overrides))
        name += f" + overrides {', '.join(keys)}" if len(keys) <= 3 else f" + {len(keys)} overridden fields"
    return name


def model_costs(ref: ModelRef, cache_dir: str = "", routing: RoutingModel | None = None, *,
                field: str = "workload.model", preset_field: str = "workload.model.preset",
                quant_field: str = "workload.model.quant", passes: str = "fused") -> ModelCosts:
    """Measured costs of the referenced model (`cache_dir`: on-disk cache, "" = none; `passes`:
    fused | eager element-wise kernels, `ModelCosts`)."""
    resolve(ref.quant, dict(ref.formats), field=quant_field)  # bad formats name their own field
    overrides = OmegaConf.to_container(OmegaConf.create(dict(ref.overrides)), resolve=True)  # plain, for the key
    key = json.dumps({"preset": ref.preset, "model_type": ref.model_type, "config_json": ref.config_json,
                      "overrides": overrides, "dtype_bytes": ref.dtype_bytes, "attention": str(ref.attention),
                      "quant": ref.quant, "formats": dict(ref.formats)},
                     sort_keys=True)
    return _model_costs(key, cache_dir, routing or RoutingModel(), field, preset_field, passes)


@lru_cache(maxsize=8)
def _model_costs(key: str, cache_dir: str, routing: RoutingModel, field: str, preset_field: str,
                 passes: str = "fused") -> ModelCosts:
    ref = ModelRef(**json.loads(key))
    formats = resolve(ref.quant, dict(ref.formats))
    hf = hf_config(ref, field=field, preset_field=preset_field)
    try:
        return ModelCosts(hf, dtype_bytes=ref.dtype_bytes, routing=routing, cache_dir=cache_dir or None,
                          attention=str(ref.attention), formats=formats, passes=passes)
    except ValueError as exc:  # CostInputError
        raise ConfigError(field, str(exc), FIX) from None


def describe_model(ref: ModelRef, mc: ModelCosts) -> str:
    """The model a run measured, as its notes say it: source, size and shape (from its config)."""
    cfg, moe = mc.cfg, mc.moe_info()
    experts = f"{moe['n_routed_experts']} routed experts (top-{moe['top_k']})" if moe["n_routed_experts"] else "dense"
    return (f"model {model_name(ref, cfg.model_type)}: {mc.total_params() / 1e9:.2f} B parameters, "
            f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {experts}")
