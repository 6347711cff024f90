"""Serving workload: queueing laws, memory-capped batching, identical arrivals, clear failures.

A tiny DeepSeek-V3-shaped model (3 layers, 16 experts) on 4-die prefill and decode instances keeps
the cost measurements fast; the mechanisms are the same as for the default model.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
from helpers import compose_run, run_cli

from stratacl.comm.library import LibraryModel, LibraryRuntime
from stratacl.errors import ConfigError, TraceError
from stratacl.machine.fabric import Fabric
from stratacl.metrics import latency_percentiles, measured_requests
from stratacl.trace import MoeShape
from stratacl.workload_api import RunContext
from workloads.common.kernels import emit_gemms
from workloads.common.model import model_costs
from workloads.llm_infer import workload as serving_workload
from workloads.llm_infer.costs import ServingCosts
from workloads.llm_infer.iteration import (
    BATCH_GRID,
    CONTEXT_GRID,
    IterationModel,
    bracket,
)
from workloads.llm_infer.requests import Requests, generate
from workloads.llm_infer.workload import Serving, summarise, validate_layout

TINY = ("{num_hidden_layers:3,first_k_dense_replace:1,hidden_size:256,intermediate_size:512,"
        "moe_intermediate_size:128,n_routed_experts:16,num_experts_per_tok:4,n_group:1,topk_group:1,"
        "num_attention_heads:4,num_key_value_heads:4,kv_lora_rank:64,q_lora_rank:64,qk_rope_head_dim:16,"
        "qk_nope_head_dim:32,v_head_dim:32,vocab_size:1024}")
OVERRIDES = [
    "workload=llm_infer", "workload.model.preset=deepseek_v3", f"+workload.model.overrides={TINY}",
    "workload.layout.prefill_instances=1", "workload.layout.prefill_dp=4", "workload.layout.prefill_ep=4",
    "workload.layout.decode_instances=1", "workload.layout.decode_dp=4", "workload.layout.decode_ep=4",
    "workload.requests.arrival=poisson", "workload.requests.rate=4", "workload.requests.duration_s=20",
    "workload.warmup_s=2", "workload.requests.input_dist=fixed", "workload.requests.input_mean=1024",
    "workload.requests.output_dist=fixed", "workload.requests.output_mean=64", "workload.cache_dir=",
    "workload.capacity.saturation=false", "library=[hccl,stratacl,hccl_jit,hccl_zerocopy]",
]


class Env:
    def __init__(self, hbm_GB: float | None = None, **sched: int) -> None:
        cfg = compose_run(OVERRIDES)
        if hbm_GB is not None:
            cfg.fabric.die.hbm_GB = hbm_GB
        for k, v in sched.items():
            setattr(cfg.workload.scheduler, k, v)
        self.cfg = cfg
        self.w = cfg.workload
        fab = Fabric(cfg.fabric)
        libs = {n: LibraryModel(n, c, fab) for n, c in cfg.library.items()}
        self.ctx = RunContext(cfg=cfg, fabric=fab, libraries=libs, baseline="hccl", seed=0)
        self.mc = _shared_costs()
        self.costs = ServingCosts(self.mc, 4, 4, self.w.requests.input_mean)
        self.kv_tok = float(self.mc.kv_bytes_per_token())
        self.iters = IterationModel(self.ctx, self.costs, self.w)
        self.serving = Serving(self.ctx, self.w, self.costs, self.iters, self.kv_tok)

    def serve(self, library: str, reqs: Requests, **kw):  # noqa: ANN003, ANN201
        return self.serving.serve(library, reqs, **kw)


def _shared_costs():  # noqa: ANN202 - one ModelCosts per process (model_costs is cached)
    return model_costs(compose_run(OVERRIDES).workload.model)


@pytest.fixture(scope="module")
def env() -> Env:
    return Env()


def test_littles_law_on_the_simulated_system(env: Env) -> None:
    reqs = generate(env.w.requests, seed=1)
    sim, _ = env.serve("hccl", reqs)
    df = sim.request_frame()
    horizon = float(df["completion_s"].max())
    sim.occupancy.change(horizon, 0)  # close the integral at the last completion
    mean_in_system = sim.occupancy.area / horizon
    lam = len(df) / horizon
    w = float((df["completion_s"] - df["arrival_s"]).mean())
    assert sim.occupancy.n == 0
    assert mean_in_system == pytest.approx(lam * w, rel=1e-9)


def test_ttft_at_least_the_prefill_of_the_request(env: Env) -> None:
    reqs = generate(env.w.requests, seed=2)
    sim, _ = env.serve("hccl", reqs)
    df = sim.request_frame()
    for _, r in df.iterrows():
        alone = env.iters.prefill("hccl", r["input_tokens"])
        assert r["ttft_s"] >= alone.compute_s
        assert r["ttft_s"] >= alone.time_s - 1e-12  # its die processed ≥ its own tokens


def test_ttft_non_decreasing_in_load(env: Env) -> None:
    means, p99s = [], []
    for rate in (1.0, 4.0, 16.0, 64.0):
        reqs = generate(env.w.requests, seed=3, rate=rate)
        sim, _ = env.serve("hccl", reqs)
        t = sim.request_frame()["ttft_s"]
        means.append(float(t.mean()))
        p99s.append(float(np.percentile(t, 99)))
    assert all(b >= a - 1e-12 for a, b in zip(means, means[1:], strict=False))
    assert all(b >= a - 1e-12 for a, b in zip(p99s, p99s[1:], strict=False))
    assert means[-1] > means[0]


def test_workload_serves_every_library_the_requests_of_its_seed(env: Env, monkeypatch) -> None:  # noqa: ANN001
    """Through the workload's own `run`: each library's request rows are exactly the requests the
    run's seed generates (all served), the same for both libraries; another seed draws others."""
    monkeypatch.setattr(serving_workload, "model_costs", lambda ref, cache_dir: env.mc)  # measured once
    cfg = copy.deepcopy(env.cfg)
    req = cfg.workload.requests
    req.input_dist = req.output_dist = "uniform"  # lengths vary with the seed too
    req.duration_s, cfg.workload.warmup_s = 6.0, 0.0
    cols = ["arrival_s", "input_tokens", "output_tokens"]

    def served(seed: int, libraries: tuple[str, ...]) -> dict[str, np.ndarray]:
        libs = {n: env.ctx.libraries[n] for n in libraries}
        ctx = RunContext(cfg=cfg, fabric=env.ctx.fabric, libraries=libs, baseline=libraries[0], seed=seed)
        rows = serving_workload.run(ctx).rows
        assert rows["completion_s"].notna().all()
        return {lib: g.sort_values("request")[cols].to_numpy(float) for lib, g in rows.groupby("library")}

    seeds = {4: served(4, ("hccl", "stratacl")), 5: served(5, ("hccl",))}
    for seed, by_lib in seeds.items():
        reqs = generate(cfg.workload.requests, seed=seed)
        expected = np.column_stack([reqs.arrival_s, reqs.input_tokens, reqs.output_tokens]).astype(float)
        for lib, got in by_lib.items():
            np.testing.assert_array_equal(got, expected, err_msg=f"{lib}, seed {seed}")
    np.testing.assert_array_equal(seeds[4]["hccl"], seeds[4]["stratacl"])
    a, b = seeds[4]["hccl"], seeds[5]["hccl"]
    n = min(len(a), len(b))
    for col, name in enumerate(cols):  # every column is drawn from the seed
        assert not np.array_equal(a[:n, col], b[:n, col]), name


