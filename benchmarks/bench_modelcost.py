"""Benchmark: DeepSeek-V4-Flash costs for all layer types at 20 shape buckets.

Targets: < 20 s cold, < 0.1 s warm (in-process cache), peak RSS < 2 GiB.
Run: python benchmarks/bench_modelcost.py
"""

from __future__ import annotations

import resource
import time

from workloads.modelcost import ModelCosts, load_model_yaml

# 20 buckets an inference + training workload asks for: prefill chunks, decode batches at
# several context lengths, training micro-batches, one TP/EP layout.
SHAPES = (
    [{"tokens": t, "phase": "prefill"} for t in (512, 1024, 2048, 4096, 8192)]
    + [{"tokens": b, "context": c, "phase": "decode"} for b in (16, 64, 128) for c in (1024, 4096, 16384)]
    + [{"tokens": 4096, "phase": p, "seq_len": 4096} for p in ("train_fwd", "train_bwd")]
    + [{"tokens": 4096, "phase": "prefill", "ep": 32}, {"tokens": 64, "context": 4096, "phase": "decode", "ep": 16},
       {"tokens": 4096, "phase": "train_fwd", "tp": 4, "ep": 64}, {"tokens": 4096, "phase": "train_bwd", "tp": 4, "ep": 64}]
)
assert len(SHAPES) == 20


def run(mc: ModelCosts) -> int:
    n = 0
    for s in SHAPES:
        for t in mc.layer_types():
            mc.layer_cost(t, **s)
            n += 1
    return n


def main() -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    mc = ModelCosts(load_model_yaml("deepseek_v4_flash"))
    t_build = time.perf_counter() - t0
    n = run(mc)
    t_cold = time.perf_counter() - t0
    cpu_cold = time.process_time() - c0
    t1 = time.perf_counter()
    run(mc)
    t_warm = time.perf_counter() - t1
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
    print(f"layer types: {mc.layer_types()}")
    print(f"queries per pass: {n} ({len(SHAPES)} shapes x {len(mc.layer_types())} layer types)")
    print(f"build (config + meta model): {t_build:.2f} s")
    print(f"cold (build + all measurements): {t_cold:.2f} s  [target < 20 s] {'OK' if t_cold < 20 else 'MISS'}")
    # CPU seconds of this process: what the cold build costs on an idle core (wall time
    # above grows with whatever else shares the machine).
    print(f"cold CPU time (process_time): {cpu_cold:.2f} s  attention={mc.attention}")
    print(f"warm (cached): {t_warm * 1e3:.2f} ms  [target < 100 ms] {'OK' if t_warm < 0.1 else 'MISS'}")
    print(f"peak RSS (ru_maxrss): {rss_gib:.2f} GiB  [target < 2 GiB] {'OK' if rss_gib < 2 else 'MISS'}")


if __name__ == "__main__":
    main()
