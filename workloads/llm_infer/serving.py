"""Request-level simulation of disaggregated serving (simpy), one library at a time.

Prefill instances run chunked prefill with DP attention, SGLang-style: every die has a budget of
`prefill_token_budget` tokens per iteration; a die continues its own chunked prompt first (the
earlier chunks' KV is on that die), then the instance's FIFO queue fills the dies with room, least
loaded first, a prompt larger than a die's room becoming that die's chunked prompt. An iteration
lasts the simulated prefill iteration for the busiest die's tokens (the MoE all-to-alls couple the
dies: idle dies step too). A request's first token is out when its last chunk finishes; its KV
moves to a decode instance layer by layer inside the simulated prefill iteration (p2p ops of the
library, contending with the all-to-alls for the prefill dies' ports); the request joins decode
when its iteration's last KV byte lands.

Prefix reuse (`prefix`, prefix.py): when a prompt enters a prefill die its longest cached prefix
of 512-token blocks is looked up; those tokens are not prefilled, the DRAM-pool part of them is
fetched into the die in that iteration (layer by layer, over the fabric), and every chunk's
attention spans the prompt tokens before it (its cached prefix and earlier chunks: the iteration
is priced at the largest such token-weighted context of a die). Its blocks enter the cache when its
prefill finishes.

Decode instances batch continuously: a request is admitted to the die with the most free KV cache
when its whole KV footprint (input + output tokens) fits and the die is below its batch cap
(`decode_max_batch`, and the fused MoE dispatch's token cap), so a library that holds more HBM
admits fewer sequences. All dies of an instance step together; a step lasts the simulated decode
iteration for the largest per-die batch and the mean context, and yields 1 + MTP acceptance tokens
per sequence.

Each instance's busiest die runs its iterations' tensors through the allocator model
(memory.ServingDie) when the library registers user buffers: whether the iteration mapped new
memory and how many of its dispatch/combine buffers a JIT cache missed go into the simulated
iteration.

Open loop: requests arrive at their arrival times. Closed loop (`closed_loop` = N): N requests are
outstanding from t = 0, and each completion brings the next request in at once (saturation).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from workloads.llm_infer import scheduling as rules
from workloads.llm_infer.iteration import CF_COLUMNS, IterationModel, IterStats
from workloads.llm_infer.memory import ServingDie, StepMemory
from workloads.llm_infer.prefix import MISS, Hit, PrefixCache
from workloads.llm_infer.requests import Requests
from workloads.llm_infer.scheduling import ServingPhase
from workloads.llm_infer.schema import LayoutConfig, LlmInferConfig, SchedulerConfig

QUIET = StepMemory()


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
                 progress: Callable[[float], None] | None = None,
                 prefill_dies: list[ServingDie] | None = None, decode_dies: list[ServingDie] | None = None,
                 closed_loop: int = 0, until_s: float | None = None, prefix: PrefixCache | None = None) -> None:
        """Layout and scheduler from `cfg`; `kv_per_die` bytes of KV cache per decode die. Instance
        i's iterations drive `prefill_dies[i]` / `decode_dies[i]` (the allocator model) if given;
        the facts they produce reach the iteration model, which prices them for the libraries
        whose cost depends on them.
        `closed_loop` N > 0: N outstanding requests taken from `reqs` in order (their arrival
        times ignored); `until_s` stops the simulation then (default: when every request is done).
        `prefix`: the prefix cache a prompt's blocks (`reqs.block_ids`) are looked up in when it
        enters a prefill die and inserted into when its prefill finishes (prefix.py)."""
        self.reqs = reqs
        self.iters = iters
        self.lib = library
        self.layout: LayoutConfig = cfg.layout
        self.sched: SchedulerConfig = cfg.scheduler
        self.kv_per_die = kv_per_die
        self.kv_tok = kv_bytes_per_token
        self.progress = progress
        self.mem_prefill = prefill_dies or []
        self.mem_decode = decode_dies or []
        self.closed_loop = closed_loop
        self.until_s = until_s
        self.prefix = prefix if reqs.block_ids is not None else None
        self.cap = rules.decode_batch_cap(self.sched)
        n = len(reqs)
        self.arrival = np.array(reqs.arrival_s, dtype=float) if not closed_loop else np.full(n, np.nan)
        self.t_prefill_start = np.full(n, np.nan)
        self.t_first_token = np.full(n, np.nan)
        self.t_decode_start = np.full(n, np.nan)
        self.t_done = np.full(n, np.nan)
        self.generated = [0.0] * n  # tokens generated per request (a list: read and written per decode step)
        self._in, self._out = reqs.input_tokens.tolist(), reqs.output_tokens.tolist()  # Python ints, per step
        self.hits: list[Hit] = [MISS] * n
        self.prefilled = np.zeros(n)  # prompt tokens whose KV exists (cached prefix + chunks done)
        self.prefix_landed = np.zeros(n)  # when a reused prefix's KV has reached the decode die
        self.iter_rows: list[tuple] = []
        self.occupancy = Occupancy()
        self.max_batch_seen = 0
        self.issued = 0

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        env = self.env = simpy.Environment()
        lay = self.layout
        self.prefill_q = [deque() for _ in range(lay.prefill_instances)]
        self.queued_tokens = [0] * lay.prefill_instances
        self.chunked: list[list[list | None]] = [[None] * lay.prefill_dp for _ in range(lay.prefill_instances)]
        self.prefill_wake = [env.event() for _ in range(lay.prefill_instances)]
        self.decode_wait = [deque() for _ in range(lay.decode_instances)]
        self.decode_wake = [env.event() for _ in range(lay.decode_instances)]
        self.decode_dies = [[DecodeDie(self.kv_per_die) for _ in range(lay.decode_dp)]
                            for _ in range(lay.decode_instances)]
        self.reserved = [0.0] * lay.decode_instances
        self.remaining = len(self.reqs)
        self.all_done = env.event()
        if self.closed_loop:
            for _ in range(min(self.closed_loop, len(self.reqs))):
                self._arrive()
        else:
            env.process(self._arrivals())
        for i in range(lay.prefill_instances):
            env.process(self._prefill(i))
        for i in range(lay.decode_instances):
            env.process(self._decode(i))
        if self.until_s is not None:
            env.run(until=self.until_s)
        elif self.remaining:
            env.run(until=self.all_done)

    def _arrivals(self):  # noqa: ANN202 - simpy process
        last = 0.0
        for t in self.reqs.arrival_s:
            yield self.env.timeout(t - self.env.now)
            self._arrive()
            if self.progress:
                self.progress(t - last)
                last = t

    def _arrive(self) -> None:
        """The next request enters: to the prefill instance with the fewest queued tokens."""
        rid = self.issued
        self.issued += 1
        self.arrival[rid] = self.env.now
        self.occupancy.change(self.env.now, +1)
        i = min(range(len(self.prefill_q)), key=self.queued_tokens.__getitem__)
        tokens = int(self.reqs.input_tokens[rid])
        self.prefill_q[i].append([rid, tokens])
        self.queued_tokens[i] += tokens
        self._wake(self.prefill_wake, i)

    @staticmethod
    def _wake(events: list, i: int) -> None:
        if not events[i].triggered:
            events[i].succeed()

    # ------------------------------------------------------------------ prefill
    def _prefill(self, i: int):  # noqa: ANN202
        env, q, chunked = self.env, self.prefill_q[i], self.chunked[i]
        dp = self.layout.prefill_dp
        budget = self.sched.prefill_token_budget
        while True:
            if not q and not any(chunked):
                self.prefill_wake[i] = env.event()
                yield self.prefill_wake[i]
                continue
            per_die, finished, fetch, send, sent = [0] * dp, [], [0] * dp, [0] * dp, []
            cached = [0.0] * dp  # Σ tokens × the prompt's earlier tokens they attend over, per die
            for d, c in enumerate(chunked):  # a die first continues its own chunked prompt
                if c is not None:
                    take = min(c[1], budget)
                    per_die[d] = take
                    cached[d] += take * self._attend(c[0], take)
                    c[1] -= take
                    if c[1] == 0:
                        finished.append(c[0])
                        chunked[d] = None
            while q:  # FCFS onto the least-loaded die with room and no prompt in progress
                d = min((x for x in range(dp) if chunked[x] is None and per_die[x] < budget),
                        key=per_die.__getitem__, default=None)
                if d is None:
                    break
                rid, left = q.popleft()
                self.queued_tokens[i] -= left
                if np.isnan(self.t_prefill_start[rid]):
                    self.t_prefill_start[rid] = env.now
                if self.prefix is not None:  # the cached prefix is not computed; pool hits are fetched
                    hit = self.hits[rid] = self.prefix.lookup(i, self.reqs.block_ids[rid], left)
                    left -= hit.tokens
                    self.prefilled[rid] = hit.tokens
                    fetch[d] += hit.pool_tokens
                    send[d] += hit.tokens  # decode needs the whole prompt's KV, the reused prefix too
                    sent.append(rid)
                take = min(left, budget - per_die[d])
                per_die[d] += take
                cached[d] += take * self._attend(rid, take)
                if take < left:
                    chunked[d] = [rid, left - take]  # the rest runs on this die next iteration
                else:
                    finished.append(rid)
            tokens = max(per_die)
            mem = self.mem_prefill[i].step(env.now, tokens, sum(per_die)) if i < len(self.mem_prefill) else QUIET
            # the context the iteration's attention spans: the largest token-weighted one of a die
            context = max((x / t for x, t in zip(cached, per_die, strict=True) if t), default=0.0)
            st = self.iters.prefill(self.lib, tokens, mem.maps > 0, _miss(mem), fetch_tokens=fetch, context=context,
                                    send_tokens=send)
            self.prefix_landed[sent] = env.now + st.prefix_ready_s
            yield env.timeout(st.time_s)
            self._record(ServingPhase.prefill.value, i, tokens, sum(per_die), 0.0, st, mem, min(per_die), context)
            kv_left = max(0.0, st.kv_ready_s - st.time_s)  # layer-wise KV sends still in flight
            for rid in finished:
                if self.prefix is not None:
                    self.prefix.insert(i, self.reqs.block_ids[rid])
                self.t_first_token[rid] = env.now
                env.process(self._to_decode(rid, kv_left))

    def _attend(self, rid: int, take: int) -> float:
        """A chunk of `take` tokens of prompt `rid`: the earlier prompt tokens it attends over
        (its cached prefix and earlier chunks), then counted as done."""
        before = float(self.prefilled[rid])
        self.prefilled[rid] += take  # computed KV leaves for decode layer by layer (iteration.py)
        return before

    def _to_decode(self, rid: int, kv_left: float):  # noqa: ANN202
        yield self.env.timeout(max(kv_left, self.prefix_landed[rid] - self.env.now))
        if self.reqs.output_tokens[rid] <= 1:
            self._complete(rid)
            return
        i = min(range(len(self.reserved)), key=lambda k: (self.reserved[k], k))  # least-loaded instance
        self.decode_wait[i].append(rid)
        self.reserved[i] += self._kv_need(rid)
        self._wake(self.decode_wake, i)

    def _kv_need(self, rid: int) -> float:
        return self.kv_tok * float(self._in[rid] + self._out[rid])

    # ------------------------------------------------------------------ decode
    def _decode(self, i: int):  # noqa: ANN202
        env = self.env
        dies = self.decode_dies[i]
        waiting = self.decode_wait[i]
        step_tokens = rules.emitted_tokens_per_step(self.sched)
        cap = self.cap
        ctx_sum = 0.0  # cached tokens of the running sequences (input + generated)
        n_running = 0
        while True:
            while waiting:  # admit FCFS while the head request's KV fits on some die below its cap
                rid = waiting[0]
                need = self._kv_need(rid)
                die = max((d for d in dies if len(d.running) < cap), key=lambda d: d.free_kv, default=None)
                if die is None or die.free_kv < need:
                    break
                waiting.popleft()
                die.free_kv -= need
                die.running.append(rid)
                ctx_sum += float(self._in[rid])
                n_running += 1
                self.t_decode_start[rid] = env.now
            batch = max(len(d.running) for d in dies)
            if batch == 0:
                self.decode_wake[i] = env.event()
                yield self.decode_wake[i]
                continue
            self.max_batch_seen = max(self.max_batch_seen, batch)
            ctx = ctx_sum / n_running
            mem = self.mem_decode[i].step(env.now, batch, n_running) if i < len(self.mem_decode) else QUIET
            st = self.iters.decode(self.lib, batch, ctx, mem.maps > 0, _miss(mem))
            yield env.timeout(st.time_s)
            kv_used = sum(self.kv_per_die - d.free_kv for d in dies) / (self.kv_per_die * len(dies))
            self._record(ServingPhase.decode.value, i, batch, n_running * step_tokens, kv_used, st, mem,
                         min(len(d.running) for d in dies), ctx)
            gen, out = self.generated, self._out
            for d in dies:
                keep = []
                for rid in d.running:
                    gen[rid] += step_tokens
                    ctx_sum += step_tokens
                    if 1 + gen[rid] >= out[rid]:  # prefill made token 1
                        d.free_kv += self._kv_need(rid)
                        self.reserved[i] -= self._kv_need(rid)
                        ctx_sum -= float(self._in[rid]) + gen[rid]
                        n_running -= 1
                        self._complete(rid)
                    else:
                        keep.append(rid)
                d.running = keep

    def _complete(self, rid: int) -> None:
        self.t_done[rid] = self.env.now
        self.occupancy.change(self.env.now, -1)
        self.remaining -= 1
        if self.closed_loop and self.issued < len(self.reqs):
            self._arrive()  # the client sends its next request
        if self.remaining == 0 and not self.all_done.triggered:
            self.all_done.succeed()

    def _record(self, phase: str, inst: int, batch: float, tokens: float, kv_util: float, st: IterStats,
                mem: StepMemory, min_batch: float = 0.0, context: float = 0.0) -> None:
        """`context`: the step's priced context (decode: mean cached tokens per sequence; prefill: the
        cached prefix its tokens attend over, 0 without reuse)."""
        self.iter_rows.append((phase, inst, self.env.now - st.time_s, st.time_s, batch, min_batch, tokens, context,
                               kv_util, st.compute_s, st.exposed_comm_s, st.copy_s, st.register_s, st.launch_s,
                               mem.maps > 0, mem.lookups, mem.misses, *(getattr(st, c) for c in CF_COLUMNS)))

    # ------------------------------------------------------------------ results
    def request_frame(self) -> pd.DataFrame:
        r = self.reqs
        df = pd.DataFrame({
            "request": np.arange(len(r)), "arrival_s": self.arrival, "input_tokens": r.input_tokens,
            "output_tokens": r.output_tokens, "prefill_start_s": self.t_prefill_start,
            "first_token_s": self.t_first_token, "decode_start_s": self.t_decode_start,
            "completion_s": self.t_done,
            "prefix_blocks": [len(x) for x in r.block_ids] if r.block_ids is not None else 0,
            "hbm_hit_blocks": [h.hbm_blocks for h in self.hits], "pool_hit_blocks": [h.pool_blocks for h in self.hits],
            "hbm_hit_tokens": [h.hbm_tokens for h in self.hits], "pool_hit_tokens": [h.pool_tokens for h in self.hits],
            # decode gets the whole prompt's KV: the reused prefix and the computed chunks
            "kv_to_decode_bytes": self.prefilled * self.kv_tok,
        })
        if self.closed_loop:
            df = df[np.isfinite(df["arrival_s"])].reset_index(drop=True)
        df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
        out = df["output_tokens"].to_numpy(dtype=float)
        df["tpot_s"] = np.where(out > 1, (df["completion_s"] - df["first_token_s"]) / np.maximum(out - 1, 1), np.nan)
        df["e2e_s"] = df["completion_s"] - df["arrival_s"]
        df["library"] = self.lib
        return df

    def iteration_frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.iter_rows, columns=["phase", "instance", "start_s", "time_s", "batch_per_die",
                                                   "min_batch_per_die", "tokens", "context", "kv_utilisation",
                                                   "compute_s", "exposed_comm_s", "copy_s", "register_s", "launch_s",
                                                   "remap", "jit_lookups", "jit_misses", *CF_COLUMNS])
        if not self.iters.reports_split:  # output.counterfactual=false: no split to report
            df = df.drop(columns=list(CF_COLUMNS))
        df["library"] = self.lib
        return df


def _miss(mem: StepMemory) -> float:
    return mem.misses / mem.lookups if mem.lookups else 0.0
