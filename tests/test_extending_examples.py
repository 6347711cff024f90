"""docs/extending.md's worked examples, built from the page's own snippets and checked for physics:
a new library preset, a new workload package (as an installed distribution, run through the CLI)
and a new GPU fabric. (The new-mechanism example has its own test module.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from stratacl.comm.library import LibraryModel
from stratacl.config import RunConfig, to_object
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from stratacl.paths import CONF
from stratacl.trace import Trace

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
MiB = 2**20


def snippets() -> dict[str, str]:
    """path -> text of every fenced block of the page whose leading comments say `file: <path>`."""
    out = {}
    for body in re.findall(r"```\w+\n(.*?)```", DOC.read_text(), flags=re.S):
        head = re.match(r"((?:#[^\n]*\n)+)", body)
        name = re.search(r"^# file: (\S+)$", head.group(1), flags=re.M) if head else None
        if name:
            out[name.group(1)] = body
    return out


def conf_with(tmp_path: Path, *files: str) -> Path:
    """A copy of conf/ with the page's snippets for `files` added."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    code = snippets()
    for f in files:
        (conf.parent / f).write_text(code[f])
    return conf


def composed(conf: Path, overrides: list[str]) -> RunConfig:
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        return to_object(compose("config", overrides=overrides))


def test_page_has_every_example() -> None:
    assert {"conf/library/hccl_400.yaml", "conf/fabric/hgx_h20.yaml", "ddp_buckets/__init__.py",
            "ddp_buckets/schema.py", "ddp_buckets/workload.py"} <= set(snippets())


def test_new_library_preset(tmp_path: Path) -> None:
    """HCCL_BUFFSIZE=400: twice the buffer memory; a 300 MiB all-reduce stages in one round
    instead of two (fewer synchronised algorithm steps), with the same bytes on the wire."""
    cfg = composed(conf_with(tmp_path, "conf/library/hccl_400.yaml"),
                   ["library=[hccl,hccl_400]", "baseline=hccl"])
    assert cfg.library["hccl_400"].comm_buffer_MiB == 400.0
    assert cfg.library["hccl_400"].data_path == cfg.library["hccl"].data_path  # inherited
    fab = Fabric(cfg.fabric)
    libs = {n: LibraryModel(n, lib, fab) for n, lib in cfg.library.items()}
    assert libs["hccl_400"].comm_memory_bytes() == pytest.approx(2 * libs["hccl"].comm_memory_bytes())
    tr = Trace(world_size=16)
    tr.add_family("g", [range(16)])
    tr.collective("allreduce", "g", 300 * MiB)
    res = {n: simulate(tr, lib) for n, lib in libs.items()}
    assert res["hccl_400"].wire_bytes.sum() == pytest.approx(res["hccl"].wire_bytes.sum())
    assert res["hccl_400"].split["sync"][0] < res["hccl"].split["sync"][0]
    assert res["hccl_400"].makespan_s < res["hccl"].makespan_s


def test_new_gpu_fabric(tmp_path: Path) -> None:
    """H20 on the HGX H100 system: what it does not state is H100's; a compute-bound op takes the
    peak ratio longer, a memory-bound one the HBM-bandwidth ratio shorter."""
    conf = conf_with(tmp_path, "conf/fabric/hgx_h20.yaml")
    base = ["library=[nccl]", "baseline=nccl"]
    h20, h100 = (Fabric(composed(conf, [f"fabric={f}", *base]).fabric) for f in ("hgx_h20", "hgx_h100"))
    assert h20.name == "hgx_h20" and h20.world == h100.world  # the system is inherited
    assert h20.hbm_bytes == pytest.approx(96e9)
    lib = {f: LibraryModel("nccl", composed(conf, [f"fabric={f.name}", *base]).library["nccl"], f)
           for f in (h20, h100)}

    def op_time(fab: Fabric, **work: float) -> float:
        tr = Trace(world_size=1)
        tr.compute([0], **work)
        return simulate(tr, lib[fab]).makespan_s

    big = {"flops": 1e15}
    assert op_time(h20, **big) / op_time(h100, **big) == pytest.approx(989.0 / 148.0, rel=0.02)
    mem = {"hbm_bytes": 64e9, "core": "vector"}
    assert op_time(h20, **mem) / op_time(h100, **mem) == pytest.approx(3350.0 / 4000.0, rel=0.02)


@pytest.fixture(scope="module")
def installed_workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page's package, installed as `pip install -e .` of its pyproject would: the package on
    the path and a dist-info declaring the `stratacl.workloads` entry point."""
    site = tmp_path_factory.mktemp("site")
    (site / "ddp_buckets").mkdir()
    for path, text in snippets().items():
        if path.startswith("ddp_buckets/"):
            (site / path).write_text(text)
    info = site / "ddp_buckets-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddp-buckets\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[stratacl.workloads]\nddp_buckets = ddp_buckets\n")
    return site


def test_new_workload_package_runs_from_the_cli(installed_workload: Path, tmp_path: Path) -> None:
    """`workload=ddp_buckets` with no YAML and no change to stratacl/: the step is at least the
    backward pass (compute-bound at the die's peak) and at most backward + every all-reduce back to
    back; the exposed all-reduce is what the step adds to backward."""
    out = tmp_path / "run"
    env = {"PYTHONPATH": str(installed_workload), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "stratacl.run", "workload=ddp_buckets", "library=[hccl,stratacl]",
           "workload.buckets=4", "output.progress=false", f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == "ddp_buckets"
    assert summary["verdict"]["libraries"]["stratacl"]["lead_metric"] == "step_s"

    sys.path.insert(0, str(installed_workload))
    try:
        from ddp_buckets.schema import DdpBucketsConfig
        from ddp_buckets.workload import build_trace
    finally:
        sys.path.remove(str(installed_workload))
    cfg = DdpBucketsConfig()
    tr = build_trace(cfg)
    colls = [op for op in tr.ops if op.kind == "collective"]
    assert len(colls) == cfg.buckets and sum(op.nbytes[0] for op in colls) == cfg.buckets * cfg.bucket_MiB * MiB
    run_cfg = composed(CONF, ["library=[hccl,stratacl]"])
    fab = Fabric(run_cfg.fabric)
    backward = cfg.backward_TFLOP * 1e12 / fab.cube_flops
    for name, lib in run_cfg.library.items():
        m = summary["libraries"][name]
        solo = sum(simulate(_one(op, cfg.ranks), LibraryModel(name, lib, fab)).makespan_s for op in colls)
        assert backward * 0.99 <= m["step_s"] <= backward / 0.5 + solo  # kernel efficiency ≥ 50 %
        assert 0.0 <= m["ddp_exposed_comm_s"] <= m["step_s"]


def _one(op, ranks: int) -> Trace:  # noqa: ANN001 - an Op
    tr = Trace(world_size=ranks)
    tr.add_family("dp", [range(ranks)])
    tr.collective(op.coll, "dp", op.nbytes[0])
    return tr
