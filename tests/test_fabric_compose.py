"""Fabric presets compose (Hydra defaults): a derived fabric is its parent except the fields it
sets, so a shared fact changed in the parent reaches every child, and a new GPU generation is a
few lines over an existing preset."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from stratacl.config import to_object, validate_run
from stratacl.run.precheck import options
from tests.helpers import CONF, compose_run

# child -> (parent, the dotted fields the child's own file sets to other values)
DERIVED = {
    "hgx_h200": ("hgx_h100", {"name", "description", "die.hbm_GB", "die.hbm_GBps"}),
    "hgx_h800": ("hgx_h100", {"name", "description", "tiers.node.beta_GBps", "port_GBps.nvlink", "nvls",
                              "die.vector_core_move_GBps", "die.sdma.engine_GBps"}),
}
# fabrics whose die is the conf/gpu/b200.yaml piece -> the die fields they set to other values
B200_DIES = {"dgx_b200": set(), "gb200_nvl72": {"hbm_GB", "cube_TFLOPs", "cube_TFLOPs_by_format.fp8",
                                                "cube_TFLOPs_by_format.int8", "cube_TFLOPs_by_format.fp4",
                                                "vector_TFLOPs"}}


def _raw(overrides: list[str], extra_dir: Path | None = None) -> dict:
    if extra_dir is not None:
        overrides = [*overrides, f"hydra.searchpath=[file://{extra_dir}]"]
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return OmegaConf.to_container(compose("config", overrides=overrides).fabric)


def _flat(tree: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}.{key}" if prefix else key).items()}


def _differing(a: dict, b: dict) -> set[str]:
    fa, fb = _flat(a), _flat(b)
    return {k for k in fa.keys() | fb.keys() if fa.get(k, "<absent>") != fb.get(k, "<absent>")}


def test_derived_fabrics_differ_from_their_parent_only_where_they_say() -> None:
    for child, (parent, fields) in DERIVED.items():
        assert _differing(_raw([f"fabric={child}"]), _raw([f"fabric={parent}"])) == fields, child


def test_b200_fabrics_share_the_b200_die_piece() -> None:
    piece = OmegaConf.to_container(OmegaConf.load(Path(CONF) / "gpu" / "b200.yaml"))
    base = _raw(["fabric=dgx_b200"])["die"]
    for name, fields in B200_DIES.items():
        die = _raw([f"fabric={name}"])["die"]
        assert _differing(die, base) == fields, name
        # every value the piece sets reaches the fabric's die unless the fabric overrides it
        assert {k for k, v in _flat(piece).items() if _flat(die)[k] != v} == fields, name


def test_fabric_choices_are_the_presets_only() -> None:
    assert options("fabric") == ["cloudmatrix384", "dgx_b200", "gb200_nvl72", "hgx_h100", "hgx_h200", "hgx_h800"]


NEW_GPU = """\
# A new GPU generation: the HGX H100 system with more and faster HBM (illustrative numbers).
defaults:
  - hgx_h100@_here_
  - _self_

name: hgx_next
description: HGX H100 system with 192 GB HBM at 6 TB/s
die:
  hbm_GB: 192.0           # ASSUMPTION: illustrative. Knob
  hbm_GBps: 6000.0        # ASSUMPTION: illustrative. Knob
"""


def test_a_new_gpu_generation_is_a_few_lines_over_a_preset(tmp_path: Path) -> None:
    (tmp_path / "fabric").mkdir()
    (tmp_path / "fabric" / "hgx_next.yaml").write_text(NEW_GPU)
    overrides = ["fabric=hgx_next", "baseline=nccl", "library=[nccl,stratacl_gpu]"]
    new = _raw(overrides, tmp_path)
    assert _differing(new, _raw(["fabric=hgx_h100"])) == {"name", "description", "die.hbm_GB", "die.hbm_GBps"}
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = to_object(compose("config", overrides=[*overrides, f"hydra.searchpath=[file://{tmp_path}]"]))
    validate_run(cfg)  # the composed preset is a whole, valid fabric
    assert (cfg.fabric.die.hbm_GB, cfg.fabric.die.hbm_GBps) == (192.0, 6000.0)
    assert cfg.fabric.die.kernel == compose_run(["fabric=hgx_h100"]).fabric.die.kernel  # inherited
