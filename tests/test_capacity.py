"""Capacity per library: the closed loop keeps every decode die at its cap; the SLO search is a
monotone bisection whose answer meets the SLO while one step more does not."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from test_llm_infer import Env

from workloads.llm_infer import workload
from workloads.llm_infer.capacity import meets, population, slo_capacity
from workloads.llm_infer.requests import Requests
from workloads.llm_infer.schema import CapacityConfig
from workloads.llm_infer.workload import saturation, slo_search


@pytest.fixture(scope="module")
def env() -> Env:
    return Env(decode_max_batch=8)


def test_closed_loop_keeps_every_decode_die_at_its_cap(env: Env) -> None:
    """Short prompts, long outputs: decode is the bottleneck; with the population the loop keeps
    outstanding, every die of every decode step sits at the batch cap once the system has filled."""
    n_pool = 4000
    reqs = Requests(np.zeros(n_pool), np.full(n_pool, 256), np.full(n_pool, 400))
    kv = env.serving.dies("hccl", "decode", False)[0].plan.kv
    pop = population(env.w, reqs, kv, env.kv_tok)
    dies = env.w.layout.decode_instances * env.w.layout.decode_dp
    assert pop >= dies * 8  # enough for every die at its cap of 8
    sim, _ = env.serve("hccl", reqs, closed_loop=pop, until_s=2.0)
    assert sim.issued < n_pool  # the pool did not run dry
    assert sim.occupancy.n == pop  # a completion brings the next request in at once
    dec = sim.iteration_frame().query("phase == 'decode'")
    filled = dec["min_batch_per_die"].to_numpy() == 8
    first = int(np.argmax(filled))
    assert filled.any() and filled[first:].all()  # once full, every step has every die at the cap
    assert (dec["batch_per_die"] <= 8).all()
    assert dec["start_s"].iloc[first] < 0.5  # and it fills early in the run


def test_saturation_metric_is_measured_closed_loop(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "POOL_RATE", 1e5)  # the tiny model completes far faster than 192 real dies
    w = copy.deepcopy(env.w)
    w.requests.input_dist, w.requests.input_mean = "fixed", 256
    w.requests.output_dist, w.requests.output_mean = "fixed", 400
    w.capacity.saturation_duration_s, w.capacity.saturation_warmup_s = 2.0, 0.5
    env.serving.cfg = w
    try:
        m, notes = saturation(env.serving, "hccl")
    finally:
        env.serving.cfg = env.w
    assert not notes
    assert m["saturation_mean_decode_batch_per_die"] == pytest.approx(8, rel=0.02)
    assert m["saturation_population"] >= 8 * w.layout.decode_dp * w.layout.decode_instances
    # more than any open-loop rate delivers: the burst of an open loop cannot beat a full decode
    burst = Requests(np.zeros(200), np.full(200, 256), np.full(200, 400))
    sim, _ = env.serve("hccl", burst)
    it = sim.iteration_frame().query("phase == 'decode'")
    assert m["saturation_throughput_tok_per_s"] >= 0.95 * it["tokens"].sum() / it["time_s"].sum()


def test_slo_bisection_on_a_known_monotone_response() -> None:
    cap = CapacityConfig(ttft_p99_slo_s=1.0, tpot_p99_slo_s=0.05, rate_step=0.5, rate_max=64.0)
    calls = []

    def evaluate(rate: float) -> tuple[float, float]:  # TTFT crosses the SLO at 7.3 req/s
        calls.append(rate)
        return rate / 7.3, 0.01

    res = slo_capacity(cap, 10.0, evaluate)
    assert res.rate == 7.0 and res.meets(cap, 7.0) and not res.meets(cap, 7.5)
    assert len(calls) == len(set(calls)) <= 8  # each rate once, logarithmically many
    res = slo_capacity(cap, 1.0, evaluate)  # from below: doubles up, then bisects
    assert res.rate == 7.0
    tight = CapacityConfig(ttft_p99_slo_s=0.001, rate_step=0.5)
    assert slo_capacity(tight, 10.0, evaluate).rate == 0.0  # nothing meets it
    loose = CapacityConfig(ttft_p99_slo_s=1e9, rate_step=0.5, rate_max=8.0)
    r = slo_capacity(loose, 3.0, evaluate)
    assert r.rate == 64.0 and r.capped and r.ceiling == 64.0  # rate_max 8 raised ×2 three times, still met
    above = CapacityConfig(ttft_p99_slo_s=1.5, rate_step=0.5, rate_max=8.0)  # crosses at 10.95 req/s
    r = slo_capacity(above, 3.0, evaluate)
    assert r.rate == 10.5 and not r.capped and r.ceiling == 16.0  # the ceiling raised once, then found


def test_slo_search_on_the_simulated_system_is_monotone_and_tight(env: Env) -> None:
    w = copy.deepcopy(env.w)
    w.requests.duration_s = 10.0
    w.warmup_s = 1.0
    w.capacity.rate_step = 8.0
    w.capacity.rate_max = 4096.0
    sims = []
    # calibrate an SLO the tiny system meets at a low rate and misses at a high one
    for rate in (8.0, 1024.0):
        from workloads.llm_infer.requests import generate
        sim, _ = env.serve("hccl", generate(w.requests, 0, rate=rate))
        sims.append(sim.request_frame()["ttft_s"].quantile(0.99))
    w.capacity.ttft_p99_slo_s = float(np.sqrt(sims[0] * sims[1]))
    w.capacity.tpot_p99_slo_s = 10.0
    env.serving.cfg = w
    try:
        m, rows = slo_search(env.serving, "hccl")
    finally:
        env.serving.cfg = env.w
    r, step = m["slo_capacity_req_per_s"], w.capacity.rate_step
    assert r > 0 and not m["slo_capacity_capped"]
    by_rate = rows.set_index("rate_req_per_s")
    assert by_rate.loc[r, "meets_slo"] and not by_rate.loc[r + step, "meets_slo"]
    ok = by_rate["meets_slo"].to_numpy()
    assert (ok[:-1] >= ok[1:]).all()  # meeting the SLO is monotone in the rate over the points tried
    assert meets(w.capacity, by_rate.loc[r, "ttft_p99_s"], by_rate.loc[r, "tpot_p99_s"])


def test_the_regime_note_calls_an_offered_rate_beyond_capacity_overload_and_names_the_model(env: Env) -> None:
    """The tiny deployment served at 3× its analytic capacity: the queue grows (a share of the
    arrival rate well under the keep-up bar), the note says overload with that growth and names
    the model; at a third of capacity it keeps up and is not overload."""
    from workloads.common.model import model_name
    from workloads.llm_infer.deployment import load_metrics, regime
    from workloads.llm_infer.requests import generate, pool
    from workloads.llm_infer.workload import queue_metrics, summarise

    w, sample = env.w, pool(env.w.requests, 0, 1000)

    def served_at(rate: float) -> dict[str, float]:
        sim, _ = env.serve("hccl", generate(w.requests, seed=3, rate=rate))
        m = summarise(sim, w.warmup_s, w.requests.duration_s)
        m.update(queue_metrics(sim, w.warmup_s, w.requests.duration_s))
        m.update(load_metrics(env.serving, "hccl", m, sample))
        return m

    probe = served_at(1.0)
    cap = min(probe["prefill_capacity_req_per_s"], probe["decode_capacity_req_per_s"])
    name = model_name(w.model, env.mc.cfg.model_type)
    assert name == "deepseek_v3 + 17 overridden fields"
    keep_up = w.search.min_served_fraction
    over = served_at(3 * cap)
    assert over["offered_load_fraction"] == pytest.approx(over["offered_req_per_s"] / cap)
    assert over["offered_load_fraction"] > 2 and over["served_fraction"] < keep_up
    assert over["backlog_growth_req_per_s"] > 0.3 * over["offered_req_per_s"]
    note = regime("hccl", over, name, keep_up)
    # short prompts, long outputs: decode binds, and its admission queue is the one growing
    assert note.startswith(f"hccl regime, model {name}: overload, decode-bound — ")
    assert "the decode queue grows" in note and "E2E p99" in note
    light = served_at(cap / 3)
    assert light["served_fraction"] >= keep_up and light["offered_load_fraction"] < 0.5
    assert ": under-load, " in regime("hccl", light, name, keep_up)
