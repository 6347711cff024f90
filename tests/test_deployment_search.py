"""Deployment search (workloads/llm_infer/search.py): the optimal split of a case whose per-role
capacities are known in closed form, goodput monotone in the SLO scale, invalid layouts rejected
with the field named (a closed-form oracle, and the serving simulator on a tiny model)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import compose_run
from test_llm_infer import OVERRIDES, _shared_costs

from stratacl.comm.library import LibraryModel
from stratacl.errors import ConfigError
from stratacl.machine.fabric import Fabric
from stratacl.workload_api import RunContext
from workloads.llm_infer.search import (
    Bisection,
    DecodeRole,
    Lengths,
    PrefillRole,
    Slo,
    attainment,
    decode_capacity,
    first_miss,
    goodput_bisect,
    goodput_on_grid,
    search,
)
from workloads.llm_infer.search_check import IterationOracle

PROMPT, OUTPUT = 1000, 101  # every request: 1000 prompt tokens, 100 decode tokens


class ClosedForm:
    """Prefill: a die computes 1000·eff(dp) tokens/s; decode: a step takes 10 ms + 1 ms per
    sequence per die; KV never binds; one token per step."""

    eff = {4: 1.0, 8: 0.9}

    def prefill_s(self, library: str, role: PrefillRole, tokens: int, context: float = 0.0) -> float:
        return tokens / (1000.0 * self.eff[role.dp])

    def decode_s(self, library: str, role: DecodeRole, batch: int, context: float) -> float:
        return 0.010 + 0.001 * batch

    def kv_per_die(self, library: str, role: DecodeRole) -> float:
        return 1e15

    def batch_limit(self, role: DecodeRole) -> int:
        return 512

    def emitted(self, role: DecodeRole) -> float:
        return 1.0

    def decode_edges(self, role: DecodeRole) -> tuple[int, ...]:
        return ()


LENGTHS = Lengths(np.full(100, PROMPT), np.full(100, OUTPUT), kv_tok=1.0)
P_ROLES = [PrefillRole(4, True, 1000), PrefillRole(8, True, 1000)]
D_ROLES = [DecodeRole(2, True, "none", False, 0)]


def test_search_finds_the_closed_form_optimal_split() -> None:
    """Prefill P4: 4 req/s per instance (1/die), P8: 7.2 (0.9/die); decode D2 at TPOT 50 ms: the
    largest batch with 10 + b ms ≤ 50 ms is 40, so 2·40/0.05 = 1600 tokens/s = 16 req/s. On 24 dies
    the best is 5 × P4 + 2 × D2 = min(20, 32) = 20 req/s; enumerated independently below."""
    slo = Slo(ttft_s=10.0, tpot_s=0.050)
    res = search(ClosedForm(), "x", P_ROLES, D_ROLES, LENGTHS, slo, budget=24)
    cap = res.decode[D_ROLES[0]]
    assert (cap.batch, cap.limit) == (40, "tpot") and cap.rate == pytest.approx(16.0)
    assert res.prefill[P_ROLES[0]].rate == pytest.approx(4.0) and res.prefill[P_ROLES[1]].rate == pytest.approx(7.2)
    best = res.best
    assert (best.prefill.dp, best.n_prefill, best.decode.dp, best.n_decode) == (4, 5, 2, 2)
    assert best.capacity == pytest.approx(20.0) and best.bound == "prefill"
    # brute force over every (prefill role, n_p, n_d) that fits, not only the decode-fills-the-rest splits
    rates = {4: 4.0, 8: 7.2}
    brute = max(min(n_p * rates[p], n_d * 16.0) for p in rates for n_p, n_d in itertools.product(range(1, 7), range(1, 13))
                if n_p * p + n_d * 2 <= 24)
    assert best.capacity == pytest.approx(brute)


def test_ttft_floor_makes_a_prefill_role_infeasible() -> None:
    """A 1000-token prompt at budget 1000 on P8 (0.9 efficiency) takes 1.11 s with no queue: under
    a 1.05 s TTFT SLO no prompt meets it, so P8 serves nothing and P4 (1.0 s) is chosen."""
    res = search(ClosedForm(), "x", P_ROLES, D_ROLES, LENGTHS, Slo(1.05, 0.050), budget=24)
    assert res.prefill[P_ROLES[1]].rate == 0.0 and res.prefill[P_ROLES[1]].limit == "ttft"
    assert all(x.prefill.dp == 4 for x in res.layouts)


def test_goodput_monotone_in_slo_scale() -> None:
    """Loosening both SLOs can only keep or raise goodput: the analytic search, and the serve
    check's goodput on a grid (random per-rate latencies, each judged at every scale)."""
    scales = np.linspace(0.3, 4.0, 25)
    caps = [(search(ClosedForm(), "x", P_ROLES, D_ROLES, LENGTHS, Slo(1.2, 0.05).scaled(k), budget=24).best)
            for k in scales]
    vals = [c.capacity if c else 0.0 for c in caps]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(vals)) and vals[-1] > vals[0]
    rng = np.random.default_rng(0)
    frames = {r: (rng.gamma(2.0, 0.5 * r, 200), rng.gamma(2.0, 0.004 * r, 200)) for r in (1.0, 2.0, 4.0, 8.0, 16.0)}
    g = [goodput_on_grid(frames, Slo(2.0, 0.02).scaled(k))[0] for k in scales]
    assert all(b >= a for a, b in itertools.pairwise(g)) and g[-1] > g[0]


