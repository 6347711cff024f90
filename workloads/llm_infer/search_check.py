"""The simulator behind the deployment search (search.py): role iteration times from the serving
workload's memoised iteration model, KV capacity from its allocator model, and the serving check
of a finalist layout at a grid of rates."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stratacl.errors import ConfigError
from stratacl.metrics import latency_percentiles
from stratacl.workload_api import RunContext
from workloads.llm_infer import scheduling as rules
from workloads.llm_infer.iteration import IterationModel
from workloads.llm_infer.prefill_context import prefill_context
from workloads.llm_infer.requests import generate
from workloads.llm_infer.scheduling import ServingPhase
from workloads.llm_infer.schema import LlmInferConfig, StreamLayout
from workloads.llm_infer.search import DecodeRole, Layout, PrefillRole
from workloads.llm_infer.stability import served_fractions
from workloads.llm_infer.workload import Serving, serving_costs
from workloads.modelcost import ModelCosts

GiB = 2**30


def layout_config(base: LlmInferConfig, p: PrefillRole, d: DecodeRole, n_p: int = 1, n_d: int = 1,
                  batch_cap: int = 0) -> LlmInferConfig:
    """The serving config of a layout: `base` (model, trace, placement, allocator) with the roles'
    instance shapes and scheduler knobs. TBO is one switch in the scheduler: a layout whose roles
    disagree takes the decode role's (the search keeps them equal; see `roles`)."""
    cfg = copy.deepcopy(base)
    lay, s = cfg.layout, cfg.scheduler
    lay.prefill_instances, lay.prefill_dp, lay.prefill_ep = n_p, p.dp, p.dp
    lay.decode_instances, lay.decode_dp, lay.decode_ep = n_d, d.dp, d.dp
    lay.total_dies = 0
    s.prefill_token_budget = p.budget
    s.tbo, s.mtp, s.decode_max_batch = d.tbo, d.mtp, d.max_batch or batch_cap
    s.decode_stream_layout = StreamLayout(d.stream_layout)
    cfg.capacity.saturation = cfg.capacity.slo_search = False
    return cfg


@dataclass(frozen=True, slots=True)
class ServingKey:
    """A layout's roles and instance counts: one serving model each."""

    prefill: PrefillRole
    decode: DecodeRole
    prefill_instances: int
    decode_instances: int
    batch_cap: int


@dataclass(frozen=True, slots=True)
class KvKey:
    """What a decode role's KV room per die depends on (not its stream layout)."""

    library: str
    dp: int
    tbo: bool
    mtp: bool
    max_batch: int


@dataclass(frozen=True, slots=True)
class ValidKey:
    library: str
    role: PrefillRole | DecodeRole
    largest_kv: float


