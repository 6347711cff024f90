"""DeepSeek-V3's published training layout (PP16 DualPipeV, EP64, ZeRO-1, 2,048 H800-like GPUs):
its memory mechanisms make it fit 80 GB without full recomputation, as the report says it did; the
experiment's library subset selects only those libraries."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import compose_run

from stratacl.comm.library import LibraryModel
from stratacl.machine.fabric import Fabric
from workloads.common.model import model_costs
from workloads.llm_train.saved_deepseek import per_routed_row_bytes, per_token_bytes
from workloads.llm_train.workload import fit_memory, prepare

EXP = "+experiment=llm_train_deepseek_v3"
CONF = Path(__file__).resolve().parents[1] / "conf" / "library"


def test_a_library_subset_selects_only_those() -> None:
    cfg = compose_run([EXP, "library=[hccl,stratacl]"])
    assert list(cfg.library) == ["hccl", "stratacl"]
    assert cfg.library["hccl"].plane == "nvlink"  # the experiment's setting still applies to the selected
    assert cfg.library["hccl"].description  # the preset, not schema defaults
    assert list(compose_run([EXP]).library) == ["deepep", "nccl", "hccl", "hccl_jit", "stratacl_no_partition",
                                                "stratacl_no_sdma", "stratacl"]


def test_every_library_preset_has_a_description() -> None:
    # config.selected_libraries tells a preset from an experiment's stray settings by it
    for path in CONF.glob("*.yaml"):
        assert "\ndescription:" in "\n" + path.read_text(), path.name


def test_deepseek_v3_per_token_bytes_follow_the_report() -> None:
    cfg = model_costs(compose_run([EXP]).workload.model).cfg
    per = per_token_bytes(cfg, 2)
    # H 7168, latents 1536 + 512 + 64, 128 heads × v 128: residual bf16, latents bf16, E5M6 output, lse
    assert per["attention"] == 7168 * 2 + (1536 + 512 + 64) * 2 + 128 * 128 * 1.5 + 128 * 4
    # per routed row: FP8 input (7168) and FP8 SwiGLU inputs (2 × 2048), one fp32 scale per 128
    assert per_routed_row_bytes(cfg) == 7168 * (1 + 4 / 128) + 4096 * (1 + 4 / 128)


@pytest.mark.parametrize("saved, fits", [("deepseek_v3", True), ("autograd", False)])
def test_the_published_layout_fits_without_recompute_only_with_deepseeks_mechanisms(saved: str, fits: bool) -> None:
    cfg = compose_run([EXP, "library=[deepep,hccl]", f"workload.saved_activations={saved}"])
    fabric = Fabric(cfg.fabric)
    prep = prepare(cfg.workload, fabric)
    for name, lib_cfg in cfg.library.items():
        knobs, mem, change = fit_memory(prep, LibraryModel(name, lib_cfg, fabric), fabric.hbm_bytes)
        assert (change == "") == fits, (name, mem)
        assert mem["reserved"] + mem["library"] + mem["overhead"] <= fabric.hbm_bytes