def test_reported_percentiles_are_the_measured_windows(env: Env, monkeypatch) -> None:  # noqa: ANN001
    """summary.json's ttft/tpot/e2e percentiles are `latency_percentiles` of the run's own request
    rows (results.parquet) over [warmup_s, duration_s): what the notebooks recompute or read."""
    monkeypatch.setattr(serving_workload, "model_costs", lambda ref, cache_dir: env.mc)
    cfg = copy.deepcopy(env.cfg)
    cfg.workload.requests.duration_s, cfg.workload.warmup_s = 6.0, 2.0
    ctx = RunContext(cfg=cfg, fabric=env.ctx.fabric, libraries={"hccl": env.ctx.libraries["hccl"]},
                     baseline="hccl", seed=0)
    res = serving_workload.run(ctx)
    rows = res.rows[res.rows["library"] == "hccl"]
    assert (rows["arrival_s"] < 2.0).any()  # the warm-up had requests: the window excludes them
    expected = latency_percentiles(rows, 2.0, 6.0)
    assert {k: res.metrics["hccl"][k] for k in expected} == pytest.approx(expected)
    before = rows[rows["arrival_s"] < 2.0]["ttft_s"]
    assert len(measured_requests(rows, 2.0, 6.0)) == len(rows) - len(before)


