"""The CLI boundary under hostile input (property-based): every run either succeeds with strict
JSON or ends with exit code 2 and one line naming the field, no traceback, no summary.json.

Overrides are drawn from the composed config's own leaves (every numeric, string and boolean knob
of the fabric, the libraries, the workload, output and limits) with hostile values. The default
suite runs a few examples on fast operator runs; `-m slow` runs many more, on every workload.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, ListConfig, OmegaConf

from stratacl.run.cli import run_overrides

CONF = str(Path(__file__).resolve().parents[1] / "conf")
HOSTILE = ["nan", "inf", "-inf", "-1", "0", "-0.5", "1e30", "1e300", "abc", "''", "../../etc/passwd",
           "[1,2]", "{a: 1}", "true", "null", "2.5", "999999999999"]
# fast bases: the operator sweep shrunk to a few points; a small moe benchmark
BASES = {
    "collectives": ["workload=collectives", "workload.collectives=[allreduce,alltoall]",
                    "workload.max_bytes=1048576", "workload.min_bytes=262144"],
    "moe": ["workload=moe", "workload.iters=1", "workload.warmup=0", "workload.ep=8"],
}
SLOW_BASES = {**BASES,
              "llm_infer": ["workload=llm_infer", "workload.requests.duration_s=5", "workload.capacity.saturation=false",
                            "workload.warmup_s=1"],
              "dlrm_train": ["workload=dlrm_train", "workload.iterations=2", "workload.ranks=16"],
              "llm_train": ["workload=llm_train", "workload.num_layers=2", "workload.iterations=[0]"]}
COMMON = ["output.timeline=false", "output.progress=false"]
SECONDS = 90.0  # a run either finishes or is refused well within this


def _leaves(node: object, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(node, DictConfig):
        for k in node:
            if k in ("hydra", "name", "description"):
                continue
            out += _leaves(node._get_node(k), f"{prefix}{k}.")
    elif isinstance(node, ListConfig):
        out.append(prefix[:-1])
    else:
        out.append(prefix[:-1])
    return out


def _keys(base: list[str]) -> list[str]:
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose("config", overrides=base + COMMON)
    OmegaConf.resolve(cfg)
    return sorted(_leaves(cfg))


KEYS = {name: _keys(base) for name, base in SLOW_BASES.items()}


def _check(base: list[str], key: str, value: str, tmp: Path) -> None:
    out = tmp / f"run{time.perf_counter_ns()}"
    t0 = time.perf_counter()
    code, err = run_overrides([*base, *COMMON, f"{key}={value}"], out)
    assert time.perf_counter() - t0 < SECONDS, (key, value)
    if code == 0:
        text = (out / "summary.json").read_text()

        def refuse(c: str) -> float:
            raise AssertionError(f"non-strict JSON constant {c} for {key}={value}")

        json.loads(text, parse_constant=refuse)
        return
    assert code == 2, (key, value, err)
    assert err.startswith("error: ") and "\n" not in err.strip(), (key, value, err)
    assert "Traceback" not in err
    assert "config field '" in err or "cannot use" in err, (key, value, err)
    assert not (out / "summary.json").exists()


def _strategy(bases: dict[str, list[str]]) -> st.SearchStrategy:
    return st.sampled_from(sorted(bases)).flatmap(
        lambda w: st.tuples(st.just(w), st.sampled_from(KEYS[w]), st.sampled_from(HOSTILE)))


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=_strategy(BASES))
def test_hostile_override_fails_cleanly_or_runs(case: tuple[str, str, str], tmp_path: Path) -> None:
    workload, key, value = case
    _check(BASES[workload], key, value, tmp_path)


@pytest.mark.slow
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=_strategy(SLOW_BASES))
def test_hostile_override_fails_cleanly_or_runs_everywhere(case: tuple[str, str, str], tmp_path: Path) -> None:
    workload, key, value = case
    _check(SLOW_BASES[workload], key, value, tmp_path)


def test_the_fuzzer_sees_every_schema() -> None:
    """Coverage: knobs of the fabric, libraries, each workload, output and limits are drawn."""
    keys = {k for ks in KEYS.values() for k in ks}
    for prefix in ("fabric.tiers.", "fabric.die.", "library.hccl.", "library.stratacl.", "output.", "limits.",
                   "workload.requests.", "workload.layout.", "workload.ranks", "workload.bottom_mlp"):
        assert any(k.startswith(prefix) for k in keys), prefix
    assert len(keys) > 150
