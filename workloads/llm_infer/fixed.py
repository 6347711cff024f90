"""Fixed-shape serving figures (`workload.mode=fixed`): one decode iteration at a given batch and
context per die and one prefill iteration at a given prompt length per die, simulated per library,
instead of request-level serving. This is how serving papers report per-NPU throughput
(e.g. CloudMatrix-Infer, arXiv 2506.12708 §5: decode at a fixed batch per NPU and KV length,
prefill at a fixed prompt length).

Memory: each library's decode and prefill die start up as in serving (memory.py `ServingDie`: the
library's buffers, the weights through the allocator, a profiling forward at the fixed shape, the
KV cache in what `allocator.memory_utilization` of HBM leaves); the decode batch's KV must fit it.

Decode: each step verifies 1 + draft tokens per sequence with MTP and emits 1 + acceptance tokens
on average, so TPOT = step / (1 + acceptance) and decode tokens/s per NPU = dies per NPU ×
batch × (1 + acceptance) / step; the step includes its graph launch (iteration.py,
`decode_graph_capture`). Prefill: tokens/s per NPU = dies per NPU × prompt tokens per die /
iteration time, each prompt's attention spanning `workload.fixed.prompt_tokens`.

The shapes are `workload.fixed`'s alone (`workload.requests` is not read) and each iteration is
priced exactly: its own trace at the fixed batch, context and prompt, simulated per library.
"""

from __future__ import annotations

import pandas as pd

from stratacl.compare import metric_table
from stratacl.errors import ConfigError
from stratacl.workload_api import RunContext, WorkloadResult
from workloads.common.expert_load import describe_law
from workloads.common.model import model_name
from workloads.llm_infer import scheduling as rules
from workloads.llm_infer.costs import ServingCosts
from workloads.llm_infer.iteration import IterationModel, decode_split_note
from workloads.llm_infer.memory import role_dies, serving_tensors
from workloads.llm_infer.scheduling import ServingPhase
from workloads.llm_infer.schema import LlmInferConfig

KEYS = ["decode_tok_per_s_per_npu", "decode_tpot_s", "decode_step_s", "decode_exposed_comm_s",
        "prefill_tok_per_s_per_npu", "prefill_iter_s", "prefill_exposed_comm_s",
        "decode_weights_GB_per_die", "decode_kv_GB_per_die", "prefill_weights_GB_per_die", "decode_expert_imbalance"]


def run_fixed(ctx: RunContext, cfg: LlmInferConfig, costs: ServingCosts, iters: IterationModel,
              kv_tok: float) -> WorkloadResult:
    f = cfg.fixed
    if f.prompt_tokens > f.prefill_tokens_per_die:
        raise ConfigError("workload.fixed.prompt_tokens", f"a {f.prompt_tokens}-token prompt does not fit the "
                          f"{f.prefill_tokens_per_die} tokens per die of the prefill iteration (fixed mode runs "
                          "whole prompts, no chunked prefill)", "raise workload.fixed.prefill_tokens_per_die or lower prompt_tokens")
    if costs.seq_len != f.prompt_tokens:
        raise ValueError(f"fixed mode prices {f.prompt_tokens}-token prompts but the costs were built for "
                         f"{costs.seq_len} (workload.serving_costs builds them from workload.fixed)")
    s = cfg.scheduler
    dies_per_npu = ctx.fabric.dies_per_npu
    per_step = rules.emitted_tokens_per_step(s)  # tokens per sequence and decode step
    verify = rules.verify_factor(s, ServingPhase.decode)
    rows, metrics = [], {}
    tensors = {role: serving_tensors(costs, cfg, role) for role in ServingPhase}
    for library in ctx.libraries:
        lib = ctx.libraries[library]
        # the serving die's start-up (memory.py) with the fixed shape as its largest forward
        # (decode: the batch and its draft tokens); the KV cache gets what it leaves
        mem_d = role_dies(tensors[ServingPhase.decode], lib, cfg, ServingPhase.decode, ctx.fabric.hbm_bytes, costs, weights=iters.weights,
                          seed=ctx.seed, profile=f.decode_batch_per_die * verify)[0].plan
        mem_p = role_dies(tensors[ServingPhase.prefill], lib, cfg, ServingPhase.prefill, ctx.fabric.hbm_bytes, costs, weights=iters.weights,
                          seed=ctx.seed, profile=f.prefill_tokens_per_die)[0].plan
        kv_need = kv_tok * f.decode_batch_per_die * (f.context + verify)  # the context and the step's tokens
        if kv_need > mem_d.kv:
            raise ConfigError("workload.fixed.decode_batch_per_die",
                              f"{kv_need / 1e9:.1f} GB of KV exceed the {mem_d.kv / 1e9:.1f} GB KV cache of a "
                              f"decode die with '{library}'", "a smaller batch or context")
        ctx.progress.phase(f"fixed shapes {library}", total=2, unit="iteration")
        dec = iters.exact(library, ServingPhase.decode, f.decode_batch_per_die, f.context)
        ctx.progress(1)
        pre = iters.exact(library, ServingPhase.prefill, f.prefill_tokens_per_die)
        ctx.progress(1)
        m = {
            "decode_tok_per_s_per_npu": dies_per_npu * f.decode_batch_per_die * per_step / dec.time_s,
            "decode_tpot_s": dec.time_s / per_step,
            "decode_step_s": dec.time_s,
            "decode_exposed_comm_s": dec.exposed_comm_s,
            "prefill_tok_per_s_per_npu": dies_per_npu * f.prefill_tokens_per_die / pre.time_s,
            "prefill_iter_s": pre.time_s,
            "prefill_exposed_comm_s": pre.exposed_comm_s,
            "decode_weights_GB_per_die": mem_d.weights / 1e9,
            "decode_kv_GB_per_die": mem_d.kv / 1e9,
            "prefill_weights_GB_per_die": mem_p.weights / 1e9,
        }
        if costs.experts:
            m["decode_expert_imbalance"] = costs.expert_imbalance[ServingPhase.decode]
        metrics[library] = m
        for phase, st in (("decode", dec), ("prefill", pre)):
            rows.append({"library": library, "phase": phase, "time_s": st.time_s, "compute_s": st.compute_s,
                         "exposed_comm_s": st.exposed_comm_s, "copy_s": st.copy_s, "register_s": st.register_s,
                         "vector_core_s": st.vector_core_s, "launch_s": st.launch_s})
    table = metric_table(metrics, ctx.baseline, KEYS)
    shapes = (f"decode batch {f.decode_batch_per_die}/die, context {f.context}; prefill "
              f"{f.prefill_tokens_per_die} tokens/die in {f.prompt_tokens}-token prompts")
    notes = [f"fixed shapes (workload.fixed), each priced exactly by its own trace: {shapes}; MTP acceptance {per_step - 1:g}; model {model_name(cfg.model)} "
             f"quant '{cfg.model.quant or 'native'}'; KV {kv_tok:.0f} B/token; {iters.simulated} traces simulated"]
    if (split := decode_split_note(ctx, cfg)) is not None:
        notes.append(split)
    if costs.experts:
        notes.append(costs.load_note(*describe_law(cfg.skew, cfg.zipf_s, cfg.expert_load, costs.experts)))
    return WorkloadResult(rows=pd.DataFrame(rows), metrics=metrics, table=table, notes=notes)
