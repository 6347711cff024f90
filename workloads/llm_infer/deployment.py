"""`workload.mode=search` (+experiment=deployment_search): each library at its goodput-optimal
layout under the trace's SLO, next to the configured (fixed) layout; the SLO-scale view.

Per library: the analytic search (search.py) at every SLO scale, then the serving check of the
finalists (the top `finalists` layouts at scale 1, the best at each scale, the configured layout)
at a grid of rates. Goodput at a scale is the best finalist's goodput on its grid (search.
goodput_on_grid): every run is judged at every scale from the same requests, so goodput can only
grow as the SLO loosens."""

from __future__ import annotations

import copy
import itertools
import time

import numpy as np
import pandas as pd

from stratacl.compare import metric_table
from stratacl.errors import ConfigError
from stratacl.workload_api import RunContext, WorkloadResult
from workloads.llm_infer import scheduling as rules
from workloads.llm_infer.requests import Requests, pool
from workloads.llm_infer.scheduling import ServingPhase
from workloads.llm_infer.schema import LlmInferConfig
from workloads.llm_infer.search import (
    Bisection,
    DecodeRole,
    Layout,
    Lengths,
    PrefillRole,
    Slo,
    decode_capacity,
    first_miss,
    goodput_bisect,
    goodput_on_grid,
    prefill_capacity,
    search,
)
from workloads.llm_infer.search_check import IterationOracle
from workloads.llm_infer.workload import Serving
from workloads.modelcost import ModelCosts


def roles(cfg: LlmInferConfig) -> tuple[list[PrefillRole], list[DecodeRole]]:
    """The search space's role shapes (stream layouts other than `none` only with TBO)."""
    s = cfg.search
    pre = [PrefillRole(dp, tbo, b) for dp, tbo, b in itertools.product(s.prefill_dp, s.tbo, s.prefill_token_budget)]
    dec = [DecodeRole(dp, tbo, sl, mtp, cap)
           for dp, tbo, sl, mtp, cap in itertools.product(s.decode_dp, s.tbo, s.stream_layout, s.mtp, s.decode_max_batch)
           if tbo or sl == "none"]
    return pre, list(dict.fromkeys(dec))


def configured(cfg: LlmInferConfig) -> tuple[PrefillRole, DecodeRole, int, int]:
    lay, s = cfg.layout, cfg.scheduler
    return (PrefillRole(lay.prefill_dp, s.tbo, s.prefill_token_budget),
            DecodeRole(lay.decode_dp, s.tbo, str(s.decode_stream_layout), s.mtp, s.decode_max_batch),
            lay.prefill_instances, lay.decode_instances)