def test_shape_grid_brackets_every_shape_without_clamping() -> None:
    """Every shape lies between two grid points (its own when it is one), however large: the grid
    has no last point; small integer shapes are grid points; the micro-batch step is never crossed."""
    for grid in (BATCH_GRID, CONTEXT_GRID):
        for x in [*np.linspace(1, 300_000, 5001), 2.0**21 + 3, 1e7 + 0.5]:
            lo, hi, w = bracket(grid, x)
            assert lo <= x <= hi and 0 <= w < 1 and lo + w * (hi - lo) == pytest.approx(x)
            assert (hi - lo) <= max(grid[0], x / grid[1])  # spacing: a 1/per_octave step of x's octave
    unit, per_octave = BATCH_GRID
    assert all(bracket(BATCH_GRID, b) == (b, b, 0.0) for b in range(1, unit * per_octave))  # priced exactly
    assert all(bracket(g, 2**j * g[0]) == (2**j * g[0],) * 2 + (0.0,) for g in (BATCH_GRID, CONTEXT_GRID)
               for j in range(20))  # octaves are grid points
    assert bracket(BATCH_GRID, 63, 64)[1] == 63 and bracket(BATCH_GRID, 64, 64) == (64, 64, 0.0)
    assert bracket(BATCH_GRID, 65, 64)[0] == 64
    assert bracket(CONTEXT_GRID, 126_000)[1] >= 126_000  # Mooncake's longest prompts: above the grid's former end


def test_interpolated_iterations_within_two_percent_of_their_exact_shapes(env: Env) -> None:
    """Seeded random shapes over the whole range a run reaches (decode batch up to the dispatch cap,
    contexts up to Mooncake's 126K-token prompts and past them): each decode step priced on the grid
    is within 2 % of the same shape priced exactly, by its own trace simulated on the fabric; so is a
    shape just below the micro-batch step. A prefill iteration (up to 4× the chunk budget) is its
    own shape's trace. The shapes' exact times span a wide range, so a coarser rule (the former
    bucket-up pricing: up to 2× over, and clamped at 32K) fails here."""
    rng = np.random.default_rng(21)
    step = env.w.scheduler.tbo_min_tokens  # just below it one micro-batch, at it two
    exact = []
    for lib in ("hccl", "stratacl"):
        shapes = [(step - 4, 4096.0, step - 1)] + [
            (int(rng.integers(1, 513)), float(rng.uniform(64, 160_000)), int(rng.integers(1, 32_768))) for _ in range(6)]
        for b, c, p in shapes:
            got, ref = env.iters.decode(lib, b, c), env.iters.exact(lib, "decode", b, c)
            assert got.time_s == pytest.approx(ref.time_s, rel=0.02), (lib, b, c)
            assert env.iters.prefill(lib, p).time_s == env.iters.exact(lib, "prefill", p).time_s, (lib, p)
            exact.append(ref.time_s)
    assert max(exact) > 3 * min(exact)  # the shapes matter: the bound is not met by a flat cost


def test_prefill_with_a_context_within_two_percent_of_its_own_trace(env: Env) -> None:
    """A prefill iteration whose prompts attend over earlier tokens (a reused prefix, earlier
    chunks) is priced between the context grid points around it at its own token count: within 2 %
    of its own shape's trace on seeded random shapes (contexts past Mooncake's 126K prompts). Where
    the cost anchors' attention shapes used to switch (+12 % between contexts 24,240 and 24,575) the
    exact time grows no faster than the context."""
    rng = np.random.default_rng(23)
    for lib in ("hccl", "stratacl"):
        for _ in range(4):
            p, c = int(rng.integers(1, 32_768)), float(rng.uniform(64, 160_000))
            got, ref = env.iters.prefill(lib, p, context=c), env.iters.exact(lib, "prefill", p, c)
            assert got.time_s == pytest.approx(ref.time_s, rel=0.02), (lib, p, c)
    a, b = (env.iters.exact("hccl", "prefill", 25_595, c).time_s for c in (24_240, 24_575))
    assert a <= b <= a * 24_575 / 24_240


