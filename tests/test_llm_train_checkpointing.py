"""Activation checkpointing as torchtitan offers it (workloads/llm_train/checkpointing.py): what
the selective op policy saves and recomputes against closed forms from the model's sizes, which
blocks the layer policy wraps, and memory / recompute time ordered as the policies imply."""

from __future__ import annotations

import pytest
from helpers import run_cli

from stratacl.errors import ConfigError
from stratacl.validate.operators import run_in_process
from workloads.llm_train.blocks import Unit
from workloads.llm_train.checkpointing import AcMode, unit_ac
from workloads.modelcost import ModelCosts
from workloads.modelcost.config import load_model_yaml

SMALL = ("workload=llm_train", "fabric=hgx_h100", "library=[nccl]", "baseline=nccl",
         "workload.model.preset=llama3_8b", "workload.num_layers=4", "workload.dies=8", "workload.fsdp=8",
         "workload.tp=1", "workload.ep=1", "workload.global_batch=8", "workload.seq_len=1024",
         "workload.iterations=[0]")


def test_selective_op_saves_every_other_mm_and_the_attention_kernel() -> None:
    """Llama block, torchtitan's op policy: mm in order q, k, v, o, gate, up, down; the 1st, 3rd,
    5th, 7th are saved (q, v, gate, down) with the SDPA output and its log-sum-exp; k, o and up
    run again (cube FLOPs 2·T·h·(kv + h) and 2·T·h·f), as do the element-wise ops."""
    cfg = load_model_yaml("llama3_8b")
    cfg.num_hidden_layers = 1
    mc = ModelCosts(cfg)
    t = 512
    h, f, heads = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads
    kv = cfg.num_key_value_heads * h // heads
    sac = mc.costs_for_shape(t, phase="train_sac", seq_len=t)
    fwd = mc.costs_for_shape(t, phase="train_fwd", seq_len=t)
    assert sac["attention"].cube_flops == 2 * t * h * (kv + h)
    assert sac["dense_mlp"].cube_flops == 2 * t * h * f
    e = 2  # bf16
    assert sac["attention"].sac_saved_bytes == t * (h + kv) * e + t * h * e + heads * t * 4
    assert sac["dense_mlp"].sac_saved_bytes == t * (f + h) * e
    for layer in ("attention", "dense_mlp"):  # every element-wise op runs again
        assert sac[layer].vector_flops > 0
        assert sac[layer].cube_flops < fwd[layer].cube_flops
    assert fwd["attention"].sac_saved_bytes == 0  # only the train_sac pass records it


def test_selective_layer_wraps_every_kth_block_counting_from_one() -> None:
    units = (Unit("embedding", (), 0, decoder=False), *(Unit(f"layer{i}", (), 0) for i in range(6)),
             Unit("lm_head", (), 0, decoder=False))
    wrapped = [i - 1 for i in range(len(units)) if unit_ac(AcMode.selective_layer, 2, units, i) == AcMode.full]
    assert wrapped == [1, 3, 5]
    assert [unit_ac(AcMode.selective_layer, 3, units, i) for i in range(len(units))].count(AcMode.full) == 2
    assert unit_ac(AcMode.full, 2, units, 0) == AcMode.none  # the embedding is never wrapped
    assert all(unit_ac(AcMode.selective_op, 2, units, i) == AcMode.selective_op for i in range(1, 7))


@pytest.fixture(scope="module")
def runs() -> dict[str, object]:
    return {mode: run_in_process("llm_train", (*SMALL, f"workload.ac={mode}", "workload.ac_every=2"))
            for mode in ("none", "full", "selective_layer", "selective_op")}


def test_policies_order_memory_and_recompute_time(runs: dict) -> None:  # noqa: ANN001
    row = {m: r.rows.iloc[0] for m, r in runs.items()}
    acts = {m: row[m]["mem_activations_GB"] for m in row}
    rec = {m: row[m]["step_recompute_s"] for m in row}
    assert acts["none"] > acts["selective_layer"] > acts["full"]
    assert acts["none"] > acts["selective_op"] > acts["full"]
    assert rec["none"] == 0 < rec["selective_op"] < rec["full"]
    # every second block of four: half the full recompute
    assert rec["selective_layer"] == pytest.approx(rec["full"] / 2, rel=0.05)
    for m in row:
        assert row[m]["ac"] == m and row[m]["schedule_change"] == ""
    assert row["none"]["compute_s"] < row["selective_op"]["compute_s"] < row["full"]["compute_s"]


@pytest.mark.parametrize("bad", ["workload.ac=partial", "workload.ac_every=0"])
def test_a_bad_policy_is_named(tmp_path, bad: str) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", *SMALL, bad], tmp_path)
    assert proc.returncode == 2
    assert bad.split("=")[0] in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_selective_op_with_deepseeks_own_saving_is_refused() -> None:
    with pytest.raises(ConfigError, match="selective_op"):
        run_in_process("llm_train", (*SMALL, "workload.ac=selective_op", "workload.saved_activations=deepseek_v3"))
