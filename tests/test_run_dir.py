"""The default run directory is claimed atomically: runs started in the same second get their own."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import non_root_user, run_cli
from omegaconf import OmegaConf

from stratacl.paths import CONF
from stratacl.run.run_dir import fresh_dir, register


def test_a_taken_directory_gets_the_next_suffix(tmp_path: Path) -> None:
    base = str(tmp_path / "runs" / "12-00-00_llm_infer")
    claim = fresh_dir.__wrapped__  # uncached: each call is another run's claim
    assert [claim(base) for _ in range(3)] == [base, f"{base}_2", f"{base}_3"]
    assert all(Path(p).is_dir() for p in (base, f"{base}_2", f"{base}_3"))


def test_one_run_reads_one_answer(tmp_path: Path) -> None:
    """Hydra reads hydra.run.dir more than once in a run: every read gives the directory claimed."""
    register()
    cfg = OmegaConf.create({"d": f"${{fresh_dir:{tmp_path}/r}}"})
    assert cfg.d == cfg.d == f"{tmp_path}/r"


def test_the_default_run_dir_uses_it() -> None:
    run_dir = OmegaConf.load(CONF / "config.yaml").hydra.run._get_node("dir")._value()
    assert run_dir.startswith("${fresh_dir:runs/")


@pytest.fixture
def shared_cwd() -> Iterator[Path]:
    """A working directory another user can enter (pytest's tmp_path is private to its owner)."""
    d = Path(tempfile.mkdtemp(prefix="stratacl_cwd_", dir="/tmp"))
    d.chmod(0o755)
    yield d
    for p in (d, *d.rglob("*")):
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(d)


@pytest.mark.parametrize("override", [[], ["hydra.run.dir=runs/mine"]])
def test_an_unwritable_runs_dir_is_one_line_for_a_non_root_user(shared_cwd: Path, override: list[str]) -> None:
    user = non_root_user()
    runs = shared_cwd / "runs"
    runs.mkdir(mode=0o555)
    runs.chmod(0o555)  # mkdir's mode is masked by the umask
    args = [*override, "workload.max_bytes=1048576", "output.timeline=false", "output.progress=false"]
    proc = run_cli(args, shared_cwd, user=user)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: config field 'hydra.run.dir'") and "writ" in lines[0], lines[0]
    assert list(runs.iterdir()) == []
    runs.chmod(0o777)  # the same user, once runs/ is writable: the refusal was the permission
    proc = run_cli(args, shared_cwd, user=user)
    assert proc.returncode == 0, proc.stderr
    assert len(list(runs.rglob("summary.json"))) == 1