def test_costs_between_anchors_are_the_costs_measured_at_the_shape(env: Env) -> None:
    """Decode and prefill-with-context attention costs (what the context changes) interpolated
    between (and extrapolated past) the measured anchors have the FLOPs, bytes and matmul shapes the
    model has when measured at that very shape: an attention core's keys grow with the context (the
    anchors' matmuls paired), not the nearer anchor's keys with its rows stretched."""
    for phase, size, ctx in (("decode", 20, 20_000), ("decode", 300, 5_000), ("decode", 3, 150_000),
                             ("prefill", 6144, 24_575), ("prefill", 2048, 77_777)):
        got = env.costs.decode(size, ctx) if phase == "decode" else env.costs.prefill(size, ctx)
        for t, ref in env.costs._measure(size, ctx, phase).items():
            if not t.startswith("attention"):
                continue
            parts = {p.kernel: p for p in got[t].parts}
            for p in ref.parts:
                q = parts[p.kernel]
                assert (q.cube_flops, q.vector_flops, q.hbm_bytes) == pytest.approx(
                    (p.cube_flops, p.vector_flops, p.hbm_bytes), rel=1e-9), (phase, size, ctx, t, p.kernel)
                assert emit_gemms(q.gemms) == emit_gemms(p.gemms), (phase, size, ctx, t, p.kernel)


def test_moe_bytes_of_an_iteration_conserve_token_copies(env: Env) -> None:
    """Decode (LL): each die dispatches tokens·k copies of INT8+scales and combines the transpose
    back in the activation dtype."""
    tr = env.iters.trace("decode", 8, 1024)
    c = env.costs
    hidden, n = c.hidden, 4
    ops = {op.name: op for op in tr.ops}
    assert "L1.dispatch.mb1" not in ops  # 8 sequences < tbo_min_tokens: one micro-batch
    tokens = 8 * 2  # 8 sequences per die, MTP verifies 2 tokens each
    d = np.asarray(ops["L1.dispatch.mb0"].peer_bytes).reshape(n, n)
    k = np.asarray(ops["L1.combine.mb0"].peer_bytes).reshape(n, n)
    per_copy = hidden * (1 + env.w.dispatch_scale_ratio)
    assert d.sum(axis=1) == pytest.approx(np.full(n, tokens * c.top_k * per_copy))
    np.testing.assert_allclose(k, d.T / per_copy * hidden * env.cfg.workload.model.dtype_bytes, rtol=1e-12)


def test_decode_batch_capped_by_kv_memory_and_library_memory_costs_exactly_its_bytes() -> None:
    small = Env(hbm_GB=2.2)  # tight HBM: the KV cache, not the load, limits the batch
    n, inp, out = 3000, 8192, 512
    reqs = Requests(np.zeros(n), np.full(n, inp), np.full(n, out))  # a burst at t = 0
    per_seq = small.kv_tok * (inp + out)
    caps, kv, held = {}, {}, {}
    for lib in ("hccl", "stratacl"):
        sim, dies = small.serve(lib, reqs)
        plan = dies[0].plan
        kv[lib], held[lib] = plan.kv, plan.comm_buffers
        caps[lib] = math.floor(plan.kv / per_seq)
        assert 0 < caps[lib] < 512  # the KV cache binds, not the dispatch cap
        dec = sim.iteration_frame().query("phase == 'decode'")
        assert dec["batch_per_die"].max() == caps[lib]  # the burst fills the cache exactly
    assert held["stratacl"] == 0 and held["hccl"] > 0
    # the buffers live outside the allocator: the KV cache loses exactly their bytes (up to the
    # rounding of the per-layer KV tensors)
    assert kv["stratacl"] - kv["hccl"] == pytest.approx(held["hccl"], abs=64 * 1024)
    assert caps["stratacl"] - caps["hccl"] >= math.floor(held["hccl"] / per_seq)


def test_deterministic_for_a_seed(env: Env) -> None:
    a = summarise(env.serve("stratacl", generate(env.w.requests, seed=5))[0], 2.0, 20.0)
    b = summarise(Env().serve("stratacl", generate(env.w.requests, seed=5))[0], 2.0, 20.0)
    a, b = (pd.Series(x).fillna(-1).to_dict() for x in (a, b))
    assert a == b


