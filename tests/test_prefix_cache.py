"""Serving prefix reuse (issue 26): the bundled Mooncake block structure, the two-tier LRU prefix
cache, prefill work removed by hits, and DRAM-pool fetches on the host port.

Reusable blocks are computed here from the hash lists alone (an id that appeared before), never
through the cache's own code."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import compose_run

from stratacl.comm.library import LibraryModel
from stratacl.machine.fabric import Fabric
from stratacl.workload_api import RunContext
from workloads.common.model import model_costs
from workloads.llm_infer import prefix_trace
from workloads.llm_infer.costs import ServingCosts
from workloads.llm_infer.iteration import IterationModel, IterStats
from workloads.llm_infer.prefix import PrefixCache, block_tokens
from workloads.llm_infer.requests import Requests
from workloads.llm_infer.schema import LlmInferConfig
from workloads.llm_infer.serving import ServingSim

SOURCE = Path("/work/shared/data/mooncake_2025/conversation_trace.jsonl")  # the release, where present
TRACES = Path(prefix_trace.__file__).parent / "traces"
BLOCK = prefix_trace.BLOCK_TOKENS


@pytest.fixture(scope="module")
def trace() -> tuple[list[np.ndarray], np.ndarray]:
    ids = prefix_trace.load("mooncake_conv")
    tokens = pd.read_csv(TRACES / "mooncake_conv.csv")["num_prefill_tokens"].to_numpy()
    return ids, tokens


def reusable_per_id(lists: list[np.ndarray]) -> Counter:
    """Per block id: its occurrences after the first (what an unbounded cache could hit)."""
    c = Counter(int(b) for ids in lists for b in ids)
    return Counter({b: n - 1 for b, n in c.items() if n > 1})


def test_bundle_is_small_and_reproduces_the_release(trace) -> None:  # noqa: ANN001
    ids, tokens = trace
    assert (TRACES / "mooncake_conv_blocks.npz").stat().st_size < 64_000
    assert [len(x) for x in ids] == [-(-int(t) // BLOCK) for t in tokens]  # one id per 512-token block
    assert sum(reusable_per_id(ids).values()) / sum(map(len, ids)) == pytest.approx(0.366, abs=5e-4)
    if SOURCE.is_file():
        with open(SOURCE) as f:
            src = [json.loads(line)["hash_ids"] for line in f]
        assert len(src) == len(ids) and all(list(a) == b for a, b in zip(ids, src, strict=True))


def test_encode_rejects_ids_that_are_not_prefix_repeats() -> None:
    assert prefix_trace.encode([[0, 1], [0, 2], [0, 1, 3]])["shared"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="prefix"):
        prefix_trace.encode([[0, 1], [2, 1]])


def replay(ids: list[np.ndarray], tokens: np.ndarray, hbm: int, pool: int, instances: int = 1) -> np.ndarray:
    """Requests in order, round-robin over instances: (hbm, pool) hit blocks per request."""
    pc = PrefixCache(instances, hbm, pool, BLOCK)
    out = np.zeros((len(ids), 2), dtype=np.int64)
    for i, x in enumerate(ids):
        h = pc.lookup(i % instances, x, int(tokens[i]))
        out[i] = h.hbm_blocks, h.pool_blocks
        pc.insert(i % instances, x)
    return out


def test_hits_never_exceed_the_reusable_blocks(trace) -> None:  # noqa: ANN001
    ids, tokens = trace
    ids, tokens = ids[:3000], tokens[:3000]
    reusable = reusable_per_id(ids)
    for hbm, pool in ((10**9, 0), (0, 10**9), (2000, 20000)):
        hits = replay(ids, tokens, hbm, pool, instances=2)
        got = Counter()
        for x, (h, p) in zip(ids, hits, strict=True):
            got.update(int(b) for b in x[: h + p])  # hits are a prefix of the request's blocks
        assert all(got[b] <= reusable[b] for b in got), (hbm, pool)
    # an unbounded cache hits every reusable block but a prompt's last token (always computed)
    hits = replay(ids, tokens, 10**9, 0).sum()
    assert sum(reusable.values()) - 5 <= hits <= sum(reusable.values())


def test_a_larger_cache_never_lowers_the_hit_rate(trace) -> None:  # noqa: ANN001
    ids, tokens = trace
    ids, tokens = ids[:3000], tokens[:3000]
    rates, prev = [], np.zeros(len(ids))
    for hbm, pool in ((0, 0), (300, 0), (3000, 0), (3000, 3000), (3000, 30000), (30000, 30000)):
        hits = replay(ids, tokens, hbm, pool, instances=2).sum(axis=1)
        # LRU's inclusion property: on the same request stream every request hits at least as much
        assert (hits >= prev).all(), (hbm, pool, int(np.argmin(hits - prev)))
        rates.append(hits.sum())
        prev = hits
    assert rates == sorted(rates) and rates[0] == 0 and rates[-1] > rates[1]


# ------------------------------------------------------------------ serving with a priced stand-in
class Priced:
    """Stands in for the iteration model: a prefill iteration costs its tokens (1 ms per 1000)
    and records what it was asked to price."""

    reports_split = False  # no counterfactual split (IterationModel.reports_split)

    def __init__(self, send_s: float = 0.0) -> None:
        self.prefills: list[tuple[int, list[int], float]] = []
        self.sends: list[list[int]] = []
        self.send_s = send_s  # when a reused prefix's KV lands on decode (0: with the iteration's own)

    def prefill(self, library, tokens, remap=False, jit_miss=0.0, fetch_tokens=None, context=0.0,  # noqa: ANN001, ANN201
                send_tokens=None):  # noqa: ANN001
        self.prefills.append((tokens, list(fetch_tokens or []), context))
        self.sends.append(list(send_tokens or []))
        t = 1e-6 * tokens + 1e-3
        return IterStats(t, 0, 0, 0, 0, 0, kv_ready_s=t, prefix_ready_s=self.send_s if any(send_tokens or []) else 0)

    def decode(self, library, batch, context, remap=False, jit_miss=0.0):  # noqa: ANN001, ANN201
        return IterStats(0.02, 0, 0, 0, 0, 0)


def serve(trace, n: int, hbm: int, pool: int, reuse: bool = True, send_s: float = 0.0,  # noqa: ANN001
          kv_tok: float = 1.0) -> tuple[ServingSim, Priced]:
    ids, tokens = trace
    cfg = LlmInferConfig()
    lay = cfg.layout
    lay.prefill_instances, lay.prefill_dp, lay.decode_instances, lay.decode_dp = 2, 4, 1, 4
    reqs = Requests(np.arange(n) * 0.02, tokens[:n].astype(np.int64), np.full(n, 8), ids[:n])
    it = Priced(send_s)
    sim = ServingSim(reqs, it, "x", cfg, kv_per_die=1e15, kv_bytes_per_token=kv_tok,
                     prefix=PrefixCache(2, hbm, pool, BLOCK) if reuse else None)
    sim.run()
    return sim, it


def test_a_hit_removes_exactly_its_tokens_prefill_work(trace) -> None:  # noqa: ANN001
    sim, it = serve(trace, 400, hbm=4000, pool=10**6)
    req = sim.request_frame()
    hit_tokens = req["hbm_hit_tokens"] + req["pool_hit_tokens"]
    assert hit_tokens.sum() > 0.1 * req["input_tokens"].sum()
    prefill = sim.iteration_frame().query("phase == 'prefill'")
    assert prefill["tokens"].sum() == req["input_tokens"].sum() - hit_tokens.sum()
    # each request's reused tokens are its hit blocks' tokens (the last prompt token excepted)
    ids = trace[0]
    for r in req.itertuples():
        sizes = block_tokens(r.input_tokens, len(ids[r.request]), BLOCK)
        k = r.hbm_hit_blocks + r.pool_hit_blocks
        assert r.hbm_hit_tokens + r.pool_hit_tokens == min(sizes[:k].sum(), r.input_tokens - 1)
    # the pool's hits are what the iterations were asked to fetch
    assert sum(sum(f) for _, f, _ in it.prefills) == req["pool_hit_tokens"].sum() > 0
    # reuse off: every prompt token is prefilled, nothing fetched, no cached context
    off, it_off = serve(trace, 400, 0, 0, reuse=False)
    assert off.iteration_frame().query("phase == 'prefill'")["tokens"].sum() == req["input_tokens"].sum()
    assert not any(sum(f) for _, f, _ in it_off.prefills)
    # reuse lowers TTFT here (same arrivals, a cost per token)
    assert sim.request_frame()["ttft_s"].mean() < off.request_frame()["ttft_s"].mean()


# ------------------------------------------------------------------ the fetch on the fabric
TINY = ("{num_hidden_layers:3,first_k_dense_replace:1,hidden_size:256,intermediate_size:512,"
        "moe_intermediate_size:128,n_routed_experts:16,num_experts_per_tok:4,n_group:1,topk_group:1,"
        "num_attention_heads:4,num_key_value_heads:4,kv_lora_rank:64,q_lora_rank:64,qk_rope_head_dim:16,"
        "qk_nope_head_dim:32,v_head_dim:32,vocab_size:1024}")


def tiny(**kw) -> tuple:  # noqa: ANN003
    """(config, fabric, run context, costs, KV bytes per token, iteration model with `kw`) of the
    tiny model's 4-die prefill instance, hccl only."""
    cfg = compose_run(["workload=llm_infer", "workload.model.preset=deepseek_v3", f"+workload.model.overrides={TINY}",
                       "workload.layout.prefill_dp=4", "workload.layout.prefill_ep=4", "workload.cache_dir=",
                       "library=[hccl]"])
    fab = Fabric(cfg.fabric)
    ctx = RunContext(cfg=cfg, fabric=fab, libraries={"hccl": LibraryModel("hccl", cfg.library["hccl"], fab)},
                     baseline="hccl", seed=0)
    mc = model_costs(cfg.workload.model)
    costs = ServingCosts(mc, 4, 4, 1024)
    kv_tok = float(mc.kv_bytes_per_token())
    return cfg, fab, ctx, costs, kv_tok, IterationModel(ctx, costs, cfg.workload, kv_bytes_per_token=kv_tok, **kw)


