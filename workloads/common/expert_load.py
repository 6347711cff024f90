"""How unevenly a trained MoE router loads the EP ranks, from a published measurement.

The router's expert popularity is a Zipf law over a seeded random placement of popularity ranks
(`routing.zipf_shares`); its exponent is not guessed but derived from a measured load figure:

- **UltraEP** (arXiv 2606.04101, abstract): across production MoE models of 106B to 671B
  parameters (DeepSeek-V3's 256 routed experts, top-8, at the top end), in training and in serving
  prefill, with the models' own trained gate balancing but **no system-level balancer**, the final
  inter-rank imbalance (the busiest EP rank's tokens over the mean rank's) is **1.30 to 4.01**;
  UltraEP's exact per-micro-batch rebalancing brings it to 1.01 to 1.04 (the sampling floor of
  large batches). Regime: large batches (training micro-batches, prefill chunks), EP groups inside
  one rack-scale node, static contiguous placement.

The default figure is the range's geometric centre, 2.28 (the ends are the knob's sensible range:
the source does not say which model sits where). The derivation places the experts contiguously on
`ep` ranks (the source's non-balancing baseline), averages the busiest rank's expected share over
`PLACEMENTS` random popularity placements (a model's layers each have their own hot experts) and
solves for the exponent; at these batches (thousands of tokens per rank) the sampling noise is well
under 1 % and is left out of the derivation. A run then applies that exponent to its own model,
placement (EPLB with redundant experts, one expert per die) and batch: the per-die load it prices
follows from the placement and the finite batch's sampling noise (`routing.route`), not from the
figure directly.

Other sources, what they say and why they are not the default:
- LMSYS, "Deploying DeepSeek with PD Disaggregation and Large-scale EP on 96 H100 GPUs" (2025-05-05,
  lm-sys.github.io blog/2025-05-05-large-scale-ep.md): "most experts are infrequently used, while a
  small subset is heavily utilized"; imbalance grows with EP size; larger batches reduce its random
  part; EPLB's throughput gains 1.49x (prefill) / 2.54x (decode) are system-level figures (never
  fitted); its balancedness plots are images without numbers in the text.
- LMSYS, "Improving DeepEP MoE Load Balance in SGLang with Waterfill and LPLB" (2026-06-26): after
  static EPLB a batch still loads ranks unevenly; LPLB's per-batch replica split +0.84 to +7.34 %
  throughput at EP16 (system level: a check, never a fit).
- Auxiliary-loss-free balancing (arXiv 2408.15664) reports MaxVio over training; its figures were not
  reachable from this workplace's corpora, so training uses the same figure as serving (no schedule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from stratacl.errors import ConfigError
from stratacl.workload_config import knob
from workloads.common.routing import by_rank, expert_weights, zipf_shares
from workloads.moe.schema import ExpertSkew

# UltraEP (arXiv 2606.04101) abstract: inter-rank imbalance without a system balancer
NO_BALANCER_LOW, NO_BALANCER_HIGH = 1.30, 4.01
NO_BALANCER_CENTRE = round(math.sqrt(NO_BALANCER_LOW * NO_BALANCER_HIGH), 3)  # 2.283
PLACEMENTS = 64  # random popularity placements averaged (a model's layers each place theirs)
MAX_EXPONENT = 4.0  # beyond this one expert takes nearly all rows: no trained router's regime


@dataclass
class ExpertLoadConfig:
    """The measured router load the Zipf exponent is derived from (`zipf_s` > 0 overrides it)."""

    # the busiest EP rank's rows over the mean rank's without a system balancer (UltraEP 2606.04101:
    # 1.30-4.01 over 106B-671B models; default the range's geometric centre; knob in that range)
    imbalance: float = knob(NO_BALANCER_CENTRE, ge=1.0)
    # ASSUMPTION: the EP size of that measurement (an EP group inside one rack-scale node; the
    # abstract gives none): 64 of an NVL72's GPUs. 32 gives a steeper law (0.58 against 0.42)
    ep: int = knob(64, ge=2)


def static_imbalance(exponent: float, experts: int, ep: int, placements: int = PLACEMENTS) -> float:
    """The busiest of `ep` ranks' expected share of the routed rows over the mean rank's, experts in
    contiguous blocks, averaged over `placements` seeded popularity placements (no sampling noise)."""
    if experts % ep:
        raise ConfigError("workload.expert_load.ep", f"{ep} ranks do not divide {experts} experts",
                          "use a divisor of the model's routed-expert count")
    peaks = [by_rank(zipf_shares(experts, exponent, np.random.default_rng([k])), ep).max() * ep
             for k in range(placements)]
    return float(np.mean(peaks))


@lru_cache(maxsize=64)
def zipf_for_imbalance(imbalance: float, experts: int, ep: int) -> float:
    """The Zipf exponent at which `static_imbalance` equals `imbalance` (bisection: the busiest
    rank's share rises monotonically with the exponent under the common random placements)."""
    # the figure's ranks holding whole expert blocks of this model: the largest EP size dividing both
    # (a model with fewer experts than the figure's ranks: one expert per rank)
    ep = math.gcd(experts, ep)
    if imbalance <= 1.0:
        return 0.0
    if ep < 2:
        raise ConfigError("workload.expert_load.ep", f"no EP size of 2 or more divides both it and the model's "
                          f"{experts} routed experts", "use a power of two (the measurement's EP group: 64)")
    hi_val = static_imbalance(MAX_EXPONENT, experts, ep)
    if imbalance > hi_val:
        raise ConfigError("workload.expert_load.imbalance", f"{imbalance} is beyond any Zipf law over {experts} "
                          f"experts on {ep} ranks (at most {hi_val:.2f})",
                          f"use a figure in the measured range {NO_BALANCER_LOW}-{NO_BALANCER_HIGH}")
    lo, hi = 0.0, MAX_EXPONENT
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if static_imbalance(mid, experts, ep) < imbalance:
            lo = mid
        else:
            hi = mid
    return round(0.5 * (lo + hi), 4)


def router_exponent(zipf_s: float, load: ExpertLoadConfig, experts: int) -> float:
    """The knob when set (> 0), else the exponent derived from the measured load figure."""
    if zipf_s > 0 or experts < 2:
        return float(zipf_s)
    return zipf_for_imbalance(float(load.imbalance), experts, int(load.ep))


def router_shares(skew: ExpertSkew | str, zipf_s: float, load: ExpertLoadConfig, experts: int,
                  seed: int) -> np.ndarray:
    """Each expert's share of the routed rows (sums to 1): `skew`'s law, a Zipf one with the
    exponent `router_exponent` gives."""
    return expert_weights(experts, skew, router_exponent(zipf_s, load, experts), seed=seed)


def describe_law(skew: ExpertSkew | str, zipf_s: float, load: ExpertLoadConfig, experts: int) -> tuple[float, str]:
    """The router's Zipf exponent and where it came from, for a run's notes."""
    if skew != ExpertSkew.zipf:
        return 0.0, f"workload.skew={skew}"
    if zipf_s > 0:
        return float(zipf_s), "workload.zipf_s"
    return router_exponent(0.0, load, experts), (
        f"derived from expert_load.imbalance {load.imbalance:g} at EP{load.ep}, UltraEP arXiv 2606.04101: "
        f"the busiest rank's rows over the mean without a balancer, {NO_BALANCER_LOW}-{NO_BALANCER_HIGH} measured")


@dataclass(frozen=True)
class DieLoad:
    """The per-die expert rows a run priced: mean, busiest, and their ratio."""

    mean: float
    max: float

    @property
    def ratio(self) -> float:
        return self.max / self.mean if self.mean > 0 else 1.0

    @staticmethod
    def of(rows: np.ndarray) -> DieLoad:
        r = np.asarray(rows, dtype=float)
        return DieLoad(float(r.mean()), float(r.max()))

    def line(self, what: str) -> str:
        return f"{what}: mean {self.mean:,.1f}, max {self.max:,.1f} rows/die (max/mean {self.ratio:.2f})"
