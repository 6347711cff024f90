"""Helpers shared by tests: configs composed from conf/ exactly as the CLI composes them, the CLI
run as users run it, and scripts outside the packages loaded by path."""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from hydra import compose, initialize_config_dir

from stratacl.comm.library import LibraryModel
from stratacl.config import ExpansionMode, RunConfig, to_object
from stratacl.machine.fabric import Fabric

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")


def compose_run(overrides: list[str] | None = None) -> RunConfig:
    """A fresh typed config (composition is cached; callers may mutate what they get)."""
    return copy.deepcopy(_compose(tuple(overrides or ())))


@functools.lru_cache(maxsize=64)
def _compose(overrides: tuple[str, ...]) -> RunConfig:
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return to_object(compose("config", overrides=list(overrides)))


def make_library(fabric: Fabric, preset: str = "hccl", **knobs: object) -> LibraryModel:
    """A library preset from conf/library with knob overrides (e.g. data_path=DataPath.pool)."""
    cfg = compose_run([f"library=[{preset}]", f"baseline={preset}"])
    lib_cfg = cfg.library[preset]
    if ("mover" in knobs or "trigger" in knobs) and "expansion_mode" not in knobs:
        knobs["expansion_mode"] = ExpansionMode.custom  # an explicit mover overrides the preset's mode
    for key, value in knobs.items():
        setattr(lib_cfg, key, value)
    return LibraryModel(preset, lib_cfg, fabric)


def run_cli(args: Sequence[str], cwd: Path, timeout: float = 300,
            env: dict[str, str] | None = None, user: tuple[int, int] | None = None) -> subprocess.CompletedProcess:
    """`python -m stratacl.run *args` in `cwd`, on this checkout's code (not whichever copy is
    pip-installed): the child's PYTHONPATH starts with the repository root. `user`: (uid, gid)
    the child runs as (from `non_root_user`)."""
    base = {**os.environ, **(env or {})}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "stratacl.run", *args], cwd=cwd, env=base,
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_become(*user) if user and os.geteuid() == 0 else None)


def _become(uid: int, gid: int):  # noqa: ANN202 - a preexec_fn
    def drop() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    return drop


def non_root_user() -> tuple[int, int]:
    """(uid, gid) of a user file permissions apply to: this process's own when it is not root;
    as root (CI), `nobody`, if it can run this interpreter and import the harness — else the
    calling test skips (permissions cannot be exercised here)."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    import pwd

    import pytest

    try:
        who = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no non-root user (nobody) to run the CLI as")
    try:
        probe = subprocess.run([sys.executable, "-c", "import stratacl.run.cli"], cwd="/", capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                               preexec_fn=_become(who.pw_uid, who.pw_gid))
    except PermissionError as exc:  # the interpreter itself is out of its reach (under /root)
        pytest.skip(f"user nobody cannot run {sys.executable}: {exc}")
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run {sys.executable} with the harness: {probe.stderr.strip()[-200:]}")
    return who.pw_uid, who.pw_gid


def merged(*groups: Sequence[str]) -> list[str]:
    """Override lists joined, a later group's value of a key replacing an earlier one's (the CLI
    refuses a key given twice with different values)."""
    out: dict[str, str] = {}
    for group in groups:
        for ov in group:
            out[ov.partition("=")[0].lstrip("+")] = ov
    return list(out.values())


def load_script(path: Path) -> ModuleType:
    """Import a file outside the packages (benchmarks/, analysis/) by path, leaving sys.path alone."""
    spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chakra_or_skip() -> ModuleType:
    """The Chakra ET schema module (PyPI mlc-chakra); without it the calling test module skips,
    except under CI (.ci/run installs the schema: missing there is a failure)."""
    try:
        from chakra.schema.protobuf import et_def_pb2
    except ImportError:
        if os.environ.get("CI"):
            raise
        import pytest

        pytest.skip("Chakra tests need the schema: pip install protobuf && "
                    "pip install --no-deps 'mlc-chakra>=1.0,<2'", allow_module_level=True)
    return et_def_pb2
