"""The GPU preset of StrataCL's design (conf/library/stratacl_gpu.yaml) on the NVIDIA fabrics, and a
library on a plane its fabric lacks: one config error naming the presets made for that fabric."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT, compose_run, make_library, run_cli

from stratacl.comm.library import LibraryModel
from stratacl.config import RegistrationMechanism, validate_run
from stratacl.machine.fabric import Fabric, R
from stratacl.machine.phases import Phase

GPU_FABRICS = ["hgx_h100", "hgx_h200", "hgx_h800", "dgx_b200", "gb200_nvl72"]
MiB = 1 << 20


@pytest.mark.parametrize("fabric", GPU_FABRICS)
def test_the_preset_validates_on_every_gpu_fabric(fabric: str) -> None:
    cfg = compose_run([f"fabric={fabric}", "library=[nccl,stratacl_gpu]", "baseline=nccl"])
    validate_run(cfg)
    assert cfg.library["stratacl_gpu"].plane == "nvlink"


def _lib(fabric: str = "hgx_h100", **fabric_knobs: object) -> LibraryModel:
    cfg = compose_run([f"fabric={fabric}"]).fabric
    for key, value in fabric_knobs.items():
        setattr(cfg.die.sdma, key, value)
    return make_library(Fabric(cfg), "stratacl_gpu")


def _wire(phases: list[Phase]) -> Phase:
    (wire,) = [p for p in phases if p.category == "wire"]
    return wire


def _res(p: Phase, kind: str) -> float:
    return sum(s for _, r, s in (*p.loads, *p.holds) if r == R[kind])


NODE = tuple(range(8))  # one HGX node: one NVLink domain


def test_a_gather_moves_on_the_copy_engines_in_one_step_without_staging() -> None:
    lib = _lib()
    phases = lib.collective_phases("allgather", 16 * MiB, NODE)
    wire = _wire(phases)
    assert _res(wire, "sdma") > 0 and _res(wire, "vec") == 0  # copy engines, no SM held
    assert lib.chosen_algorithm("allgather", 16 * MiB, NODE) == "fullmesh"
    assert lib.wire_plan("allgather", 16 * MiB, NODE).steps == 1
    assert not [p for p in phases if p.category == "copy"]  # registered user buffers: no staging
    assert lib.user_buffer_registration == RegistrationMechanism.on_alloc
    # the engines' host launch (fabric.die.sdma.launch_us.host) precedes the transfer
    parts = [part for p in phases for part in p.parts]
    launch = sum(s for c, s in parts if c == "launch")
    assert launch == pytest.approx((lib.cfg.launch_us + 10.0) * 1e-6)
    tier = lib.fabric.tier(1, "nvlink")  # one synchronised step at the NVLink tier
    assert sum(s for c, s in parts if c == "sync") == pytest.approx(tier.alpha_s + tier.sync_s)


@pytest.mark.parametrize("coll", ["allreduce", "reducescatter"])
def test_a_reduction_runs_on_the_sms_because_copy_engines_cannot_reduce(coll: str) -> None:
    wire = _wire(_lib().collective_phases(coll, 16 * MiB, NODE))
    assert _res(wire, "vec") > 0 and _res(wire, "sdma") == 0
    # the fabric fact decides it: engines that reduce would take the same op
    wire = _wire(_lib(reduces=True).collective_phases(coll, 16 * MiB, NODE))
    assert _res(wire, "sdma") > 0 and _res(wire, "vec") == 0


def test_routed_exchanges_run_on_the_sms_with_no_host_in_the_loop() -> None:
    lib = _lib()
    peer = tuple(float(MiB) for _ in range(len(NODE) ** 2))
    phases = lib.collective_phases("alltoallv", 8 * MiB, NODE, peer)
    assert _res(_wire(phases), "vec") > 0 and _res(_wire(phases), "sdma") == 0
    assert not [p for p in phases if p.category == "host"] and not lib.needs_host("dispatch", "ht")
    nccl = make_library(lib.fabric, "nccl")
    assert nccl.needs_host("alltoallv")  # the baseline's host round trip is real


def test_balanced_partitioning_spreads_the_sms_of_a_reduction() -> None:
    """Balanced partitioning of the reduction SMs keeps the cores' completion spread below uniform's."""
    lib = _lib("hgx_h100")
    group = tuple(range(16))  # two nodes: NVLink and NIC peers, different unit costs
    balanced = lib.op_info("reducescatter", 64 * MiB, group).core_spread
    uniform = make_library(lib.fabric, "stratacl_gpu", partitioning="uniform").op_info(
        "reducescatter", 64 * MiB, group).core_spread
    assert balanced < uniform


def _one_line_error(tmp_path: Path, args: list[str]) -> str:
    out = tmp_path / "run"
    proc = run_cli([*args, f"hydra.run.dir={out}"], cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: config field"), proc.stderr
    assert not out.exists()  # nothing written
    return lines[0]


def test_an_ascend_preset_on_a_gpu_fabric_names_the_gpu_presets(tmp_path: Path) -> None:
    line = _one_line_error(tmp_path, ["fabric=hgx_h100", "library=[nccl,stratacl]", "baseline=nccl"])
    assert "'library.stratacl.plane'" in line and "hgx_h100" in line
    for name in ("nccl", "nccl_ubr", "nccl_roa", "stratacl_gpu"):
        assert name in line.split("fix:")[1]
    assert "hccl" not in line and "plane=nvlink" not in line and "set library.stratacl.plane" not in line


def test_a_gpu_preset_on_cloudmatrix_names_the_ascend_presets(tmp_path: Path) -> None:
    line = _one_line_error(tmp_path, ["library=[hccl,stratacl_gpu]"])
    fix = line.split("fix:")[1]
    assert "'library.stratacl_gpu.plane'" in line and "hccl" in fix and " stratacl," in fix
    assert "nccl" not in fix and "stratacl_gpu" not in fix


def test_a_preset_moved_onto_a_foreign_plane_is_named_in_a_note() -> None:
    """The Ascend preset with its plane overridden onto NVLink runs, but the run says what it is and
    names the presets made for that plane; a preset on its own fabric gets no such note."""
    from stratacl.config import moved_preset_notes

    moved = compose_run(["fabric=hgx_h100", "library=[nccl,stratacl]", "baseline=nccl",
                         "library.stratacl.plane=nvlink"])
    (note,) = moved_preset_notes(moved.library, moved.fabric)
    assert "'stratacl' is a preset for 'ub' fabrics" in note and "stratacl_gpu" in note
    own = compose_run(["fabric=hgx_h100", "library=[nccl,stratacl_gpu]", "baseline=nccl"])
    assert moved_preset_notes(own.library, own.fabric) == []
    ascend = compose_run([])
    assert moved_preset_notes(ascend.library, ascend.fabric) == []