def test_a_pool_fetch_loads_the_host_port() -> None:
    """Four dies of one node fetch B bytes per layer each from the DRAM pool, striped over the
    node's 4 CPUs (cloudmatrix384): each layer's copy takes at least 4B / 4 over a CPU's 160 GB/s
    link — longer than the dies' 196 GB/s ports alone would allow, so it is not a device-local
    copy nor a port-only transfer — and the iteration's attention waits for it. Write-through
    stores are device-to-host copies to the pool."""
    cfg, fab, ctx, costs, kv_tok, it = tiny(pool_writes=True)
    tokens = 64 * 2**20 // int(kv_tok) * len(costs.layers)  # 64 MiB per layer
    tr = it.trace("prefill", 1024, 0, fetch=(4, tokens))
    fetches = [op for op in tr.ops if op.stream == "kv_fetch"]
    stores = [op for op in tr.ops if op.stream == "kv_store"]
    assert len(fetches) == len(costs.layers) and all(op.peer == "pool" and op.direction == "h2d" for op in fetches)
    assert all(op.peer == "pool" and op.direction == "d2h" for op in stores) and stores
    nbytes = tokens * kv_tok / len(costs.layers)
    assert all(tuple(op.ranks) == (0, 1, 2, 3) and float(op.nbytes[0]) == pytest.approx(nbytes) for op in fetches)
    cpus = len(fab.host.cpus((0, 1, 2, 3), pool=True))
    assert 4 * nbytes / cpus / fab.host_link_Bps > nbytes / fab.port_Bps["ub"]  # the CPU link binds
    res = ctx.simulate(tr, "hccl")
    for op in fetches:
        assert res.end[op.id] - res.start[op.id] >= 4 * nbytes / cpus / fab.host_link_Bps
    first_attn = next(op for op in tr.ops if op.name.startswith("L0.attn"))
    assert fetches[0].id in first_attn.deps
    assert it.prefill("hccl", 1024, fetch_tokens=[tokens] * 4).time_s > it.prefill("hccl", 1024).time_s


