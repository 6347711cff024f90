"""Session fixtures built from the real conf/ tree."""

from __future__ import annotations

import os

import pytest
from helpers import compose_run

from stratacl.config import RunConfig
from stratacl.fabric import Fabric


@pytest.fixture(scope="session")
def run_cfg() -> RunConfig:
    return compose_run()


@pytest.fixture(scope="session")
def cm384(run_cfg: RunConfig) -> Fabric:
    return Fabric(run_cfg.fabric)


# CI replays a fixed set of examples (no flaky red builds); locally hypothesis explores freely
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
