"""Serving memory from the allocator model: library facts, communicator buffers as deployments size
them, registration events that follow the allocator's map events, JIT hits and misses by address
range, and their cost in the simulated iterations."""

from __future__ import annotations

import types

import numpy as np
import pytest
from helpers import compose_run, make_library
from test_llm_infer import Env

from stratacl.comm.buffers import MiB, buffer_sizes_MiB, moe_window_bytes
from stratacl.config import DataPath, JitMatch
from stratacl.engine.replay import simulate
from stratacl.fabric import Fabric
from stratacl.memory import MemEvent
from stratacl.memory.communicators import Communicator, MoeWindows
from stratacl.trace import REGISTERED, Trace
from workloads.llm_infer.requests import Requests


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
    assert st.die_memory(2**34, 15).on_alloc is not None and st.die_memory(2**34, 15).jit is None
    assert jit.die_memory(2**34, 15).jit.match == "exact"  # HCCL keys by (address, size)
    cover = make_library(fab, "hccl_jit", jit_cache_match=JitMatch.cover)
    assert cover.die_memory(2**34, 15).jit.match == "cover"


def test_registered_buffers_cost_nothing_to_jit_registration(fab: Fabric) -> None:
    lib = make_library(fab, "hccl_jit")
    tr = Trace(world_size=8)
    tr.add_family("g", [range(8)])
    tr.add_buffer("cached", REGISTERED)
    tr.add_buffer("warm", -1)
    for buf in ("cached", "warm", "cached", "warm"):
        tr.collective("alltoall", "g", 2**20, buffer=buf)
    res = simulate(tr, lib)
    one = (lib.cfg.register_base_us + lib.cfg.register_per_peer_us * 7) * 1e-6
    assert list(res.split["register"]) == pytest.approx([0.0, one, 0.0, 0.0])
    on_alloc = simulate(tr, make_library(fab, "hccl", data_path=DataPath.on_alloc))
    assert on_alloc.split["register"].sum() == 0.0  # registered before the trace: ready


# ----------------------------------------------------------------------------- the die model

def test_registration_jobs_follow_the_map_events_of_serving_iterations(env: Env) -> None:
    die = env.serving.dies("stratacl", "decode", False)[0]
    _expected_routing(die)
    events: list[MemEvent] = []
    die.alloc.subscribe(events.append)
    roa = die.mem.on_alloc
    jobs_before = len(roa.jobs)
    maps = []
    for k, batch in enumerate((4, 4, 64, 64, 8, 300, 300)):  # growing demand maps memory; repeats do not
        st = die.step(1.0 + k, batch, batch * 4)
        maps.append(st.maps)
    mapped = [e for e in events if e.kind == "map"]
    assert sum(maps) == len(mapped) > 0
    new_jobs = roa.jobs[jobs_before:]
    assert [(j.addr, j.size, j.t_map) for j in new_jobs] == [(e.addr, e.size, e.t) for e in mapped]
    assert all(j.start >= j.t_map and j.done > j.start for j in new_jobs)
    assert maps[1] == maps[3] == maps[4] == maps[6] == 0  # a shape seen before (or smaller) maps nothing
    assert maps[5] > 0  # the largest batch yet outgrows the mapping: a remap


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
    n = it.moe_buffer_uses("decode", 8)
    one = (8.0 + 10.8 * 3) * 1e-6  # EP4: base + 3 peers (conf/library/hccl_jit.yaml)
    none = it.decode("hccl_jit", 8, 1024, jit_miss=0.0)
    full = it.decode("hccl_jit", 8, 1024, jit_miss=1.0)
    assert none.register_s == 0.0
    assert full.register_s == pytest.approx(n * one)
    assert full.time_s > none.time_s
    half = it.decode("hccl_jit", 8, 1024, jit_miss=0.5)
    assert none.register_s < half.register_s < full.register_s
    # other libraries do not register user buffers just in time: the same fact costs them nothing
    assert it.decode("stratacl", 8, 1024, jit_miss=1.0) == it.decode("stratacl", 8, 1024)


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
