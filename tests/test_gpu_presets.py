"""The NVIDIA GPU presets (conf/fabric/hgx_h100, hgx_h200, dgx_b200, gb200_nvl72): every workload
composes and validates on each by name with the NCCL libraries; a small run of every workload on
each (slow); the NCCL facts the presets state (NVLS, the tuning tables' generation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import compose_run
from test_cli_fuzz import COMMON, SLOW_BASES
from test_llm_infer import TINY

from stratacl.config import Plane, validate_run
from stratacl.machine.fabric import Fabric
from stratacl.run.cli import run_overrides

GPU_FABRICS = ["hgx_h100", "hgx_h200", "dgx_b200", "gb200_nvl72"]
NVIDIA = ["library=[nccl,nccl_ubr]", "baseline=nccl"]
# small model-workload layouts that fit the smallest GPU preset (32 GPUs)
SMALL = {
    "llm_infer": ["workload=llm_infer", "workload.model.preset=deepseek_v3", f"+workload.model.overrides={TINY}",
                  "workload.layout.prefill_instances=1", "workload.layout.prefill_dp=4",
                  "workload.layout.prefill_ep=4", "workload.layout.decode_instances=1",
                  "workload.layout.decode_dp=4", "workload.layout.decode_ep=4", "workload.requests.duration_s=5",
                  "workload.warmup_s=1", "workload.capacity.saturation=false", "workload.cache_dir=",
                  "workload.scheduler.decode_stream_layout=none"],
    "llm_train": ["workload=llm_train", "workload.model.preset=deepseek_v3", f"+workload.model.overrides={TINY}",
                  "workload.num_layers=2", "workload.iterations=[0]", "workload.dies=32", "workload.fsdp=8",
                  "workload.tp=4", "workload.ep=16", "workload.global_batch=32", "workload.seq_len=1024"],
    "dlrm_train": [*SLOW_BASES["dlrm_train"], "workload.total_table_TiB=0.5"],
}


@pytest.mark.parametrize("fabric", GPU_FABRICS)
@pytest.mark.parametrize("workload", sorted(SLOW_BASES))
def test_every_workload_validates_on_each_gpu_preset(fabric: str, workload: str) -> None:
    validate_run(compose_run([f"fabric={fabric}", *NVIDIA, *SLOW_BASES[workload]]))


@pytest.mark.parametrize("fabric", GPU_FABRICS)
def test_gpu_presets_state_nvls_and_generation(fabric: str) -> None:
    fab = Fabric(compose_run([f"fabric={fabric}"]).fabric)
    assert fab.nvls and fab.gpu_arch in ("hopper", "blackwell")
    assert fab.tiers["node"].plane == Plane.nvlink
    assert fab.tiers["node"].beta_Bps <= fab.port_Bps["nvlink"]


def test_nvl72_is_one_nvlink_domain() -> None:
    fab = Fabric(compose_run(["fabric=gb200_nvl72"]).fabric)
    assert fab.dies_per_supernode == 72 and fab.tier(2, Plane.nvlink).plane == Plane.nvlink


@pytest.mark.parametrize("fabric", GPU_FABRICS)
@pytest.mark.parametrize("workload", ["collectives", "moe"])
def test_operator_workloads_run_on_each_gpu_preset(tmp_path: Path, fabric: str, workload: str) -> None:
    out = tmp_path / "run"
    rc, err = run_overrides([f"fabric={fabric}", *NVIDIA, *SLOW_BASES[workload], *COMMON,
                             f"hydra.run.dir={out}"], out)
    assert rc == 0, err
    assert json.loads((out / "summary.json").read_text())["fabric"] == fabric


@pytest.mark.slow
@pytest.mark.parametrize("fabric", GPU_FABRICS)
@pytest.mark.parametrize("workload", ["llm_infer", "llm_train", "dlrm_train"])
def test_model_workloads_run_on_each_gpu_preset(tmp_path: Path, fabric: str, workload: str) -> None:
    out = tmp_path / "run"
    rc, err = run_overrides([f"fabric={fabric}", *NVIDIA, *SMALL[workload], *COMMON,
                             f"hydra.run.dir={out}"], out)
    assert rc == 0, err
