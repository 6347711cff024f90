"""Capacity of a serving deployment per library: closed-loop saturation throughput and the SLO
capacity (the highest request rate whose P99 TTFT and TPOT meet the SLOs).

Saturation: a closed loop keeps enough requests outstanding that every decode die could sit at its
KV or batch cap (`population`) — each completion brings the next request in at once — and the
output-token throughput is measured after the system has filled (`saturation_warmup_s`). Whatever
saturates first (prefill, decode, the KV cache, the fabric) sets it.

SLO capacity: the same arrivals scaled to each rate (Poisson gaps drawn once and divided by the
rate; a trace's gaps scaled), searched on the grid k × `rate_step`: doubling until a rate misses
the SLO, then bisection, so the answer r meets it and r + step does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from workloads.llm_infer.requests import Requests
from workloads.llm_infer.scheduling import decode_batch_cap
from workloads.llm_infer.schema import CapacityConfig, LlmInferConfig


def population(cfg: LlmInferConfig, reqs: Requests, kv_per_die: float, kv_tok: float) -> int:
    """Outstanding requests that let every decode die reach its cap (KV or batch), plus a full
    chunked-prefill budget on every prefill die."""
    lay, s = cfg.layout, cfg.scheduler
    mean_in = float(np.mean(reqs.input_tokens)) if len(reqs) else 1.0
    mean_kv = kv_tok * float(np.mean(reqs.input_tokens + reqs.output_tokens)) if len(reqs) else 1.0
    per_die = min(decode_batch_cap(s), max(1, math.floor(kv_per_die / max(mean_kv, 1.0))))
    decode = lay.decode_instances * lay.decode_dp * per_die
    prefill = lay.prefill_instances * lay.prefill_dp * max(1, math.ceil(s.prefill_token_budget / mean_in))
    return decode + prefill


RAISES = 3  # a capacity at rate_max raises the ceiling ×2 up to this many times before it is reported capped


@dataclass
class SloSearch:
    """Result of the SLO-capacity search: the capacity and every rate evaluated."""

    rate: float  # highest grid rate meeting the SLO (0: none does)
    step: float
    evaluated: dict[float, tuple[float, float]] = field(default_factory=dict)  # rate -> (ttft p99, tpot p99)
    capped: bool = False  # the search reached its raised ceiling without missing the SLO
    ceiling: float = 0.0  # the ceiling the search ended with (rate_max, doubled while it was met)

    def meets(self, cap: CapacityConfig, rate: float) -> bool:
        ttft, tpot = self.evaluated[rate]
        return meets(cap, ttft, tpot)


def meets(cap: CapacityConfig, ttft_p99: float, tpot_p99: float) -> bool:
    return bool(ttft_p99 <= cap.ttft_p99_slo_s and tpot_p99 <= cap.tpot_p99_slo_s)


def slo_capacity(cap: CapacityConfig, start_rate: float,
                 evaluate: Callable[[float], tuple[float, float]]) -> SloSearch:
    """Search the grid k × step for the highest rate whose (P99 TTFT, P99 TPOT) from `evaluate`
    meets the SLO, assuming (and recording for a check) that meeting it is monotone in the rate."""
    step = cap.rate_step
    res = SloSearch(rate=0.0, step=step)
    top = max(1, math.floor(cap.rate_max / step + 1e-9))

    def ok(k: int) -> bool:
        r = round(k * step, 9)
        if r not in res.evaluated:
            res.evaluated[r] = evaluate(r)
        return meets(cap, *res.evaluated[r])

    k = min(top, max(1, round(start_rate / step)))
    if ok(k):  # double until a rate misses the SLO; at the ceiling, raise it (RAISES times at most)
        lo = k
        hi = None
        for attempt in range(RAISES + 1):
            while lo < top:
                nxt = min(top, lo * 2)
                if ok(nxt):
                    lo = nxt
                else:
                    hi = nxt
                    break
            if hi is not None or attempt == RAISES:
                break
            top *= 2
        res.ceiling = round(top * step, 9)
        if hi is None:
            res.rate, res.capped = round(lo * step, 9), True
            return res
    else:  # halve until one meets it
        hi = k
        lo = 0
        while hi > 1:
            nxt = hi // 2
            if ok(nxt):
                lo = nxt
                break
            hi = nxt
        if lo == 0:
            return res
    while hi - lo > 1:  # invariant: ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    res.rate = round(lo * step, 9)
    return res
