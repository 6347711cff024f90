"""Config validation: typed choices fail at compose time, every numeric knob has a declared range
that validate_run enforces (NaN/inf/out of range name the full field path), schema defaults equal
the YAML defaults, NVLink is a plane of its own, and ConfigError survives simpy's re-raise."""

from __future__ import annotations

import copy
import json
import math
import pickle
import subprocess
import sys
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pandas as pd
import pytest
import simpy
from helpers import CONF, ROOT, compose_run
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf.errors import OmegaConfBaseException

from stratacl import config as C
from stratacl.config import Plane, RunConfig, validate_fabric, validate_run
from stratacl.errors import ConfigError
from stratacl.machine.fabric import RESOURCES, Fabric
from stratacl.run.precheck import one_line
from stratacl.workload_config import BOUND, Bound, WorkloadConfig, check_ranges

WORKLOADS = sorted(p.stem for p in (ROOT / "conf" / "workload").glob("*.yaml"))
GPU_LIBS = ["nccl", "nccl_ubr", "nccl_roa", "stratacl_gpu"]  # the presets on the nvlink plane
NVIDIA = [f"library=[{','.join(GPU_LIBS)}]", "baseline=nccl"]
ASCEND_LIBS = sorted(p.stem for p in (ROOT / "conf" / "library").glob("*.yaml") if p.stem not in GPU_LIBS)
# what a workload cannot run without (workload=replay: the trace to replay)
REQUIRED = {"replay": [f"workload.trace={ROOT / 'tests' / 'data' / 'replay_small.parquet'}"]}
# composed defaults covering every workload, fabric and library preset
DEFAULTS = {
    **{f"workload={w}": [f"workload={w}", *REQUIRED.get(w, [])] for w in WORKLOADS},
    "fabric=dgx_b200": ["fabric=dgx_b200", *NVIDIA],
    "fabric=hgx_h800": ["fabric=hgx_h800", *NVIDIA],
    "ascend libraries": [f"library=[{','.join(ASCEND_LIBS)}]"],
}


def test_the_default_configs_pass() -> None:
    for overrides in DEFAULTS.values():
        validate_run(compose_run(overrides))


# --------------------------------------------------------------------------- the examples


