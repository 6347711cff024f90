"""Per-die allocator on an inference-like decode die: fragmentation with expandable segments off
(the pool baseline's setting) vs on, registration-on-allocation remaps, JIT cache hits; and speed.

    python benchmarks/bench_allocator.py [--iterations 1000] [--seed 0]

The die (ASSUMPTION: plausible sizes, not calibrated) is a DeepSeek-V3/R1-shaped decode die as
CloudMatrix-Infer deploys it (REFERENCE §6): 64 GB HBM (REFERENCE §2), EP320 with one routed
expert per die, INT8 weights, DP attention, MTP with one draft token. Start-up allocates the
weights as one tensor per parameter and a KV cache of one tensor per layer; every decode iteration
then allocates and frees, layer by layer, the activations of its batch and the MoE dispatch /
combine buffers whose sizes follow that layer's routing (tokens routed to this die's expert).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from stratacl.config import JitMatch
from stratacl.memory import (
    AllocatorConfig,
    CachingAllocator,
    DieMemory,
    GiB,
    JitRegistrationCache,
    RegistrationCost,
    RegistrationOnAllocation,
)

# DeepSeek-V3 shape (transformers DeepseekV3Config defaults)
H, LAYERS, DENSE, VOCAB = 7168, 61, 3, 129280
Q_LORA, KV_LORA, ROPE, HEADS, NOPE, VDIM = 1536, 512, 64, 128, 128, 128
MOE_INTER, DENSE_INTER, EXPERTS, TOPK = 2048, 18432, 256, 8
DIES = 320  # EP320 (REFERENCE §6)
CAPACITY = 64 * 10**9  # REFERENCE §2
KV_BYTES = 24 * GiB  # ASSUMPTION: the KV cache the die was sized for
ITER_S = 0.05  # ASSUMPTION: decode iteration length (only spaces event times)
# registration costs as conf/library/hccl.yaml (8 µs base, 10.8 µs per peer); 16 peers per die
COST = RegistrationCost(base_us=8.0, per_peer_us=10.8)
PEERS = 16


def weights() -> list[int]:
    w = [VOCAB * H * 2]  # embedding (bf16)
    for layer in range(LAYERS):
        w += [H * 2, H * 2, H * Q_LORA, Q_LORA * HEADS * (NOPE + ROPE), H * (KV_LORA + ROPE),
              KV_LORA * HEADS * (NOPE + VDIM), HEADS * VDIM * H]  # norms (bf16) + MLA (int8)
        if layer < DENSE:
            w += [H * DENSE_INTER] * 3
        else:
            w += [H * MOE_INTER] * 6 + [EXPERTS * H * 2]  # routed + shared expert, router
    return w + [H * 2, VOCAB * H * 2]  # final norm, lm_head


def iteration(tokens: int, routed: np.ndarray) -> list[tuple]:
    """The tensors one decode iteration allocates and frees, in order."""
    ops: list[tuple] = []
    a = lambda n, b: ops.append(("alloc", f"{n}", int(b)))  # noqa: E731
    f = lambda n: ops.append(("free", f"{n}"))  # noqa: E731
    T = tokens
    a("h0", T * H * 2)
    for layer in range(LAYERS):
        h, hn = f"h{layer}", f"h{layer + 1}"
        a("norm", T * H * 2)
        a("q", T * HEADS * (NOPE + ROPE) * 2)
        a("kv", T * (KV_LORA + ROPE) * 2)
        a("attn", T * HEADS * VDIM * 2)
        f("q"), f("kv")
        a("o", T * H * 2)
        f("attn"), f("norm")
        a("norm2", T * H * 2)
        if layer < DENSE:
            a("gate_up", T * 2 * DENSE_INTER * 2)
            a("act", T * DENSE_INTER * 2)
            f("gate_up")
            a("ffn", T * H * 2)
            f("act")
        else:
            R = int(routed[layer])
            a("logits", T * EXPERTS * 4)
            a("topk", T * TOPK * 8)
            f("logits")
            a("dispatch", R * (H + 4))  # int8 tokens + per-token scale, sized by routing
            a("gate_up", R * 2 * MOE_INTER * 2)
            a("act", R * MOE_INTER * 2)
            f("gate_up")
            a("down", R * H * 2)
            f("act"), f("dispatch")
            a("combine", T * TOPK * H * 2)  # each token receives its top-k expert outputs
            f("down")
            a("sh_gate_up", T * 2 * MOE_INTER * 2)
            a("sh_act", T * MOE_INTER * 2)
            f("sh_gate_up")
            a("ffn", T * H * 2)
            f("sh_act"), f("combine"), f("topk")
        f("norm2")
        a(hn, T * H * 2)
        f("o"), f("ffn"), f(h)
    a("logits_out", T * VOCAB * 4)
    a("probs", T * VOCAB * 4)
    f(f"h{LAYERS}"), f("logits_out"), f("probs")
    return ops


def drive(expandable: bool, iterations: int, seed: int, warmup: int) -> dict:
    rng = np.random.default_rng(seed)
    alloc = CachingAllocator(AllocatorConfig(CAPACITY, expandable_segments=expandable))
    # both mechanisms listen to one allocator, to compare them on the same map events
    roa = RegistrationOnAllocation(COST, PEERS).attach(alloc)
    jit = JitRegistrationCache(COST, PEERS).attach(alloc)
    mem = DieMemory(alloc)
    jit_exact = JitRegistrationCache(COST, PEERS, match=JitMatch.exact).attach(alloc)
    for i, nbytes in enumerate(weights()):
        mem.alloc(f"w{i}", nbytes, 0.0)
    for layer in range(LAYERS):
        mem.alloc(f"kv{layer}", KV_BYTES // LAYERS, 0.0)
    after_startup = alloc.stats.reserved_bytes
    batch = 64
    t0 = 3.0  # first decode iteration starts after warm-up (≥ 2.6 s, REFERENCE §4)
    steady = t0 + warmup * ITER_S
    waits: list[float] = []
    wall = time.perf_counter()
    for it in range(iterations):
        batch = int(np.clip(batch + rng.integers(-8, 9), 16, 96))  # continuous batching drifts
        tokens = 2 * batch  # MTP: one draft token
        load = rng.lognormal(0.0, 0.5, LAYERS)
        routed = rng.poisson(tokens * DIES * TOPK / EXPERTS * load / load.mean())
        ops = iteration(tokens, routed)
        t = t0 + it * ITER_S
        dt = ITER_S / len(ops)
        for k, op in enumerate(ops):
            ti = t + k * dt
            if op[0] == "free":
                mem.free(op[1], ti)
                continue
            b = mem.alloc(op[1], op[2], ti)
            if op[1] in ("dispatch", "combine"):  # the collective uses its buffer right away
                waits.append(roa.wait_s(b.addr, b.requested, ti + 1e-6))
                jit.lookup(b.addr, b.requested)
                jit_exact.lookup(b.addr, b.requested)
    wall = time.perf_counter() - wall
    s = alloc.stats
    remaps = [j for j in roa.jobs if j.t_map >= steady]
    remap_iters = {int((j.t_map - t0) // ITER_S) for j in remaps}
    return {
        "expandable": expandable,
        "reserved_after_startup_GiB": after_startup / GiB,
        "allocated_peak_GiB": s.allocated_bytes_peak / GiB,
        "requested_peak_GiB": s.requested_bytes_peak / GiB,
        "reserved_peak_GiB": s.reserved_bytes_peak / GiB,
        "fragmentation_GiB": s.fragmentation_bytes / GiB,
        "inactive_split_GiB": alloc.inactive_split_bytes() / GiB,
        "segments": s.segments,
        "maps": s.num_device_alloc,
        "steady_maps": len(remaps),
        "steady_remap_iteration_share": len(remap_iters) / max(1, iterations - warmup),
        "roa_waits": sum(w > 0 for w in waits),
        "roa_wait_ms_total": sum(waits) * 1e3,
        "jit_cover_hit_rate": jit.hits / max(1, jit.hits + jit.misses),
        "jit_exact_hit_rate": jit_exact.hits / max(1, jit_exact.hits + jit_exact.misses),
        "mallocs_per_s": s.num_mallocs / wall,
        "wall_s": wall,
    }


def memo_speed(repeats: int = 200) -> tuple[float, float]:
    """Wall time per iteration of a fixed-shape iteration: first run vs replays from the memo."""
    alloc = CachingAllocator(AllocatorConfig(CAPACITY))
    mem = DieMemory(alloc)
    ops = tuple(iteration(128, np.full(LAYERS, 1280)))
    w = time.perf_counter()
    mem.run(ops)
    mem.run(ops)  # the first run maps segments; the second starts from the state it leaves
    cold = (time.perf_counter() - w) / 2
    w = time.perf_counter()
    for _ in range(repeats):
        mem.run(ops)
    return cold, (time.perf_counter() - w) / repeats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"weights {sum(weights()) / GiB:.2f} GiB in {len(weights())} tensors; KV {KV_BYTES / GiB:.0f} GiB")
    for expandable in (False, True):
        r = drive(expandable, args.iterations, args.seed, args.warmup)
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    cold, warm = memo_speed()
    print(f"fixed-shape iteration: {cold * 1e3:.1f} ms simulated, {warm * 1e6:.0f} µs from the memo")


if __name__ == "__main__":
    main()
