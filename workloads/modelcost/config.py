"""Build `transformers` configs offline from a model type, overrides or a config.json.

Configs come from the config classes transformers ships (no hub access); overrides are
checked against the class's own fields so a typo fails loudly instead of silently adding
an unused attribute.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from stratacl.paths import CONF

from .attention import ATTENTION_KEY, ATTENTION_MODES
from .errors import ModelConfigError

CONF_MODEL_DIR = CONF / "model"

# Keys a config accepts although they are not dataclass fields of every config class:
# legacy aliases the V4 config folds in, and the base PretrainedConfig attributes.
# `head_dim` is read by modeling code via getattr(config, "head_dim", hidden // heads).
_EXTRA_KEYS = {
    "dtype", "torch_dtype", "architectures", "model_type", "transformers_version",
    "quantization_config", "auto_map", "head_dim",
}
_LEGACY_KEYS = {
    "deepseek_v4": {"compress_ratios", "compress_rate_csa", "compress_rate_hca", "num_hash_layers",
                    "qk_rope_head_dim"},
}


# Families whose real modules the cost model measures at every phase (prefill, decode, training
# forward and backward; tests/test_user_loop.py measures each at a tiny size): a causal LM whose
# decoder layers are `model.model.layers[i].self_attn / .mlp`, dense or MoE. Not listed: GPT-2 /
# GPT-NeoX / Falcon / Phi (other module trees), sliding-window families (Mistral, Gemma-2/3: their
# windowed layers' KV per token is not measured yet), DeepSeek-V2.
SUPPORTED_FAMILIES = ("deepseek_v3", "deepseek_v32", "deepseek_v4", "llama", "mixtral", "qwen2", "qwen2_moe",
                      "qwen3", "qwen3_moe")


class UnsupportedFamilyError(ModelConfigError):
    """A model type outside the families a caller measures; `key` is the field that named it."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


def known_model_types() -> list[str]:
    return sorted(CONFIG_MAPPING.keys())


def _valid_keys(cfg_cls: type[PretrainedConfig]) -> set[str]:
    keys = set(_EXTRA_KEYS) | _LEGACY_KEYS.get(getattr(cfg_cls, "model_type", ""), set())
    if dataclasses.is_dataclass(cfg_cls):
        keys |= {f.name for f in dataclasses.fields(cfg_cls)}
    keys |= set(getattr(cfg_cls, "attribute_map", {}))
    # Older-style configs declare their fields as __init__ parameters instead.
    import inspect

    keys |= {p for p in inspect.signature(cfg_cls.__init__).parameters if p not in ("self", "kwargs")}
    return keys