def run_search(ctx: RunContext, cfg: LlmInferConfig, mc: ModelCosts) -> WorkloadResult:
    sc = cfg.search
    trace = str(cfg.requests.trace) if str(cfg.requests.arrival) == "trace" else None
    cls, ttft, tpot = sc.slo(trace)
    slo = Slo(ttft, tpot, sc.attainment)
    sample = pool(cfg.requests, ctx.seed, 10_000)
    lengths = Lengths(sample.input_tokens, sample.output_tokens, float(mc.kv_bytes_per_token()))
    oracle = IterationOracle(ctx, check_window(cfg, lengths, slo), mc)
    budget = min(sc.die_budget, ctx.fabric.world)
    pre, dec = roles(cfg)
    scales = sorted(set(sc.slo_scales) | {1.0})
    metrics, layout_rows, check_rows, scale_rows, role_rows, rejected, notes = {}, [], [], [], [], [], []
    timing_rows: list[dict] = []
    fixed_rates: list[float] = []  # the configured layout's common rates: loads × the baseline's goodput on it
    # the baseline first: every library serves the configured layout at its goodput's fixed_loads
    for library in sorted(ctx.libraries, key=lambda lib: lib != ctx.baseline):
        t0 = time.perf_counter()
        sims0 = oracle_sims(oracle)
        by_scale = {k: search(oracle, library, pre, dec, lengths, slo.scaled(k), budget,
                              validate=lambda lib, r: oracle.validate(lib, r, lengths.kv_largest)) for k in scales}
        t_search = time.perf_counter() - t0
        res = by_scale[1.0]
        rejected += [{"library": library, "role": r.role, "field": r.field, "reason": r.reason} for r in res.rejected]
        role_rows += _role_rows(library, res)
        layout_rows += [_layout_row(library, x, i) for i, x in enumerate(res.layouts)]
        if not sc.serve_check:
            metrics[library] = _analytic_only(by_scale, scales, budget, oracle_sims(oracle) - sims0)
            timing_rows.append({"library": library, "search_s": t_search, "check_s": 0.0})
            scale_rows += [{"library": library, "slo_scale": k, "die_budget": budget, "analytic_best": by_scale[k].best.label() if by_scale[k].best
                            else "", "analytic_capacity_req_per_s": by_scale[k].best.capacity if by_scale[k].best else 0.0}
                           for k in scales]
            notes.append(f"{library}: {int(metrics[library]['candidates'])} candidate layouts priced in {t_search:.1f} s; "
                         f"analytic best {res.best.label() if res.best else '—'}")
            continue
        p, d, n_p, n_d = configured(cfg)
        fixed = Layout(p, d, n_p, n_d, 0.0, "")
        if sc.check_default:
            cp, cd = prefill_capacity(oracle, library, p, lengths, slo), decode_capacity(oracle, library, d, lengths, slo)
            fixed.capacity = min(n_p * cp.rate, n_d * cd.rate)  # its own batch cap: as configured
            fixed.bound = "prefill" if n_p * cp.rate <= n_d * cd.rate else "decode"
        t1 = time.perf_counter()
        checks = Checks(oracle, library, sc)
        if sc.check_default:
            checks.run("fixed", fixed, slo)
            if library == ctx.baseline:
                gb = goodput_on_grid(checks.frames("fixed"), slo)[0]
                fixed_rates = [round(k * gb, 3) for k in sc.fixed_loads] if gb > 0 else []
            for r in fixed_rates:  # P99 TTFT / TPOT at the same offered rates for every library
                checks.serve("fixed", fixed, r)
        checks.finalists(res.layouts[:sc.finalists], slo)
        for k in scales:  # each scale's analytic best, bisected at that scale (every served rate reused)
            if by_scale[k].best is not None and (sc.scale_checks or k == 1.0):
                checks.run(by_scale[k].best.label(), by_scale[k].best, slo.scaled(k))
        finalists = {n: x for n, x in checks.layouts.items() if n != "fixed"}
        check_rows += [{"library": library, "layout": lay.label(), "role": "fixed" if name == "fixed" else "search",
                        "analytic_capacity_req_per_s": lay.capacity, "rate_req_per_s": r,
                        "ttft_p99_s": f["ttft_p99_s"], "tpot_p99_s": f["tpot_p99_s"],
                        "served_fraction": f["served_fraction"], "stable": checks.stable(f),
                        **{f"{r}{k}_served_fraction": f.get(f"{r}{k}_served_fraction", np.nan)
                           for r in ("prefill", "decode") for k in ("", "_window")},
                        **{k: f[k] for k in ("prefill_fill", "prefill_slowdown", "prefix_hit_share")},
                        # attainment in the window (a slow overload's can read high: `stable` says so)
                        **{f"attainment_x{k:g}": _att(f, slo.scaled(k)) for k in scales}}
                       for name, lay in checks.layouts.items() for r, f in sorted(checks.stats[name].items())]
        notes += [f"{library}: {n} not served (analytic {c:.3g} req/s cannot beat the served {g:.3g})"
                  for n, c, g in checks.pruned]
        t_check = time.perf_counter() - t1
        m = {"slo_ttft_s": ttft, "slo_tpot_s": tpot, "die_budget": float(budget),
             "candidates": float(sum(by_scale[k].candidates for k in scales)),
             "iteration_traces_simulated": float(oracle_sims(oracle) - sims0)}
        # host wall time: in timing.parquet, not in summary.json (deterministic for a seed)
        timing_rows.append({"library": library, "search_s": t_search, "check_s": t_check})
        for k in scales:
            g = _goodput(checks, finalists, slo.scaled(k))
            scale_rows.append({"library": library, "slo_scale": k, "die_budget": budget, "goodput_req_per_s": g[0],
                               # not bisected at this scale (scale_checks=false): a lower bound
                               "lower_bound": not (sc.scale_checks or k == 1.0),
                               "goodput_req_per_s_per_die": g[0] / budget, "layout": g[1], "capped": g[2],
                               # the goodput is in [goodput, this): ratios inside the brackets are unresolved
                               "goodput_upper_req_per_s": g[3],
                               "analytic_best": by_scale[k].best.label() if by_scale[k].best else "",
                               "analytic_capacity_req_per_s": by_scale[k].best.capacity if by_scale[k].best else 0.0})
            if k == 1.0:
                m.update({"goodput_req_per_s": g[0], "goodput_per_die": g[0] / budget, "goodput_capped": float(g[2]),
                          "analytic_capacity_req_per_s": res.best.capacity if res.best else 0.0})
                best_lay = finalists.get(g[1])
                if best_lay is not None:
                    m.update(_layout_metrics(best_lay))
                    m.update({"best_layout_analytic_req_per_s": best_lay.capacity,
                              "goodput_over_analytic": g[0] / best_lay.capacity if best_lay.capacity else np.nan})
        if sc.check_default:
            gf, capped = goodput_on_grid(checks.frames("fixed"), slo)
            # per die of the configured layout itself (it need not fit the search's die budget)
            m.update({"fixed_layout_goodput_req_per_s": gf, "fixed_layout_goodput_per_die": gf / fixed.dies,
                      "fixed_layout_capped": float(capped), "fixed_layout_analytic_req_per_s": fixed.capacity})
        metrics[library] = m
        row1 = scale_rows[-len(scales) + scales.index(1.0)]
        upper = row1["goodput_upper_req_per_s"]
        notes.append(f"{library}: {int(m['candidates'])} candidate layouts priced in {t_search:.1f} s "
                     f"({t_search / max(m['candidates'], 1) * 1e3:.2f} ms each, {int(m['iteration_traces_simulated'])} "
                     f"iteration traces); {len(checks.layouts)} layouts served at {checks.served} rates in {t_check:.1f} s; "
                     f"best: {row1['layout'] or '—'} at {m['goodput_req_per_s']:.4g} req/s "
                     f"({'capped' if m['goodput_capped'] else f'{upper:.4g} req/s misses' if upper > 0 else 'no served rate meets it'})")
    notes.insert(0, f"SLO class '{cls}': P{sc.attainment * 100:g} attainment of TTFT ≤ {ttft:g} s and TPOT ≤ "
                    f"{tpot * 1e3:g} ms (docs/sources.md 'Serving SLOs'); die budget {budget}")
    keys = ["goodput_req_per_s", "goodput_per_die", "analytic_capacity_req_per_s", "fixed_layout_goodput_req_per_s",
            "fixed_layout_goodput_per_die", "prefill_instances", "prefill_dp", "decode_instances", "decode_dp",
            "decode_max_batch", "goodput_over_analytic", "candidates"]
    keys = [k for k in keys if k in next(iter(metrics.values()))]
    extra = {"checks": pd.DataFrame(check_rows), "slo_scale": pd.DataFrame(scale_rows), "roles": pd.DataFrame(role_rows),
             "rejected": pd.DataFrame(rejected, columns=["library", "role", "field", "reason"]),
             "timing": pd.DataFrame(timing_rows)}
    return WorkloadResult(rows=pd.DataFrame(layout_rows), metrics=metrics, table=metric_table(metrics, ctx.baseline, keys),
                          notes=notes, extra_rows=extra)


