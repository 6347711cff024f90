"""One scheduling rule for the trace and the memory model, and the decode step's graph launches.

The memory model (memory.py) and the iteration trace (iteration.py) describe the same iteration:
the tensors a die allocates must be the ones the trace sends and computes. A die that receives every
routed row of its instance (`p_hot` = 1) allocates, per layer and micro-batch, a dispatch receive
buffer of exactly the token copies the trace's dispatch carries, in as many micro-batches and over
as many layers (the MTP layer included).
"""

from __future__ import annotations

import copy
import itertools
import re

import pytest
from helpers import compose_run
from test_llm_infer import OVERRIDES, Env

from stratacl.comm.library import LibraryModel
from stratacl.machine.fabric import Fabric
from stratacl.workload_api import RunContext
from workloads.llm_infer import scheduling as rules
from workloads.llm_infer.fixed import run_fixed
from workloads.llm_infer.iteration import IterationModel
from workloads.llm_infer.memory import role_dies, serving_tensors
from workloads.llm_infer.workload import serving_costs

DP = 4  # the test layout's decode and prefill dies per instance
MOE_LAYERS = 2  # the tiny model: 3 layers, the first dense
LAUNCH_S = 700e-6  # graph launch on a CloudMatrix384 die (REFERENCE §2: 0.6-0.8 ms)


@pytest.fixture(scope="module")
def env() -> Env:
    return Env()


def _die_and_model(env: Env, role: str, **sched: object):  # noqa: ANN202
    w = copy.deepcopy(env.w)
    for k, v in sched.items():
        setattr(w.scheduler, k, v)
    iters = IterationModel(env.ctx, env.costs, w)
    die = role_dies(serving_tensors(env.costs, w, role), env.ctx.libraries["stratacl"], w, role,
                    env.ctx.fabric.hbm_bytes, env.costs, weights=iters.weights, seed=0)[0]
    die.p_hot = 1.0  # this die's experts receive every routed row of the instance
    return die, iters


