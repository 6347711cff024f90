"""Request-level simulation of disaggregated serving (simpy), one library at a time.

Prefill instances run chunked prefill with DP attention: each iteration every die takes requests
from the instance's FIFO queue up to `prefill_token_budget` tokens (a long prompt is chunked and
continues in the next iteration); the iteration lasts the simulated prefill iteration for the
busiest die's tokens (dies step together: the MoE all-to-alls couple them). A request's first
token is out when its last chunk finishes. Its KV cache moves to a decode instance layer by layer
inside the simulated prefill iteration (p2p ops of the library, contending with the all-to-alls
for the prefill dies' ports); the request joins decode when its iteration's last KV byte lands.
Decode instances batch continuously: a request is admitted to the die with the most free KV cache
when its whole KV footprint (input + output tokens) fits, so a library that holds more HBM admits
fewer sequences. All dies of an instance step together (the MoE all-to-alls couple them); a step
lasts the simulated decode iteration for the largest per-die batch and the mean context, and
yields 1 + MTP acceptance tokens per sequence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from stratacl.schemas.llm_infer import LayoutConfig, LlmInferConfig, SchedulerConfig
from workloads.llm_infer.iteration import IterationModel, IterStats
from workloads.llm_infer.requests import Requests


@dataclass
class Occupancy:
    """Time integral of the number of requests in the system (for Little's law)."""

    n: int = 0
    area: float = 0.0
    t_last: float = 0.0

    def change(self, now: float, delta: int) -> None:
        self.area += self.n * (now - self.t_last)
        self.t_last = now
        self.n += delta


@dataclass
class DecodeDie:
    free_kv: float
    running: list[int] = field(default_factory=list)


class ServingSim:
    def __init__(self, reqs: Requests, iters: IterationModel, library: str, cfg: LlmInferConfig, *,
                 kv_per_die: float, kv_bytes_per_token: float,
                 progress: Callable[[float], None] | None = None, seed: int = 0) -> None:
        """Layout, scheduler and remap fraction from `cfg`; `kv_per_die` bytes of KV cache per
        decode die (the prefill→decode KV transfer is inside the simulated prefill iterations)."""
        self.reqs = reqs
        self.iters = iters
        self.lib = library
        self.layout: LayoutConfig = cfg.layout
        self.sched: SchedulerConfig = cfg.scheduler
        self.kv_per_die = kv_per_die
        self.kv_tok = kv_bytes_per_token
        self.progress = progress
        self.remap_fraction = cfg.remap_fraction
        self._remap_rng = np.random.default_rng([seed, 7])  # same draws for every library
        n = len(reqs)
        self.t_prefill_start = np.full(n, np.nan)
        self.t_first_token = np.full(n, np.nan)
        self.t_decode_start = np.full(n, np.nan)
        self.t_done = np.full(n, np.nan)
        self.generated = np.zeros(n)
        self.iter_rows: list[tuple] = []
        self.occupancy = Occupancy()
        self.max_batch_seen = 0

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        env = self.env = simpy.Environment()
        self.prefill_q = [deque() for _ in range(self.layout.prefill_instances)]
        self.prefill_wake = [env.event() for _ in range(self.layout.prefill_instances)]
        self.decode_wait = [deque() for _ in range(self.layout.decode_instances)]
        self.decode_wake = [env.event() for _ in range(self.layout.decode_instances)]
        self.decode_dies = [[DecodeDie(self.kv_per_die) for _ in range(self.layout.decode_dp)]
                            for _ in range(self.layout.decode_instances)]
        self.reserved = [0.0] * self.layout.decode_instances
        self.remaining = len(self.reqs)
        self.all_done = env.event()
        env.process(self._arrivals())
        for i in range(self.layout.prefill_instances):
            env.process(self._prefill(i))
        for i in range(self.layout.decode_instances):
            env.process(self._decode(i))
        if self.remaining:
            env.run(until=self.all_done)

    def _arrivals(self):  # noqa: ANN202 - simpy process
        last = 0.0
        for rid, t in enumerate(self.reqs.arrival_s):
            yield self.env.timeout(t - self.env.now)
            self.occupancy.change(self.env.now, +1)
            # shortest queue (in tokens) among prefill instances
            i = min(range(len(self.prefill_q)), key=lambda k: sum(r[1] for r in self.prefill_q[k]))
            self.prefill_q[i].append([rid, int(self.reqs.input_tokens[rid])])
            self._wake(self.prefill_wake, i)
            if self.progress:
                self.progress(t - last)
                last = t

    @staticmethod
    def _wake(events: list, i: int) -> None:
        if not events[i].triggered:
            events[i].succeed()

    # ------------------------------------------------------------------ prefill
    def _prefill(self, i: int):  # noqa: ANN202
        env, q = self.env, self.prefill_q[i]
        dp = self.layout.prefill_dp
        budget = self.sched.prefill_token_budget
        while True:
            if not q:
                self.prefill_wake[i] = env.event()
                yield self.prefill_wake[i]
                continue
            per_die, finished = [0] * dp, []
            while q:  # FCFS; each prompt (or its next chunk) to the least-loaded die with room
                d = min(range(dp), key=per_die.__getitem__)
                room = budget - per_die[d]
                if room <= 0:
                    break
                rid, left = q[0]
                if np.isnan(self.t_prefill_start[rid]):
                    self.t_prefill_start[rid] = env.now
                chunk = min(left, room)
                per_die[d] += chunk
                q[0][1] -= chunk
                if q[0][1] > 0:
                    break  # the rest of a chunked prompt waits for the next iteration
                finished.append(rid)
                q.popleft()
            st = self.iters.prefill(self.lib, max(per_die), self._remap())
            yield env.timeout(st.time_s)
            self._record("prefill", i, max(per_die), sum(per_die), 0.0, st)
            kv_left = max(0.0, st.kv_ready_s - st.time_s)  # layer-wise KV sends still in flight
            for rid in finished:
                self.t_first_token[rid] = env.now
                env.process(self._to_decode(rid, kv_left))

    def _to_decode(self, rid: int, kv_left: float):  # noqa: ANN202
        yield self.env.timeout(kv_left)
        if self.reqs.output_tokens[rid] <= 1:
            self._complete(rid)
            return
        i = min(range(len(self.reserved)), key=lambda k: (self.reserved[k], k))  # least-loaded instance
        self.decode_wait[i].append(rid)
        self.reserved[i] += self._kv_need(rid)
        self._wake(self.decode_wake, i)

    def _kv_need(self, rid: int) -> float:
        return self.kv_tok * float(self.reqs.input_tokens[rid] + self.reqs.output_tokens[rid])

    # ------------------------------------------------------------------ decode
    def _decode(self, i: int):  # noqa: ANN202
        env = self.env
        dies = self.decode_dies[i]
        waiting = self.decode_wait[i]
        step_tokens = 1.0 + (self.sched.mtp_acceptance if self.sched.mtp else 0.0)
        cap = self.sched.decode_max_batch or 1 << 30
        while True:
            while waiting:  # admit FCFS while the head request's KV fits on some die
                rid = waiting[0]
                need = self._kv_need(rid)
                die = max(dies, key=lambda d: d.free_kv)
                if die.free_kv < need or len(die.running) >= cap:
                    break
                waiting.popleft()
                die.free_kv -= need
                die.running.append(rid)
                self.t_decode_start[rid] = env.now
            batch = max(len(d.running) for d in dies)
            if batch == 0:
                self.decode_wake[i] = env.event()
                yield self.decode_wake[i]
                continue
            self.max_batch_seen = max(self.max_batch_seen, batch)
            running = [r for d in dies for r in d.running]
            ctx = float(np.mean(self.reqs.input_tokens[running] + self.generated[running]))
            st = self.iters.decode(self.lib, batch, ctx, self._remap())
            yield env.timeout(st.time_s)
            kv_used = sum(self.kv_per_die - d.free_kv for d in dies) / (self.kv_per_die * len(dies))
            self._record("decode", i, batch, len(running) * step_tokens, kv_used, st)
            for d in dies:
                keep = []
                for rid in d.running:
                    self.generated[rid] += step_tokens
                    if 1 + self.generated[rid] >= self.reqs.output_tokens[rid]:  # prefill made token 1
                        d.free_kv += self._kv_need(rid)
                        self.reserved[i] -= self._kv_need(rid)
                        self._complete(rid)
                    else:
                        keep.append(rid)
                d.running = keep

    def _remap(self) -> bool:
        """Does the allocator map new memory for the MoE buffers in this iteration?"""
        return bool(self.remap_fraction) and self._remap_rng.random() < self.remap_fraction

    def _complete(self, rid: int) -> None:
        self.t_done[rid] = self.env.now
        self.occupancy.change(self.env.now, -1)
        self.remaining -= 1
        if self.remaining == 0 and not self.all_done.triggered:
            self.all_done.succeed()

    def _record(self, phase: str, inst: int, batch: float, tokens: float, kv_util: float, st: IterStats) -> None:
        self.iter_rows.append((phase, inst, self.env.now - st.time_s, st.time_s, batch, tokens, kv_util,
                               st.compute_s, st.exposed_comm_s, st.copy_s, st.register_s))

    # ------------------------------------------------------------------ results
    def request_frame(self) -> pd.DataFrame:
        r = self.reqs
        out = np.asarray(r.output_tokens, dtype=float)
        df = pd.DataFrame({
            "request": np.arange(len(r)), "arrival_s": r.arrival_s, "input_tokens": r.input_tokens,
            "output_tokens": r.output_tokens, "prefill_start_s": self.t_prefill_start,
            "first_token_s": self.t_first_token, "decode_start_s": self.t_decode_start,
            "completion_s": self.t_done,
        })
        df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
        df["tpot_s"] = np.where(out > 1, (df["completion_s"] - df["first_token_s"]) / np.maximum(out - 1, 1), np.nan)
        df["e2e_s"] = df["completion_s"] - df["arrival_s"]
        df["library"] = self.lib
        return df

    def iteration_frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.iter_rows, columns=["phase", "instance", "start_s", "time_s", "batch_per_die",
                                                   "tokens", "kv_utilisation", "compute_s", "exposed_comm_s",
                                                   "copy_s", "register_s"])
        df["library"] = self.lib
        return df
