"""The decomposition's prefill context (workloads/llm_infer/prefill_context.py): against a literal
run of the serving scheduler's chunked packing, closed forms for fixed prompts, and what it does to
a prefill role's capacity and TTFT floor (search.py `prefill_capacity`)."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.llm_infer.prefill_context import iteration_contexts, prefill_context
from workloads.llm_infer.search import Lengths, PrefillRole, Slo, prefill_capacity


def brute_force(prompts: list[int], budget: int, dp: int) -> list[float]:
    """serving.py `_prefill` with every prompt queued at once: each iteration a die continues its
    chunked prompt, then the FCFS queue fills the least-loaded die with room and no prompt in
    progress; a chunk's context is its prompt's tokens computed before it, a die's the
    token-weighted mean, the iteration's the max over dies. Iterations with every die full."""
    q = list(prompts)
    chunked: list[list[int] | None] = [None] * dp
    done = [0] * len(prompts)
    rid_of = iter(range(len(prompts)))
    out = []
    while q or any(chunked):
        per_die, cached = [0] * dp, [0.0] * dp
        for d, c in enumerate(chunked):
            if c is not None:
                take = min(c[1], budget)
                per_die[d], cached[d] = take, take * done[c[0]]
                done[c[0]] += take
                c[1] -= take
                if c[1] == 0:
                    chunked[d] = None
        while q:
            room = [x for x in range(dp) if chunked[x] is None and per_die[x] < budget]
            if not room:
                break
            d = min(room, key=per_die.__getitem__)
            rid, left = next(rid_of), q.pop(0)
            take = min(left, budget - per_die[d])
            per_die[d] += take
            cached[d] += take * done[rid]
            done[rid] += take
            if take < left:
                chunked[d] = [rid, left - take]
        if min(per_die) < budget:
            break  # the queue ran dry: a die not full
        out.append(max(c / t for c, t in zip(cached, per_die, strict=True)))
    return out


@pytest.mark.parametrize(("dp", "budget", "dist"), [(1, 64, "geo"), (2, 64, "geo"), (3, 50, "wide"),
                                                    (8, 1000, "wide"), (4, 7, "geo")])
def test_matches_a_literal_run_of_the_serving_scheduler(dp: int, budget: int, dist: str) -> None:
    rng = np.random.default_rng(dp * 1000 + budget)
    n = 400
    p = (rng.geometric(1 / (2 * budget), n) if dist == "geo"
         else np.exp(rng.uniform(0, np.log(20 * budget), n)).astype(int))
    want = brute_force(p.tolist(), budget, dp)
    got = iteration_contexts(p, budget, dp)
    assert len(want) > 20 and len(got) == len(want)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert prefill_context(p, budget, dp) == pytest.approx(np.mean(want))


@pytest.mark.parametrize("m", [1, 2, 3, 5])
@pytest.mark.parametrize("dp", [1, 4])
def test_fixed_prompts_of_m_budgets_attend_over_half_the_earlier_chunks(m: int, dp: int) -> None:
    """Prompts of m·B tokens: every die's windows cycle through chunk j = 0..m−1, context j·B, in
    step with each other; the mean is B(m−1)/2."""
    b = 512
    c = iteration_contexts(np.full(12 * dp, m * b), b, dp)
    assert len(c) == 12 * m
    np.testing.assert_array_equal(c, np.tile(np.arange(m) * b, 12))
    assert prefill_context(np.full(12 * dp, m * b), b, dp) == pytest.approx(b * (m - 1) / 2)


