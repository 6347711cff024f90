"""Speed of the operator benchmarks (issue budget: sweep < 20 s, MoE table < 10 s).

    python benchmarks/bench_operators.py

Runs `+experiment=operators` (6 collectives × 15 sizes × 4 presets, 32 ranks) and
`+experiment=moe_table` (EP32, HT + LL, 4 libraries) in-process, without writing a timeline, and
prints wall times (excluding interpreter start-up; the CLI adds ~1 s for Hydra and imports).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from stratacl.config import to_object
from stratacl.run import execute

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def timed(experiment: str) -> float:
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = to_object(compose("config", overrides=[f"+experiment={experiment}", "output.timeline=false",
                                                     "output.progress=false"]))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        execute(cfg, Path(tmp), echo=False)
        return time.perf_counter() - t0


if __name__ == "__main__":
    print(f"operator sweep (6 collectives x 15 sizes x 4 presets, 32 ranks): {timed('operators'):.2f} s")
    print(f"MoE table (EP32, HT+LL, 4 libraries): {timed('moe_table'):.2f} s")