class IterationOracle:
    """Role costs per library on the run's fabric, each role shape's iteration model built once
    (its traces memoised across libraries and batch sizes)."""

    def __init__(self, ctx: RunContext, base: LlmInferConfig, mc: ModelCosts) -> None:
        self.ctx, self.base, self.mc = ctx, base, mc
        self.kv_tok = float(mc.kv_bytes_per_token())
        self._serving: dict[ServingKey, Serving] = {}
        self._kv: dict[KvKey, float] = {}
        self._valid: dict[ValidKey, ConfigError | None] = {}

    def serving(self, p: PrefillRole, d: DecodeRole, n_p: int = 1, n_d: int = 1, batch_cap: int = 0) -> Serving:
        key = ServingKey(p, d, n_p, n_d, batch_cap)
        hit = self._serving.get(key)
        if hit is None:
            cfg = layout_config(self.base, p, d, n_p, n_d, batch_cap)
            costs = serving_costs(self.mc, cfg, self.ctx.seed)
            first = n_p * p.dp
            iters = IterationModel(self.ctx, costs, cfg, kv_bytes_per_token=self.kv_tok,
                                   decode_dies=tuple(range(first, first + d.dp)))
            iters.split = False  # a search prices layouts; its iterations carry no counterfactual split
            hit = self._serving[key] = Serving(self.ctx, cfg, costs, iters, self.kv_tok)
        return hit

    # a role alone: the other role mirrors it (prefill's KV goes to as many decode dies as it has)
    def _prefill_model(self, role: PrefillRole) -> Serving:
        return self.serving(role, DecodeRole(role.dp, role.tbo, "none", self.base.scheduler.mtp, 0))

    def _decode_model(self, role: DecodeRole) -> Serving:
        return self.serving(PrefillRole(role.dp, role.tbo, self.base.scheduler.prefill_token_budget), role)

    def prefill_s(self, library: str, role: PrefillRole, tokens: int, context: float = 0.0) -> float:
        return self._prefill_model(role).iters.prefill(library, tokens, context=context).time_s

    def decode_s(self, library: str, role: DecodeRole, batch: int, context: float) -> float:
        return self._decode_model(role).iters.decode(library, batch, context).time_s

    def kv_per_die(self, library: str, role: DecodeRole) -> float:
        key = KvKey(library, role.dp, role.tbo, role.mtp, role.max_batch)
        if key not in self._kv:
            self._kv[key] = self._decode_model(role).dies(library, ServingPhase.decode, False)[0].plan.kv
        return self._kv[key]

    def batch_limit(self, role: DecodeRole) -> int:
        s = self._decode_model(role).cfg.scheduler
        return rules.dispatch_token_cap(s) // rules.verify_factor(s, rules.ServingPhase.decode)

    def emitted(self, role: DecodeRole) -> float:
        return rules.emitted_tokens_per_step(self._decode_model(role).cfg.scheduler)

    def decode_edges(self, role: DecodeRole) -> tuple[int, ...]:
        edge = self._decode_model(role).iters.micro_batch_edge
        return (edge,) if edge else ()

    def validate(self, library: str, role: PrefillRole | DecodeRole, largest_kv: float) -> None:
        """Divisibility and memory of a role shape, as the serving workload checks them; the error
        names the search field (the workload's own field in the problem)."""
        key = ValidKey(library, role, largest_kv)
        if key in self._valid:  # the same verdict at every SLO scale
            if self._valid[key] is not None:
                raise self._valid[key]
            return
        try:
            self._validate(library, role, largest_kv)
            self._valid[key] = None
        except ConfigError as e:
            self._valid[key] = e
            raise

    def _validate(self, library: str, role: PrefillRole | DecodeRole, largest_kv: float) -> None:
        kind = ServingPhase.prefill if isinstance(role, PrefillRole) else ServingPhase.decode
        try:
            srv = self._prefill_model(role) if kind == ServingPhase.prefill else self._decode_model(role)
            die = srv.dies(library, kind, False)[0]  # start-up: weights, buffers, profiled activations
        except ConfigError as e:
            raise ConfigError(f"search.{kind}_dp", f"{e.field}: {e.problem}", e.fix) from None
        if kind == ServingPhase.decode and die.plan.kv < largest_kv:
            raise ConfigError("search.decode_dp", f"a decode die's {die.plan.kv / GiB:.2f} GiB KV cache with "
                              f"'{library}' holds less than the trace's largest request ({largest_kv / GiB:.2f} GiB)",
                              "larger decode instances (more EP: fewer expert weights per die)")

    def check(self, library: str, lay: Layout, rate: float) -> dict[str, np.ndarray | float]:
        """Serve the trace at `rate` on the layout: TTFT and TPOT of the requests arriving in the
        measured window [warmup_s, duration_s), their P99s, and the served fraction — the lesser of
        prefill's (the share of the prompt-token arrival rate first-served) and decode's (the share
        of the rate of requests reaching decode that a decode slot admits), each from its backlog's
        trend over the window (stability.py): ≈ 1 in a steady state, 1 − ε under an overload by ε.
        The two-ends counts (served in the window ÷ arrived in it) are kept beside them."""
        srv = self.serving(lay.prefill, lay.decode, lay.n_prefill, lay.n_decode, lay.decode_batch)
        cfg = srv.cfg
        sim, _ = srv.serve(library, generate(cfg.requests, self.ctx.seed, rate=rate), f"check {rate:.3g} req/s")
        df = sim.request_frame()
        t0, t1 = cfg.warmup_s, cfg.requests.duration_s
        w = df[df["arrival_s"] >= t0]
        ttft, tpot = w["ttft_s"].to_numpy(float), w["tpot_s"].to_numpy(float)
        p = latency_percentiles(w, t0, t1) if len(w) else {"ttft_p99_s": np.nan, "tpot_p99_s": np.nan}
        return {"ttft": ttft, "tpot": tpot, "ttft_p99_s": p["ttft_p99_s"], "tpot_p99_s": p["tpot_p99_s"],
                **served_fractions(df, t0, t1), **self._prefill_gap(library, lay, sim.iteration_frame(), w, t0, t1)}

    def _prefill_gap(self, library: str, lay: Layout, it: pd.DataFrame, req: pd.DataFrame, t0: float,
                     t1: float) -> dict[str, float]:
        """Where a served prefill instance departs from the decomposition's dp·B / t(B): the fill of
        its iterations (tokens ÷ dp·B), their mean time ÷ the decomposition's t(B) at the context of
        the window's prompts (prefill_context.py; what it leaves out: pool fetches, a context other
        than saturated packing's), and the prompt share the prefix cache saves. Saturated, the
        served request rate ÷ the analytic one = fill ÷ slowdown ÷ (1 − hit share)."""
        p = it[(it["phase"] == ServingPhase.prefill) & (it["start_s"] >= t0) & (it["start_s"] < t1)]
        if not len(p):
            return {"prefill_fill": np.nan, "prefill_slowdown": np.nan, "prefix_hit_share": np.nan}
        b = lay.prefill.budget
        hits = req[["hbm_hit_tokens", "pool_hit_tokens"]].to_numpy(float).sum()
        ctx = prefill_context(req["input_tokens"].to_numpy(), b, lay.prefill.dp)
        return {"prefill_fill": float(p["tokens"].sum() / (len(p) * lay.prefill.dp * b)),
                "prefill_slowdown": float(p["time_s"].mean() / self.prefill_s(library, lay.prefill, b, ctx)),
                "prefix_hit_share": float(hits / max(req["input_tokens"].sum(), 1))}
