"""The mechanism registries by the `LibraryConfig` field that selects from each, and the check of
a library's choices and plugin options against them (run before anything is built)."""

from __future__ import annotations

from typing import Any

from stratacl.comm.datapath import DATA_PATHS
from stratacl.comm.ep import HT_PATHS
from stratacl.comm.families import FAMILIES
from stratacl.comm.mechanism import from_library
from stratacl.comm.movers import MOVERS
from stratacl.comm.registry import Registry
from stratacl.config import LibraryConfig, resolved_mover
from stratacl.errors import ConfigError

REGISTRIES: tuple[Registry[Any], ...] = (DATA_PATHS, FAMILIES, MOVERS, HT_PATHS)


def selected(lib: LibraryConfig) -> dict[str, str]:
    """The mechanism each registry's field selects (the mover as the expansion mode resolves it)."""
    chosen = {r.field: str(getattr(lib, r.field)) for r in REGISTRIES}
    chosen["mover"] = str(resolved_mover(lib)[0])
    return chosen


def check_library(where: str, lib: LibraryConfig) -> None:
    """ConfigError for a mechanism name no registry holds, for options of a mechanism the library
    does not select, and for an option its mechanism's Config lacks or types otherwise."""
    for registry in REGISTRIES:
        registry.check(getattr(lib, registry.field), f"{where}.{registry.field}")
    chosen = selected(lib)
    for mechanism in lib.options:
        if mechanism not in chosen.values():
            raise ConfigError(f"{where}.options.{mechanism}", f"the library selects no mechanism '{mechanism}'",
                              f"options are keyed by a selected mechanism: {sorted(set(chosen.values()))}")
    for registry in REGISTRIES:
        cls = registry[chosen[registry.field]]
        from_library(cls.Config, lib, str(cls.kind), where)
