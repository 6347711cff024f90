"""Deployment search: the goodput-optimal serving layout of one library under an SLO.

Goodput as DistServe defines it (Zhong et al., OSDI 2024, arXiv 2401.09670 §2): the highest
request rate at which the SLO attainment — the share of requests whose TTFT and TPOT both meet
their SLOs — reaches a target (90 % there); per die it is that rate over the die budget.

Method: an exact decomposition, not a black-box optimiser. Prefill and decode instances only meet
through the request stream, so each role's capacity is a function of its own shape:
  prefill (DP = EP dies, TBO, chunked-prefill budget B): under load every die runs B tokens per
    iteration, so an instance serves dp·B / t_prefill(B, c) prompt tokens/s, c the context its
    chunks attend over (prefill_context.py: the trace's prompts packed as the scheduler packs
    them); a prompt of L tokens takes ceil(L / B) such iterations on its die even with no queue,
    chunk j at context j·B (its TTFT floor);
  decode (DP = EP dies, TBO, stream layout, MTP, batch cap): the largest per-die batch b whose step
    meets the TPOT SLO (TPOT = step / tokens emitted per step), no larger than the dispatch cap,
    the batch cap and the KV cache (the trace's length-biased mean reservation); an instance then
    serves dp·b·emitted / step decode tokens/s.
Iteration times come from the run's memoised iteration model, so a role costs a handful of
iteration traces however many layouts use it. A layout (n_p prefill × n_d decode instances
within the die budget) then has the analytic capacity min(n_p·R_p, n_d·R_d), an upper bound on its
goodput when no prompt reuses a cached prefix (queueing is left out; a prefix hit saves prefill
work the decomposition prices); the split is enumerated exactly. The top layouts by that bound
(the finalists) are checked by serving the trace at a grid of rates (search_check.py), which
gives the goodput. Optuna through Hydra's sweeper would treat each layout as a black box at the
price of a serving run per trial; the decomposition prices ~10^4 layouts for the cost of the
role traces and spends serving runs only where the answer is decided.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from stratacl.errors import ConfigError
from workloads.llm_infer.prefill_context import prefill_context


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float
    attainment: float = 0.9  # share of requests meeting both (DistServe's 90 %)

    def scaled(self, k: float) -> Slo:
        """Both latency SLOs × k (the SLO-scale view); the attainment target unchanged."""
        return replace(self, ttft_s=self.ttft_s * k, tpot_s=self.tpot_s * k)


@dataclass(frozen=True)
class PrefillRole:
    dp: int  # dies of an instance (attention DP = MoE EP)
    tbo: bool
    budget: int  # chunked-prefill tokens per die per iteration

    def label(self) -> str:
        return f"P{self.dp}{'+tbo' if self.tbo else ''} B{self.budget}"


@dataclass(frozen=True)
class DecodeRole:
    dp: int
    tbo: bool
    stream_layout: str  # none | cloudmatrix_tbo (only with tbo)
    mtp: bool
    max_batch: int  # sequences per die, 0 = no cap of its own

    def label(self) -> str:
        s = "+cm" if self.tbo and self.stream_layout != "none" else ("+tbo" if self.tbo else "")
        return f"D{self.dp}{s}{'+mtp' if self.mtp else ''} cap{self.max_batch or '-'}"


class Oracle(Protocol):
    """What the decomposition asks of the cost model (search_check.IterationOracle: the simulator;
    tests: closed forms)."""

    def prefill_s(self, library: str, role: PrefillRole, tokens: int, context: float = 0.0) -> float: ...
    def decode_s(self, library: str, role: DecodeRole, batch: int, context: float) -> float: ...
    def kv_per_die(self, library: str, role: DecodeRole) -> float: ...
    def batch_limit(self, role: DecodeRole) -> int: ...  # dispatch cap and batch cap
    def emitted(self, role: DecodeRole) -> float: ...  # tokens a step yields per sequence
    # batches per die at which the decode step turns to another regime (one micro-batch → two)
    def decode_edges(self, role: DecodeRole) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Lengths:
    """The trace's request lengths and what the decomposition needs of them."""

    input: np.ndarray
    output: np.ndarray
    kv_tok: float  # KV bytes per cached token

    @property
    def mean_input(self) -> float:
        return float(np.mean(self.input))

    @property
    def decode_tokens(self) -> float:
        """Mean tokens a request asks of decode (the prefill makes its first)."""
        return float(np.mean(np.maximum(self.output - 1, 0)))

    def _biased(self, x: np.ndarray) -> float:
        """Time average over running sequences: a request is in decode for ∝ its output tokens."""
        w = np.maximum(self.output - 1, 0).astype(float)
        return float(np.sum(w * x) / max(w.sum(), 1e-12))

    @property
    def context(self) -> float:
        """Mean cached tokens of a running sequence (its prompt and half its output, length-biased)."""
        return self._biased(self.input + self.output / 2)

    @property
    def kv_reserved(self) -> float:
        """Mean KV a running sequence holds reserved (the scheduler reserves prompt + output)."""
        return self.kv_tok * self._biased(self.input + self.output)

    @property
    def kv_largest(self) -> float:
        return self.kv_tok * float(np.max(self.input + self.output))


