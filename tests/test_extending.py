"""docs/extending.md "A new mechanism": its Python file and YAML preset, taken from the doc as
written, run as a plugin beside NCCL's staged path."""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, compose_run, run_cli

from stratacl.comm.datapath import DATA_PATHS
from stratacl.comm.library import LibraryModel
from stratacl.config import validate_run
from stratacl.engine.replay import simulate
from stratacl.errors import ConfigError
from stratacl.machine.fabric import Fabric
from stratacl.trace import Trace

DOC = ROOT / "docs" / "extending.md"
MODULE, PRESET = "nccl_symmetric", "nccl_symmetric"


def _blocks() -> list[tuple[str, str]]:
    """(language, body) of each fenced block of the doc's `## A new mechanism` section."""
    section = DOC.read_text().split("## A new mechanism", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def _snippets() -> dict[str, str]:
    return dict(_blocks())


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The doc's two files in a user directory; the mechanism's registration ends with the test."""
    blocks = _snippets()
    (tmp_path / f"{MODULE}.py").write_text(blocks["python"])
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / f"{PRESET}.yaml").write_text(blocks["yaml"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(DATA_PATHS, "_classes", dict(DATA_PATHS._classes))
    yield tmp_path
    sys.modules.pop(MODULE, None)


def _allreduce_8(size: float) -> Trace:
    tr = Trace(world_size=8)
    tr.add_family("g", [range(8)])
    tr.collective("allreduce", "g", size)
    return tr


def test_the_doc_example_is_one_file_and_one_yaml() -> None:
    langs = [lang for lang, _ in _blocks()]
    assert langs.count("python") == langs.count("yaml") == langs.count("sh") == 1


def test_symmetric_kernels_beat_the_staged_path_at_small_sizes_with_the_same_wire_bytes(plugin_dir: Path) -> None:
    cfg = compose_run([f"hydra.searchpath=[file://{plugin_dir}]", f"plugins=[{MODULE}]", "fabric=hgx_h100",
                       f"library=[nccl,{PRESET}]", "baseline=nccl"])
    validate_run(cfg)
    fabric = Fabric(cfg.fabric)
    sym, staged = (LibraryModel(n, cfg.library[n], fabric) for n in (PRESET, "nccl"))
    assert sym.path.config.sync_fraction == 0.5  # the preset's option reached the mechanism's Config
    assert not sym.path.stages and sym.comm_memory_bytes() == 0.0
    for size in (4096.0, 65536.0, 262144.0):
        a, b = simulate(_allreduce_8(size), sym), simulate(_allreduce_8(size), staged)
        assert a.makespan_s < b.makespan_s, size  # no staging copy, shorter synchronised steps
        # the same algorithm moves the same bytes; only the staged path copies through HBM
        assert np.sum(a.wire_bytes) == pytest.approx(np.sum(b.wire_bytes), rel=1e-12) and np.sum(a.wire_bytes) > 0
        assert np.sum(a.copy_bytes) == 0.0 < np.sum(b.copy_bytes)


def test_the_doc_command_runs_and_reports_the_new_library(plugin_dir: Path) -> None:
    cmd = shlex.split(_snippets()["sh"].replace("\\\n", " ").replace("$PWD", str(plugin_dir)))
    assert cmd[:3] == ["python", "-m", "stratacl.run"]
    proc = run_cli([*cmd[3:], f"hydra.run.dir={plugin_dir / 'run'}", "output.progress=false"], plugin_dir)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((plugin_dir / "run" / "summary.json").read_text())
    assert set(summary["libraries"]) == {"nccl", PRESET}


@pytest.mark.parametrize(("override", "field"), [
    ("library.nccl_symmetric.data_path=symetric", "library.nccl_symmetric.data_path"),
    ("+library.nccl_symmetric.options.symmetric.sync_fractoin=0.3",
     "library.nccl_symmetric.options.symmetric.sync_fractoin"),
    ("library.nccl_symmetric.options.symmetric.sync_fraction=fast",
     "library.nccl_symmetric.options.symmetric.sync_fraction"),
])
def test_a_wrong_plugin_knob_names_its_field(plugin_dir: Path, override: str, field: str) -> None:
    cfg = compose_run([f"hydra.searchpath=[file://{plugin_dir}]", f"plugins=[{MODULE}]", "fabric=hgx_h100",
                       f"library=[nccl,{PRESET}]", "baseline=nccl", override])
    with pytest.raises(ConfigError) as err:
        validate_run(cfg)
    assert err.value.field == field