def check_window(cfg: LlmInferConfig, lengths: Lengths, slo: Slo) -> LlmInferConfig:
    """The serving checks' window: the warm-up covers a request's mean decode residence at the TPOT
    SLO (decode tokens × TPOT), so decode slots have filled before the window measures (a 1024-token
    output stays ~50 s), then the configured measured span (duration_s − warmup_s)."""
    out = copy.deepcopy(cfg)
    span = cfg.requests.duration_s - cfg.warmup_s
    out.warmup_s = max(cfg.warmup_s, lengths.decode_tokens * slo.tpot_s)
    out.requests.duration_s = out.warmup_s + span
    return out


def _analytic_only(by_scale: dict, scales: list[float], budget: int, sims: int) -> dict[str, float]:
    res = by_scale[1.0]
    m = {"die_budget": float(budget), "candidates": float(sum(by_scale[k].candidates for k in scales)),
         "iteration_traces_simulated": float(sims),
         "analytic_capacity_req_per_s": res.best.capacity if res.best else 0.0}
    if res.best:
        m.update(_layout_metrics(res.best))
    return m


def oracle_sims(oracle: IterationOracle) -> int:
    return sum(s.iters.simulated for s in oracle._serving.values())


def _att(f: dict, slo: Slo) -> float:
    from workloads.llm_infer.search import attainment
    return attainment(f["ttft"], f["tpot"], slo)