@dataclass
class RoleCap:
    """One role shape's capacity per instance (req/s) and why it stops there."""

    rate: float
    # prefill: compute | ttft; decode: tpot | kv | batch_cap | dispatch_cap | infeasible, or rate_peak
    # (the best rate is at a smaller batch than the largest feasible one: below a regime edge)
    limit: str
    step_s: float = 0.0
    batch: int = 0  # decode: sequences per die at the capacity (the best rate)
    slo_batch: int = 0  # decode: the largest batch per die within the TPOT SLO and the batch limits
    ttft_floor_share: float = 1.0  # prefill: share of prompts whose no-queue TTFT meets the SLO


@dataclass
class Rejection:
    role: str
    field: str
    reason: str


@dataclass
class Layout:
    prefill: PrefillRole
    decode: DecodeRole
    n_prefill: int
    n_decode: int
    capacity: float  # analytic: min of the roles' capacities (req/s), an upper bound on goodput without prefix reuse
    bound: str  # which role binds
    # the batch cap the operator sets (decode.max_batch, or with 0 the batch of the best rate within
    # the TPOT SLO: a scheduler left to fill the KV cache would run past the SLO, or past the rate's peak)
    decode_batch: int = 0

    @property
    def dies(self) -> int:
        return self.n_prefill * self.prefill.dp + self.n_decode * self.decode.dp

    def label(self) -> str:
        return f"{self.n_prefill}×{self.prefill.label()} | {self.n_decode}×{self.decode.label()}"


def prefill_capacity(oracle: Oracle, library: str, role: PrefillRole, lengths: Lengths, slo: Slo) -> RoleCap:
    """A saturated instance runs full-budget iterations whose chunks attend over their prompts'
    earlier tokens (prefill_context.py: the serving scheduler's packing of the trace's prompts)."""
    ctx = prefill_context(lengths.input, role.budget, role.dp)
    t = oracle.prefill_s(library, role, role.budget, ctx)
    rate = role.dp * role.budget / t / lengths.mean_input
    # no queue: a prompt's n = ceil(L / B) chunks, each a full iteration whose context is the j·B
    # tokens before it; priced on the chord from no context to ctx (attention is linear in its keys)
    t0 = oracle.prefill_s(library, role, role.budget) if ctx > 0 else t
    slope = (t - t0) / ctx if ctx > 0 else 0.0
    n = np.ceil(lengths.input / role.budget)
    floor = n * t0 + slope * role.budget * n * (n - 1) / 2
    share = float(np.mean(floor <= slo.ttft_s))
    if share < slo.attainment:  # too few prompts meet the TTFT SLO even on an idle instance
        return RoleCap(0.0, "ttft", t, ttft_floor_share=share)
    return RoleCap(rate, "compute", t, ttft_floor_share=share)


