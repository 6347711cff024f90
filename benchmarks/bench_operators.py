"""Speed of the operator benchmarks (issue budget: sweep < 10 s, MoE table < 10 s).

    python benchmarks/bench_operators.py

Runs `+experiment=operators` (6 collectives × 15 sizes × 4 presets, 32 ranks) and
`+experiment=moe_table` (EP32, HT + LL, 4 libraries) in-process, without writing a timeline, and
prints wall times (excluding interpreter start-up; the CLI adds ~1 s for Hydra and imports).
Also times StrataCL's partitioning policy generation for a 32-rank 128 MiB all-gather on 24
cores (REFERENCE §4: ≈ 40 µs in the paper's native implementation; here the Python LPT).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from stratacl.comm.library import LibraryModel
from stratacl.config import to_object
from stratacl.machine.fabric import Fabric
from stratacl.run.cli import execute

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def timed(experiment: str) -> float:
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = to_object(compose("config", overrides=[f"+experiment={experiment}", "output.timeline=false",
                                                     "output.progress=false"]))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        execute(cfg, Path(tmp), echo=False)
        return time.perf_counter() - t0


def policy_generation_us(repeats: int = 50) -> tuple[float, float]:
    """Median wall time of the balanced core schedule of one die's 31 peers (32-rank 128 MiB
    all-gather, 24 cores), and the spread it reaches."""
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = to_object(compose("config", overrides=["library=[stratacl_no_sdma]", "baseline=stratacl_no_sdma"]))
    fab = Fabric(cfg.fabric)
    lib = LibraryModel("stratacl_no_sdma", cfg.library["stratacl_no_sdma"], fab)
    plan = lib.wire_plan("allgather", 128 * 2**20, tuple(range(32)), algorithm="fullmesh")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sched = lib.ctx.core_schedule(plan)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e6, sched.spread


if __name__ == "__main__":
    print(f"operator sweep (6 collectives x 15 sizes x 4 presets, 32 ranks): {timed('operators'):.2f} s")
    print(f"MoE table (EP32, HT+LL, 4 libraries): {timed('moe_table'):.2f} s")
    us, spread = policy_generation_us()
    print(f"policy generation (32-rank 128 MiB all-gather, 24 cores, Python LPT): {us:.0f} us, "
          f"core spread {spread:.1%}")