class Checks:
    """The serving checks of one library: every served rate per layout (memoised: each SLO scale's
    bisection reuses them), the finalists' branch and bound."""

    def __init__(self, oracle: IterationOracle, library: str, sc) -> None:  # noqa: ANN001
        self.oracle, self.library, self.sc = oracle, library, sc
        self.bis = Bisection(sc.start_fraction, sc.rate_tolerance, sc.grid_extend, sc.max_extend)
        self.layouts: dict[str, Layout] = {}
        self.stats: dict[str, dict[float, dict]] = {}
        self._frames: dict[str, dict[float, tuple[np.ndarray, np.ndarray]]] = {}
        self.pruned: list[tuple[str, float, float]] = []

    def run(self, name: str, lay: Layout, slo: Slo) -> float:
        """The layout's goodput at `slo` by bisection on the rate (search.goodput_bisect)."""
        frames = self.frames(name)
        return goodput_bisect(lambda rate: self.serve(name, lay, rate), lay.capacity, slo, self.bis, frames)[0]

    def serve(self, name: str, lay: Layout, rate: float) -> tuple[np.ndarray, np.ndarray] | None:
        """One served rate of a layout (memoised), judged; None when the trace holds too few
        requests for it (a goodput stays capped there)."""
        self.layouts.setdefault(name, lay)
        stats = self.stats.setdefault(name, {})
        done = self._frames.setdefault(name, {})
        if rate not in stats:
            try:
                stats[rate] = self.oracle.check(self.library, lay, rate)
            except ConfigError as e:
                if e.field != "workload.requests.rate":
                    raise
                return None
            done[rate] = self._frame(stats[rate])
        return done[rate]

    def _frame(self, f: dict) -> tuple[np.ndarray, np.ndarray]:
        """(TTFT, TPOT) judged against the SLO: a rate the run does not keep up with (served
        fraction below min_served_fraction) has a steady-state TTFT without bound."""
        if self.stable(f):
            return f["ttft"], f["tpot"]
        return np.full(len(f["ttft"]), np.inf), f["tpot"]

    def stable(self, f: dict) -> bool:
        return not f["served_fraction"] < self.sc.min_served_fraction

    def frames(self, name: str) -> dict[float, tuple[np.ndarray, np.ndarray]]:
        """Every served rate's judged (TTFT, TPOT) of a layout, each judged once."""
        done = self._frames.setdefault(name, {})
        for r, f in self.stats.get(name, {}).items():
            if r not in done:
                done[r] = self._frame(f)
        return dict(done)

    @property
    def served(self) -> int:
        return sum(len(x) for x in self.stats.values())

    def finalists(self, layouts: list[Layout], slo: Slo) -> None:
        """Best analytic capacity first; a finalist that cannot beat the best served goodput (its
        capacity × the largest served / analytic ratio so far × (1 + prune_margin)) is skipped."""
        best, ratio = 0.0, 1.0
        for lay in layouts:
            if self.sc.prune and best > 0 and lay.capacity * ratio * (1 + self.sc.prune_margin) < best:
                self.pruned.append((lay.label(), lay.capacity, best))
                continue
            g = self.run(lay.label(), lay, slo)
            best, ratio = max(best, g), max(ratio, g / lay.capacity if lay.capacity > 0 else 1.0)


