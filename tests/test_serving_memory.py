"""Serving memory from the allocator model: library facts, communicator buffers as deployments size
them, registration events that follow the allocator's map events, JIT hits and misses by address
range, and their cost in the simulated iterations."""

from __future__ import annotations

import copy
import types

import numpy as np
import pytest
from helpers import compose_run, make_library
from test_llm_infer import Env

from stratacl.comm.buffers import MiB, buffer_sizes_MiB, moe_window_bytes
from stratacl.config import DataPath, JitMatch
from stratacl.engine.replay import simulate
from stratacl.errors import ConfigError
from stratacl.machine.fabric import Fabric
from stratacl.memory import JitRegistrationCache, MemEvent, NoRegistration, RegistrationOnAllocation
from stratacl.memory.communicators import Communicator, MoeWindows
from stratacl.trace import REGISTERED, Trace
from stratacl.workload_api import RunContext
from workloads.common.placement import contiguous, eplb
from workloads.common.routing import by_rank
from workloads.llm_infer import memory as memory_mod
from workloads.llm_infer import tensors as tensors_mod
from workloads.llm_infer import workload as serving_workload
from workloads.llm_infer.costs import ServingCosts
from workloads.llm_infer.fixed import run_fixed
from workloads.llm_infer.iteration import IterationModel
from workloads.llm_infer.memory import hot_share, role_dies, serving_tensors
from workloads.llm_infer.requests import Requests
from workloads.llm_infer.workload import serving_costs


@pytest.fixture(scope="module")
def fab() -> Fabric:
    return Fabric(compose_run().fabric)


@pytest.fixture(scope="module")
def env() -> Env:
    return Env()


def _expected_routing(die) -> None:  # noqa: ANN001
    """Make the die's routing draws deterministic (the expected rows), so shapes repeat exactly."""
    die.rng = types.SimpleNamespace(binomial=lambda n, p: np.rint(np.asarray(n) * p).astype(np.int64))


# ----------------------------------------------------------------------------- library facts

def test_cann_moe_window_rule_closed_form() -> None:
    # DeepSeek-V4-Flash decode, EP16: 16 local experts, maxBs 512, H 4096, top-6, one shared expert
    w = MoeWindows(max_tokens=512, hidden=4096, top_k=6, local_experts=16, shared_experts=1)
    token_in = 8704  # Align512(Align32(2 * 4096) + 64)
    token_out = 8192  # Align512(2 * 4096)
    assert moe_window_bytes(w, 16) == 2 * (16 * 512 * 16 * token_in + 7 * 512 * token_out)
    assert int(np.ceil(moe_window_bytes(w, 16) / MiB)) == 2232


def test_communicator_buffers_sized_as_deployments_size_them(fab: Fabric) -> None:
    moe = MoeWindows(max_tokens=512, hidden=4096, top_k=6, local_experts=16, shared_experts=1)
    comms = [Communicator("world", 16, 200.0), Communicator("tp", 1, 200.0), Communicator("dp", 16, 50.0),
             Communicator("mc2", 16, None, moe), Communicator("x", 16, None)]
    sizes = buffer_sizes_MiB(comms, 200.0)
    assert "tp" not in sizes  # a one-rank group holds nothing
    assert sizes["world"] == 200.0 and sizes["dp"] == 50.0  # the framework's per-group sizes stay
    assert sizes["mc2"] == 2232.0  # HCCL_BUFFSIZE raised to the MoE windows' need...
    assert sizes["x"] == 2232.0  # ... and every group on the process-wide default gets it too
    hccl = make_library(fab, "hccl")
    assert hccl.communicator_buffer_bytes(comms) == pytest.approx(2 * (200 + 50 + 2232 + 2232) * MiB)
    small = [Communicator("mc2", 16, None, MoeWindows(8, 4096, 6, 16, 1))]
    assert hccl.communicator_buffer_bytes(small) == pytest.approx(2 * 200 * MiB)  # the default wins
    for preset in ("stratacl", "hccl_jit", "hccl_zerocopy"):
        assert make_library(fab, preset).communicator_buffer_bytes(comms) == 0.0


