"""Open registries of library mechanisms: each kind of mechanism (data path, algorithm family,
mover, MoE HT path) is a `Registry` keyed by name. Built-ins register under their enum's value; a
plugin module (the run config's `plugins`) registers more with the same decorator, and a library
selects one by name in its kind field (`data_path: symmetric`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from stratacl.errors import ConfigError

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Mechanism classes of one kind by name; `field` is the LibraryConfig field selecting one."""

    def __init__(self, field: str) -> None:
        self.field = field
        self._classes: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: register the class under `name` (its `kind`)."""
        def add(cls: T) -> T:
            key = str(name)
            if key in self._classes and self._classes[key] is not cls:
                raise ValueError(f"{self.field} '{key}' is already registered by {self._classes[key].__qualname__}")
            setattr(cls, "kind", name)  # noqa: B010 - T is any class
            self._classes[key] = cls
            return cls
        return add

    def __getitem__(self, name: str) -> T:
        return self._classes[str(name)]

    def __contains__(self, name: object) -> bool:
        return str(name) in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def names(self) -> list[str]:
        return list(self._classes)

    def check(self, name: str, where: str) -> None:
        """ConfigError at `where` (e.g. library.hccl.data_path) unless `name` is registered."""
        if str(name) not in self._classes:
            raise ConfigError(where, f"unknown {self.field} '{name}'",
                              f"use one of {self.names()}, or list the module registering it in `plugins`")