def _goodput(checks: Checks, finalists: dict[str, Layout], slo: Slo) -> tuple[float, str, bool, float]:
    """The best finalist's goodput on its served rates at `slo` (ties: the first, best analytic),
    and the top of its bracket: the lowest served rate of that layout missing the SLO (NaN: none)."""
    best = (0.0, "", False, np.nan)
    for name, lay in finalists.items():
        frames = checks.frames(name)
        g, capped = goodput_on_grid(frames, slo)
        if g > best[0]:
            miss = first_miss(frames, slo)
            best = (g, lay.label(), capped, np.nan if miss is None else miss)
    return best


def _layout_metrics(lay: Layout) -> dict[str, float | str]:
    p, d = lay.prefill, lay.decode
    return {"prefill_instances": float(lay.n_prefill), "prefill_dp": float(p.dp),
            "decode_instances": float(lay.n_decode), "decode_dp": float(d.dp), "tbo": float(d.tbo),
            "mtp": float(d.mtp), "cloudmatrix_streams": float(d.tbo and d.stream_layout != "none"),
            "decode_max_batch": float(lay.decode_batch or d.max_batch), "prefill_token_budget": float(p.budget), "dies_used": float(lay.dies)}


def _layout_row(library: str, lay: Layout, rank: int) -> dict:
    return {"library": library, "rank": rank, "layout": lay.label(), "capacity_req_per_s": lay.capacity,
            "bound": lay.bound, **_layout_metrics(lay)}


def _role_rows(library: str, res) -> list[dict]:  # noqa: ANN001
    rows = [{"library": library, "role": "prefill", "shape": r.label(), "req_per_s_per_instance": c.rate,
             "per_die": c.rate / r.dp, "limit": c.limit, "step_s": c.step_s, "batch": np.nan,
             "ttft_floor_share": c.ttft_floor_share} for r, c in res.prefill.items()]
    rows += [{"library": library, "role": "decode", "shape": r.label(), "req_per_s_per_instance": c.rate,
              "per_die": c.rate / r.dp, "limit": c.limit, "step_s": c.step_s, "batch": c.batch,
              "ttft_floor_share": np.nan} for r, c in res.decode.items()]
    return rows


class RunOracle:
    """The Oracle of one run's own layout (its iteration model and dies): what the default run's
    load-vs-capacity line prices, with no trace beyond its bisection's decode shapes."""

    def __init__(self, serving: Serving) -> None:
        self.s = serving

    def prefill_s(self, library: str, role: PrefillRole, tokens: int, context: float = 0.0) -> float:
        return self.s.iters.prefill(library, tokens, context=context).time_s

    def decode_s(self, library: str, role: DecodeRole, batch: int, context: float) -> float:
        return self.s.iters.decode(library, batch, context).time_s

    def kv_per_die(self, library: str, role: DecodeRole) -> float:
        return self.s.dies(library, ServingPhase.decode, False)[0].plan.kv

    def batch_limit(self, role: DecodeRole) -> int:
        s = self.s.cfg.scheduler
        return rules.dispatch_token_cap(s) // rules.verify_factor(s, rules.ServingPhase.decode)

    def emitted(self, role: DecodeRole) -> float:
        return rules.emitted_tokens_per_step(self.s.cfg.scheduler)

    def decode_edges(self, role: DecodeRole) -> tuple[int, ...]:
        return (self.s.iters.micro_batch_edge,) if self.s.iters.micro_batch_edge else ()