def test_library_memory_facts(fab: Fabric) -> None:
    zc, st, jit, hccl = (make_library(fab, p) for p in ("hccl_zerocopy", "stratacl", "hccl_jit", "hccl"))
    assert zc.forces_expandable_segments_off and not st.forces_expandable_segments_off
    assert zc.pool_bytes == pytest.approx(1.72e9) and st.pool_bytes == 0.0
    assert [x.user_buffer_registration for x in (zc, st, jit, hccl)] == ["none", "on_alloc", "jit", "none"]
    assert not zc.die_memory(2**34, 15).allocator.cfg.expandable_segments  # forced off
    assert st.die_memory(2**34, 15).allocator.cfg.expandable_segments
    assert isinstance(st.die_memory(2**34, 15).registrar, RegistrationOnAllocation)
    assert isinstance(zc.die_memory(2**34, 15).registrar, NoRegistration)
    jit_cache = jit.die_memory(2**34, 15).registrar
    assert isinstance(jit_cache, JitRegistrationCache) and jit_cache.match == JitMatch.exact  # HCCL: (address, size)
    cover = make_library(fab, "hccl_jit", jit_cache_match=JitMatch.cover).die_memory(2**34, 15).registrar
    assert isinstance(cover, JitRegistrationCache) and cover.match == JitMatch.cover


def test_registered_buffers_cost_nothing_to_jit_registration(fab: Fabric) -> None:
    lib = make_library(fab, "hccl_jit")
    tr = Trace(world_size=8)
    tr.add_family("g", [range(8)])
    tr.add_buffer("cached", REGISTERED)
    tr.add_buffer("warm", -1)
    for buf in ("cached", "warm", "cached", "warm"):
        tr.collective("alltoall", "g", 2**20, buffer=buf)
    res = simulate(tr, lib)
    one = 83.6e-6  # 8 µs + 7 peers × 10.8 µs (conf/library/hccl_jit.yaml)
    assert list(res.split["register"]) == pytest.approx([0.0, one, 0.0, 0.0])
    on_alloc = simulate(tr, make_library(fab, "hccl", data_path=DataPath.on_alloc))
    assert on_alloc.split["register"].sum() == 0.0  # registered before the trace: ready


# ----------------------------------------------------------------------------- the die model

def test_registration_jobs_follow_the_map_events_of_serving_iterations(env: Env) -> None:
    die = env.serving.dies("stratacl", "decode", False)[0]
    _expected_routing(die)
    events: list[MemEvent] = []
    die.alloc.subscribe(events.append)
    roa = die.mem.registrar
    assert isinstance(roa, RegistrationOnAllocation)
    jobs_before = len(roa.jobs)
    maps = []
    for k, batch in enumerate((4, 4, 64, 64, 8, 300, 300)):  # growing demand maps memory; repeats do not
        st = die.step(1.0 + k, batch, batch * 4)
        maps.append(st.maps)
    mapped = [e for e in events if e.kind == "map"]
    assert sum(maps) == len(mapped) > 0
    new_jobs = roa.jobs[jobs_before:]
    assert [(j.key, j.size, j.t_map) for j in new_jobs] == [(e.addr, e.size, e.t) for e in mapped]
    assert all(j.start >= j.t_map and j.done > j.start for j in new_jobs)
    assert maps[1] == maps[3] == maps[4] == maps[6] == 0  # a shape seen before (or smaller) maps nothing
    assert maps[5] > 0  # the largest batch yet outgrows the mapping: a remap


def _decode_die(env: Env, library: str):  # noqa: ANN202 - a die on block lists of its own
    return role_dies(serving_tensors(env.costs, env.w, "decode"), env.ctx.libraries[library], env.w, "decode",
                     env.ctx.fabric.hbm_bytes, env.costs, weights=env.iters.weights, seed=0)[0]


