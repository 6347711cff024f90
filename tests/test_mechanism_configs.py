"""Mechanisms own their config (comm/mechanism.py), sit in open registries (comm/registry.py,
comm/kinds.py), price through a narrow context (comm/context.py) and stage in one place
(DataPathModel.staging)."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
from helpers import ROOT, compose_run

from stratacl.comm.buffers import MiB
from stratacl.comm.datapath import DataPathModel, Staged, Staging, staging_bytes
from stratacl.comm.kinds import REGISTRIES, check_library
from stratacl.comm.library import LibraryModel
from stratacl.comm.mechanism import LIBRARY_FIELDS, from_library
from stratacl.comm.registry import Registry
from stratacl.config import LibraryConfig, load_plugins, resolved_mover
from stratacl.errors import ConfigError
from stratacl.machine.fabric import Fabric

# not knobs of any mechanism: the preset marker (config.selected_libraries) and the plugin knobs' home
NOT_KNOBS = {"description", "options"}


def _mechanisms() -> list[type]:
    return [r[name] for r in REGISTRIES for name in r]


def test_every_library_knob_is_read_by_a_mechanism_config_or_the_library_model() -> None:
    read = {f.name for cls in _mechanisms() for f in fields(cls.Config)}
    own = inspect.getsource(LibraryModel) + inspect.getsource(resolved_mover)
    read |= set(re.findall(r"\b(?:cfg|lib)\.(\w+)", own)) & LIBRARY_FIELDS
    assert LIBRARY_FIELDS - NOT_KNOBS - read == set()


def test_a_built_in_config_holds_exactly_the_flat_knobs_it_names() -> None:
    lib = compose_run(["library=[nccl_ubr]", "baseline=nccl_ubr"]).library["nccl_ubr"]
    for cls in _mechanisms():
        config = from_library(cls.Config, lib, str(cls.kind))
        for f in fields(config):
            assert f.name in LIBRARY_FIELDS, (cls, f.name)  # built-ins have no options of their own
            want = getattr(lib, f.name)
            assert getattr(config, f.name) == (tuple(want) if isinstance(want, list) else want)


def test_no_comm_module_but_the_library_imports_the_library_model() -> None:
    for path in sorted((ROOT / "stratacl" / "comm").glob("*.py")):
        if path.name != "library.py":
            assert "LibraryModel" not in re.sub(r'""".*?"""|#.*', "", path.read_text(), flags=re.S), path.name


@dataclass(frozen=True)
class _Own:
    launch_us: float
    depth: int = 2
    ratio: float = 0.5
    colls: tuple[str, ...] = ()


def test_options_fill_a_config_and_flat_knobs_stay_flat() -> None:
    lib = LibraryConfig(launch_us=3.0, options={"own": {"depth": 4, "ratio": 1, "colls": ["allreduce"]}})
    assert from_library(_Own, lib, "own") == _Own(launch_us=3.0, depth=4, ratio=1.0, colls=("allreduce",))
    assert from_library(_Own, LibraryConfig(), "own") == _Own(launch_us=0.0)  # the Config's defaults


@pytest.mark.parametrize(("options", "field"), [
    ({"own": {"dpeth": 4}}, "library.x.options.own.dpeth"),  # unknown key
    ({"own": {"depth": 2.5}}, "library.x.options.own.depth"),  # wrong type
    ({"own": {"depth": True}}, "library.x.options.own.depth"),  # a bool is no int
    ({"own": {"colls": [1]}}, "library.x.options.own.colls"),
    ({"own": {"launch_us": 1.0}}, "library.x.options.own.launch_us"),  # a flat knob is not an option
])
def test_a_wrong_option_names_library_options_mechanism_key(options: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_library(_Own, LibraryConfig(options=options), "own", "library.x")
    assert err.value.field == field and err.value.fix


def test_options_of_a_mechanism_the_library_does_not_select_are_refused() -> None:
    lib = compose_run(["library=[hccl]"]).library["hccl"]
    lib.options = {"pool": {}}
    with pytest.raises(ConfigError, match="selects no mechanism 'pool'") as err:
        check_library("library.hccl", lib)
    assert err.value.field == "library.hccl.options.pool"
    lib.options = {"staged": {"buffers": 3}}  # the built-in staged path has no options
    with pytest.raises(ConfigError) as err:
        check_library("library.hccl", lib)
    assert err.value.field == "library.hccl.options.staged.buffers"


def test_an_unknown_mechanism_name_lists_the_registered_ones() -> None:
    lib = compose_run(["library=[hccl]"]).library["hccl"]
    lib.algorithm = "ringg"
    with pytest.raises(ConfigError, match=r"'ring', .*'nccl'") as err:
        check_library("library.hccl", lib)
    assert err.value.field == "library.hccl.algorithm" and "plugins" in err.value.fix


def test_a_registry_refuses_a_second_class_under_a_taken_name() -> None:
    reg: Registry[type] = Registry("thing")

    @reg.register("a")
    class A:
        pass

    assert reg["a"] is A and A.kind == "a" and "a" in reg and reg.names() == ["a"]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(type("B", (), {}))


def test_a_missing_plugin_module_names_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as err:
        load_plugins(["no_such_plugin_module"])
    assert err.value.field == "plugins" and "no_such_plugin_module.py" in err.value.fix
    # a plugin that exists but imports something missing is the plugin's own error, shown as such
    (tmp_path / "broken_plugin.py").write_text("import no_such_dependency_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_module"):
        load_plugins(["broken_plugin"])


def test_each_registry_is_selected_by_its_library_field() -> None:
    assert {r.field for r in REGISTRIES} == {"data_path", "algorithm", "mover", "moe_ht_path"}
    assert all(r.field in LIBRARY_FIELDS for r in REGISTRIES)


# ------------------------------------------------------------------ one staging function
def _staged(**knobs: object) -> Staged:
    base = dict(stage_anyway={}, pipeline_chunks=1, comm_buffer_MiB=4.0, copy_GBps=0.0, comm_buffers=2)
    return Staged(Staged.Config(**{**base, **knobs}))  # type: ignore[arg-type]


def test_unpipelined_staging_runs_rounds_of_the_buffer_and_exposes_every_copy() -> None:
    size = 10 * MiB  # allreduce: all of it in and out, in ⌈10 / 4⌉ rounds
    assert _staged().staging("allreduce", size, 8, 16) == Staging(3, size, size, size, size)


def test_pipelined_staging_exposes_one_chunk_or_every_channel_s_first_slot() -> None:
    p = _staged(pipeline_chunks=8)
    small = 64 * 1024.0  # allgather: S/n in, S out
    assert p.staging("allgather", small, 8, 16) == Staging(1, small / 8, small, small / 64, small / 8)
    big = 4096 * MiB  # 16 channels × 4 MiB / 8 slots = 8 MiB exposed each way
    assert p.staging("allreduce", big, 8, 16) == Staging(1, big, big, 8 * MiB, 8 * MiB)


def test_a_zero_copy_path_stages_only_what_it_stages_anyway() -> None:
    path = DataPathModel(DataPathModel.Config(stage_anyway={"reducescatter": 1.0, "p2p": 0.5},
                                              pipeline_chunks=1, comm_buffer_MiB=4.0, copy_GBps=0.0))
    assert path.staging("allreduce", MiB, 8, 16) == Staging()
    assert path.staging("reducescatter", MiB, 8, 16) == Staging(1, MiB, MiB / 8, MiB, MiB / 8)
    assert path.p2p_staging(MiB, 16) == Staging(1, MiB / 2, MiB / 2, MiB / 2, MiB / 2)


def test_the_library_model_prices_staging_through_its_data_path() -> None:
    """The copy phases of a staged op are exactly the data path's exposed fills."""
    cfg = compose_run(["library=[nccl]", "baseline=nccl", "fabric=hgx_h100"])
    lib = LibraryModel("nccl", cfg.library["nccl"], Fabric(cfg.fabric))
    size, group = 64 * 1024.0, tuple(range(8))
    copies = lib.path.staging("allgather", size, 8, lib.ctx.kernel_cores(None))
    phases = lib.collective_phases("allgather", size, group)
    assert [p.copy_bytes for p in phases if p.category == "copy"] == [copies.fill_in * 8, copies.fill_out * 8]
    assert staging_bytes("allgather", size, 8) == (copies.copy_in, copies.copy_out)