def load_metrics(serving: Serving, library: str, m: dict[str, float], sample: Requests) -> dict[str, float]:
    """Load as a fraction of capacity: the run's layout's analytic role capacities (search.py, the
    TPOT SLO of workload.capacity; TTFT not binding) against its served rate."""
    cfg = serving.cfg
    p, d, n_p, n_d = configured(cfg)
    lengths = Lengths(sample.input_tokens, sample.output_tokens, serving.kv_tok)
    slo = Slo(float("inf"), cfg.capacity.tpot_p99_slo_s, 1.0)
    o = RunOracle(serving)
    cp, cd = prefill_capacity(o, library, p, lengths, slo), decode_capacity(o, library, d, lengths, slo)
    pc, dc = n_p * cp.rate, n_d * cd.rate
    rate = m["requests_per_s"]
    offered = {"offered_load_fraction": m["offered_req_per_s"] / max(min(pc, dc), 1e-12)} if "offered_req_per_s" in m else {}
    return {"prefill_capacity_req_per_s": pc, "decode_capacity_req_per_s": dc, **offered,
            "load_fraction": rate / max(min(pc, dc), 1e-12), "prefill_load_fraction": rate / max(pc, 1e-12),
            "decode_load_fraction": rate / max(dc, 1e-12), "decode_slo_batch_per_die": float(cd.slo_batch),
            "decode_capacity_batch_per_die": float(cd.batch),
            # the decode batch a die runs as a share of the batch the TPOT SLO allows it
            "decode_batch_fraction": m["mean_decode_batch_per_die"] / max(cd.slo_batch, 1)}


# ASSUMPTION (display): the regime words below capacity — under half of it "under-load", above
# 85 % "near capacity" (an M/M/1 time in system is 1 / (1 − load) service times: ~7 at 85 %)
UNDER_LOAD, NEAR_CAPACITY = 0.5, 0.85


def load_word(offered_fraction: float, served_fraction: float, keep_up: float) -> str:
    """The regime from the offered rate against the layout's analytic capacity: overload when it
    exceeds the capacity, or when the run serves less than `keep_up` of the arrival rate (its
    backlog grows: the analytic capacity is an estimate); below it by the share of capacity."""
    if offered_fraction > 1 or served_fraction < keep_up:  # NaN served: no reading, the analytic side decides
        return "overload"
    if offered_fraction >= NEAR_CAPACITY:
        return "near capacity"
    return "moderate load" if offered_fraction >= UNDER_LOAD else "under-load"


def regime(library: str, m: dict[str, float], model: str, keep_up: float) -> str:
    """One line: the model, where the offered rate sits against the layout's capacity, which side
    binds, and whether the queue keeps up (an overload is named with its backlog growth)."""
    side = "prefill" if m["prefill_capacity_req_per_s"] <= m["decode_capacity_req_per_s"] else "decode"
    cap = min(m["prefill_capacity_req_per_s"], m["decode_capacity_req_per_s"])
    served = m["served_fraction"]
    word = load_word(m["offered_load_fraction"], served, keep_up)
    if not np.isfinite(served):
        queue = "the backlog was not measured (no arrivals in the window)"
    elif served < keep_up:
        role = (ServingPhase.prefill if m.get("prefill_served_fraction", served) <= m.get("decode_served_fraction", np.inf)
                else ServingPhase.decode)
        latency = "ttft_p99_s" if role == ServingPhase.prefill else "e2e_p99_s"
        queue = (f"the {role} queue grows: the run serves {served:.0%} of the arrival rate, the backlog growing by "
                 f"{m['backlog_growth_req_per_s']:.3g} req/s; {latency[:-6].upper()} p99 {m[latency]:.3g} s")
    else:
        queue = f"the queue keeps up (serves {min(served, 1.0):.0%} of the arrival rate)"
    return (f"{library} regime, model {model}: {word}, {side}-bound — {m['offered_req_per_s']:.3g} req/s offered is "
            f"{m['offered_load_fraction']:.0%} of the layout's analytic capacity ({cap:.3g} req/s; prefill "
            f"{m['prefill_capacity_req_per_s']:.3g}, decode {m['decode_capacity_req_per_s']:.3g} req/s at the TPOT "
            f"SLO); {queue}; {m['requests_per_s']:.3g} req/s completed in the window; prefill dies "
            f"{m['prefill_die_busy_fraction']:.0%} busy; decode {m['mean_decode_batch_per_die']:.1f} sequences per die, "
            f"{m['decode_batch_fraction']:.1%} of the {m['decode_slo_batch_per_die']:.0f} the TPOT SLO allows")
