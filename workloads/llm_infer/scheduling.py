"""The serving scheduler's shape rules, each stated once: how many micro-batches an iteration
runs, how many tokens each sequence verifies and emits per decode step, whether the MTP layer runs,
how many tokens one step's fused dispatches may carry, and the largest forward a die profiles.

The trace builder (iteration.py), the memory model (memory.py), the request scheduler
(serving.py, capacity.py) and the fixed-shape figures (fixed.py) all call these, so an iteration's
priced trace and the tensors its die allocates have the same shape (tests/test_llm_infer.py checks
the two against each other).
"""

from __future__ import annotations

from enum import StrEnum

from workloads.llm_infer.schema import SchedulerConfig


class ServingPhase(StrEnum):
    """What an iteration does, and so what an instance (a role) runs: prompts' prefill or
    decode steps. A member equals its plain string, which traces, tables and metric names keep."""

    prefill = "prefill"
    decode = "decode"



def max_micro_batches(s: SchedulerConfig) -> int:
    """Micro-batches of a large iteration: two with two-batch overlap (SGLang TBO; CloudMatrix-Infer's
    decode pipeline, arXiv 2506.12708 §4.2.3), else one."""
    return 2 if s.tbo else 1


def micro_batches(s: SchedulerConfig, tokens: int) -> int:
    """Micro-batches of an iteration of `tokens` per die: below `tbo_min_tokens` (and below two)
    one: splitting a small batch re-reads the weights for little overlap (`tbo_min_tokens`)."""
    return max_micro_batches(s) if tokens >= max(2, s.tbo_min_tokens) else 1


def micro_batch_tokens(tokens: int, mbs: int) -> tuple[int, ...]:
    """A die's tokens split over `mbs` micro-batches, the first taking the odd one."""
    if mbs == 1:
        return (tokens,)
    return (tokens - tokens // 2, tokens // 2)


def runs_mtp_layer(s: SchedulerConfig, phase: ServingPhase) -> bool:
    """Whether a `phase` iteration runs the MTP module (one more decoder layer drafting the next
    token): decode only (DeepSeek-V3 report §2.2 and §5.4.3, one draft token per step)."""
    return s.mtp and phase == ServingPhase.decode


def verify_factor(s: SchedulerConfig, phase: ServingPhase) -> int:
    """Tokens per sequence the main model processes in a `phase` step: with MTP a decode step
    verifies the previous step's draft token beside the new one (DeepSeek-V3 §5.4.3), else 1."""
    return 2 if runs_mtp_layer(s, phase) else 1


def emitted_tokens_per_step(s: SchedulerConfig) -> float:
    """Mean tokens a decode step yields per sequence: 1 + the draft's acceptance rate with MTP
    (DeepSeek-V3 report §5.4.3: 85-90 % second-token acceptance)."""
    return 1.0 + (s.mtp_acceptance if s.mtp else 0.0)


def dispatch_token_cap(s: SchedulerConfig) -> int:
    """Tokens per die one decode step's fused MoE dispatches may carry: one dispatch per
    micro-batch, each at most `moe_dispatch_max_tokens` (the operator's maxBs; CANN: Bs ≤ 512 on
    Atlas A3)."""
    return s.moe_dispatch_max_tokens * max_micro_batches(s)


def decode_batch_cap(s: SchedulerConfig) -> int:
    """Sequences per decode die: what the fused dispatch carries (each sequence verifies
    `verify_factor` tokens) and `decode_max_batch` (0 = no cap of its own)."""
    cap = dispatch_token_cap(s) // verify_factor(s, ServingPhase.decode)
    return min(cap, s.decode_max_batch) if s.decode_max_batch else cap


def profile_tokens(s: SchedulerConfig, role: ServingPhase) -> int:
    """Tokens per die of the largest forward the scheduler runs on a `role` die (what the
    start-up's profiling forward runs, vLLM `profile_run`): the chunked-prefill budget on prefill;
    on decode the dispatch cap, or the batch cap's verified tokens when lower."""
    if role != ServingPhase.decode:
        return s.prefill_token_budget
    cap = dispatch_token_cap(s)
    if s.decode_max_batch:
        cap = min(cap, s.decode_max_batch * verify_factor(s, ServingPhase.decode))
    return cap
