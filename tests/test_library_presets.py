"""Library presets inherit (conf/library): a variant names its parent in Hydra defaults
(`<parent>@_here_`) and states only what differs. (What the presets compute is pinned by the
golden summaries, benchmarks/golden_summaries.py --ci, not by a snapshot of their composed configs.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import CONF
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

PRESETS = sorted(p.stem for p in (Path(CONF) / "library").glob("*.yaml"))


def _composed(overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose("config", overrides=overrides)
    return OmegaConf.to_container(cfg.library, resolve=True, enum_to_str=True)


def _raw(name: str) -> dict:
    return yaml.safe_load((Path(CONF) / "library" / f"{name}.yaml").read_text())


def _parent(name: str) -> str | None:
    here = [d for d in _raw(name).get("defaults", []) if isinstance(d, str) and d.endswith("@_here_")]
    return here[0].removesuffix("@_here_") if here else None


VARIANTS = [n for n in PRESETS if _parent(n)]
# a value a variant restates although its parent has it already, for its source comment
RESTATED = {("hccl_jit", "jit_cache_match")}


def test_the_variants_inherit() -> None:
    assert set(VARIANTS) >= {"hccl_jit", "hccl_zerocopy", "hccl_roa", "stratacl_no_partition",
                             "stratacl_no_sdma", "cann_ep_zerocopy", "nccl_ubr", "nccl_roa"}


@pytest.mark.parametrize("name", VARIANTS)
def test_a_variant_states_only_what_differs_from_its_parent(name: str) -> None:
    parent = _parent(name)
    assert parent is not None
    mine = _composed([f"library=[{name}]", f"baseline={name}"])[name]
    theirs = _composed([f"library=[{parent}]", f"baseline={parent}"])[parent]
    for key in set(_raw(name)) - {"defaults"}:
        assert mine[key] != theirs[key] or (name, key) in RESTATED, f"{name}.{key} repeats {parent}'s value"


def test_inheritance_works_in_the_multi_select_group_with_per_library_overrides() -> None:
    """`library=[parent, variant]` composes both under their own names; an override of one
    library's knob reaches that library only, parent or variant."""
    libs = _composed(["library=[hccl,hccl_jit,nccl,nccl_roa]", "library.hccl_jit.comm_cores=12",
                      "library.hccl.launch_us=9.0", "library.nccl_roa.pipeline_chunks=2"])
    assert list(libs) == ["hccl", "hccl_jit", "nccl", "nccl_roa"]
    assert (libs["hccl"]["comm_cores"], libs["hccl_jit"]["comm_cores"]) == (24, 12)
    assert (libs["hccl"]["launch_us"], libs["hccl_jit"]["launch_us"]) == (9.0, 5.0)
    assert (libs["hccl"]["data_path"], libs["hccl_jit"]["data_path"]) == ("staged", "jit_register")
    # two levels: nccl_roa <- nccl_ubr <- nccl
    assert (libs["nccl"]["pipeline_chunks"], libs["nccl_roa"]["pipeline_chunks"]) == (8, 2)
    assert libs["nccl_roa"]["stage_anyway"] == {"allreduce": 0.5, "reducescatter": 1.0}
    assert libs["nccl_roa"]["data_path"] == "on_alloc" and libs["nccl"]["stage_anyway"] == {}