def decode_capacity(oracle: Oracle, library: str, role: DecodeRole, lengths: Lengths, slo: Slo) -> RoleCap:
    """The best decode rate per die within the TPOT SLO and the batch limits. The largest feasible
    batch is found by bisection (step time non-decreasing in the batch). Within one regime of the
    step (one micro-batch, or two) the step is near-affine in the batch, a + c·b with a > 0, so the
    rate b / step(b) rises with b and peaks at the regime's top; across an edge (two-batch overlap
    switching on) the step can jump, so the top batch below each edge is priced too and the best
    rate of those candidates is the capacity (`limit` "rate_peak" when it is not the largest batch)."""
    emitted = oracle.emitted(role)
    kv_cap = math.floor(oracle.kv_per_die(library, role) / max(lengths.kv_reserved, 1.0))
    limits = {"dispatch_cap": oracle.batch_limit(role), "kv": kv_cap}
    if role.max_batch:
        limits["batch_cap"] = role.max_batch
    why, top = min(limits.items(), key=lambda kv: (kv[1], kv[0] != "batch_cap"))
    ctx = lengths.context

    def step(b: int) -> float:
        return oracle.decode_s(library, role, b, ctx)

    if top < 1 or step(1) / emitted > slo.tpot_s:
        return RoleCap(0.0, "infeasible" if top >= 1 else "kv", step(1) if top >= 1 else 0.0)
    lo, hi = 1, top
    if step(top) / emitted <= slo.tpot_s:
        lo = top
    else:
        why = "tpot"
        while hi - lo > 1:  # invariant: lo meets the TPOT SLO, hi does not
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if step(mid) / emitted <= slo.tpot_s else (lo, mid)
    cands = {lo} | {e - 1 for e in oracle.decode_edges(role) if 1 <= e - 1 < lo}
    best = max(sorted(cands), key=lambda b: b / step(b))  # ties to the smaller batch
    if best < lo:
        why = "rate_peak"
    t = step(best)
    return RoleCap(role.dp * best * emitted / t / max(lengths.decode_tokens, 1e-12), why, t, batch=best, slo_batch=lo)


