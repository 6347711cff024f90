"""A real Ray sweep: a Ray head on 127.0.0.1, a two-point sweep through `hydra/launcher=ray` joining
it by address, both summaries checked against the basic launcher's run of the same points.

Marked `ray` (not in the default run: Ray is ~420 MB). `.ci/run` installs `.[ray]` and runs
`python -m pytest -m ray`; there a missing Ray is a failure, elsewhere a skip.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT, run_cli

pytestmark = pytest.mark.ray

try:
    import hydra_plugins.hydra_ray_launcher  # noqa: F401
    import ray  # noqa: F401

    RAY_MISSING: ImportError | None = None
except ImportError as exc:  # judged when a test runs: the default run collects but deselects them
    RAY_MISSING = exc


@pytest.fixture(autouse=True, scope="module")
def _ray_installed() -> None:
    if RAY_MISSING is None:
        return
    if os.environ.get("CI"):  # .ci/run installs .[ray]: missing there is a failure, not a skip
        pytest.fail(f"Ray tests under CI without the extra: {RAY_MISSING}")
    pytest.skip('Ray tests need the extra: pip install -e ".[ray]"')

# Ray rewrites 127.0.0.1 to the machine's routable address (a cluster's nodes must reach it);
# this switch (its loopback mode for laptops) keeps the head, its workers and the driver on loopback.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Token authentication as a real cluster would run it (Ray 2.60 turns it on for a head that finds
# a token, e.g. ~/.ray/auth_token): head and driver share this token file, so the test does not
# depend on the user's ~/.ray.
TOKEN = Path(tempfile.mkdtemp(prefix="raytok", dir="/tmp")) / "auth_token"
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(TOKEN)}
POINTS = ["workload.max_bytes=1048576", "workload.ranks=16,32",
          "output.timeline=false"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """`ray start --head --block` on 127.0.0.1 in its own process group; its workers import this
    checkout (PYTHONPATH). Stopped by signalling that group only (never `ray stop`, which would end
    every Ray process of the user)."""
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
           "RAY_USAGE_STATS_ENABLED": "0", **LOOPBACK, **AUTH}
    TOKEN.write_text(secrets.token_hex(32))
    ray_cli = Path(sys.executable).with_name("ray")
    head = subprocess.Popen(
        [str(ray_cli), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
         "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
         f"--object-store-memory={100 << 20}", f"--temp-dir={temp}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the GCS port answers once the head is up
            if head.poll() is not None:
                raise RuntimeError(f"ray start exited {head.returncode}: {head.stdout.read()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            raise RuntimeError("the Ray head did not come up in 120 s")
        yield address
    finally:
        _stop_group(head)
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(TOKEN.parent, ignore_errors=True)


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _summaries(sweep: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/summary.json")}


def test_two_point_sweep_on_a_ray_head_matches_the_basic_launcher(ray_head: str, tmp_path: Path) -> None:
    ray_sweep, basic_sweep = tmp_path / "ray", tmp_path / "basic"
    proc = run_cli(["--multirun", "hydra/launcher=ray", f"hydra.launcher.ray.init.address={ray_head}",
                    *POINTS, f"hydra.sweep.dir={ray_sweep}"], tmp_path, timeout=600,
                   env={**LOOPBACK, **AUTH})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Connecting to existing Ray cluster" in proc.stderr + proc.stdout  # joined the head, not a new Ray
    got = _summaries(ray_sweep)
    assert sorted(got) == ["workload.max_bytes=1048576,workload.ranks=16",
                           "workload.max_bytes=1048576,workload.ranks=32"]
    for s in got.values():
        assert set(s["libraries"]) == {"hccl", "stratacl"}
        assert s["libraries"]["hccl"]["busbw_GBps_mean"] > 0
    proc = run_cli(["--multirun", "hydra/launcher=basic", *POINTS, f"hydra.sweep.dir={basic_sweep}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _summaries(basic_sweep) == got  # the launcher changes where a point runs, not its result
    for name in got:  # byte for byte, too
        assert (ray_sweep / name / "summary.json").read_bytes() == (basic_sweep / name / "summary.json").read_bytes()
