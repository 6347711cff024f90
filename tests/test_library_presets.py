"""Library presets inherit (conf/library): a variant names its parent in Hydra defaults
(`<parent>@_here_`) and states only what differs. Composition must give every preset exactly the
config it had as a full copy (tests/data/library_presets_composed.json, snapshotted before the
presets were cut down), except the values fixed on purpose (DELIBERATE)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import CONF, ROOT
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

FIXTURE = ROOT / "tests" / "data" / "library_presets_composed.json"
PRESETS = sorted(p.stem for p in (Path(CONF) / "library").glob("*.yaml"))

# Values that changed on purpose since the snapshot, per preset ("*" = every preset):
# key -> (value then, value now); a value of None is a key absent on that side.
DELIBERATE: dict[str, dict[str, tuple[object, object]]] = {
    "*": {
        # issue 20 item 4: the graph launch is a fact of the die (fabric.die.graph_launch_us)
        "graph_launch_us": ("any", None),
        # issue 20 item 5: the knob says its unit (it always was MiB, as HCCL_BUFFSIZE)
        "comm_buffer_MB": ("any", None),
        "comm_buffer_MiB": (None, "= comm_buffer_MB"),
        # issue 22: NCCL_ALGO / NCCL_PROTO restrictions of algorithm=nccl (empty = NCCL's defaults)
        "nccl_algos": (None, []),
        "nccl_protos": (None, []),
        # issue 22: how an HT MoE dispatch/combine crosses nodes (stratacl/comm/ep.py)
        "moe_ht_path": (None, "flat"),
        # issue 32: collectives an SDMA library leaves to the vector cores (empty = none)
        "vector_core_colls": (None, []),
        # where an LL dispatch/combine lands a peer's tokens (per-expert slots unless all-to-all-v)
        "moe_ll_windows": (None, "per_expert"),
        # a plugin mechanism's own knobs by mechanism name (stratacl/comm/mechanism.py)
        "options": (None, {}),
    },
    # issue 32: the GPU StrataCL design moves routed exchanges on the SMs (added with the preset)
    "stratacl_gpu": {"vector_core_colls": (None, ["alltoallv", "dispatch", "combine"])},
    # NCCL_BUFFSIZE is 4 MiB (NCCL src/init.cc DEFAULT_BUFFSIZE 1 << 22), written 4.194 "MB" before;
    # issue 22: NCCL's own algorithm choice instead of one flat ring
    "nccl": {"comm_buffer_MiB": (None, 4.0), "algorithm": ("ring", "nccl"), "moe_ll_windows": (None, "per_peer")},
    "nccl_ubr": {"algorithm": ("ring", "nccl"), "moe_ll_windows": (None, "per_peer")},
    # issue 22: DeepEP's normal kernels forward across nodes (csrc/kernels/legacy/internode.cu)
    "deepep": {"moe_ht_path": (None, "node_forward")},
    "cann_ep_hierarchy": {"moe_ht_path": (None, "node_forward")},  # added with issue 22
    # inherited from the parent, unused by the variant's mechanisms:
    # JIT cache matching without JIT registration
    "nccl_roa": {"jit_cache_match": ("exact", "cover"), "algorithm": ("ring", "nccl"), "moe_ll_windows": (None, "per_peer")},
    # HCCL lowers dispatch/combine onto HcclAlltoAllV: one packed receive region per peer
    **{h: {"moe_ll_windows": (None, "per_peer")} for h in ("hccl", "hccl_jit", "hccl_roa", "hccl_zerocopy")},
    # transfer units / policy generator of balanced partitioning under uniform partitioning
    "stratacl_no_partition": {"refine_units_below": (0.0, 8.0),
                              "unit_KiB": ({}, {"die": 256.0, "node": 256.0, "supernode": 512.0,
                                                "scaleout": 1024.0})},
}


def _composed(overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose("config", overrides=overrides)
    return OmegaConf.to_container(cfg.library, resolve=True, enum_to_str=True)


def _expected_now(name: str, then: dict) -> dict:
    want = dict(then)
    for key, (_, now) in {**DELIBERATE["*"], **DELIBERATE.get(name, {})}.items():
        if now is None:
            want.pop(key, None)
        elif now == "= comm_buffer_MB":
            want[key] = then["comm_buffer_MB"]
        else:
            want[key] = now
    return want


def test_every_preset_composes_as_before_but_for_the_listed_fixes() -> None:
    fixture = json.loads(FIXTURE.read_text())
    assert sorted(fixture) == PRESETS  # a new preset gets a fixture entry, a removed one loses it
    for name in PRESETS:
        for key, (then, _) in DELIBERATE.get(name, {}).items():
            assert then is None or fixture[name][key] == then, (name, key)  # the exception is real
        assert _composed([f"library=[{name}]", f"baseline={name}"])[name] == _expected_now(name, fixture[name]), name


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