def best_split(p: PrefillRole, d: DecodeRole, rp: float, rd: float, budget: int) -> tuple[Layout | None, int]:
    """The (n_p, n_d) within `budget` dies maximising min(n_p·rp, n_d·rd), exactly (every n_p, the
    decode instances taking what is left); ties to fewer dies. Returns it and the splits priced."""
    best, n = None, 0
    for n_p in range(1, (budget - d.dp) // p.dp + 1):
        n_d = (budget - n_p * p.dp) // d.dp
        n += 1
        cap = min(n_p * rp, n_d * rd)
        lay = Layout(p, d, n_p, n_d, cap, "prefill" if n_p * rp <= n_d * rd else "decode")
        if best is None or cap > best.capacity + 1e-12 or (abs(cap - best.capacity) <= 1e-12 and lay.dies < best.dies):
            best = lay
    return best, n


@dataclass
class SearchResult:
    library: str
    layouts: list[Layout]  # best split per (prefill role, decode role), best first
    prefill: dict[PrefillRole, RoleCap] = field(default_factory=dict)
    decode: dict[DecodeRole, RoleCap] = field(default_factory=dict)
    rejected: list[Rejection] = field(default_factory=list)
    candidates: int = 0  # layouts priced (role pairs × splits)

    @property
    def best(self) -> Layout | None:
        return self.layouts[0] if self.layouts else None


def search(oracle: Oracle, library: str, prefill_roles: Iterable[PrefillRole], decode_roles: Iterable[DecodeRole],
           lengths: Lengths, slo: Slo, budget: int,
           validate: Callable[[str, object], None] | None = None) -> SearchResult:
    """Every role pair's best split within `budget` dies, ranked by analytic capacity. `validate`
    (library, role) raises ConfigError for a role shape that cannot run (memory, divisibility):
    it is rejected with the field named, never scored."""
    res = SearchResult(library, [])
    for roles, table, fn, kind in ((prefill_roles, res.prefill, prefill_capacity, "prefill"),
                                   (decode_roles, res.decode, decode_capacity, "decode")):
        for r in roles:
            try:
                if r.dp > budget:
                    raise ConfigError(f"search.{kind}_dp", f"{r.dp} dies exceed the budget of {budget}",
                                      "a smaller instance or a larger search.die_budget")
                if validate is not None:
                    validate(library, r)
                table[r] = fn(oracle, library, r, lengths, slo)
            except ConfigError as e:
                res.rejected.append(Rejection(kind, e.field, f"{r.label()}: {e.problem}"))
    for p, cp in res.prefill.items():
        for d, cd in res.decode.items():
            if p.dp + d.dp > budget or p.tbo != d.tbo:  # TBO is one scheduler switch for both roles
                continue
            lay, n = best_split(p, d, cp.rate, cd.rate, budget)
            res.candidates += n
            if lay is not None and lay.capacity > 0:
                lay.decode_batch = d.max_batch or cd.batch
                res.layouts.append(lay)
    res.layouts.sort(key=lambda x: (-x.capacity, x.dies, x.label()))
    return res


def attainment(ttft: np.ndarray, tpot: np.ndarray, slo: Slo) -> float:
    """Share of requests meeting both SLOs (a request of one output token has no TPOT)."""
    if not len(ttft):
        return 0.0
    ok = (ttft <= slo.ttft_s) & (np.isnan(tpot) | (tpot <= slo.tpot_s))
    return float(np.mean(ok))


def first_miss(frames: dict[float, tuple[np.ndarray, np.ndarray]], slo: Slo) -> float | None:
    """The lowest served rate missing the attainment target (None: every served rate meets it)."""
    return next((r for r in sorted(frames) if attainment(*frames[r], slo) < slo.attainment), None)


def goodput_on_grid(frames: dict[float, tuple[np.ndarray, np.ndarray]], slo: Slo) -> tuple[float, bool]:
    """DistServe's goodput on the served rates: the highest rate r such that every served rate up to
    r reaches the attainment target (a lucky rate above a miss does not count). Returns it and
    whether the top served rate met it (capped: the true goodput may be higher). The goodput lies in
    [it, first_miss): the bisection's bracket."""
    miss = first_miss(frames, slo)
    return max((r for r in frames if miss is None or r < miss), default=0.0), miss is None


@dataclass(frozen=True)
class Bisection:
    """How the goodput of one layout is searched on the rate (search.start_fraction ... max_extend)."""

    start_fraction: float = 0.9
    tolerance: float = 0.05  # stop when the bracket [meets, misses] is within this (relative)
    extend: float = 1.25
    max_extend: int = 4
    max_lower: int = 10  # ÷ extend per step: light-load rates cost most to serve (a prefill trace per token count)


def goodput_bisect(serve: Callable[[float], tuple[np.ndarray, np.ndarray] | None], capacity: float, slo: Slo,
                   b: Bisection, frames: dict[float, tuple[np.ndarray, np.ndarray]]) -> tuple[float, bool]:
    """Bisection on the served rate for DistServe's goodput (its simulator searches a placement's
    rate the same way: LLMServe/DistServe simdistserve/benchmarks/search_binary.py), assuming the
    attainment falls with the rate. `serve(rate)` gives (TTFT, TPOT) per measured request, or None
    when the rate cannot be served (the trace runs out: capped). `frames` memoises served rates
    across calls (other SLO scales reuse them) and starts the bracket from what they already say.
    Returns goodput_on_grid over every served rate."""
    def ok(r: float) -> bool | None:
        if r not in frames:
            got = serve(r)
            if got is None:
                return None
            frames[r] = got
        return attainment(*frames[r], slo) >= slo.attainment

    lo = goodput_on_grid(frames, slo)[0] if frames else 0.0
    above = [r for r in frames if r > lo]
    hi = min(above) if above else None
    if not frames:
        r0 = round(max(capacity, 1e-3) * b.start_fraction, 3)
        met = ok(r0)
        for _ in range(b.max_lower if met is None else 0):  # above what the trace holds: lower it
            r0 = round(r0 / b.extend, 3)
            met = ok(r0)
            if met is not None:
                break
        if met is None:
            return 0.0, True
        lo, hi = (r0, None) if met else (0.0, r0)
    for _ in range(b.max_extend if hi is None else 0):  # raise the ceiling while the top rate meets the SLO
        nxt = round(lo * b.extend, 3)
        met = ok(nxt)
        if met is None:
            break
        if not met:
            hi = nxt
            break
        lo = nxt
    if hi is None:
        return goodput_on_grid(frames, slo)
    for _ in range(b.max_lower if lo == 0 else 0):  # lower the floor while the bottom rate misses
        nxt = round(hi / b.extend, 3)
        if ok(nxt):
            lo = nxt
            break
        hi = nxt
    while lo > 0 and hi / lo - 1 > b.tolerance:  # invariant: lo meets the SLO, hi does not
        mid = round(math.sqrt(lo * hi), 3)
        if mid in (lo, hi):
            break
        met = ok(mid)
        if met is None:
            break
        lo, hi = (mid, hi) if met else (lo, mid)
    return goodput_on_grid(frames, slo)
