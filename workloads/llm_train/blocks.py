"""What the schedule needs to know about a model: FSDP units made of sub-blocks with costs
(`workloads.common.cost.Cost` triples).

Kept free of torch/transformers so the same schedule serves the real model (model.py) and the
small MLP stack of the PyTorch cross-check (crosscheck.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.common.cost import Cost

# How a sub-block talks to its TP group (TorchTitan plans; SP = sequence parallel):
#   block      SP: all-gather before, reduce-scatter after (fwd and bwd alike);
#              no SP: all-reduce after in fwd, all-reduce of the input grad in bwd
#   embedding  vocab-parallel: SP fwd reduce-scatter, bwd all-gather; no SP fwd all-reduce
#   head       colwise with loss parallel: SP fwd all-gather, bwd reduce-scatter; no SP bwd all-reduce
TP_STYLES = ("block", "embedding", "head", "none")


@dataclass(frozen=True)
class SubBlock:
    name: str  # attention | dense_mlp | moe | embedding | lm_head | mlp
    fwd: Cost
    bwd: Cost
    tp_style: str = "block"
    # MoE (EP > 1): fwd/bwd = router + shared experts; routed experts cost per received row
    row_fwd: Cost | None = None
    row_bwd: Cost | None = None
    dtype: str = ""  # numeric format its matmuls run in (picks the die's cube peak; "" = bf16)
    # attention with quantised projections: the part of fwd/bwd that is the attention core
    # (scores and values over the context), which stays in `core_dtype`
    core_fwd: Cost | None = None
    core_bwd: Cost | None = None
    core_dtype: str = ""
    # the forward's ops selective op AC runs again (checkpointing.py; None: not measured)
    sac: Cost | None = None
    row_sac: Cost | None = None

    @property
    def routed(self) -> bool:
        return self.row_fwd is not None


@dataclass(frozen=True)
class Unit:
    """One FSDP unit (one `fully_shard` call): its sub-blocks and this rank's parameter shard."""

    name: str
    subs: tuple[SubBlock, ...]
    params: int  # TP/EP-shard parameters sharded over `fsdp` (everything but routed experts)
    expert_params: int = 0  # routed-expert parameters of the EP shard, sharded over `efsdp`
    saved_bytes: float = 0.0  # activations autograd keeps for backward (no checkpointing)
    decoder: bool = True  # transformer blocks are what activation checkpointing wraps
    sac_saved_bytes: float = 0.0  # what selective op AC keeps: its saved ops' outputs


@dataclass(frozen=True)
class ModelPlan:
    units: tuple[Unit, ...]
    hidden: int
    tokens: int  # tokens per TP group per iteration (local batch × sequence)
    top_k: int = 0
    n_experts: int = 0
    boundary_bytes: float = 0.0  # block inputs per rank, all layers (kept for a checkpointed block)
    first_input_needs_grad: bool = True  # False when no embedding precedes the first block

    @property
    def params(self) -> int:
        return sum(u.params for u in self.units)

    @property
    def expert_params(self) -> int:
        return sum(u.expert_params for u in self.units)
