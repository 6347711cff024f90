"""Fluid sharing of per-die resources among concurrent activities.

An *activity* is one phase of one SPMD op. It loads resources on sets of dies ("ranksets"): each
entry says "on every die of rankset K, this activity needs `seconds` of resource kind t at full
capacity". Every die's resource has capacity 1, so an activity alone runs at full speed f = 1 and
takes T = max(entry seconds, min_time). With others, rates come from weighted max-min fairness on
the dominant share (progressive filling; = dominant resource fairness): two equal transfers through
one port each get half of it. Activities may also *hold* a fraction of a resource (vector cores
running a communication kernel): held capacity is unavailable to others regardless of rate. A compute activity sensitive to loaded
memory latency (`stall` > 0) is further capped by the HBM share of the traffic activities beside it
(stratacl/engine/interference.py).

Rates change only when an activity starts or ends, and only inside the connected component of
activities whose ranksets intersect. Dies that see the same set of ranksets are identical, so the
constraints are taken per maximal overlap signature of the component's ranksets, not per die:
the work per event is independent of the number of ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import count
from typing import TYPE_CHECKING

import simpy

from stratacl.engine.interference import involved, stall_caps

if TYPE_CHECKING:
    from stratacl.engine.utilisation import UtilisationRecorder

EPS = 1e-12
# Bound on the solve memo (component descriptors -> rates). An entry took ≈ 1.2 KB with descriptor
# tuples as keys (components of ~7 activities; measured on benchmarks/bench_engine.py traces, which
# store ≈ 0.47 entries per op) and less with interned descriptor ids, so the cap holds the memo
# under ≈ 250 MB on runs of ~400 000 ops and more. Past it, new shapes
# are solved but not stored: the memo only saves solver time, it never changes an allocation.
SOLVE_MEMO_MAX_ENTRIES = 200_000
# an activity's (rankset, kind, coefficient) rows as the solver sees them: loads, then holds
# plus its stall exposure and its HBM traffic rows (rankset, coefficient)
Descriptor = tuple[tuple[tuple[int, int, float], ...], tuple[tuple[int, int, float], ...], float,
                   tuple[tuple[int, float], ...]]
Grouped = tuple[list[tuple[int, float]], list[tuple[int, float]]]  # one rankset's (loads, holds)
HELD_BACK = 1 - 1e-12  # an activity runs below its own maximum when f < solo_f * HELD_BACK


class Activity:
    __slots__ = (
        "uid", "entries", "holds", "T", "solo_f", "desc", "by_rs", "remaining", "f", "t_last", "gen", "on_done", "rs_ids",
        "work", "did", "held", "cap", "mo", "mark", "stall", "tr",
    )

    def __init__(self, entries: list[tuple[int, int, float]], holds: list[tuple[int, int, float]],
                 min_time: float, on_done: Callable[[], None] | None, uid: int, stall: float = 0.0,
                 traffic: int = -1) -> None:
        self.uid = uid
        T = min_time
        for _, _, s in entries:
            if s > T:
                T = s
        self.T = T
        # consumption per unit rate: seconds/T ≤ 1
        self.entries = [(k, t, s / T) for k, t, s in entries if s > 0]
        self.holds = [(k, t, h) for k, t, h in holds if h > 0]
        self.rs_ids = frozenset([k for k, _, _ in self.entries] + [k for k, _, _ in self.holds])
        self.stall = stall  # exposure to others' HBM traffic (engine/interference.py); 0 = none
        # HBM traffic others see: (rankset, coefficient) of its loads of resource kind `traffic`
        self.tr = [(k, c) for k, t, c in self.entries if t == traffic] if traffic >= 0 else []
        self.desc: Descriptor | None = None  # solver descriptor, built on first shared solve
        self.did = -1  # the descriptor's interned id (FluidSystem._desc_id)
        self.held = False  # runs below its own maximum (counted in FluidSystem.n_held)
        self.cap = 1.0  # solver scratch: rate cap from oversubscribed holds
        self.mo: list[tuple[int, float]] = []  # solver scratch: (constraint, coefficient)
        self.mark = 0  # the last component walk that reached it (FluidSystem._stamp)
        self.by_rs: dict[int, Grouped] | None = None  # rankset -> ([(kind, coefficient)], [(kind, held)]), built on demand
        self.remaining = 1.0
        self.solo_f = 1.0
        if self.holds:
            held: dict[int, float] = {}
            for _, t, h in self.holds:
                held[t] = held.get(t, 0.0) + h
            # rate when alone: holding more than a die has (overlapping roles) time-shares it
            self.solo_f = 1.0 / max(1.0, *held.values())
        self.f = 0.0
        self.t_last = 0.0
        self.gen = 0
        self.work = 0.0  # ∫ f/T dt, must reach 1 at completion (conservation check)
        self.on_done = on_done

    def __hash__(self) -> int:
        return self.uid

    def grouped(self) -> dict[int, Grouped]:
        """Loads and holds grouped by rankset (what one overlap atom sees of this activity)."""
        if self.by_rs is None:
            g: dict[int, Grouped] = {}
            for k, t, c in self.entries:
                g.setdefault(k, ([], []))[0].append((t, c))
            for k, t, h in self.holds:
                g.setdefault(k, ([], []))[1].append((t, h))
            self.by_rs = g
        return self.by_rs

    def descriptor(self) -> Descriptor:
        """What the solver sees of the activity: equal descriptors get equal rates."""
        if self.desc is None:
            self.desc = (tuple(sorted(self.entries)), tuple(sorted(self.holds)), self.stall, tuple(sorted(self.tr)))
        return self.desc

    def __eq__(self, other: object) -> bool:
        return self is other


class FluidSystem:
    """Active activities, rankset interning and the max-min solver, driven by a simpy env."""

    def __init__(self, env: simpy.Environment, check: bool = False) -> None:
        self.env = env
        self.check = check
        self._rs_index: dict[tuple[int, ...], int] = {}
        self.rs_masks: list[int] = []
        self.rs_ranks: list[tuple[int, ...]] = []
        self._nbrs: list[set[int]] = []  # rankset id -> ids of ranksets sharing a die with it
        self._atoms: dict[frozenset[int], list[frozenset[int]]] = {}
        self._solved: dict[tuple[int, ...], dict[int, float]] = {}  # component descriptor ids -> rate per id
        self._desc_index: dict[Descriptor, int] = {}  # descriptor -> small int (cheap memo keys)
        self.n_held = 0  # active activities running below their own maximum
        self._stamp = 0  # component walks so far
        self.active_by_rs: dict[int, set[Activity]] = {}
        self._uid = count()
        self.solves = 0
        self.max_violation = 0.0  # worst capacity excess seen in check mode
        self.recorder: UtilisationRecorder | None = None  # opt-in (None: no cost)

    # ------------------------------------------------------------------ ranksets
    def rankset(self, ranks: tuple[int, ...]) -> int:
        idx = self._rs_index.get(ranks)
        if idx is None:
            mask = 0
            for r in ranks:
                mask |= 1 << r
            idx = self._rs_index[ranks] = len(self.rs_masks)
            self.rs_masks.append(mask)
            self.rs_ranks.append(ranks)
            nb = {idx}
            for j, m in enumerate(self.rs_masks[:-1]):
                if m & mask:
                    nb.add(j)
                    self._nbrs[j].add(idx)
            self._nbrs.append(nb)
        return idx

    def _maximal_atoms(self, ks: frozenset[int]) -> list[frozenset[int]]:
        """Distinct sets of ranksets sharing a die, keeping only maximal ones (others are implied)."""
        hit = self._atoms.get(ks)
        if hit is not None:
            return hit
        parts: list[tuple[int, frozenset[int]]] = []
        union = 0
        for k in ks:
            union |= self.rs_masks[k]
        parts = [(union, frozenset())]
        for k in ks:
            m = self.rs_masks[k]
            nxt = []
            for mask, label in parts:
                inside, outside = mask & m, mask & ~m
                if inside:
                    nxt.append((inside, label | {k}))
                if outside:
                    nxt.append((outside, label))
            parts = nxt
        labels = {label for _, label in parts}
        atoms = [a for a in labels if not any(a < b for b in labels)]
        self._atoms[ks] = atoms
        return atoms

    # ------------------------------------------------------------------ lifecycle
    def start(self, entries: list[tuple[int, int, float]], holds: list[tuple[int, int, float]],
              min_time: float, on_done: Callable[[], None], stall: float = 0.0, traffic: int = -1) -> Activity:
        """`stall`: the activity's exposure to HBM traffic; `traffic`: the resource kind whose loads
        are traffic others stall behind (-1: none). Both only matter together (interference.py)."""
        act = Activity(entries, holds, min_time, on_done, next(self._uid), stall, traffic)
        act.t_last = self.env.now
        active = self.active_by_rs
        for k in act.rs_ids:
            s = active.get(k)
            if s is None:
                active[k] = {act}
            else:
                s.add(act)
        if not act.rs_ids:  # pure min-time activity: nothing to share
            act.f = act.solo_f
            self._schedule(act)
            return act
        if self.recorder is not None:
            self.recorder.started(act, self.env.now)
        self._resolve(self._component(act.rs_ids))
        return act

    def _finish(self, act: Activity, gen: int) -> None:
        if gen != act.gen:
            return  # stale timer: the rate changed after it was set
        dt = self.env.now - act.t_last
        act.work += act.f * dt / act.T
        act.remaining = 0.0
        if self.recorder is not None and act.rs_ids:
            self.recorder.finished(act, self.env.now)
        for k in act.rs_ids:
            s = self.active_by_rs[k]
            s.discard(act)
            if not s:
                del self.active_by_rs[k]
        if act.held:
            act.held = False
            self.n_held -= 1
        # an ending activity can only speed up the ones that were held back: if every neighbour
        # (or, without looking, every activity anywhere) already runs at its maximum, no rate changes
        if act.rs_ids and self.n_held:
            comp = self._component(act.rs_ids)
            if comp and any(a.held for a in comp):
                self._resolve(comp)
        # drop the callback before calling it: it usually refers back to the activity (the
        # replay's box), and without the cycle the activity is freed by reference counting
        on_done, act.on_done = act.on_done, None
        assert on_done is not None, "an activity completes once"
        on_done()

    def _component(self, seed: frozenset[int]) -> set[Activity]:
        """Active activities connected to the seed ranksets through shared dies."""
        comp: set[Activity] = set()
        seen = set(seed)
        stack = list(seed)
        active = self.active_by_rs
        nbrs = self._nbrs
        walked: set[int] = set()  # ranksets whose activities are all in comp already
        stamp = self._stamp = self._stamp + 1  # marks this walk's members (no hashing to test)
        while stack:
            for j in nbrs[stack.pop()]:
                acts = active.get(j)
                if acts and j not in walked:
                    walked.add(j)
                    for a in acts:
                        if a.mark != stamp:
                            a.mark = stamp
                            comp.add(a)
                            for k in a.rs_ids:
                                if k not in seen:
                                    seen.add(k)
                                    stack.append(k)
        return comp

    def _schedule(self, act: Activity) -> None:
        act.gen += 1
        if act.f <= EPS:
            return  # stalled (e.g. all cores held by others); resumes at the next change
        gen = act.gen
        ev = self.env.timeout(max(0.0, act.remaining * act.T / act.f))
        ev.callbacks.append(lambda _ev: self._finish(act, gen))

    # ------------------------------------------------------------------ solver
    def _resolve(self, comp: set[Activity]) -> None:
        now = self.env.now
        old = []
        for a in comp:
            if a.t_last != now:
                prog = a.f * (now - a.t_last) / a.T
                a.work += prog
                a.remaining = max(0.0, a.remaining - prog)
                a.t_last = now
            old.append((a, a.f))
        self._solve(comp)
        self.solves += 1
        if self.recorder is not None:
            self.recorder.rates(old, now)
        for a, f in old:
            af = a.f
            held = af < a.solo_f * HELD_BACK
            if held != a.held:
                a.held = held
                self.n_held += 1 if held else -1
            if af != f or a.gen == 0:
                self._schedule(a)
        if self.check:
            self._check_capacity()

    def _solve(self, comp: set[Activity]) -> None:
        if len(comp) == 1:
            (a,) = comp
            a.f = a.solo_f
            return
        # the max-min allocation depends only on the activities' descriptors: memoise it (keyed by
        # the descriptors' interned ids, a bijection, so hits are exactly those of the descriptors)
        key = tuple(sorted([a.did if a.did >= 0 else self._desc_id(a) for a in comp]))
        hit = self._solved.get(key)
        if hit is not None:
            for a in comp:
                a.f = hit[a.did]
            return
        self._fill(comp)
        if involved(comp):  # kernels beside HBM traffic: cap them, then share again
            caps = stall_caps(comp, self._atoms_of(comp))
            if caps:
                self._share(comp, caps)
        if len(self._solved) < SOLVE_MEMO_MAX_ENTRIES:
            self._solved[key] = {a.did: a.f for a in comp}

    def _desc_id(self, a: Activity) -> int:
        index = self._desc_index
        did = a.did = index.setdefault(a.descriptor(), len(index))
        return did

    def _atoms_of(self, comp: set[Activity]) -> list[frozenset[int]]:
        ks = frozenset().union(*(a.rs_ids for a in comp))
        return [ks] if len(ks) == 1 else self._maximal_atoms(ks)

    def _fill(self, comp: set[Activity]) -> None:
        self._share(comp, None)

    def _share(self, comp: set[Activity], caps: dict[Activity, float] | None) -> None:
        """Progressive filling; `caps`: rate caps some activities start with (stall caps)."""
        atoms = self._atoms_of(comp)
        # constraints per (atom, resource kind): [residual, unfrozen coefficient sum]; each
        # activity keeps its (constraint, coefficient) list (`mo`) so freezing updates sums in
        # place, and its rate cap (`cap`). Per-atom maps are keyed by uid (ints hash in C; insertion
        # order, hence summation order, is the same as keyed by activity).
        residual: list[float] = []
        total: list[float] = []
        members: list[list[Activity]] = []
        by_uid: dict[int, Activity] = {}
        by_rs: dict[int, list[tuple[int, Grouped]]] = {}
        for a in comp:
            a.cap = 1.0 if caps is None else caps.get(a, 1.0)
            a.mo = []
            u = a.uid
            by_uid[u] = a
            g = a.by_rs if a.by_rs is not None else a.grouped()
            for k in a.rs_ids:
                lst = by_rs.get(k)
                if lst is None:
                    by_rs[k] = [(u, g[k])]
                else:
                    lst.append((u, g[k]))
        for atom in atoms:
            loads: dict[int, dict[int, float]] = {}
            holds: dict[int, float] = {}
            holders: dict[int, list[int]] = {}
            for k in atom:
                for u, (ent, hld) in by_rs[k]:
                    for t, c in ent:
                        d = loads.get(t)
                        if d is None:
                            loads[t] = {u: c}
                        else:
                            d[u] = d.get(u, 0.0) + c
                    for t, h in hld:
                        holds[t] = holds.get(t, 0.0) + h
                        holders.setdefault(t, []).append(u)
            for t, held in holds.items():
                if held > 1.0:  # oversubscribed cores: holders time-share them
                    for u in holders[t]:
                        a = by_uid[u]
                        a.cap = min(a.cap, 1.0 / held)
            for t, mem in loads.items():
                held_t = holds.get(t)
                if held_t is None:
                    res = 1.0
                else:
                    res = 1.0 - held_t
                    if not res > 0.0:  # max(0.0, 1.0 - held)
                        res = 0.0
                tot = sum(mem.values()) if len(mem) > 1 else next(iter(mem.values()))
                if tot <= res:
                    continue  # cannot bind: every rate is ≤ 1
                ci = len(residual)
                residual.append(res)
                total.append(tot)
                ms = []
                for u, c in mem.items():
                    a = by_uid[u]
                    ms.append(a)
                    a.mo.append((ci, c))
                members.append(ms)
        if not residual:  # nothing binds: everyone runs at its cap
            for a in comp:
                a.f = a.cap
            return
        # progressive filling: raise all unfrozen rates together until a constraint or cap binds
        unfrozen = set(comp)
        live = [ci for ci, s in enumerate(total) if s > EPS]
        level = 0.0
        while unfrozen:
            step = min([a.cap for a in unfrozen]) - level
            if live:
                step = min(step, min([residual[ci] / total[ci] for ci in live]))
            step = max(step, 0.0)
            level += step
            frozen = {a for a in unfrozen if a.cap - level <= 1e-12}
            for ci in live:
                s = total[ci]
                r = residual[ci] = residual[ci] - step * s
                if r <= 1e-12 * (s if s > 1.0 else 1.0):  # max(1.0, s)
                    frozen.update([a for a in members[ci] if a in unfrozen])
            if not frozen:  # numerical safety
                frozen = set(unfrozen)
            for a in frozen:
                a.f = level
                for ci, c in a.mo:
                    total[ci] -= c
            unfrozen -= frozen
            live = [ci for ci in live if total[ci] > EPS]

    def _check_capacity(self) -> None:
        """Brute force per die: Σ consumption ≤ capacity left after holds (test/debug mode)."""
        use: dict[tuple[int, int], float] = {}
        held: dict[tuple[int, int], float] = {}
        acts = set().union(*self.active_by_rs.values()) if self.active_by_rs else set()
        for a in acts:
            for k, t, c in a.entries:
                for r in self.rs_ranks[k]:
                    use[(r, t)] = use.get((r, t), 0.0) + c * a.f
            for k, t, h in a.holds:
                for r in self.rs_ranks[k]:
                    held[(r, t)] = held.get((r, t), 0.0) + h
        for key, u in use.items():
            excess = u - max(0.0, 1.0 - held.get(key, 0.0))
            self.max_violation = max(self.max_violation, excess)