@pytest.mark.parametrize("library", ["hccl", "stratacl"])
def test_quiet_index_skips_exactly_the_steps_the_block_by_block_check_skips(env: Env, library: str,
                                                                           monkeypatch) -> None:  # noqa: ANN001
    """A decode step whose every block `_quiet` holds is answered by the index at once; the same
    steps checked block by block (the index never answering) give the same facts, allocator
    counters and state, step by step — also across a rebuild of the block lists (BLOCK_MEMO)."""
    monkeypatch.setattr(tensors_mod, "BLOCK_MEMO", 160)  # rebuilds within the run
    rng = np.random.default_rng(5)
    shapes = [(int(b), int(b) * int(rng.integers(1, 5))) for b in rng.choice([1, 2, 3, 4, 48, 300], 160,
                                                                            p=[.3, .3, .2, .15, .04, .01])]

    real, rebuilt = memory_mod.QuietIndex.all_quiet, []

    def trace(skip: bool) -> tuple[list, int]:
        fast = 0

        def all_quiet(self, rows, moe) -> bool:  # noqa: ANN001
            nonlocal fast
            hit = real(self, rows, moe) and skip
            fast += hit
            return hit

        monkeypatch.setattr(memory_mod.QuietIndex, "all_quiet", all_quiet)
        die = _decode_die(env, library)
        s = die.alloc.stats
        out = []
        for k, (b, total) in enumerate(shapes):
            st = die.step(float(k), b, total)
            out.append((st, s.num_mallocs, s.allocated_bytes_peak, s.reserved_bytes_peak, s.num_device_alloc,
                        die.alloc.state_signature()))
        rebuilt.append(die.t.generation)
        return out, fast

    ref, _ = trace(skip=False)
    got, fast = trace(skip=True)
    assert got == ref
    assert fast > len(shapes) // 10  # steps repeating a quiet shape: the index answered them
    assert rebuilt[-1] > 0


def test_jit_cache_hits_a_reused_block_and_misses_a_new_segment(env: Env) -> None:
    die = env.serving.dies("hccl_jit", "decode", False)[0]
    _expected_routing(die)
    first = die.step(1.0, 8, 32)
    assert first.lookups > 0
    again = die.step(2.0, 8, 32)  # the same shape: its buffers come back at the same addresses
    assert again.lookups == first.lookups and again.misses == 0
    bigger = die.step(3.0, 300, 1200)  # buffers that need new memory (a new mapping)
    assert bigger.maps > 0 and bigger.misses > 0
    back = die.step(4.0, 8, 32)
    assert back.misses == 0  # the small buffers' registrations are still cached


def test_cover_matching_hits_whenever_exact_matching_does_and_more(env: Env, fab: Fabric) -> None:
    """The same allocation sequence (registration does not move memory): a registration covering
    a buffer's pages serves it in "cover" mode even when its size changed; "exact" mode (HCCL's
    (address, size) key) misses then, so cover misses are a subset of exact misses."""
    misses = {}
    for match in (JitMatch.exact, JitMatch.cover):
        env.ctx.libraries["jit_probe"] = make_library(fab, "hccl_jit", jit_cache_match=match)
        try:
            die = env.serving.dies("jit_probe", "decode", False)[0]
        finally:
            del env.ctx.libraries["jit_probe"]
        rng = np.random.default_rng(7)
        misses[match] = [die.step(float(k), b, 4 * b).misses for k, b in enumerate(rng.integers(1, 200, 200))]
    assert all(c <= e for c, e in zip(misses[JitMatch.cover], misses[JitMatch.exact], strict=True))
    assert sum(misses[JitMatch.cover]) < sum(misses[JitMatch.exact])


