"""A mechanism's own typed config: each mechanism class declares a frozen `Config` dataclass with
exactly the knobs it reads, built from the library's config by `from_library`. A field named like
a `LibraryConfig` field takes that (flat) knob; any other field is the mechanism's own option,
read from `library.<lib>.options.<mechanism>.<field>` and type-checked there."""

from __future__ import annotations

import enum
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from stratacl.config import LibraryConfig
from stratacl.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")
LIBRARY_FIELDS = frozenset(f.name for f in fields(LibraryConfig))


@dataclass(frozen=True)
class NoConfig:
    """The config of a mechanism that reads no knob."""


class Mechanism:
    """Base of every mechanism class: `kind` is its registered name, `Config` its knobs."""

    kind: ClassVar[str]
    Config: ClassVar[type] = NoConfig


def option_fields(config_cls: type) -> list[str]:
    """The fields of a mechanism Config that are its own options (not flat library knobs)."""
    return [f.name for f in fields(config_cls) if f.name not in LIBRARY_FIELDS]


def from_library(config_cls: type[C], lib: LibraryConfig, mechanism: str, where: str = "library") -> C:
    """`config_cls` filled from `lib`: flat knobs by field name, the rest from
    `lib.options[mechanism]`. `where` names the library in errors (library.<name>)."""
    own = lib.options.get(mechanism, {})
    allowed = option_fields(config_cls)
    for key in own:
        if key not in allowed:
            raise ConfigError(f"{where}.options.{mechanism}.{key}", f"'{mechanism}' has no option '{key}'",
                              f"use one of {allowed}" if allowed else f"drop {where}.options.{mechanism}")
    hints = typing.get_type_hints(config_cls)
    values: dict[str, Any] = {}
    for f in fields(config_cls):
        if f.name in LIBRARY_FIELDS:
            values[f.name] = _frozen(getattr(lib, f.name))
        elif f.name in own:
            values[f.name] = _checked(own[f.name], hints[f.name], f"{where}.options.{mechanism}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"{where}.options.{mechanism}.{f.name}", "is required",
                              f"set it in the library preset's options.{mechanism}")
    return config_cls(**values)


def _frozen(value: Any) -> Any:
    """Lists become tuples (a Config is immutable); dicts are copied."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _checked(value: Any, hint: Any, where: str) -> Any:
    """`value` as the Config's field type `hint` (bool, int, float, str, an enum, tuple[X, ...],
    dict[str, X]), else a ConfigError naming `where`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and isinstance(value, list | tuple):
        return tuple(_checked(v, args[0], where) for v in value)
    if origin is dict and isinstance(value, Mapping):
        return {str(k): _checked(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise ConfigError(where, f"'{value}' is not a {hint.__name__}",
                              f"use one of {[m.value for m in hint]}") from None
    ok = {bool: lambda v: isinstance(v, bool),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str)}.get(hint)
    if ok is None or not ok(value):
        name = getattr(hint, "__name__", str(hint))
        raise ConfigError(where, f"{value!r} is not a {name}", f"give a {name}")
    return float(value) if hint is float else value