def _check_overrides(cfg_cls: type[PretrainedConfig], model_type: str, overrides: dict) -> None:
    valid = _valid_keys(cfg_cls)
    for key in overrides:
        if key not in valid:
            close = difflib.get_close_matches(key, sorted(valid), n=5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ModelConfigError(
                f"overrides.{key}: not a field of {cfg_cls.__name__} (model_type={model_type!r}).{hint}"
                f" Valid fields: {', '.join(sorted(k for k in valid if not k.startswith('_')))}"
            )


def load_model_config(
    model_type: str | None = None,
    overrides: dict[str, Any] | None = None,
    config_json: str | None = None,
    families: Collection[str] | None = None,
) -> PretrainedConfig:
    """A transformers config from `model_type` (+ `overrides`) or from a `config.json` path;
    `families`: the model types accepted (None = any transformers type).

    `overrides` may also hold `modelcost_attention: production|reference`, which is not passed
    to transformers but set on the returned config for `ModelCosts`."""
    overrides = dict(overrides or {})
    attention = overrides.pop(ATTENTION_KEY, None)
    if attention is not None and attention not in ATTENTION_MODES:
        raise ModelConfigError(f"overrides.{ATTENTION_KEY}: {attention!r}; valid options: {', '.join(ATTENTION_MODES)}")
    base: dict[str, Any] = {}
    if config_json is not None:
        path = Path(config_json)
        if not path.is_file():
            raise ModelConfigError(f"config_json: file not found: {config_json}")
        try:
            base = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelConfigError(f"config_json: {config_json} is not valid JSON ({e})") from e
        if not isinstance(base, dict):
            raise ModelConfigError(f"config_json: {config_json} holds a JSON {type(base).__name__}, "
                                   "not an object of config fields")
        file_type = base.get("model_type")
        if model_type is not None and file_type is not None and file_type != model_type:
            raise ModelConfigError(
                f"model_type: {model_type!r} disagrees with {config_json} (model_type={file_type!r})"
            )
        model_type = model_type or file_type
    if model_type is None:
        raise ModelConfigError("model_type: missing (give model_type or a config_json that names one)")
    if families is not None and model_type not in families:
        from_file = config_json is not None and base.get("model_type") == model_type
        src, key = (f"{config_json} (model_type {model_type!r})", "config_json") if from_file \
            else (f"model_type {model_type!r}", "model_type")
        raise UnsupportedFamilyError(f"{src} is not a model family the cost model measures "
                                     f"(supported: {', '.join(families)})", key)
    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(model_type, known_model_types(), n=5)
        raise ModelConfigError(
            f"model_type: unknown model type {model_type!r}."
            + (f" Did you mean: {', '.join(close)}?" if close else "")
            + f" ({len(known_model_types())} types are known: `python -c 'import transformers; "
            "print(sorted(transformers.CONFIG_MAPPING))'` lists them)"
        )
    cfg_cls = CONFIG_MAPPING[model_type]
    _check_overrides(cfg_cls, model_type, overrides)
    kwargs = {k: v for k, v in base.items() if k != "model_type"}
    kwargs.update(overrides)
    try:
        cfg = AutoConfig.for_model(model_type, **kwargs)
    except (TypeError, ValueError, ArithmeticError, StrictDataclassError) as e:  # typed fields; 0 heads
        msg = " ".join(str(e).split())
        raise ModelConfigError(f"overrides: {cfg_cls.__name__} rejected the values: {msg}") from None
    _check_sizes(cfg, "config_json" if config_json is not None and not overrides else "overrides")
    if attention is not None:
        setattr(cfg, ATTENTION_KEY, attention)
    return cfg


# Shape fields a model cannot have zero of (others, e.g. n_shared_experts or
# first_k_dense_replace, may be 0; none may be negative)
_POSITIVE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")
_SHAPE_SUFFIXES = ("_size", "_layers", "_heads", "_experts", "_dim", "_rank", "_tok", "_replace")


def _check_sizes(cfg: PretrainedConfig, where: str) -> None:
    """transformers accepts negative or non-integer layer counts and sizes; the cost model cannot."""
    for key, value in cfg.to_dict().items():
        if not key.endswith(_SHAPE_SUFFIXES) or value is None or isinstance(value, bool | dict | list):
            continue
        if not isinstance(value, int):
            raise ModelConfigError(f"{where}.{key}: {value!r} is not an integer")
        if value < 0 or (value == 0 and key in _POSITIVE):
            raise ModelConfigError(f"{where}.{key}: {value} must be {'positive' if key in _POSITIVE else '≥ 0'}")


def load_model_yaml(name: str, conf_dir: str | Path | None = None) -> PretrainedConfig:
    """Config for a `conf/model/<name>.yaml` entry (model_type, overrides, config_json)."""
    from omegaconf import OmegaConf

    conf_dir = Path(conf_dir) if conf_dir is not None else CONF_MODEL_DIR
    path = conf_dir / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in conf_dir.glob("*.yaml"))
        raise ModelConfigError(f"model: no {path}. Valid options: {', '.join(names)}")
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return config_from_node(node, where=str(path))


def config_from_node(node: dict[str, Any], where: str = "model") -> PretrainedConfig:
    """Config from a Hydra `model` node: {model_type, overrides, config_json, attention}."""
    allowed = {"model_type", "overrides", "config_json", "name", "attention"}
    for key in node:
        if key not in allowed:
            raise ModelConfigError(f"{where}: unknown key {key!r}; valid keys: {', '.join(sorted(allowed))}")
    overrides = dict(node.get("overrides") or {})
    if node.get("attention") is not None:
        overrides.setdefault(ATTENTION_KEY, node["attention"])
    return load_model_config(node.get("model_type"), overrides, node.get("config_json"))
