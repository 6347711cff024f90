"""How many communication operators a library can run at once on one unit of hardware.

HCCL expands each operator on hardware a die shares with its other communicators (REFERENCE §3,
CANN HCCL docs, HCCL_OP_EXPANSION_MODE): in AI_CPU mode an operator is a graph the card's AI CPU
cores run, at most 6 at a time per card before they saturate; in AIV mode the vector-core kernel has
no multi-communicator concurrency, one operator per die. An operator whose units are all below the
limit starts; otherwise it waits, first come first served, until one on each of its units has ended.
Admission is all-or-nothing per operator (no unit is held while waiting), so waits cannot deadlock.

Work per operator is over its distinct units (cards or dies), counted once per distinct rank tuple:
events scale with ops, not ranks.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from stratacl.machine.lowering import Concurrency


class Admission:
    """Per-unit in-flight counts of one replay and the FIFO of operators waiting for a slot."""

    def __init__(self, concurrency: Concurrency, world_size: int) -> None:
        self.c = concurrency
        self._in_flight = np.zeros(-(-world_size // concurrency.dies_per_unit), dtype=np.int64)
        self._units: dict[tuple[int, ...], np.ndarray] = {}
        self._held: dict[int, np.ndarray] = {}
        self._waiting: deque[tuple[int, np.ndarray]] = deque()

    def units(self, ranks: tuple[int, ...]) -> np.ndarray:
        hit = self._units.get(ranks)
        if hit is None:
            hit = self._units[ranks] = np.unique(np.asarray(ranks, dtype=np.int64) // self.c.dies_per_unit)
        return hit

    def admit(self, op: int, ranks: tuple[int, ...]) -> bool:
        """Start `op` now if every unit it spans has a free slot (and none waits before it), else queue it."""
        units = self.units(ranks)
        # a waiter on one of its units keeps its place (first come, first served per unit)
        if self._fits(units) and not any(np.intersect1d(units, w).size for _, w in self._waiting):
            self._take(op, units)
            return True
        self._waiting.append((op, units))
        return False

    def release(self, op: int) -> list[int]:
        """`op` has ended: free its slots; the waiting operators that now fit, in arrival order."""
        units = self._held.pop(op, None)
        if units is None:
            return []
        self._in_flight[units] -= 1
        started = []
        kept: deque[tuple[int, np.ndarray]] = deque()
        for i, u in self._waiting:
            # an earlier waiter on the same units keeps its place: a later one may not overtake it there
            if self._fits(u) and not any(np.intersect1d(u, w).size for _, w in kept):
                self._take(i, u)
                started.append(i)
            else:
                kept.append((i, u))
        self._waiting = kept
        return started

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _fits(self, units: np.ndarray) -> bool:
        return bool((self._in_flight[units] < self.c.limit).all())

    def _take(self, op: int, units: np.ndarray) -> None:
        self._in_flight[units] += 1
        self._held[op] = units
