"""The workload registry: every package `workloads.<name>` that exports a `SPEC`, and every
installed distribution's package named under the `stratacl.workloads` entry-point group
(`[project.entry-points."stratacl.workloads"] <name> = "<package>"`, docs/extending.md).

The core knows no workload by name. A workload package holds a `schema` module. Loading the
registry imports every such package's `__init__` (each must stay light: its spec, schema and
metric tables, never torch) and stores each schema in Hydra's ConfigStore as
`workload/<name>_schema`, which `conf/workload/<name>.yaml` lists first in its defaults. A package
without a YAML of its own gets one: `workload=<name>` composes its schema's defaults.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Mapping
from importlib.metadata import entry_points
from types import MappingProxyType

from hydra.core.config_store import ConfigStore

from stratacl.errors import ConfigError
from stratacl.paths import CONF
from stratacl.workload_spec import WorkloadSpec

PACKAGE = "workloads"
ENTRY_POINTS = "stratacl.workloads"
_specs: dict[str, WorkloadSpec] = {}
_loaded = False


def specs() -> Mapping[str, WorkloadSpec]:
    """Every registered workload by name (discovered on first use)."""
    global _loaded
    if not _loaded:
        _loaded = True
        root = importlib.import_module(PACKAGE)
        for mod in sorted(pkgutil.iter_modules(root.__path__), key=lambda m: m.name):
            if mod.ispkg and not mod.name.startswith("_") and _has_schema(mod):
                found = getattr(importlib.import_module(f"{PACKAGE}.{mod.name}"), "SPEC", None)
                if isinstance(found, WorkloadSpec):
                    register(found, package=mod.name)
        for ep in entry_points(group=ENTRY_POINTS):
            found = getattr(importlib.import_module(ep.value), "SPEC", None)
            if not isinstance(found, WorkloadSpec):
                raise ConfigError(f"entry point {ENTRY_POINTS}:{ep.name}", f"module '{ep.value}' has no SPEC",
                                  "export SPEC = WorkloadSpec(...) from the package's __init__")
            register(found, package=None if found.name == ep.name else ep.name)
    return MappingProxyType(_specs)


def _has_schema(mod: pkgutil.ModuleInfo) -> bool:
    """A workload package holds a `schema` module; shared packages (`common`, `modelcost`) do not,
    and are never imported here (modelcost's `__init__` imports torch and transformers)."""
    where = getattr(mod.module_finder, "path", None)
    if where is None:
        return True  # not on the file system: import it and look for a SPEC
    return any(m.name == "schema" for m in pkgutil.iter_modules([os.path.join(where, mod.name)]))


def register(spec: WorkloadSpec, package: str | None = None) -> None:
    """Add a workload: its schema into the ConfigStore, its metric names checked against the
    others' (a name means one thing across workloads)."""
    where = f"{package or spec.name}.SPEC"
    if package is not None and spec.name != package:
        raise ConfigError(f"{where}.name", f"'{spec.name}' differs from the name it is registered by, "
                          f"'{package}'", f"name the spec '{package}'")
    if spec.name in _specs and _specs[spec.name] is not spec:
        raise ConfigError(where, f"a second workload named '{spec.name}'", "rename one of the packages")
    _check_metrics(spec, where)
    store = ConfigStore.instance()
    store.store(group="workload", name=f"{spec.name}_schema", node=spec.schema)
    if not (CONF / "workload" / f"{spec.name}.yaml").exists():
        store.store(group="workload", name=spec.name, node=spec.schema)
    _specs[spec.name] = spec


def _check_metrics(spec: WorkloadSpec, where: str) -> None:
    from stratacl.directions import EXACT

    for other in _specs.values():
        for name in spec.metrics.keys() & other.metrics.keys():
            if spec.metrics[name] != other.metrics[name]:
                raise ConfigError(f"{where}.metrics.{name}", f"means something else in workload '{other.name}'",
                                  "give the metric a name of its own")
    clash = sorted(spec.metrics.keys() & EXACT.keys())
    if clash:
        raise ConfigError(f"{where}.metrics.{clash[0]}", "is a core metric (stratacl/directions.py EXACT)",
                          "drop it from the workload's table, or give the metric a name of its own")


def spec(name: str) -> WorkloadSpec:
    """The workload `workload.name` selects; a ConfigError listing the known ones otherwise."""
    found = specs().get(name)
    if found is None:
        if not name.isidentifier():
            raise ConfigError("workload.name", f"'{name}' is not a workload name")
        raise ConfigError("workload.name", f"unknown workload '{name}'", f"use one of {sorted(_specs)}")
    return found