@pytest.mark.parametrize("overrides, field", [
    (["library.hccl.launch_us=nan"], "library.hccl.launch_us"),  # was byte-equal to launch_us=0
    (["fabric.tiers.node.sync_us=nan"], "fabric.tiers.node.sync_us"),  # was a 24 % busbw shift
    (["fabric.tiers.supernode.alpha_us=nan"], "fabric.tiers.supernode.alpha_us"),  # was ZeroDivisionError
    (["workload=llm_infer", "workload.requests.input_sigma=-1"], "workload.requests.input_sigma"),  # numpy
    (["fabric.tiers.node.beta_GBps=inf"], "fabric.tiers.node.beta_GBps"),
    (["fabric.die.kernel.hbm_saturation_cores=25"], "fabric.die.kernel.hbm_saturation_cores"),  # > 24 AIC
    (["fabric.die.kernel.hbm_saturation_cores=0"], "fabric.die.kernel.hbm_saturation_cores"),
    (["fabric.port_GBps.ub=-inf"], "fabric.port_GBps.ub"),
    (["fabric.die.sdma.launch_us.host=nan"], "fabric.die.sdma.launch_us.host"),
    (["library.stratacl.unit_KiB.node=0"], "library.stratacl.unit_KiB.node"),
    (["library.hccl.comm_cores=0"], "library.hccl.comm_cores"),
    (["workload=moe", "workload.histogram=[1.0,-1.0]"], "workload.histogram[1]"),
    (["workload=llm_train", "workload.skew.decay_iters=0"], "workload.skew.decay_iters"),
    (["workload=dlrm_train", "workload.rows_per_feature=[10,0]"], "workload.rows_per_feature[1]"),
    (["workload=llm_infer", "workload.scheduler.mtp_acceptance=1.01"], "workload.scheduler.mtp_acceptance"),
    (["output.timeline_max_ranks=0"], "output.timeline_max_ranks"),
    (["seed=-1"], "seed"),
    # no declared bound (free-form transformers overrides): still finite
    (["workload=llm_infer", "+workload.model.overrides.rope_theta=nan"], "workload.model.overrides.rope_theta"),
])
def test_out_of_range_numbers_name_their_field(overrides: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_run(compose_run(overrides))
    assert err.value.field == field
    assert f"'{field}'" in str(err.value)


@pytest.mark.parametrize("override, key", [
    ("workload.requests.arrival=weibull", "workload.requests.arrival"),
    ("workload.requests.input_dist=pareto", "workload.requests.input_dist"),
    ("workload.skew=histogram", "workload.skew"),  # llm_infer has no per-expert histogram
    ("fabric.tiers.node.plane=infiniband", "fabric.tiers.node.plane"),
    ("+fabric.port_GBps.nvlinkk=900", "fabric.port_GBps.nvlinkk"),
    ("library.hccl.plane=nvlnk", "library.hccl.plane"),
    ("fabric.fidelity=packet", "fabric.fidelity"),
    ("fabric.switch.routing=ecmp", "fabric.switch.routing"),
    ("+library.hccl.hccl_algo.allreduce=tree", "library.hccl.hccl_algo.allreduce"),
    ("library.hccl.auto_candidates=[ring,tree]", "library.hccl.auto_candidates"),
])
def test_unknown_choices_fail_at_compose_time(override: str, key: str) -> None:
    with initialize_config_dir(config_dir=CONF, version_base=None), pytest.raises(
            (HydraException, OmegaConfBaseException)) as err:
        compose("config", overrides=["workload=llm_infer", override])
    assert key in str(err.value) or key in str(err.value.__cause__)


@pytest.mark.parametrize("workload, override", [
    ("dlrm_train", "workload.sharding=diagonal"),
    ("moe", "workload.modes=[ht,xl]"),
    ("moe", "workload.skew=pareto"),
])
def test_unknown_workload_choices_fail_at_compose_time(workload: str, override: str) -> None:
    with initialize_config_dir(config_dir=CONF, version_base=None), pytest.raises(
            (HydraException, OmegaConfBaseException)):
        compose("config", overrides=[f"workload={workload}", override])


def test_unknown_choice_fails_before_model_costs_load(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "stratacl.run", "workload=llm_infer",
                           "workload.requests.arrival=weibull", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "workload.requests.arrival" in proc.stderr
    assert "poisson, gamma, csv" in proc.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize("old, new", [
    ("library.hccl.comm_buffer_MB=400", "library.<name>.comm_buffer_MiB"),
    ("library.hccl.graph_launch_us=0", "fabric.die.graph_launch_us"),
])
def test_a_moved_knob_names_its_new_place(old: str, new: str) -> None:
    with initialize_config_dir(config_dir=CONF, version_base=None), pytest.raises(
            (HydraException, OmegaConfBaseException)) as err:
        compose("config", overrides=[old])
    line = one_line(err.value)
    assert old.split("=")[0] in line and f"use {new}" in line


@pytest.mark.parametrize("workload", ["llm_train", "interference"])
def test_a_flat_model_name_points_to_the_model_reference(workload: str) -> None:
    """llm_train and interference name their model as llm_infer does (workload.model.preset)."""
    with initialize_config_dir(config_dir=CONF, version_base=None), pytest.raises(
            (HydraException, OmegaConfBaseException)) as err:
        compose("config", overrides=[f"workload={workload}", "workload.model=deepseek_v3"])
    line = one_line(err.value)
    assert "config field 'workload.model'" in line and "workload.model.preset=<name>" in line
    assert "deepseek_v3" in line.split("fix:")[1]


def test_cross_field_checks_remain() -> None:
    cases = [
        (["library.hccl.comm_cores=49"], "library.hccl.comm_cores"),  # 48 vector cores per die
        (["library.hccl.comm_buffer_MiB=0"], "library.hccl.comm_buffer_MiB"),  # staged needs a buffer
        (["fabric.tiers.node.beta_GBps=197"], "fabric.tiers.node.beta_GBps"),  # above the 196 GB/s port
        (["fabric.tiers.node.store_GBps=197"], "fabric.tiers.node.store_GBps"),  # stores above the port too
        (["fabric.tiers.node.store_GBps=-1"], "fabric.tiers.node.store_GBps"),
        (["library.stratacl.core_access=put"], "library.stratacl.core_access"),  # stratacl moves with SDMA
        (["fabric.die.sdma.engine_GBps=0"], "fabric.die.sdma.engine_GBps"),  # 4 engines at 0 GB/s
        (["library.hccl.auto_candidates=[ring,pairwise]"], "library.hccl.auto_candidates"),
    ]
    for overrides, field in cases:
        with pytest.raises(ConfigError) as err:
            validate_run(compose_run(overrides))
        assert err.value.field == field, overrides


# --------------------------------------------------------------------------- planes


def test_ports_exist_for_every_plane() -> None:
    for plane in Plane:
        assert f"{plane}_tx" in RESOURCES and f"{plane}_rx" in RESOURCES


def test_a_plane_without_port_rate_fails_clearly() -> None:
    with pytest.raises(ConfigError) as err:
        validate_run(compose_run(["fabric.tiers.node.plane=nvlink"]))
    assert err.value.field == "fabric.tiers.node.plane" and "fabric.port_GBps.nvlink" in str(err.value)


def test_library_plane_must_be_one_the_fabric_routes_on() -> None:
    with pytest.raises(ConfigError) as err:  # hccl names UB; DGX B200 has NVLink
        validate_run(compose_run(["fabric=dgx_b200"]))
    assert err.value.field == "library.hccl.plane" and "nvlink" in str(err.value)
    with pytest.raises(ConfigError) as err:  # SIO carries die-to-die traffic only
        validate_run(compose_run(["library.hccl.plane=sio"]))
    assert err.value.field == "library.hccl.plane"
    validate_run(compose_run(["fabric=dgx_b200", "library.hccl.plane=nvlink", "library.stratacl.plane=nvlink",
                              "library.hccl.expansion_mode=aiv"]))  # GPUs: no AI CPU to expand on


def test_nvidia_fabrics_name_nvlink() -> None:
    for name in ("dgx_b200", "hgx_h800"):
        fab = compose_run([f"fabric={name}", *NVIDIA]).fabric
        assert fab.tiers["node"].plane == Plane.nvlink and Plane.ub not in fab.port_GBps


def _run(tmp: Path, overrides: list[str]) -> tuple[dict, pd.DataFrame]:
    proc = subprocess.run([sys.executable, "-m", "stratacl.run", f"hydra.run.dir={tmp}", "output.timeline=false",
                           "output.utilisation=true", "workload.max_bytes=4194304", *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp / "summary.json").read_text()), pd.read_parquet(tmp / "utilisation.parquet")


def test_a_tier_on_nvlink_loads_the_nvlink_ports(tmp_path: Path) -> None:
    """Naming the node tier's plane nvlink (same port rate) moves its bytes to the nvlink ports and
    leaves the timing of a one-node collective unchanged."""
    one_node = ["workload.ranks=16", "workload.collectives=[allgather]"]
    ub, ub_util = _run(tmp_path / "ub", one_node)
    nv, nv_util = _run(tmp_path / "nv", [*one_node, "+fabric.port_GBps.nvlink=196", "fabric.tiers.node.plane=nvlink"])
    assert nv["libraries"] == ub["libraries"]

    def busy(util: pd.DataFrame, res: str) -> float:
        return float(util.loc[util["resource"] == res, "utilisation"].max()) if (util["resource"] == res).any() else 0.0

    assert busy(ub_util, "ub_tx") > 0.1 and busy(ub_util, "nvlink_tx") == 0
    assert busy(nv_util, "nvlink_tx") == pytest.approx(busy(ub_util, "ub_tx")) and busy(nv_util, "ub_tx") == 0


# --------------------------------------------------------------------------- ConfigError


def _experiment_library_knobs() -> dict[str, dict[str, dict]]:
    """Experiments whose body sets knobs of libraries (`library: {name: {...}}`), with those knobs."""
    import yaml

    bodies = {p.stem: yaml.safe_load(p.read_text()) or {} for p in sorted((ROOT / "conf" / "experiment").glob("*.yaml"))}
    return {name: b["library"] for name, b in bodies.items() if isinstance(b.get("library"), dict)}


@pytest.mark.parametrize("experiment, knobs", sorted(_experiment_library_knobs().items()))
def test_an_experiments_library_knobs_create_no_library(experiment: str, knobs: dict[str, dict]) -> None:
    """config.selected_libraries: the knobs an experiment sets apply to the libraries its defaults
    list selects (a knob naming another would be dropped silently: none does) and never set the
    `description` marker; when the user picks one of them, the others' knobs compose no library."""
    names = list(knobs)
    assert not any("description" in k for k in knobs.values()), experiment
    selected = list(compose_run([f"+experiment={experiment}"]).library)
    assert set(names) <= set(selected), f"{experiment} sets knobs of unselected {set(names) - set(selected)}"
    for name in names:
        cfg = compose_run([f"+experiment={experiment}", f"library=[{name}]", f"baseline={name}"])
        assert list(cfg.library) == [name], (experiment, name)
    assert list(compose_run(["+library@library.nccl=nccl"]).library) == ["hccl", "stratacl", "nccl"]


def test_some_experiment_sets_library_knobs() -> None:
    assert {"core_spread", "llm_train_deepseek_v3"} <= set(_experiment_library_knobs())  # the test above runs


def test_config_error_survives_recreation_and_pickling() -> None:
    e = ConfigError("library.hccl.launch_us", "must be ≥ 0", "use 5.0")
    for again in (type(e)(*e.args), pickle.loads(pickle.dumps(e))):
        assert isinstance(again, ConfigError)
        assert (again.field, str(again)) == (e.field, str(e))


def test_config_error_raised_in_a_simpy_process_reaches_the_caller() -> None:
    env = simpy.Environment()

    def proc(env: simpy.Environment):  # noqa: ANN202
        yield env.timeout(1)
        raise ConfigError("workload.x", "bad", "fix it")

    env.process(proc(env))
    with pytest.raises(ConfigError) as err:
        env.run()
    assert err.value.field == "workload.x" and "fix it" in str(err.value)


# --------------------------------------------------------------------------- schema defaults = YAML


def _leaves(obj: Any, path: str = "") -> dict[str, Any]:
    if is_dataclass(obj):
        out: dict[str, Any] = {}
        for f in fields(obj):
            out.update(_leaves(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name))
        return out
    return {path: obj}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_schema_defaults_equal_yaml_defaults(workload: str) -> None:
    """Drift between a schema's defaults and conf/workload/<name>.yaml makes a direct constructor
    call (tests, helpers) model something else than the CLI."""
    composed = compose_run([f"workload={workload}"]).workload
    yaml, schema = _leaves(composed), _leaves(type(composed)())
    assert yaml.keys() == schema.keys()
    diff = {k: (schema[k], yaml[k]) for k in yaml if yaml[k] != schema[k] or type(yaml[k]) is not type(schema[k])}
    assert not diff, f"schema default vs YAML: {diff}"


# --------------------------------------------------------------------------- every numeric knob


def _all_schemas() -> list[type]:
    seen: list[type] = []

    def visit(cls: type) -> None:
        if cls in seen:
            return
        seen.append(cls)
        for t in get_type_hints(cls).values():
            for sub in (t, *get_args(t)):
                if isinstance(sub, type) and is_dataclass(sub):
                    visit(sub)

    for root in (RunConfig, C.FabricConfig, C.LibraryConfig, *_subclasses(WorkloadConfig)):
        visit(root)
    return seen


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def _numeric(t: Any) -> bool:
    args = get_args(t) if get_origin(t) in (list, dict) else ()
    return t in (int, float) or (bool(args) and args[-1] in (int, float))


def test_every_numeric_schema_field_declares_a_bound() -> None:
    schemas = _all_schemas()
    assert {"LlmInferConfig", "DlrmTrainConfig", "MoeConfig", "TierConfig", "SdmaConfig"} <= {c.__name__ for c in schemas}
    missing = [f"{cls.__name__}.{f.name}" for cls in schemas for f in fields(cls)
               if _numeric(get_type_hints(cls)[f.name])
               and (BOUND not in f.metadata or f.metadata[BOUND] == Bound())]
    assert not missing, f"numeric fields without a declared range (use knob(..., ge=/gt=/le=)): {missing}"


@dataclass(frozen=True)
class Leaf:
    config: str  # key of DEFAULTS
    path: str  # dotted path in the run config
    steps: tuple  # attribute names / dict keys / list indices from the root
    bound: Bound
    integer: bool

    def set(self, cfg: RunConfig, value: float) -> RunConfig:
        cfg = copy.deepcopy(cfg)
        node: Any = cfg
        for step in self.steps[:-1]:
            node = getattr(node, step) if isinstance(step, str) and is_dataclass(node) else node[step]
        last = self.steps[-1]
        if is_dataclass(node):
            setattr(node, last, value)
        else:
            node[last] = value
        return cfg

    def outside(self) -> list[float]:
        """Values just outside the declared range, plus NaN and ±inf."""
        b, out = self.bound, [math.nan, math.inf, -math.inf]
        step_down = (lambda v: v - 1) if self.integer else (lambda v: math.nextafter(v, -math.inf))
        step_up = (lambda v: v + 1) if self.integer else (lambda v: math.nextafter(v, math.inf))
        out += [step_down(b.ge)] if b.ge is not None else []
        out += [b.gt] if b.gt is not None else []
        out += [step_up(b.le)] if b.le is not None else []
        out += [b.lt] if b.lt is not None else []
        return out

    def admits(self, v: float) -> bool:
        b = self.bound
        return (math.isfinite(v) and (not self.integer or float(v).is_integer())
                and (b.ge is None or v >= b.ge) and (b.gt is None or v > b.gt)
                and (b.le is None or v <= b.le) and (b.lt is None or v < b.lt))


def _enumerate(config: str, obj: Any, path: str, steps: tuple) -> list[Leaf]:
    out: list[Leaf] = []
    hints = get_type_hints(type(obj))
    for f in fields(obj):
        value, p, s = getattr(obj, f.name), f"{path}.{f.name}" if path else f.name, (*steps, f.name)
        t = hints[f.name]
        if is_dataclass(value):
            out += _enumerate(config, value, p, s)
        elif isinstance(value, dict) and all(is_dataclass(v) for v in value.values()) and value:
            for k, v in value.items():
                out += _enumerate(config, v, f"{p}.{k}", (*s, k))
        elif _numeric(t):
            integer = int in (t, *get_args(t))
            bound = f.metadata.get(BOUND, Bound())  # a missing bound fails the test above
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) \
                else [(None, value)]
            for k, _ in items:
                leaf_path = p if k is None else f"{p}[{k}]" if isinstance(value, list) else f"{p}.{k}"
                out.append(Leaf(config, leaf_path, s if k is None else (*s, k), bound, integer))
    return out


LEAVES = [leaf for name, ov in DEFAULTS.items() for leaf in _enumerate(name, compose_run(ov), "", ())]


def test_every_leaf_is_enumerated() -> None:
    paths = {leaf.path for leaf in LEAVES}
    assert {"fabric.tiers.supernode.alpha_us", "library.hccl.launch_us", "fabric.port_GBps.rdma",
            "workload.requests.input_sigma", "workload.rows_per_feature[25]", "library.nccl_ubr.stage_anyway.allreduce",
            "seed", "output.timeline_max_ranks", "workload.skew.decay_iters"} <= paths
    assert len(LEAVES) > 400


def test_nan_inf_and_values_just_outside_the_bound_are_rejected() -> None:
    """Exhaustive over every numeric leaf of every composed default config."""
    for leaf in LEAVES:
        cfg = compose_run(DEFAULTS[leaf.config])
        for bad in leaf.outside():
            with pytest.raises(ConfigError) as err:
                validate_run(leaf.set(cfg, bad))
            assert err.value.field == leaf.path, (leaf, bad)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_number_passes_the_range_check_iff_it_is_within_its_declared_bound(data: st.DataObject) -> None:
    leaf = data.draw(st.sampled_from(LEAVES))
    value = data.draw(st.integers(-10**6, 10**6) if leaf.integer and data.draw(st.booleans())
                      else st.floats(allow_nan=True, allow_infinity=True))
    cfg = leaf.set(compose_run(DEFAULTS[leaf.config]), value)
    if leaf.admits(value):  # the range check passes (cross-field checks may still object)
        check_ranges(cfg)
    else:
        with pytest.raises(ConfigError) as err:
            validate_run(cfg)
        assert err.value.field == leaf.path


def test_fabric_ranges_are_checked_without_validate_run() -> None:
    """Fabric() is built directly by tools and tests: it applies the same ranges."""
    fab = compose_run().fabric
    fab.tiers["supernode"].alpha_us = math.nan
    with pytest.raises(ConfigError) as err:
        Fabric(fab)
    assert err.value.field == "fabric.tiers.supernode.alpha_us"
    with pytest.raises(ConfigError):
        validate_fabric(fab)


def test_balanced_partitioning_needs_units_only_when_vector_cores_move() -> None:
    """The mover checked is the one the expansion mode resolves to: ai_cpu moves with SDMA (no
    transfer units to balance), aiv on the vector cores (units required)."""
    base = ["library=[hccl]", "library.hccl.partitioning=balanced", "library.hccl.unit_KiB={}"]
    validate_run(compose_run([*base, "library.hccl.expansion_mode=ai_cpu"]))
    with pytest.raises(ConfigError, match=r"library\.hccl\.unit_KiB"):
        validate_run(compose_run([*base, "library.hccl.expansion_mode=aiv"]))