def test_goodput_on_grid_stops_at_the_first_miss() -> None:
    """DistServe's goodput: a rate meeting the target above one that misses does not count."""
    ok, bad = (np.zeros(10), np.zeros(10)), (np.full(10, 9.0), np.zeros(10))
    assert goodput_on_grid({1.0: ok, 2.0: bad, 3.0: ok}, Slo(1.0, 1.0)) == (1.0, False)
    assert goodput_on_grid({1.0: ok, 2.0: ok}, Slo(1.0, 1.0)) == (2.0, True)  # capped: top rate met
    # the bracket's top: the lowest miss, not a later lucky rate; none when every rate met
    assert first_miss({1.0: ok, 3.0: bad, 2.0: bad, 4.0: ok}, Slo(1.0, 1.0)) == 2.0
    assert first_miss({1.0: ok, 2.0: ok}, Slo(1.0, 1.0)) is None
    assert attainment(np.array([0.5, 2.0]), np.array([np.nan, 0.1]), Slo(1.0, 1.0)) == 0.5


def test_kv_cap_binds_decode() -> None:
    class Tight(ClosedForm):
        def kv_per_die(self, library: str, role: DecodeRole) -> float:
            return 25 * (PROMPT + OUTPUT) + 1.0  # 25 sequences' reservations

    cap = decode_capacity(Tight(), "x", D_ROLES[0], LENGTHS, Slo(10.0, 0.05))
    assert (cap.batch, cap.limit) == (25, "kv")


def test_decode_capacity_is_the_best_rate_within_the_limits_not_the_largest_batch() -> None:
    """A step that jumps at a regime edge (two micro-batches from 64 per die, each at a third of the
    cores: 30 ms + 0.2 ms/seq below, 80 ms + 0.1 ms/seq from it) runs 63 sequences faster per second
    than the 116 the SLO allows; without the edge priced the capacity would be the 116's rate."""
    class Edge(ClosedForm):
        def decode_s(self, library: str, role: DecodeRole, batch: int, context: float) -> float:
            return 0.030 + 0.0002 * batch if batch < 64 else 0.080 + 0.0001 * batch

        def decode_edges(self, role: DecodeRole) -> tuple[int, ...]:
            return (64,)

    slo = Slo(10.0, 0.09165)  # the 116-sequence step (91.6 ms) meets it, 117 (91.7 ms) does not
    cap = decode_capacity(Edge(), "x", D_ROLES[0], LENGTHS, slo)
    rate = {b: b / Edge().decode_s("x", D_ROLES[0], b, 0.0) for b in (63, 116)}
    assert rate[63] > rate[116]
    assert (cap.batch, cap.slo_batch, cap.limit) == (63, 116, "rate_peak")
    assert cap.rate == pytest.approx(D_ROLES[0].dp * rate[63] / (OUTPUT - 1))
    # with no edge below the largest feasible batch the two coincide, limited by the SLO
    flat = decode_capacity(ClosedForm(), "x", D_ROLES[0], LENGTHS, Slo(10.0, 0.05))
    assert flat.batch == flat.slo_batch == 40 and flat.limit == "tpot"