# ------------------------------------------------------------------ the reused prefix goes on to decode
def test_decode_receives_the_whole_prompts_kv_reused_prefix_included(trace) -> None:  # noqa: ANN001
    """PD-disaggregated: a request's decode die gets its whole prompt's KV, prompt tokens × KV bytes
    per token, whatever part was reused: computed chunks leave with their iteration, the reused
    prefix is sent by the die that starts the prompt (asked of the iteration as its `send_tokens`).
    A request goes to decode only once its prefix's KV has landed there."""
    kv_tok = 70_272.0  # bytes per token (any value: the bytes scale with it)
    sim, it = serve(trace, 400, hbm=4000, pool=10**6, kv_tok=kv_tok)
    req = sim.request_frame()
    hit = req["hbm_hit_tokens"] + req["pool_hit_tokens"]
    assert hit.sum() > 0.1 * req["input_tokens"].sum()
    done = req[req["first_token_s"].notna()]
    np.testing.assert_array_equal(done["kv_to_decode_bytes"], done["input_tokens"] * kv_tok)
    assert sum(map(sum, it.sends)) == hit.sum()  # the prefix tokens the iterations were asked to send
    for (_, fetch, _), send in zip(it.prefills, it.sends, strict=True):
        assert all(s >= f for s, f in zip(send, fetch, strict=False))  # a die sends what it fetched
    # a slow prefix send holds its requests back from decode, and only those
    late, _ = serve(trace, 400, hbm=4000, pool=10**6, send_s=5.0, kv_tok=kv_tok)
    r = late.request_frame()
    r = r[r["output_tokens"] > 1]
    since_start = r["decode_start_s"] - r["prefill_start_s"]  # the send leaves when the prompt starts
    hits = r["hbm_hit_tokens"] + r["pool_hit_tokens"] > 0
    assert (since_start[hits] >= 5.0).all() and (since_start[~hits] < 5.0).all() and hits.any() and (~hits).any()


