"""Session fixtures built from the real conf/ tree."""

from __future__ import annotations

import copy
import os

import pytest
from helpers import compose_run

from stratacl.config import KernelModelConfig, RunConfig
from stratacl.machine.fabric import Fabric


@pytest.fixture(scope="session")
def run_cfg() -> RunConfig:
    return compose_run()


@pytest.fixture(scope="session")
def cm384(run_cfg: RunConfig) -> Fabric:
    return Fabric(run_cfg.fabric)


@pytest.fixture(scope="session")
def cm384_ideal(run_cfg: RunConfig) -> Fabric:
    """CloudMatrix384 with the ideal kernel (fabric.die.kernel defaults: 100 % of peak, no launch,
    no re-reads): for tests of the engine's sharing whose closed forms price compute as the roofline
    (the kernel model has its own tests, tests/test_kernel_model.py)."""
    cfg = copy.deepcopy(run_cfg.fabric)
    cfg.die.kernel = KernelModelConfig()
    return Fabric(cfg)


# CI replays a fixed set of examples (no flaky red builds); locally hypothesis explores freely
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
