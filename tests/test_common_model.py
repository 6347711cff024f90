"""One model reference for every workload: presets, overrides, clear errors, cached costs."""

from __future__ import annotations

import pytest

from stratacl.errors import ConfigError
from workloads.common.model import hf_config, model_costs
from workloads.common.model_schema import ModelRef
from workloads.common.routing import RoutingModel
from workloads.llm_infer import schema as llm_infer
from workloads.llm_train.model import model_ref
from workloads.llm_train.schema import LlmTrainConfig

SMALL = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 1024}


def test_llm_infer_schema_re_exports_the_shared_reference() -> None:
    assert llm_infer.ModelRef is ModelRef
    assert isinstance(llm_infer.LlmInferConfig().model, ModelRef)


def test_preset_overrides_extend_the_presets() -> None:
    cfg = hf_config(ModelRef(preset="llama3_8b", overrides={"num_hidden_layers": 3}))
    assert cfg.model_type == "llama" and cfg.num_hidden_layers == 3
    plain = hf_config(ModelRef(preset="", model_type="llama", overrides=SMALL))
    assert plain.hidden_size == 256


def test_llm_train_num_layers_cuts_its_model_reference() -> None:
    model = ModelRef(preset="llama3_8b", overrides={"vocab_size": 2048}, dtype_bytes=4)
    ref = model_ref(LlmTrainConfig(model=model, num_layers=5))
    assert ref == ModelRef(preset="llama3_8b", overrides={"vocab_size": 2048, "num_hidden_layers": 5},
                           dtype_bytes=4)
    assert hf_config(ref).num_hidden_layers == 5
    assert model.overrides == {"vocab_size": 2048}  # the workload's own reference is left as it is
    assert model_ref(LlmTrainConfig(model=model)) == model  # num_layers 0: the model's own depth


@pytest.mark.parametrize(("ref", "field"), [
    (ModelRef(preset="nosuch"), "workload.model.preset"),
    (ModelRef(preset="llama3_8b", overrides={"hiden_size": 1}), "workload.model"),
    (ModelRef(preset="", model_type="no_such_type"), "workload.model.model_type"),  # names the supported families
])
def test_bad_references_name_their_field(ref: ModelRef, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        hf_config(ref)
    assert err.value.field == field


def test_fields_follow_the_workloads_keys() -> None:
    with pytest.raises(ConfigError) as err:
        hf_config(ModelRef(preset="nosuch"), field="workload.overrides", preset_field="workload.preset")
    assert err.value.field == "workload.preset"


def test_costs_are_measured_once_per_reference_and_routing() -> None:
    ref = ModelRef(preset="", model_type="llama", overrides=SMALL)
    a = model_costs(ref)
    assert model_costs(ModelRef(preset="", model_type="llama", overrides=dict(SMALL))) is a
    assert model_costs(ref, routing=RoutingModel("zipf", 1.0)) is not a
    assert a.dtype_bytes == 2 and a.cfg.num_hidden_layers == 2
