"""Expert placement over expert-parallel (EP) dies, with redundant experts and shared-expert replicas.

Slots = routed experts + redundant replicas + shared-expert replicas, spread over `ep` dies
(ceil(slots / ep) per die at most). Two placements:

- contiguous: expert e on die e // (experts / ep), no replicas (needs ep | experts);
- eplb (DeepSeek EPLB-style, from the expected popularity): each redundant slot replicates the
  expert with the highest load per replica; the replicas (and the shared-expert replicas, each
  carrying an even share of every token's shared-expert row) are packed heaviest first onto the
  least-loaded die with a free slot that does not already hold that expert.

A token routed to a replicated expert goes to one of its replicas; successive tokens cycle over
the replicas, so each replica gets an even share (±1) of that expert's tokens. With shared-expert
replicas every token also sends one copy to a shared-expert die (cycled likewise) instead of
running the shared expert locally.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stratacl.errors import ConfigError


@dataclass(frozen=True)
class Placement:
    ep: int
    experts: int  # routed experts; the shared expert has id `experts` when replicated
    slot_expert: tuple[int, ...]  # expert id of each slot
    slot_die: tuple[int, ...]  # die of each slot
    shared_weight: float = 0.0  # shared-expert rows per token in routed-expert-row units

    @property
    def shared_replicas(self) -> int:
        return sum(1 for e in self.slot_expert if e == self.experts)

    @property
    def shared_local(self) -> bool:
        """Every die runs the shared expert for its own tokens (no shared-expert replicas)."""
        return self.shared_replicas == 0

    def slots_per_die(self) -> np.ndarray:
        return np.bincount(np.asarray(self.slot_die), minlength=self.ep)

    def routed_slots_per_die(self) -> np.ndarray:
        d = np.asarray(self.slot_die)[np.asarray(self.slot_expert) < self.experts]
        return np.bincount(d, minlength=self.ep)

    def shared_slots_per_die(self) -> np.ndarray:
        d = np.asarray(self.slot_die)[np.asarray(self.slot_expert) == self.experts]
        return np.bincount(d, minlength=self.ep)

    def die_rows(self, shares: np.ndarray, top_k: int) -> np.ndarray:
        """Expected expert rows per token each die runs (routed rows in routed-row units, a shared
        replica's share of every token's shared row): each copy to an expert goes to one of its
        replicas in turn (`destinations`), so a replica takes 1/replicas of its expert's rows."""
        reps = self.replicas()
        load = np.concatenate([top_k * np.asarray(shares, dtype=float), [self.shared_weight]])
        rows = np.zeros(self.ep)
        np.add.at(rows, np.asarray(self.slot_die), (load / np.maximum(reps, 1))[np.asarray(self.slot_expert)])
        return rows

    def replicas(self) -> np.ndarray:
        """Replica count per expert (routed, then the shared expert)."""
        return np.bincount(np.asarray(self.slot_expert), minlength=self.experts + 1)

    def _table(self) -> tuple[np.ndarray, np.ndarray]:
        n = self.replicas()
        dies = np.full((self.experts + 1, max(int(n.max()), 1)), -1, dtype=np.int64)
        fill = np.zeros(self.experts + 1, dtype=np.int64)
        for e, d in zip(self.slot_expert, self.slot_die, strict=True):
            dies[e, fill[e]] = d
            fill[e] += 1
        return dies, n

    def destinations(self, choice: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Destination die of every (token, selected expert) of `choice` (ep, tokens, top_k), with
        the shared-expert copy appended as a last column when it is replicated; and the rows'
        weights in routed-expert-row units (1, or `shared_weight` for the shared copy)."""
        ep, tokens, k = choice.shape
        dies, n = self._table()
        chosen = choice
        if not self.shared_local:
            chosen = np.concatenate([choice, np.full((ep, tokens, 1), self.experts)], axis=2)
        # the i-th copy to expert e (in token order) goes to replica i mod replicas(e): an even split
        flat = chosen.ravel()
        order = np.argsort(flat, kind="stable")
        first = np.searchsorted(flat[order], flat[order])
        occ = np.empty_like(flat)
        occ[order] = np.arange(flat.size) - first
        idx = (occ % n[flat]).reshape(chosen.shape)
        weight = np.ones(chosen.shape)
        if not self.shared_local:
            weight[..., -1] = self.shared_weight
        return dies[chosen, idx], weight


def contiguous(experts: int, ep: int) -> Placement:
    per = experts // ep
    return Placement(ep, experts, tuple(range(experts)), tuple(e // per for e in range(experts)))


def eplb(shares: np.ndarray, ep: int, top_k: int, redundant: int = 0, shared_replicas: int = 0,
         shared_weight: float = 1.0, *, field: str = "workload.layout") -> Placement:
    """EPLB-style placement for expected routed-expert `shares` (sum 1); `shared_weight`: the
    shared expert's rows per token relative to one routed-expert row (its width over a routed
    expert's)."""
    experts = len(shares)
    slots = experts + redundant + shared_replicas
    if slots < ep:
        raise ConfigError(f"{field}.*_ep", f"EP {ep} exceeds the {slots} expert slots "
                          f"({experts} routed + {redundant} redundant + {shared_replicas} shared replicas)",
                          "add redundant experts or shared-expert replicas, or lower the EP size")
    if redundant > experts * (ep - 1) or shared_replicas > ep:
        raise ConfigError(f"{field}.*_redundant_experts", f"{redundant} redundant experts / {shared_replicas} "
                          f"shared replicas cannot sit on {ep} dies (one replica of an expert per die)",
                          "fewer replicas or a larger EP size")
    cap = math.ceil(slots / ep)
    load = top_k * np.asarray(shares, dtype=float)  # rows per token of the whole instance
    reps = np.ones(experts, dtype=np.int64)
    for _ in range(redundant):
        reps[int(np.argmax(load / reps))] += 1
    if reps.max() > ep:
        raise ConfigError(f"{field}.*_redundant_experts", f"an expert would need {reps.max()} replicas "
                          f"on {ep} dies", "fewer redundant experts or a larger EP size")
    items = [(load[e] / reps[e], e) for e in range(experts) for _ in range(reps[e])]
    if shared_replicas:
        items += [(shared_weight / shared_replicas, experts)] * shared_replicas
    items.sort(key=lambda x: (-x[0], x[1]))
    die_load = np.zeros(ep)
    die_used = np.zeros(ep, dtype=np.int64)
    hosts: list[set[int]] = [set() for _ in range(ep)]
    slot_expert, slot_die = [], []
    for w, e in items:
        ok = [d for d in range(ep) if die_used[d] < cap and e not in hosts[d]]
        if not ok:
            raise ConfigError(f"{field}.*_redundant_experts", f"no die left for a replica of expert {e}",
                              "fewer replicas or a larger EP size")
        # least loaded; among equals the die with the fewest slots (keeps empty dies filled)
        d = min(ok, key=lambda x: (die_load[x], die_used[x], x))
        die_load[d] += w
        die_used[d] += 1
        hosts[d].add(e)
        slot_expert.append(e)
        slot_die.append(d)
    return Placement(ep, experts, tuple(slot_expert), tuple(slot_die), shared_weight)


def copies(dest: np.ndarray, weight: np.ndarray, ep: int, per_expert: bool) -> tuple[np.ndarray, np.ndarray]:
    """(token copies from each source die to each destination die, weighted rows each die's
    experts process). `dest`: (ep, tokens, c) destination die per routed copy. High-throughput
    dispatch (per_expert False) sends a token once to every distinct destination die."""
    out = np.zeros((ep, ep))
    for src in range(ep):
        d = dest[src]
        if per_expert:
            out[src] = np.bincount(d.ravel(), minlength=ep)
        else:
            hit = np.zeros((d.shape[0], ep), dtype=bool)
            np.put_along_axis(hit, d, True, axis=1)
            out[src] = hit.sum(axis=0)
    rows = np.bincount(dest.ravel(), weights=weight.ravel(), minlength=ep)
    return out, rows