def test_model_that_does_not_fit_fails_before_simulating(env: Env) -> None:
    tight = Env(hbm_GB=1.5)  # hccl's communicator buffers leave no KV cache
    with pytest.raises(ConfigError, match="workload.layout.prefill_ep.*does not fit.*held by the library"):
        tight.serve("hccl", generate(env.w.requests, seed=0))
    tight.serve("stratacl", generate(env.w.requests, seed=0))  # a library without buffers fits
    tiny_hbm = Env(hbm_GB=1.0)  # the buffers (2 x 650 MiB on a prefill die) exceed the die
    with pytest.raises(ConfigError, match="workload.layout.prefill_ep.*holds"):
        tiny_hbm.serve("hccl", generate(env.w.requests, seed=0))
    tinier = Env(hbm_GB=0.05)  # not even the weights and the profiling forward
    with pytest.raises(ConfigError, match="workload.layout.prefill_ep.*does not fit"):
        tinier.serve("stratacl", generate(env.w.requests, seed=0))


def test_ep_must_divide_experts(env: Env) -> None:
    with pytest.raises(ConfigError, match="workload.layout.prefill_ep.*divide"):
        ServingCosts(env.mc, 3, 4, 1024)


def test_layout_larger_than_fabric(env: Env) -> None:
    w = copy.deepcopy(env.w)
    w.layout.decode_instances = 200  # 200 x 4 + 4 > 768 dies
    with pytest.raises(ConfigError, match="workload.layout"):
        validate_layout(w, env.ctx.fabric.world)