def _memory_dispatches(die, tokens: int) -> list[tuple[int, int]]:  # noqa: ANN001
    """(micro-batch, routed rows) of each dispatch receive buffer of one iteration, in order."""
    ops = [op for block in die.iteration_ops(tokens, tokens * DP) for op in block]
    return [(int(op[1].split(".")[1]), op[2] // die.t.dispatch_token)
            for op in ops if op[0] == "alloc" and op[1].startswith("dispatch.")]


def _trace_dispatches(iters: IterationModel, phase: str, tokens: int) -> list[tuple[int, float]]:
    """(micro-batch, token copies received over the instance) of each dispatch, in (layer, micro-batch) order."""
    out = []
    for op in iters.trace(phase, tokens, 1024).ops:
        m = re.fullmatch(r"L(\d+)\.dispatch\.mb(\d+)", op.name)
        if m:
            out.append(((int(m[1]), int(m[2])), round(sum(op.peer_bytes) / iters.dispatch_bytes, 6)))
    return [(lm[1], copies) for lm, copies in sorted(out)]


@pytest.mark.parametrize("tbo, mtp, tbo_min", list(itertools.product((False, True), (False, True), (0, 64))))
def test_decode_memory_allocates_what_the_trace_dispatches(env: Env, tbo: bool, mtp: bool, tbo_min: int) -> None:
    """Per layer (the MTP layer included) and micro-batch, the decode die's dispatch buffer holds the
    token copies the trace's LL dispatch delivers to the instance: every sequence's verified tokens
    × top-k (and the same number of micro-batches and layers)."""
    die, iters = _die_and_model(env, "decode", tbo=tbo, mtp=mtp, tbo_min_tokens=tbo_min)
    assert abs(die.t.dispatch_token - iters.dispatch_bytes) <= 0.5  # one token copy, the same format
    for batch in (1, 8, 96):  # bucket sizes: the shapes the trace is built for
        mem = _memory_dispatches(die, batch)
        trace = _trace_dispatches(iters, "decode", batch)
        mbs = 2 if tbo and batch >= max(2, tbo_min) else 1
        layers = MOE_LAYERS + int(mtp)
        assert len(mem) == len(trace) == layers * mbs, (batch, mem, trace)
        assert [m for m, _ in mem] == [m for m, _ in trace]
        assert [r for _, r in mem] == [c for _, c in trace]
        # closed form: the main layers carry each sequence's verified tokens, the MTP layer one
        top_k = env.costs.top_k
        main = DP * batch * (1 + int(mtp)) * top_k // mbs
        assert [r for _, r in mem] == [main] * (MOE_LAYERS * mbs) + [DP * batch * top_k // mbs] * (int(mtp) * mbs)


@pytest.mark.parametrize("tbo, tbo_min", [(False, 0), (True, 0), (True, 4096)])
def test_prefill_memory_runs_the_trace_micro_batches(env: Env, tbo: bool, tbo_min: int) -> None:
    """Prefill (HT dispatch: one copy per die, so bytes differ by design): the same micro-batches
    and layers in the memory model as in the trace, no MTP layer."""
    die, iters = _die_and_model(env, "prefill", tbo=tbo, tbo_min_tokens=tbo_min)
    for tokens in (256, 1024):
        mem = [m for m, _ in _memory_dispatches(die, tokens)]
        trace = [m for m, _ in _trace_dispatches(iters, "prefill", tokens)]
        mbs = 2 if tbo and tokens >= tbo_min else 1
        assert mem == trace and len(mem) == MOE_LAYERS * mbs


# ----------------------------------------------------------------------------- graph launches

def _with_launch(env: Env, preset: str, launch_us: float) -> RunContext:
    """A context whose one library `preset` runs on a die that launches a graph in `launch_us`."""
    cfg = compose_run([*OVERRIDES, f"library=[{preset}]", f"baseline={preset}"])
    cfg.fabric.die.graph_launch_us = launch_us
    fab = Fabric(cfg.fabric)
    return RunContext(cfg=env.cfg, fabric=fab, libraries={preset: LibraryModel(preset, cfg.library[preset], fab)},
                      baseline=preset, seed=0)


@pytest.mark.parametrize("preset, syncs", [("stratacl", 0), ("hccl", 2 * (MOE_LAYERS + 1))])
def test_graph_capture_moves_the_decode_step_by_its_launches(env: Env, preset: str, syncs: int) -> None:
    """A captured decode step launches one graph (stratacl); a step holding host-synchronising
    operators (hccl: every dispatch and combine, MTP layer included; 8 sequences: one micro-batch)
    runs eagerly: no launch. The operators' host round trips are in the trace either way.
    Prefill runs eagerly."""
    ctx = _with_launch(env, preset, LAUNCH_S * 1e6)
    w_off = copy.deepcopy(env.w)
    w_off.scheduler.decode_graph_capture = False
    on, off = IterationModel(ctx, env.costs, env.w), IterationModel(ctx, env.costs, w_off)
    d_on, d_off = on.decode(preset, 8, 1024), off.decode(preset, 8, 1024)
    launches = 0 if syncs else 1
    assert d_on.time_s - d_off.time_s == pytest.approx(launches * LAUNCH_S, rel=1e-9, abs=1e-15)
    assert d_on.launch_s == pytest.approx(launches * LAUNCH_S) and d_off.launch_s == 0.0
    lib = ctx.libraries[preset]
    assert (MOE_LAYERS + 1) * sum(lib.needs_host(c, "ll") for c in ("dispatch", "combine")) == syncs
    assert lib.step_graph_launch_s(syncs) == pytest.approx(launches * LAUNCH_S)
    assert on.prefill(preset, 1024) == off.prefill(preset, 1024)


def test_graph_launch_cost_reaches_the_fixed_mode_figures(env: Env) -> None:
    """0, 700 and 10⁶ µs per launch give three different decode figures, apart by exactly the
    step's one graph launch (stratacl: no operator needs the host); prefill keeps its."""
    w = copy.deepcopy(env.w)
    w.mode, w.fixed.decode_batch_per_die, w.fixed.context, w.fixed.prefill_tokens_per_die = "fixed", 8, 1024, 512
    w.fixed.prompt_tokens = 512
    costs = serving_costs(env.mc, w, 0)
    steps, prefill = {}, set()
    for us in (0.0, 700.0, 1e6):
        ctx = _with_launch(env, "stratacl", us)
        m = run_fixed(ctx, w, costs, IterationModel(ctx, costs, w), env.kv_tok).metrics["stratacl"]
        steps[us] = m["decode_step_s"]
        prefill.add(m["prefill_iter_s"])
    launches = 1
    assert steps[700.0] - steps[0.0] == pytest.approx(launches * 700e-6, rel=1e-9)
    assert steps[1e6] - steps[0.0] == pytest.approx(launches * 1.0, rel=1e-9)
    assert len(prefill) == 1


def test_scheduler_caps_closed_form() -> None:
    """Defaults: two micro-batches of at most 512 tokens per die each (CANN maxBs on Atlas A3), two
    tokens verified per sequence with MTP: 512 sequences per decode die, a 1024-token profiling
    forward; a batch cap below that binds both; one micro-batch and no MTP halve and double them."""
    s = compose_run(["workload=llm_infer"]).workload.scheduler
    assert (rules.decode_batch_cap(s), rules.profile_tokens(s, "decode")) == (512, 1024)
    assert rules.profile_tokens(s, "prefill") == s.prefill_token_budget == 8192
    assert rules.emitted_tokens_per_step(s) == pytest.approx(1.85)
    s.decode_max_batch = 100
    assert (rules.decode_batch_cap(s), rules.profile_tokens(s, "decode")) == (100, 200)
    s.decode_max_batch, s.tbo, s.mtp = 0, False, False
    assert (rules.decode_batch_cap(s), rules.profile_tokens(s, "decode")) == (512, 512)
    assert rules.emitted_tokens_per_step(s) == 1.0
    assert [rules.micro_batches(s, n) for n in (1, 64, 4096)] == [1, 1, 1]
    s.tbo = True
    assert [rules.micro_batches(s, n) for n in (1, 63, 64)] == [1, 1, 2]
    assert rules.micro_batch_tokens(65, 2) == (33, 32) and sum(rules.micro_batch_tokens(7, 1)) == 7
