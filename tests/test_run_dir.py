"""The default run directory is claimed atomically: runs started in the same second get their own."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from stratacl.paths import CONF
from stratacl.run_dir import fresh_dir, register


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