def test_expandable_segments_off_fragments_the_pool_baseline(env: Env) -> None:
    frag = {}
    for lib in ("hccl_zerocopy", "hccl_jit"):  # ES forced off vs on; neither holds comm buffers
        die = env.serving.dies(lib, "decode", False)[0]
        rng = np.random.default_rng(3)
        for k in range(300):
            b = int(rng.integers(1, 4000))
            die.step(float(k), b, 4 * b)
        frag[lib] = die.stats().fragmentation
        assert die.plan.expandable_segments == (lib == "hccl_jit")
    assert frag["hccl_zerocopy"] > 4 * frag["hccl_jit"]


# ----------------------------------------------------------------------------- iterations

def test_jit_misses_reach_the_simulated_iteration(env: Env) -> None:
    it = env.iters
    # 8 sequences (one micro-batch): a dispatch and a combine buffer in each of the 2 MoE layers
    # and the MTP layer
    n = 2 * (2 + 1)
    assert it.moe_buffer_uses("decode", 8) == n
    one = (8.0 + 10.8 * 3) * 1e-6  # EP4: base + 3 peers (conf/library/hccl_jit.yaml)
    none = it.decode("hccl_jit", 8, 1024, jit_miss=0.0)
    full = it.decode("hccl_jit", 8, 1024, jit_miss=1.0)
    assert none.register_s == 0.0
    assert full.register_s == pytest.approx(n * one)
    assert full.time_s > none.time_s
    half = it.decode("hccl_jit", 8, 1024, jit_miss=0.5)
    assert none.register_s < half.register_s < full.register_s
    # a library whose registrar does not pay at use never reports a miss: its iterations take none
    die = env.serving.dies("stratacl", "decode", False)[0]
    assert [die.step(1.0 + k, b, 4 * b).lookups for k, b in enumerate((8, 64, 8))] == [0, 0, 0]


def test_serving_records_remaps_and_jit_misses_per_iteration(env: Env) -> None:
    reqs = Requests(np.zeros(1500), np.full(1500, 1024), np.full(1500, 64))  # a burst: batches of hundreds
    for lib in ("stratacl", "hccl_jit"):
        sim, dies = env.serve(lib, reqs)
        it = sim.iteration_frame()
        dec = it[it["phase"] == "decode"]
        assert dec["remap"].any()  # the first iterations map their activations
        if lib == "hccl_jit":
            assert dec["jit_lookups"].sum() > 0 and dec["jit_misses"].sum() > 0
            missed = dec[dec["jit_misses"] > 0]
            assert (missed["register_s"] > 0).all()
        else:
            assert dec["jit_lookups"].sum() == 0


def test_prefill_continues_a_chunked_prompt_while_other_dies_take_new_ones(env: Env) -> None:
    budget = env.w.scheduler.prefill_token_budget
    n = 9
    inp = np.full(n, 512)
    inp[0] = 3 * budget  # one long prompt: three chunks on one die
    reqs = Requests(np.zeros(n), inp, np.full(n, 8))
    sim, _ = env.serve("hccl", reqs)
    df = sim.request_frame()
    pre = sim.iteration_frame().query("phase == 'prefill'")
    assert pre["batch_per_die"].iloc[1] == budget  # the long prompt's second chunk ...
    assert pre["tokens"].iloc[1] == budget + 512 * (n - 1)  # ... beside every short prompt
    t3 = pre["start_s"].iloc[2] + pre["time_s"].iloc[2]
    assert df.loc[0, "first_token_s"] == pytest.approx(t3)  # the long prompt's third chunk ends it
    assert (df.loc[1:, "first_token_s"] < df.loc[0, "first_token_s"]).all()


# ----------------------------------------------------------------------------- fixed shapes (mode=fixed)

def _fixed(env: Env, batch: int, prompt: int = 512, context: int = 1024) -> Env:
    """`env` in fixed mode: one `prompt`-token prompt per prefill die; costs as the workload builds them."""
    env.w.mode = "fixed"
    f = env.w.fixed
    f.decode_batch_per_die, f.prefill_tokens_per_die, f.prompt_tokens, f.context = batch, prompt, prompt, context
    env.costs = serving_costs(env.mc, env.w, 0)
    env.iters = IterationModel(env.ctx, env.costs, env.w)
    return env