def test_invalid_role_rejected_with_field_not_scored() -> None:
    """A role larger than the die budget, and one a validator refuses (memory), are rejected with
    the search field named and priced into no layout."""
    def validate(lib: str, role: object) -> None:
        if isinstance(role, PrefillRole) and role.dp == 8:
            raise ConfigError("search.prefill_dp", "the model does not fit a prefill die", "more EP")

    res = search(ClosedForm(), "x", P_ROLES, [*D_ROLES, DecodeRole(32, True, "none", False, 0)], LENGTHS,
                 Slo(10.0, 0.05), budget=24, validate=validate)
    fields = {(r.role, r.field) for r in res.rejected}
    assert fields == {("prefill", "search.prefill_dp"), ("decode", "search.decode_dp")}
    assert all(x.prefill.dp != 8 and x.decode.dp != 32 for x in res.layouts)
    assert PrefillRole(8, True, 1000) not in res.prefill


def test_simulator_oracle_rejects_ep_not_dividing_experts_and_kv_too_small() -> None:
    """The real oracle (tiny model, 16 experts): EP 3 does not divide them; a decode die whose KV
    cache cannot hold the largest request is refused — both name search.*_dp."""
    cfg = compose_run(OVERRIDES)
    fab = Fabric(cfg.fabric)
    libs = {n: LibraryModel(n, c, fab) for n, c in cfg.library.items()}
    ctx = RunContext(cfg=cfg, fabric=fab, libraries=libs, baseline="hccl", seed=0)
    oracle = IterationOracle(ctx, cfg.workload, _shared_costs())
    with pytest.raises(ConfigError) as e:
        oracle.validate("hccl", PrefillRole(3, True, 1024), 0.0)
    assert e.value.field == "search.prefill_dp" and "does not divide" in e.value.problem
    role = DecodeRole(4, True, "none", True, 0)
    oracle.validate("hccl", role, 1.0)  # fits
    kv = oracle.kv_per_die("hccl", role)
    with pytest.raises(ConfigError) as e:
        oracle.validate("hccl", role, 2 * kv)
    assert e.value.field == "search.decode_dp" and "KV cache" in e.value.problem


def test_die_busy_fraction_counts_each_die_share_of_the_iteration() -> None:
    """Two prefill iterations of 1 s on a 4-die instance in a 4 s window: one full (4 dies × 100
    tokens), one with 100 tokens on one die only: the instance is in an iteration half the window,
    a die computes (1 + 1/4) / 4 of it."""
    import pandas as pd

    from workloads.llm_infer.workload import _die_busy
    it = pd.DataFrame({"time_s": [1.0, 1.0], "tokens": [400.0, 100.0], "batch_per_die": [100.0, 100.0]})
    assert _die_busy(it, 4.0, 1, 4, 1.0) == pytest.approx(1.25 / 4)
    # a decode row records emitted tokens (1.85 per sequence with MTP): the same fill
    it_d = it.assign(tokens=it["tokens"] * 1.85)
    assert _die_busy(it_d, 4.0, 1, 4, 1.85) == pytest.approx(1.25 / 4)


def test_load_fraction_grows_with_the_rate_and_busy_is_not_load() -> None:
    """On the tiny deployment: load as a fraction of the layout's capacity grows with the served
    rate, as do the prefill dies' busy share and the decode batch as a share of its TPOT-feasible
    batch; no instance-level "busy" (1.0 whenever one prompt is in flight) is reported."""
    from test_llm_infer import Env

    from workloads.llm_infer.deployment import load_metrics
    from workloads.llm_infer.requests import generate, pool
    from workloads.llm_infer.workload import summarise
    env = Env()
    sample = pool(env.w.requests, 0, 1000)
    loads, busy, batch = [], [], []
    for rate in (1.0, 4.0):
        sim, _ = env.serve("hccl", generate(env.w.requests, seed=3, rate=rate))
        m = summarise(sim, env.w.warmup_s, env.w.requests.duration_s)
        m.update(load_metrics(env.serving, "hccl", m, sample))
        assert "prefill_busy_fraction" not in m and 0 < m["prefill_die_busy_fraction"] <= 1
        assert m["decode_batch_fraction"] == pytest.approx(m["mean_decode_batch_per_die"] / m["decode_slo_batch_per_die"])
        busy.append(m["prefill_die_busy_fraction"])
        batch.append(m["decode_batch_fraction"])
        assert m["load_fraction"] == pytest.approx(m["requests_per_s"] / min(m["prefill_capacity_req_per_s"],
                                                                          m["decode_capacity_req_per_s"]))
        loads.append(m["load_fraction"])
    assert 0 < loads[0] < loads[1] and busy[0] < busy[1] and batch[0] <= batch[1]


