"""The training step as PyTorch runs it: the loss over the vocabulary, eager vs compiled passes,
and the step breakdown / MFU each run reports."""

from __future__ import annotations

import pytest

from stratacl.validate.operators import run_in_process
from workloads.modelcost import ModelCosts
from workloads.modelcost.config import load_model_yaml

SMALL = ("workload=llm_train", "fabric=hgx_h100", "library=[nccl]", "baseline=nccl",
         "workload.model.preset=llama3_8b", "workload.num_layers=2", "workload.dies=8", "workload.fsdp=8",
         "workload.tp=1", "workload.ep=1", "workload.global_batch=8", "workload.seq_len=1024",
         "workload.iterations=[0]")


@pytest.fixture(scope="module")
def costs() -> dict[str, ModelCosts]:
    cfg = load_model_yaml("llama3_8b")
    cfg.num_hidden_layers = 1
    return {p: ModelCosts(cfg, passes=p) for p in ("eager", "fused")}


def _elementwise_bytes(mc: ModelCosts, phase: str, layer: str, tokens: int = 256) -> float:
    cost = mc.costs_for_shape(tokens, phase=phase, seq_len=tokens).get(layer)
    assert cost is not None
    return sum(p[3] for p in cost.parts if p[0] == "elementwise")


def test_the_loss_reads_the_fp32_logits(costs: dict[str, ModelCosts]) -> None:
    """Eager cross-entropy on fp32 logits: the cast reads T·V bf16 and writes T·V fp32, the
    log-softmax reads and writes T·V fp32: at least 14 bytes per logit in the head's forward."""
    tokens, vocab = 256, costs["eager"].cfg.vocab_size
    assert _elementwise_bytes(costs["eager"], "train_fwd", "lm_head", tokens) >= 14 * tokens * vocab
    # backward from the loss: the log-softmax gradient reads and writes fp32 logits again
    assert _elementwise_bytes(costs["eager"], "train_bwd", "lm_head", tokens) >= 8 * tokens * vocab
    # serving has no loss: the prefill head's passes are a small part of the training forward's
    prefill = _elementwise_bytes(costs["eager"], "prefill", "lm_head", tokens)
    assert prefill < 0.25 * _elementwise_bytes(costs["eager"], "train_fwd", "lm_head", tokens)


@pytest.mark.parametrize("phase", ["train_fwd", "train_bwd"])
@pytest.mark.parametrize("layer", ["attention", "dense_mlp", "lm_head"])
def test_eager_passes_move_at_least_the_fused_bytes(costs: dict[str, ModelCosts], phase: str, layer: str) -> None:
    eager = _elementwise_bytes(costs["eager"], phase, layer)
    fused = _elementwise_bytes(costs["fused"], phase, layer)
    assert eager >= fused > 0
    assert eager > 1.2 * fused  # a chain of several ops: fusion saves its intermediates


def test_a_bad_passes_mode_is_named() -> None:
    from workloads.modelcost import CostInputError

    with pytest.raises(CostInputError, match="passes"):
        ModelCosts(load_model_yaml("llama3_8b"), passes="jit")


@pytest.fixture(scope="module")
def runs() -> dict[str, object]:
    return {name: run_in_process("llm_train", SMALL + extra) for name, extra in (
        ("eager", ("workload.compile=false", "workload.ac=none")),
        ("compiled", ("workload.compile=true", "workload.ac=none")),
        ("recompute", ("workload.compile=false", "workload.ac=full")))}


def test_step_breakdown_accounts_for_the_compute(runs: dict) -> None:  # noqa: ANN001
    parts = ("gemm", "attention_fwd", "attention_bwd", "elementwise", "loss", "optimizer", "fsdp_copy")
    for name, res in runs.items():
        row = res.rows.iloc[0]
        kernels = sum(row[f"step_{p}_s"] for p in parts)
        # the main stream's kernels run one at a time inside the compute time (union); FSDP2's
        # copy-ins run on the collectives' streams beside them
        assert kernels - row["step_fsdp_copy_s"] <= row["compute_s"] * (1 + 1e-9) <= kernels * (1 + 1e-9), name
        assert all(row[f"step_{p}_s"] > 0 for p in parts), name
        assert 0 < row["mfu"] < 1, name
        assert row["exposed_comm_s"] == pytest.approx(
            row["iteration_time_s"] - row["compute_s"], abs=1e-9)
        for col in (c for c in res.rows.columns if c.startswith("exposed_") and c != "exposed_comm_s"):
            assert 0 <= row[col] <= row["exposed_comm_s"] + 1e-12, col


def test_eager_is_slower_only_in_its_passes(runs: dict) -> None:  # noqa: ANN001
    eager, comp = runs["eager"].rows.iloc[0], runs["compiled"].rows.iloc[0]
    assert eager["step_elementwise_s"] > comp["step_elementwise_s"]
    assert eager["step_loss_s"] > comp["step_loss_s"]
    for p in ("gemm", "attention_fwd", "attention_bwd", "optimizer"):
        assert eager[f"step_{p}_s"] == pytest.approx(comp[f"step_{p}_s"], rel=0.02), p
    assert eager["mfu"] < comp["mfu"]


def test_recompute_is_reported_and_costs_forward_time(runs: dict) -> None:  # noqa: ANN001
    plain, rc = runs["eager"].rows.iloc[0], runs["recompute"].rows.iloc[0]
    assert plain["step_recompute_s"] == 0
    assert rc["step_recompute_s"] > 0
    # recomputed forwards add GEMM time but no model FLOPs: MFU falls
    assert rc["step_gemm_s"] > plain["step_gemm_s"]
    assert rc["mfu"] < plain["mfu"]


def test_an_eager_attention_backward_is_one_attention_kernel() -> None:
    """DeepSeek-V3's attention (q and K 192 wide, V 128: no fused CPU kernel, so the reference
    runs bmm and softmax) counts its backward as the attention_backward kernel: the matmuls of the
    interface's autograd nodes (dP, dV, dQ, dK: twice the forward's) and a fused kernel's traffic,
    not S×S score gradients through HBM (before: 25× the forward's element-wise bytes)."""
    cfg = load_model_yaml("deepseek_v3")
    cfg.num_hidden_layers, cfg.first_k_dense_replace = 2, 1
    mc = ModelCosts(cfg)
    t = 512
    fwd, bwd = (mc.costs_for_shape(t, phase=ph, seq_len=t)["attention"].parts for ph in ("train_fwd", "train_bwd"))
    f = {p[0]: p for p in fwd}
    b = {p[0]: p for p in bwd}
    assert b["attention_backward"][1] == 2 * f["attention_prefill"][1]
    heads = cfg.num_attention_heads
    # none of the backward's matmuls outside the kernel is a (t × t) score product of the heads
    assert not any(g[3] == heads and sorted(g[:3])[1:] == [t, t] for g in b["gemm"][4])
    assert b["elementwise"][3] < 3 * f["elementwise"][3]