def _fixed_die(env: Env, library: str, role: str, profile: int):  # noqa: ANN202
    return role_dies(serving_tensors(env.costs, env.w, role), env.ctx.libraries[library], env.w, role,
                     env.ctx.fabric.hbm_bytes, env.costs, weights=env.iters.weights, seed=0, profile=profile)[0]


def test_fixed_mode_memory_is_the_serving_die() -> None:
    """Fixed-shape figures come from the serving die's start-up with the fixed shape as its largest
    forward: the same weights and KV cache; a larger batch reserves more activations and leaves less KV."""
    env = _fixed(Env(), batch=32)
    res = run_fixed(env.ctx, env.w, env.costs, env.iters, env.kv_tok)
    verify = 2  # MTP (on by default): each sequence's step verifies its draft token too
    for lib in ("hccl", "stratacl"):
        dec = _fixed_die(env, lib, "decode", 32 * verify).plan
        pre = _fixed_die(env, lib, "prefill", 512).plan
        m = res.metrics[lib]
        assert m["decode_kv_GB_per_die"] == dec.kv / 1e9 and m["decode_weights_GB_per_die"] == dec.weights / 1e9
        assert m["prefill_weights_GB_per_die"] == pre.weights / 1e9
        assert dec.weights + dec.activations + dec.kv + dec.library <= env.w.allocator.memory_utilization * dec.hbm
    # hccl holds communicator buffers, stratacl none: the KV cache gets that much more
    gap = res.metrics["stratacl"]["decode_kv_GB_per_die"] - res.metrics["hccl"]["decode_kv_GB_per_die"]
    assert gap * 1e9 == pytest.approx(_fixed_die(env, "hccl", "decode", 32 * verify).plan.comm_buffers, rel=0.01)
    small, big = (_fixed_die(env, "hccl", "decode", b * verify).plan for b in (8, 512))
    assert big.activations > small.activations and big.kv < small.kv


def test_fixed_mode_errors_name_the_field() -> None:
    env = _fixed(Env(), batch=64, context=10**7)  # 64 sequences of 10M tokens: KV far beyond a die
    with pytest.raises(ConfigError) as kv:
        run_fixed(env.ctx, env.w, env.costs, env.iters, env.kv_tok)
    assert kv.value.field == "workload.fixed.decode_batch_per_die" and "KV cache of a decode die" in kv.value.problem
    tiny = _fixed(Env(hbm_GB=1.9), batch=8)  # hccl's 1.8 GB of buffers fit, nothing is left for KV
    with pytest.raises(ConfigError) as oom:
        run_fixed(tiny.ctx, tiny.w, tiny.costs, tiny.iters, tiny.kv_tok)
    e = oom.value
    assert e.field == "workload.layout.decode_ep" and "does not fit a decode die with 'hccl'" in e.problem
    assert "leave no KV cache" in e.problem and "workload.fixed" in e.fix and "\n" not in str(e)


def test_fixed_mode_shapes_come_from_workload_fixed_alone(monkeypatch) -> None:  # noqa: ANN001
    """Through the workload's `run`: the prompt length is `workload.fixed.prompt_tokens`, not the
    request generator's mean prompt (which fixed mode must not read); shorter prompts in the same
    tokens per die attend over less, so the prefill is faster; each figure is its exact shape's."""
    env = Env()
    monkeypatch.setattr(serving_workload, "model_costs", lambda ref, cache_dir: env.mc)

    def figures(prompt: int, input_mean: int) -> dict:
        cfg = copy.deepcopy(env.cfg)
        w = cfg.workload
        w.mode, w.requests.input_mean = "fixed", input_mean
        w.fixed.decode_batch_per_die, w.fixed.context = 8, 1024
        w.fixed.prefill_tokens_per_die, w.fixed.prompt_tokens = 8192, prompt
        ctx = RunContext(cfg=cfg, fabric=env.ctx.fabric, libraries={"hccl": env.ctx.libraries["hccl"]},
                         baseline="hccl", seed=0)
        res = serving_workload.run(ctx)
        assert f"8192 tokens/die in {prompt}-token prompts" in res.notes[0] and "bucket" not in res.notes[0]
        return res.metrics["hccl"]

    long = figures(8192, 1024)
    assert figures(8192, 256) == long  # requests.input_mean plays no part
    short = figures(1024, 1024)
    assert short["prefill_iter_s"] < 0.98 * long["prefill_iter_s"]  # 8 prompts of 1K: 1/8 the attention
    assert short["decode_step_s"] == long["decode_step_s"]
    with pytest.raises(ConfigError) as e:
        figures(16384, 1024)  # a prompt larger than the iteration: fixed mode does not chunk
    assert e.value.field == "workload.fixed.prompt_tokens"


