"""Pipeline schedules as each pipeline rank's ordered compute actions, from their published code.

A schedule says only what each pipeline rank computes, in which order; when it runs (and so the
bubbles) comes out of the replay, from the actions' dependencies and the point-to-point transfers.

Definitions followed (read, not copied):
- GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble: torch.distributed.pipelining,
  pytorch/pytorch torch/distributed/pipelining/schedules.py @1fd7abc2f521e4429a29c3088e39ebaca20f4698
  (`ScheduleGPipe`: all forwards then all backwards in micro-batch order; `Schedule1F1B`:
  min(m, p − rank) warm-up forwards, then one backward and one forward; `ScheduleInterleaved1F1B`
  / `ScheduleInterleavedZeroBubble` through `_get_1f1b_rank_ops`: rounds = max(1, m // p),
  warm-up (v − 1)·m_round + 2·(p − 1 − rank) forwards (factor 1 for zero bubble), depth-first
  stage choice per round, and ZB1P's input/weight split with the weight backward deferred by
  `rank` micro-batches).
- ZBV (`ScheduleZBVZeroBubble._calculate_single_rank_operations`, same file; ZB paper arXiv
  2401.10241 §6 "ZB-V"): V-shaped placement, 2(p − r) − 1 forwards of the first chunk, r pairs
  (F1, F0), p − r triples (F1, I1, W1), then F0 I0 W0 F1 I1 W1 until every forward is done, r
  (I0, I1) pairs, p − r (I0, W0) pairs and the remaining W1 then W0; built for max(2p − 1, m)
  micro-batches and the actions of micro-batches ≥ m dropped, as torch does.
- DualPipeV: `ScheduleDualPipeV._calculate_single_rank_operations` (torch main, which follows
  deepseek-ai/DualPipe; the eight steps F0, F0F1, I1W1F1, F0B1-F1B0 overlapped, B1-F1B0, B1B0,
  W0B0, W0), V-shaped stage placement (rank r holds stages r and 2p − 1 − r); DeepSeek-V3
  report (arXiv 2412.19437) §3.2.1 for the overlapped forward/backward pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratacl.errors import ConfigError
from workloads.llm_train.schema import PpScheduleName as PpSchedule


# F forward, B full backward, I input-gradient backward, W weight-gradient backward
@dataclass(frozen=True, slots=True)
class Action:
    kind: str
    stage: int  # global stage (model chunk) index
    mb: int


Step = tuple[Action, ...]  # one action, or DualPipeV's overlapped (forward, backward) pair


V_SHAPED = (PpSchedule.zbv, PpSchedule.dualpipev)  # two stages per rank: r and 2p − 1 − r


def stages_per_rank(schedule: PpSchedule, virtual: int) -> int:
    if schedule in V_SHAPED:
        return 2
    if schedule in (PpSchedule.gpipe, PpSchedule.one_f_one_b):
        return 1
    return virtual


def stage_rank(stage: int, p: int, schedule: PpSchedule) -> int:
    """Pipeline rank holding a stage: looped (s mod p) or V-shaped for ZBV and DualPipeV."""
    if schedule in V_SHAPED:
        return stage if stage < p else 2 * p - 1 - stage
    return stage % p


def check(schedule: PpSchedule, p: int, m: int, v: int) -> None:
    """The schedules' own preconditions, as ConfigErrors naming the knob."""
    n_stages = p * stages_per_rank(schedule, v)
    if schedule == PpSchedule.dualpipev and m < n_stages:
        raise ConfigError("workload.microbatches", f"DualPipeV needs at least as many micro-batches as "
                          f"stages ({n_stages} = 2 × pp {p}), got {m}", f"use microbatches ≥ {n_stages}")
    if schedule in (PpSchedule.interleaved_1f1b, PpSchedule.interleaved_zb):
        rounds = max(1, m // p)
        if m % rounds:
            raise ConfigError("workload.microbatches", f"{schedule.value} needs micro-batches a multiple of "
                              f"its rounds max(1, m // pp) = {rounds}, got {m}", f"use a multiple of pp={p}")


COMBINABLE = (PpSchedule.one_f_one_b, PpSchedule.interleaved_1f1b)


def rank_steps(schedule: PpSchedule, p: int, m: int, v: int = 1, combined: bool = False) -> list[list[Step]]:
    """Each pipeline rank's steps in issue order; `combined`: Megatron-Core's combined 1F1B."""
    if combined:
        return [combine_1f1b(steps) for steps in rank_steps(schedule, p, m, v)]
    check(schedule, p, m, v)
    if schedule == PpSchedule.gpipe:
        return [[(Action("F", r, i),) for i in range(m)] + [(Action("B", r, i),) for i in range(m)]
                for r in range(p)]
    if schedule == PpSchedule.one_f_one_b:
        return [_one_f_one_b(r, p, m) for r in range(p)]
    if schedule == PpSchedule.dualpipev:
        return [_dualpipev(r, p, m) for r in range(p)]
    if schedule == PpSchedule.zbv:
        return [_zbv(r, p, m) for r in range(p)]
    return [_interleaved(r, p, m, v, schedule == PpSchedule.interleaved_zb) for r in range(p)]


def combine_1f1b(steps: list[Step]) -> list[Step]:
    """Megatron-Core's combined 1F1B (`--overlap-moe-expert-parallel-comm`,
    megatron/core/pipeline_parallel/combined_1f1b.py `combined_1f1b_schedule_for_interleaved_pipelining`,
    "Combined 1F1B: Expert-Parallel All-to-All Overlap" in its docs): a backward and the forward
    issued right after it (the 1F1B steady state: B of micro-batch i, F of a later one) become one
    combined step, run together so that the EP all-to-all of one hides under the other's compute.
    Only a backward joins the forward after it: a warm-up forward joined to the first backward would
    wait for a downstream stage that needs that forward first."""
    out: list[Step] = []
    i = 0
    while i < len(steps):
        a = steps[i]
        b = steps[i + 1] if i + 1 < len(steps) else None
        if (b is not None and len(a) == len(b) == 1 and (a[0].kind, b[0].kind) == ("B", "F")
                and (a[0].stage, a[0].mb) != (b[0].stage, b[0].mb)):
            out.append((b[0], a[0]))
            i += 2
        else:
            out.append(a)
            i += 1
    return out


def _one_f_one_b(r: int, p: int, m: int) -> list[Step]:
    warm = min(m, p - r)
    out: list[Step] = [(Action("F", r, i),) for i in range(warm)]
    f, b = warm, 0
    while b < m:
        out.append((Action("B", r, b),))
        b += 1
        if f < m:
            out.append((Action("F", r, f),))
            f += 1
    return out


def _interleaved(r: int, p: int, m: int, v: int, zero_bubble: bool) -> list[Step]:
    rounds = max(1, m // p)
    per_round = m // rounds
    warm = min((v - 1) * per_round + (1 if zero_bubble else 2) * (p - 1 - r), m * v)
    fwd_bwd = m * v - warm
    total = warm + fwd_bwd + warm

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % v) * p + r

    def bwd_stage(step: int) -> int:
        return (v - 1 - ((step - warm) // per_round) % v) * p + r

    nxt: dict[tuple[str, int], int] = {}
    out: list[Step] = []
    bwd_steps: list[int] = []
    weights_done = 0

    def act(kind: str, stage: int) -> None:
        i = nxt.get((kind, stage), 0)
        nxt[(kind, stage)] = i + 1
        out.append((Action(kind, stage, i),))

    def weight() -> None:
        nonlocal weights_done
        act("W", bwd_stage(bwd_steps[weights_done]))
        weights_done += 1

    for step in range(total):
        if step < warm + fwd_bwd:
            act("F", fwd_stage(step))
        if step >= warm:
            act("I" if zero_bubble else "B", bwd_stage(step))
            bwd_steps.append(step)
            if zero_bubble and step - warm >= r:  # ZB1P: W deferred by `rank` micro-batches
                weight()
    while zero_bubble and weights_done < len(bwd_steps):
        weight()
    return out


def _zbv(r: int, p: int, m: int) -> list[Step]:
    s0, s1 = r, 2 * p - 1 - r
    n = max(2 * p - 1, m)
    cnt = {(k, s): 0 for k in "FIW" for s in (s0, s1)}
    out: list[Action] = []

    def act(*seq: tuple[str, int]) -> None:
        for kind, stage in seq:
            out.append(Action(kind, stage, cnt[(kind, stage)]))
            cnt[(kind, stage)] += 1

    for _ in range(2 * (p - r) - 1):
        act(("F", s0))
    for _ in range(r):
        act(("F", s1), ("F", s0))
    for _ in range(p - r):
        act(("F", s1), ("I", s1), ("W", s1))
    while cnt[("F", s1)] < cnt[("F", s0)] or cnt[("F", s0)] < n:
        if cnt[("F", s0)] < n:
            act(("F", s0))
        act(("I", s0), ("W", s0), ("F", s1), ("I", s1), ("W", s1))
    for _ in range(r):
        act(("I", s0), ("I", s1))
    for _ in range(p - r):
        act(("I", s0), ("W", s0))
    while cnt[("W", s1)] < cnt[("I", s1)]:
        act(("W", s1))
    while cnt[("W", s0)] < cnt[("I", s0)]:
        act(("W", s0))
    return [(a,) for a in out if a.mb < m]


def _dualpipev(r: int, p: int, m: int) -> list[Step]:
    s0, s1 = r, 2 * p - 1 - r
    nxt: dict[tuple[str, int], int] = {}
    pending_w: list[Action] = []
    out: list[Step] = []

    def take(kind: str, stage: int) -> Action:
        key = ("I" if kind in "BI" else kind, stage)  # B and I share the backward counter
        i = nxt.get(key, 0)
        nxt[key] = i + 1
        if kind == "I":
            pending_w.append(Action("W", stage, i))
        return Action(kind, stage, i)

    def one(kind: str, stage: int) -> None:
        out.append((take(kind, stage),))

    def pair(f_stage: int, b_stage: int) -> None:
        out.append((take("F", f_stage), take("B", b_stage)))

    def weight() -> None:
        if pending_w:
            out.append((pending_w.pop(0),))

    for _ in range((p - r - 1) * 2):  # 1: F0
        one("F", s0)
    for _ in range(r + 1):  # 2: F0F1
        one("F", s0)
        one("F", s1)
    for _ in range(p - r - 1):  # 3: I1 W1 F1
        one("I", s1)
        weight()
        one("F", s1)
    for i in range(m - 2 * p + r + 1):  # 4: F0B1-F1B0, overlapped pairs
        if i == 0 and r == p - 1:  # not overlapped: shortens the bubble (DualPipe's note)
            one("F", s0)
            one("B", s1)
        else:
            pair(s0, s1)
        pair(s1, s0)
    for _ in range(p - r - 1):  # 5: B1-F1B0
        one("B", s1)
        pair(s1, s0)
    zb = False
    steps6 = r + 1
    for i in range(steps6):  # 6: B1B0, the second half with zero bubble
        if i == steps6 // 2 and r % 2 == 1:
            zb = True
        one("I" if zb else "B", s1)
        if i == steps6 // 2 and r % 2 == 0:
            zb = True
        one("I" if zb else "B", s0)
    for _ in range(p - r - 1):  # 7: W0B0
        weight()
        one("I" if zb else "B", s0)
    for _ in range(r + 1):  # 8: W0
        weight()
    return out


def validate(steps: list[list[Step]], schedule: PpSchedule, p: int, m: int, v: int) -> None:
    """Every stage runs each micro-batch's forward once and its backward once (B, or I and W), on
    the rank that holds it."""
    n_stages = p * stages_per_rank(schedule, v)
    seen: dict[tuple[str, int], list[int]] = {}
    for r, lst in enumerate(steps):
        for step in lst:
            for a in step:
                if stage_rank(a.stage, p, schedule) != r:
                    raise AssertionError(f"{schedule}: stage {a.stage} scheduled on rank {r}")
                seen.setdefault((a.kind, a.stage), []).append(a.mb)
    for s in range(n_stages):
        fwd = sorted(seen.get(("F", s), []))
        bwd = sorted(seen.get(("B", s), []) + seen.get(("I", s), []))
        if fwd != list(range(m)) or bwd != list(range(m)) or \
                sorted(seen.get(("W", s), [])) != sorted(seen.get(("I", s), [])):
            raise AssertionError(f"{schedule}: stage {s} does not run every micro-batch once")