def test_a_layout_carries_the_tpot_feasible_batch_as_its_cap() -> None:
    """With no batch cap of its own, the layout's cap is the batch the TPOT SLO allows (40 here),
    so the serving check runs the scheduler the decomposition priced; an explicit cap stays."""
    res = search(ClosedForm(), "x", P_ROLES, [*D_ROLES, DecodeRole(2, True, "none", False, 16)], LENGTHS,
                 Slo(10.0, 0.050), budget=24)
    caps = {x.decode.max_batch: x.decode_batch for x in res.layouts}
    assert caps == {0: 40, 16: 16}


def test_bisection_finds_the_goodput_of_a_known_threshold() -> None:
    """Attainment 1 below 37.3 req/s and 0 above: the bisection from a 50 req/s capacity brackets
    it within the tolerance, serves a handful of rates, and every rate it served is reused by a
    second search at a looser SLO (no rate served twice); a trace that runs out reports capped."""
    served: list[float] = []

    def serve(r: float) -> tuple[np.ndarray, np.ndarray] | None:
        served.append(r)
        late = 1.0 if r <= 37.3 else 9.0  # TTFT: meets a 2 s SLO below the threshold, misses above
        return np.full(50, late), np.full(50, 0.01)

    frames: dict = {}
    g, capped = goodput_bisect(serve, 50.0, Slo(2.0, 0.05), Bisection(tolerance=0.02), frames)
    above = min(r for r in frames if r > g)
    assert g <= 37.3 < above and above / g - 1 <= 0.02 and not capped
    assert len(served) <= 8 and len(set(served)) == len(served)
    n = len(served)
    g2, capped2 = goodput_bisect(serve, 50.0, Slo(10.0, 0.05), Bisection(tolerance=0.02, max_extend=2), frames)
    assert capped2 and g2 == max(frames) and len(set(served)) == len(served) > n  # every rate meets: raised, capped
    none, capped3 = goodput_bisect(lambda r: None, 50.0, Slo(2.0, 0.05), Bisection(), {})
    assert (none, capped3) == (0.0, True)
    # the trace holds requests up to 20 req/s only: the search lowers its first rate into what it
    # holds, and a goodput at the top of that is capped
    short = goodput_bisect(lambda r: serve(r) if r <= 20.0 else None, 50.0, Slo(2.0, 0.05), Bisection(), {})
    assert short[1] and 20.0 / 1.25 < short[0] <= 20.0


def test_die_busy_is_clipped_to_the_window() -> None:
    """A prefill die computing full iterations back to back from t = 0.1 s (one of 1.8 s, then two of
    1.05 s) is busy the whole window [1, 4) s — exactly 1.0, not 1.3 (an iteration straddling the
    window's start counts only its part inside it)."""
    import pandas as pd

    from workloads.llm_infer.schema import LayoutConfig, SchedulerConfig
    from workloads.llm_infer.workload import summarise

    class Sim:
        layout = LayoutConfig(prefill_instances=1, prefill_dp=2, decode_instances=1, decode_dp=1)
        sched = SchedulerConfig(mtp=False)
        max_batch_seen = 1

        def request_frame(self) -> pd.DataFrame:
            return pd.DataFrame({"arrival_s": [1.0], "first_token_s": [2.0], "completion_s": [3.0], "ttft_s": [1.0],
                                 "tpot_s": [0.1], "e2e_s": [2.0], "input_tokens": [100], "output_tokens": [10]})

        def iteration_frame(self) -> pd.DataFrame:
            return pd.DataFrame({"phase": "prefill", "instance": 0, "start_s": [0.1, 1.9, 2.95],
                                 "time_s": [1.8, 1.05, 1.05],
                                 "batch_per_die": 100.0, "tokens": 200.0, "kv_utilisation": 0.0,
                                 "exposed_comm_s": 0.0})

    assert summarise(Sim(), 1.0, 4.0)["prefill_die_busy_fraction"] == pytest.approx(1.0)