@pytest.mark.parametrize("override, field", [
    ("workload.layout.decode_instances=100", "workload.layout"),
    ("workload.layout.prefill_ep=3", "workload.layout.prefill_ep"),
    ("workload.model.preset=nosuch", "workload.model.preset"),
])  # unknown choices (arrival=weibull) fail at compose time: tests/test_config_validation.py
def test_cli_failures_name_the_field(tmp_path, override, field) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli(["workload=llm_infer", override, f"hydra.run.dir={out}"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "summary.json").exists()


def test_fixed_mode_shapes_come_from_workload_fixed_alone(tmp_path) -> None:  # noqa: ANN001
    """Fixed mode's prefill attention spans `workload.fixed.prompt_tokens` (it took the serving
    trace's `requests.input_mean` before, 2048 by default): a longer prompt makes the same 1024-token
    prefill iteration slower (one prompt's attention is quadratic in its length), `requests.input_mean`
    moves nothing, and a prompt longer than the iteration is refused with the field named."""
    from stratacl.run.cli import run_overrides

    base = [*OVERRIDES, "workload.mode=fixed", "library=[stratacl]", "baseline=stratacl",
            "workload.fixed.decode_batch_per_die=4", "workload.fixed.context=256",
            "workload.fixed.prefill_tokens_per_die=1024", "workload.capacity.saturation=false"]
    figs = {}
    for name, extra in {"short": ["workload.fixed.prompt_tokens=256"],
                        "long": ["workload.fixed.prompt_tokens=1024"],
                        "long_other_mean": ["workload.fixed.prompt_tokens=1024", "workload.requests.input_mean=64"]
                        }.items():
        rc, err = run_overrides([*base, *extra, f"hydra.run.dir={tmp_path / name}"], tmp_path / name)
        assert rc == 0, err
        figs[name] = json.loads((tmp_path / name / "summary.json").read_text())["libraries"]["stratacl"]
    assert figs["long"]["prefill_iter_s"] > figs["short"]["prefill_iter_s"]
    assert figs["long_other_mean"] == figs["long"]
    rc, err = run_overrides([*base, "workload.fixed.prompt_tokens=2048"], tmp_path / "refused")
    assert rc == 2 and "workload.fixed.prompt_tokens" in err and not (tmp_path / "refused" / "summary.json").exists()


def test_the_run_notes_the_router_law_and_the_per_die_load_it_priced(env: Env) -> None:
    """The notes name the exponent and its source (the measured figure unless workload.zipf_s is
    set) and each phase's per-die expert rows: the mean is the rows every token brings (top_k plus
    a shared expert's replica rows: conserved by any placement), the busiest die at or above it."""
    from workloads.common.expert_load import ExpertLoadConfig, describe_law

    c = env.costs
    line = c.load_note(*describe_law("zipf", 0.0, ExpertLoadConfig(), c.experts))
    assert "UltraEP" in line and "prefill (" in line and "decode (" in line and "max/mean" in line
    for phase in ("prefill", "decode"):
        load = c.die_load[phase]
        pl = c.placement[phase]
        assert load.mean == pytest.approx(c.top_k + (0.0 if pl.shared_local else pl.shared_weight))
        assert load.max >= load.mean and load.ratio == pytest.approx(c.expert_imbalance[phase])


# --------------------------------------------------------------------------- the MoE shape


def test_serving_iterations_carry_the_moe_shape_their_dispatches_are_lowered_with(env: Env) -> None:
    """Prefill (HT) and decode (LL) traces carry the payload bytes per copy and the experts each die
    hosts (16 experts contiguous on 4 dies); without it the trace is refused, and an LL dispatch
    lowered with it pays a start-up per expert window hit (more than one window per peer)."""
    c = env.costs
    for phase, mode in (("prefill", "ht"), ("decode", "ll")):
        tr = env.iters.trace(phase, 256 if phase == "prefill" else 8, 1024)
        moe_ops = [op for op in tr.ops if op.coll in ("dispatch", "combine")]
        assert moe_ops and {op.moe_mode for op in moe_ops} == {mode}
        assert tr.moe == MoeShape(env.iters.dispatch_bytes, env.iters.combine_bytes, 16 // 4, c.top_k)
        with pytest.raises(TraceError, match=rf"'{moe_ops[0].name}'.*needs the trace's MoeShape"):
            dataclasses.replace(tr, moe=None).validate()
    lib = env.ctx.libraries["hccl"]
    disp = next(op for op in tr.ops if op.coll == "dispatch")
    moe = LibraryRuntime(lib, tr)._moe_op(disp)
    assert moe is not None and (moe.mode, moe.bytes_per_copy, moe.experts_per_rank, moe.top_k) == (
        "ll", env.iters.dispatch_bytes, 4, c.top_k)
    # per-expert receive slots (stratacl) pay a start-up per expert hit; HCCL's all-to-all-v
    # lowering lands a peer's tokens in one region (moe_ll_windows: per_peer): one window each
    for name, many in (("stratacl", True), ("hccl", False)):
        plan = env.ctx.libraries[name].wire_plan("dispatch", max(disp.nbytes), tuple(range(4)), disp.peer_bytes,
                                                moe=moe)
        assert (max(plan.peer_copies, default=1) > 1) is many, name


def test_serving_prefill_dispatch_takes_deepeps_node_forwarding_path() -> None:
    """A 16-GPU prefill instance on two HGX H800 nodes: DeepEP lowers the serving trace's HT
    dispatch on its node-forwarding plan (once per (token, node) over RDMA), which the same op
    without the trace's MoeShape never reaches."""
    over = [o for o in OVERRIDES if not o.startswith(("workload.layout.prefill_", "library="))]
    cfg = compose_run([*over, "fabric=hgx_h800", "library=[deepep]", "workload.layout.prefill_dp=16",
                       "workload.layout.prefill_ep=16", "workload.scheduler.decode_stream_layout=none"])
    fab = Fabric(cfg.fabric)
    lib = LibraryModel("deepep", cfg.library["deepep"], fab)
    ctx = RunContext(cfg=cfg, fabric=fab, libraries={"deepep": lib}, baseline="deepep", seed=0)
    iters = IterationModel(ctx, ServingCosts(_shared_costs(), 16, 4, 1024), cfg.workload)
    tr = iters.trace("prefill", 512, 0)
    disp = next(op for op in tr.ops if op.coll == "dispatch")
    phases, info = LibraryRuntime(lib, tr).lower_with_info(disp, 0.0)
    assert info.algorithm == "node_forward"
    bare = dataclasses.replace(tr, moe=None)  # the lowering as it was without the shape
    flat_phases, flat_info = LibraryRuntime(lib, bare).lower_with_info(disp, 0.0)
    assert flat_info.algorithm != "node_forward"
    # the two-hop notify (RDMA to same-index peers, then NVLink) replaces the flat count all-to-all,
    # and the payload's wire phase runs once per (token, node) over RDMA
    wires = [p for p in phases if p.category == "wire"]
    flat_wires = [p for p in flat_phases if p.category == "wire"]
    assert (len(wires), len(flat_wires)) == (3, 2)
    assert wires[-1].standalone_s() < flat_wires[-1].standalone_s()
    fwd = lib.wire_plan("dispatch", max(disp.nbytes), tuple(range(16)), disp.peer_bytes,
                        moe=LibraryRuntime(lib, tr)._moe_op(disp))
    flat = lib.wire_plan("dispatch", max(disp.nbytes), tuple(range(16)), disp.peer_bytes)
    assert fwd.algorithm == "node_forward" and fwd.tx_s["rdma"] < flat.tx_s["rdma"]