def test_one_and_a_half_budget_prompts_closed_form() -> None:
    """Prompts of 3B/2 on one die: windows [B of p1 at 0], [B/2 of p1 at B, B/2 of p2 at 0],
    [B of p2 at B/2]: contexts 0, B/2, B/2 — mean B/3; a token-level bound Σ L(L−1)/2 ÷ Σ L above it."""
    b = 600
    c = iteration_contexts(np.full(10, 3 * b // 2), b, 1)
    np.testing.assert_array_equal(c, np.tile([0, b / 2, b / 2], 5))
    p = np.random.default_rng(1).integers(1, 5000, 300)
    assert prefill_context(p, 512, 1) <= np.sum(p * (p - 1) / 2) / p.sum()


def test_dies_raise_the_context_the_iteration_waits_for() -> None:
    """The iteration is priced at its slowest die: more dies, a larger max over them (same prompts)."""
    p = np.random.default_rng(2).lognormal(np.log(8000), 1.0, 4000).astype(int)
    ctx = [prefill_context(p, 4096, dp) for dp in (1, 2, 8, 32)]
    assert all(a < b for a, b in zip(ctx, ctx[1:], strict=False))


class Linear:
    """A prefill iteration of B tokens: t0 + s·context (attention linear in its keys)."""

    t0, s = 1.0, 1e-4

    def prefill_s(self, library: str, role: PrefillRole, tokens: int, context: float = 0.0) -> float:
        return self.t0 * tokens / role.budget + self.s * context


def test_capacity_prices_the_chunk_context_and_falls_as_prompts_lengthen() -> None:
    """Fixed prompts of m·B: the role serves dp·B tokens per t0 + s·B(m−1)/2, falling with m; the
    no-queue TTFT floor is Σ_j (t0 + s·j·B) and rejects the role once it passes the TTFT SLO."""
    role, o = PrefillRole(4, True, 1000), Linear()
    tokens_per_s = []
    for m in range(1, 7):
        lengths = Lengths(np.full(64, m * role.budget), np.full(64, 2), kv_tok=1.0)
        cap = prefill_capacity(o, "x", role, lengths, Slo(1e9, 1.0))
        t = o.t0 + o.s * role.budget * (m - 1) / 2
        assert cap.step_s == pytest.approx(t) and cap.limit == "compute"
        tokens_per_s.append(cap.rate * m * role.budget)
        assert tokens_per_s[-1] == pytest.approx(role.dp * role.budget / t)
        floor = sum(o.t0 + o.s * j * role.budget for j in range(m))
        assert prefill_capacity(o, "x", role, lengths, Slo(floor * 1.001, 1.0)).ttft_floor_share == 1.0
        if m > 1:
            under = prefill_capacity(o, "x", role, lengths, Slo(floor * 0.999, 1.0))
            assert under.limit == "ttft" and under.rate == 0.0
    assert all(a > b for a, b in zip(tokens_per_s, tokens_per_s[1:], strict=False))


def test_ttft_floor_prices_each_chunk_at_its_own_context() -> None:
    """Prompts of B and 5B alternating: the no-queue floor of a 5B prompt is Σ_j (t0 + s·j·B) =
    5·t0 + 10·s·B, above 5 chunks at the loaded iteration's context (10B/6): at an SLO just under
    it only the B prompts meet it."""
    role, o = PrefillRole(1, False, 1000), Linear()
    lengths = Lengths(np.tile([1000, 5000], 40), np.full(80, 2), kv_tok=1.0)
    long_floor = 5 * o.t0 + 10 * o.s * role.budget
    assert prefill_capacity(o, "x", role, lengths, Slo(1e9, 1.0)).step_s == pytest.approx(o.t0 + o.s * 10_000 / 6)
    for k, share in ((1.001, 1.0), (0.999, 0.5)):
        cap = prefill_capacity(o, "x", role, lengths, Slo(long_floor * k, 1.0, attainment=0.5))
        assert cap.ttft_floor_share == share and cap.limit == "compute"


@pytest.mark.slow
def test_the_served_iterations_context_is_the_decomposition_s() -> None:
    """The serving simulator (tiny model, one P4 instance, budget 1024) with every prompt queued at
    t = 0 behind a 1-token primer (the first iteration starts on the first arrival alone): each
    full prefill iteration's recorded context equals the module's, iteration by iteration."""
    from test_llm_infer import Env

    from workloads.llm_infer.requests import Requests

    b, n = 1024, 80
    e = Env(prefill_token_budget=b)
    inp = np.random.default_rng(3).integers(64, 4 * b, n)
    sim, _ = e.serve("hccl", Requests(np.zeros(n + 1), np.r_[1, inp], np.full(n + 1, 2)))
    it = sim.iteration_frame()
    full = it[(it["phase"] == "prefill") & (it["min_batch_per_die"] == b)]
    want = iteration_contexts(inp, b, e.w.layout.prefill_dp)
    assert len(want) > 30 and len(full) == len(want)
    np.testing.assert_allclose(full["context"].to_numpy(), want, rtol=1e-9)