def test_hot_die_follows_the_placement() -> None:
    """The busiest die's share of routed rows: its block of experts when contiguous (as before);
    under EPLB its slots, a replicated expert's rows split over its replicas — closed form: one
    expert with 70 % of the rows, tripled, plus one 10 % expert on each of 3 dies = 1/3 each."""
    shares = np.array([0.7, 0.1, 0.1, 0.1])
    pl = eplb(shares, 3, top_k=1, redundant=2)
    assert pl.replicas()[0] == 3
    assert hot_share(shares, 3, 1, pl) == pytest.approx(1 / 3)
    w = np.random.default_rng(0).dirichlet(np.ones(16))
    assert hot_share(w, 4, 4, contiguous(16, 4)) == by_rank(w, 4).max()  # bit for bit
    # shared-expert replicas take their share of every token's shared row (conservation over dies)
    pl = eplb(np.full(16, 1 / 16), 6, top_k=4, redundant=0, shared_replicas=2, shared_weight=2.0)
    assert hot_share(np.full(16, 1 / 16), 6, 4, pl) == pytest.approx(max(
        np.bincount(np.asarray(pl.slot_die)[np.asarray(pl.slot_expert) < 16], minlength=6) / 16
        + pl.shared_slots_per_die() * 2.0 / 2 / 4))


def test_an_ep_size_that_does_not_divide_the_experts_starts_a_die() -> None:
    """EP 6 over 16 experts with 2 redundant replicas (EPLB: 3 slots per die), as the CloudMatrix
    decode's EP 320 over 256: the die's tensors come from the shard the costs are measured on (EP 4:
    4 experts), its expert tensors scaled to its 3 slots (this failed: EP 6 does not divide 16)."""
    env = Env()
    lay = env.w.layout
    lay.decode_dp = lay.decode_ep = 6
    lay.expert_placement, lay.decode_redundant_experts = "eplb", 2
    costs = ServingCosts(env.mc, 4, 6, 1024, layout=lay, shares=env.iters.weights)
    assert costs.measure_ep["decode"] == 4 and (costs.placement["decode"].slots_per_die() == 3).all()
    die = role_dies(serving_tensors(costs, env.w, "decode"), env.ctx.libraries["stratacl"], env.w, "decode",
                    env.ctx.fabric.hbm_bytes, costs, weights=env.iters.weights, seed=0)[0]
    ref = env.serving.dies("stratacl", "decode", False)[0]  # EP 4, contiguous: 4 experts per die
    ids = set(ref.t.expert_tensor_ids())
    experts4 = sum(b for i, b in enumerate(ref.t.weight_tensors()) if i in ids)
    # expert tensors: 3 routed slots + the shared expert (one expert wide, on every die) against the
    # EP-4 shard's 4 + 1
    assert die.expert_scale == pytest.approx((3 + 1) / (4 + 1))
    # the allocator rounds each tensor up to 512 B
    assert die.plan.weights - ref.plan.weights == pytest.approx((die.expert_scale - 1) * experts4, abs=512 * len(ids))
    assert die.plan.kv > 0 and 0 < die.p_hot < 1
