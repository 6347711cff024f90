"""Schema of `workload=llm_train` (conf/workload/llm_train.yaml extends it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stratacl.workload_config import WorkloadConfig, knob
from workloads.common.expert_load import ExpertLoadConfig
from workloads.common.model_schema import ModelRef
from workloads.llm_train.checkpointing import AcMode


@dataclass
class SkewScheduleConfig:
    """Expert-load skew over training: Zipf exponent end + (start − end)·exp(−iteration / decay).
    start = end = 0 (default): no schedule, the exponent derived from `expert_load` at every
    iteration (no source gives the load's course over training: workloads/common/expert_load.py)."""

    start: float = knob(0.0, ge=0)
    end: float = knob(0.0, ge=0)
    decay_iters: float = knob(500.0, gt=0)


class SavedActivations(StrEnum):
    """What a forward keeps for backward."""

    autograd = "autograd"  # what autograd saves in the model's own modules, measured (fused kernels)
    deepseek_v3 = "deepseek_v3"  # DeepSeek-V3 report §3.2.3 / §3.3.3 (workloads/llm_train/saved_deepseek.py)


@dataclass
class TrainStepConfig(WorkloadConfig):
    """The model, mesh and batch of one training step (what workloads/llm_train/model.py plans
    from); the workloads that train (llm_train, interference) extend it."""

    # the model (the shared reference: preset, overrides, dtype_bytes = compute and parameter
    # all-gather dtype, attention kernels, numeric formats: the tensors' bytes and the format the
    # matmuls run in, the attention core staying bf16)
    model: ModelRef = field(default_factory=lambda: ModelRef(preset="deepseek_v32"))
    num_layers: int = knob(0, ge=0)  # 0 = the model's own depth; else overrides num_hidden_layers
    dies: int = knob(512, ge=1)
    fsdp: int = knob(128, ge=1)
    tp: int = knob(4, ge=1)
    ep: int = knob(64, ge=1)  # formed over (fsdp × tp): ep/tp FSDP ranks × the whole TP group
    global_batch: int = knob(512, ge=1)  # sequences per iteration
    seq_len: int = knob(4096, ge=1)
    grad_dtype_bytes: int = knob(4, ge=1)  # reduce-scatter / sharded gradient dtype
    sequence_parallel: bool = True
    flash_attention: bool = True  # fused kernels: no S×S scores, no fp32 upcast copies kept for backward
    # element-wise passes as one kernel per chain of ops (torch.compile / fused operators) or, false,
    # every aten op its own kernel (eager); llm_train defaults to eager (torchtitan's default)
    compile: bool = True
    saved_activations: SavedActivations = SavedActivations.autograd

    def check_inputs(self, prefix: str = "workload") -> None:
        self.model.check(f"{prefix}.model")  # loads, and is of a family the cost model measures

    def check_run(self, run: Any) -> None:  # noqa: ANN401 - RunConfig (validate_run calls it)
        """The batch must fit a die: checked before the run directory exists."""
        from workloads.llm_train.model import check_batch  # needs the model's config (transformers)

        check_batch(self, run.fabric.die.hbm_GB)


class PpScheduleName(StrEnum):
    """Pipeline schedules TorchTitan offers (torch.distributed.pipelining names in brackets)."""

    gpipe = "gpipe"  # ScheduleGPipe
    one_f_one_b = "one_f_one_b"  # Schedule1F1B (an identifier: Hydra takes enum names)
    interleaved_1f1b = "interleaved_1f1b"  # ScheduleInterleaved1F1B
    interleaved_zb = "interleaved_zb"  # ScheduleInterleavedZeroBubble (ZB1P)
    zbv = "zbv"  # ScheduleZBVZeroBubble (ZB-V, arXiv 2401.10241 §6)
    dualpipev = "dualpipev"  # ScheduleDualPipeV


class LayerSplit(StrEnum):
    even = "even"  # every stage the same number of decoder layers (else a ConfigError)
    balanced = "balanced"  # ⌊L/S⌋ or ⌈L/S⌉ layers, the extra ones on the stages after the first


@dataclass
class LlmTrainConfig(TrainStepConfig):
    """TorchTitan-style FSDP × TP × EP training of a transformers model (REFERENCE §6)."""

    name: str = "llm_train"
    master_dtype_bytes: int = knob(4, ge=1)  # sharded fp32 parameters
    optimizer_state_bytes: int = knob(8, ge=0)  # Adam exp_avg + exp_avg_sq in fp32
    optimizer_flops_per_param: float = knob(12.0, ge=0)
    # torchtitan's gradient clipping before the step (job config `training.max_norm`, default 1.0:
    # on): the shard's norm, one fp32 all-reduced over the data- and tensor-parallel groups, the scale
    grad_clip: bool = True
    # activation checkpointing as torchtitan's `activation_checkpoint.mode` / `selective_ac_option`
    # (workloads/llm_train/checkpointing.py): none | full | selective_layer (every `ac_every`-th
    # block in full) | selective_op (torchtitan's op policy in every block)
    ac: AcMode = AcMode.full
    ac_every: int = knob(2, ge=1)
    # torch.compile on the model (torchtitan `compile.enable`, default off): true runs each chain
    # of element-wise ops (norms, RoPE, SwiGLU, casts, the loss) as one kernel, false runs every
    # aten op as its own kernel reading and writing HBM (eager)
    compile: bool = False
    prefetch: int = knob(1, ge=0)  # FSDP units all-gathered ahead of the one computing
    # FSDP2 runs gradient reduce-scatters on the all-gathers' process group (one communicator:
    # they run one at a time, in issue order) unless FSDPModule.set_separate_reduce_scatter_group()
    # gives them their own (torch 2.13 torch/distributed/fsdp/_fully_shard/_fully_shard.py)
    separate_reduce_scatter_group: bool = False
    # pipeline parallelism: dies = pp × fsdp × tp; stages over contiguous blocks of the placement
    pp: int = knob(1, ge=1)
    pp_schedule: PpScheduleName = PpScheduleName.one_f_one_b
    pp_virtual_stages: int = knob(2, ge=1)  # stages per pipeline rank of the interleaved schedules
    microbatches: int = knob(1, ge=1)  # per data-parallel rank and step (gradient accumulation)
    pp_layer_split: LayerSplit = LayerSplit.even
    # ZeroBubble / DualPipeV split a backward into input- and weight-gradient parts: the weight
    # part's share of the backward's work (ASSUMPTION: 0.5, one of the two GEMMs per linear)
    pp_weight_grad_fraction: float = knob(0.5, ge=0, le=1)
    # DualPipeV's overlapped forward/backward pairs on two streams, so one micro-batch's MoE
    # all-to-all runs under the other's compute (false: the pair runs back to back, the ablation)
    pp_overlap: bool = True
    # Megatron-Core's combined 1F1B (`--overlap-moe-expert-parallel-comm`): in the steady state of
    # one_f_one_b / interleaved_1f1b, a forward and a backward of different micro-batches run as one
    # step on two streams, each one's EP dispatch/combine under the other's compute (Megatron docs
    # "Combined 1F1B: Expert-Parallel All-to-All Overlap"); off in TorchTitan
    ep_overlap: bool = False
    # ZeRO stage of the data-parallel (fsdp) group: 3 = FSDP (parameters gathered per unit),
    # 2 = parameters replicated, gradients reduce-scattered per micro-batch, 1 = gradients
    # reduce-scattered once per step; 1 and 2 all-gather the updated parameters after the step
    zero: int = knob(3, ge=1, le=3)
    # ZeRO-3 under pipelining: free a unit's gathered parameters after each forward (true) or keep
    # them until the step's last backward (false: TorchTitan's default policy with PP,
    # `reshard_after_forward = not pp_enabled`; without PP the FSDP iteration reshards as before)
    zero3_reshard_after_forward: bool = False
    iterations: list[int] = knob(factory=lambda: [0, 100, 500, 1000, 2000], ge=0)
    skew: SkewScheduleConfig = field(default_factory=SkewScheduleConfig)
    expert_load: ExpertLoadConfig = field(default_factory=ExpertLoadConfig)  # the measured router load
    alloc_overhead_GB: float = knob(2.0, ge=0)  # runtime context / workspaces outside the allocator, per die
    expandable_segments: bool = True  # PyTorch allocator setting (a pool library forces it off)