def test_the_prefix_send_loads_the_ports_from_prefill_to_decode_dies() -> None:
    """A reused prefix's KV, `tokens` per die on `dies` prefill dies, leaves layer by layer for the
    decode dies: Σ bytes = dies × tokens × KV bytes per token, each transfer from a prefill die to its
    decode die (prefill die i → decode die i mod D) and at least its bytes over a die's port long;
    the iteration's own end does not wait for it, its requests' decode start does."""
    cfg, fab, ctx, costs, kv_tok, it = tiny(decode_dies=(4, 5))
    dies, tokens = 3, 2**20
    tr = it.trace("prefill", 1024, 0, send=(dies, tokens))
    sends = [op for op in tr.ops if op.stream == "kv_prefix"]
    sent = sum(float(np.broadcast_to(op.nbytes, len(op.src)).sum()) for op in sends)  # bytes per pair
    assert sent == pytest.approx(dies * tokens * kv_tok)
    pairs = {(s, d) for op in sends for s, d in zip(op.src, op.dst, strict=True)}
    assert pairs == {(0, 4), (1, 5), (2, 4)}
    res = ctx.simulate(tr, "hccl")
    layer = tokens * kv_tok / len(costs.layers)
    assert all(res.end[op.id] - res.start[op.id] >= layer / fab.port_Bps["ub"] for op in sends)
    # priced: the iteration with it ends no earlier, its prefix lands when the send ends
    plain, sent = it.prefill("hccl", 1024), it.prefill("hccl", 1024, send_tokens=[tokens] * dies + [0])
    budget = it.trace("prefill", cfg.workload.scheduler.prefill_token_budget, 0, send=(4, tokens))
    end = max(ctx.simulate(budget, "hccl").end[op.id] for op in budget.ops if op.stream == "kv_prefix")
    assert sent.time_s >= plain.time_s and sent.prefix_ready_s == pytest.approx(end)
    assert sent.prefix_ready_s >= len(costs.layers) * 2 * layer / fab.port_Bps["ub"]  # 2 senders into die 4