def test_a_rate_the_run_does_not_keep_up_with_fails_whatever_the_window_attainment() -> None:
    """Every request of the window meets the SLO at every rate, but above 30 req/s the served
    fraction (prompt tokens first-served in the window ÷ arriving in it) is 0.9, below 0.95: a
    backlog grows, so the goodput is below 30 req/s, not at the search's ceiling."""
    from workloads.llm_infer.deployment import Checks
    from workloads.llm_infer.search import Layout
    from workloads.llm_infer.search_schema import SearchConfig

    class Oracle:
        def check(self, library: str, lay: Layout, rate: float) -> dict:
            return {"ttft": np.zeros(20), "tpot": np.zeros(20), "served_fraction": 1.0 if rate <= 30 else 0.9}

    lay = Layout(P_ROLES[0], D_ROLES[0], 1, 1, 40.0, "prefill")
    checks = Checks(Oracle(), "x", SearchConfig(rate_tolerance=0.02))
    g = checks.run("a", lay, Slo(1.0, 0.05))
    assert 30 / 1.02 <= g <= 30 and not goodput_on_grid(checks.frames("a"), Slo(1.0, 0.05))[1]


def test_check_window_warms_up_over_a_decode_residence() -> None:
    """1025-token outputs at a 50 ms TPOT stay 51.2 s in decode: the checks' warm-up covers that
    (the configured 10 s would measure decode before its slots fill) and keeps the measured span."""
    from workloads.llm_infer.deployment import check_window
    from workloads.llm_infer.schema import LlmInferConfig

    cfg = LlmInferConfig()
    out = check_window(cfg, Lengths(np.full(10, 100), np.full(10, 1025), 1.0), Slo(2.5, 0.05))
    assert out.warmup_s == pytest.approx(51.2) and out.requests.duration_s == pytest.approx(51.2 + 50.0)
    assert cfg.warmup_s == 10.0  # the run's own config untouched
    short = check_window(cfg, LENGTHS, Slo(2.5, 0.05))  # 100 decode tokens: 5 s, the configured 10 s stays
    assert (short.warmup_s, short.requests.duration_s) == (10.0, 60.0)


def test_checks_serve_memoises_a_rate_and_stops_where_the_trace_runs_out() -> None:
    """A served rate is simulated once (the bisection, the SLO scales and the fixed-load rates share
    it); a rate the trace holds too few requests for gives None, any other ConfigError is raised."""
    from workloads.llm_infer.deployment import Checks
    from workloads.llm_infer.search import Layout
    from workloads.llm_infer.search_schema import SearchConfig

    calls: list[float] = []

    class Oracle:
        def check(self, library: str, lay: Layout, rate: float) -> dict:
            calls.append(rate)
            if rate > 50:
                raise ConfigError("workload.requests.rate", "too few requests", "a lower rate")
            if rate == 13:
                raise ConfigError("workload.layout.decode_dp", "bad", "fix")
            return {"ttft": np.full(5, 0.1), "tpot": np.zeros(5), "served_fraction": 1.0}

    lay = Layout(P_ROLES[0], D_ROLES[0], 1, 1, 40.0, "prefill")
    checks = Checks(Oracle(), "x", SearchConfig())
    first = checks.serve("fixed", lay, 10.0)
    again = checks.serve("fixed", lay, 10.0)
    assert calls == [10.0] and again is first and list(checks.stats["fixed"]) == [10.0]
    assert checks.serve("fixed", lay, 60.0) is None and 60.0 not in checks.stats["fixed"]
    with pytest.raises(ConfigError):
        checks.serve("fixed", lay, 13)
