"""Token routing to experts over expert-parallel (EP) ranks, for every workload.

Expert popularity: uniform, a Zipf law over a seeded random placement of popularity ranks (any
expert may be hot), or a given histogram. Experts sit on EP ranks in contiguous blocks of
experts/ep. Three uses share these pieces:

- sampled routing of a batch (`route`, `copies_matrix`; moe, llm_infer): each token picks top_k
  distinct experts with probability proportional to their popularity. High-throughput dispatch
  (DeepEP normal mode) sends a token once to every rank hosting one of its experts; low-latency
  mode sends one copy per selected expert;
- routing over training (`zipf_exponent`, `dispatch_rows`; llm_train): each MoE layer has its own
  placement, the Zipf exponent decays as the gate learns to balance, and every EP rank draws its
  tokens × top_k rows multinomially (seeded by layer and iteration);
- the expected load of the hottest rank (`RoutingModel`; modelcost): fake tensors carry no values,
  so the expert MLP is measured on the row count this model gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from stratacl.errors import ConfigError
from workloads.common.errors import CostInputError
from workloads.moe.schema import ExpertSkew

if TYPE_CHECKING:
    from workloads.llm_train.schema import SkewScheduleConfig


# ---------------------------------------------------------------------------- popularity
def zipf_shares(n_experts: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Share of each expert (sums to 1): 1/rank^exponent, popularity ranks placed by `rng`."""
    p = 1.0 / np.arange(1, n_experts + 1) ** exponent
    return (p / p.sum())[rng.permutation(n_experts)]


def by_rank(per_expert: np.ndarray, ep: int) -> np.ndarray:
    """Sum the last (expert) axis over each EP rank's contiguous block of experts."""
    return per_expert.reshape(*per_expert.shape[:-1], ep, -1).sum(axis=-1)


def expert_weights(experts: int, skew: ExpertSkew | str, zipf_s: float = 1.0,
                   histogram: list[float] | None = None, seed: int = 0) -> np.ndarray:
    # the schemas' vocabulary (llm_infer's RouterSkew is a subset of it); direct callers get the
    # schema's errors too
    if skew not in tuple(ExpertSkew):
        raise ConfigError("workload.skew", f"unknown skew '{skew}'", f"use one of {[m.value for m in ExpertSkew]}")
    if skew == ExpertSkew.zipf:
        if zipf_s < 0:
            raise ConfigError("workload.zipf_s", f"must be ≥ 0, got {zipf_s}")
        return zipf_shares(experts, zipf_s, np.random.default_rng(seed))
    if skew == ExpertSkew.histogram:
        if not histogram or len(histogram) != experts or sum(histogram) <= 0:
            raise ConfigError("workload.histogram", f"needs {experts} non-negative weights, not all 0",
                              "one weight per expert")
        w = np.asarray(histogram, dtype=float)
    else:
        w = np.ones(experts)
    return w / w.sum()


# ---------------------------------------------------------------------------- sampled batches
@dataclass(frozen=True)
class GroupLimit:
    """Node-limited (group-limited) routing, DeepSeek-V3's gate (`n_group`, `topk_group` in its
    config; DeepEP's test_internode.py routes the same way with one group per node): the experts
    are cut into `n_group` contiguous groups, each token first picks `topk_group` groups, then its
    top_k experts only inside them — so it reaches at most `topk_group` groups (nodes, when the
    groups are the nodes' expert blocks). n_group = 0: no limit."""

    n_group: int = 0
    topk_group: int = 0

    def check(self, experts: int, top_k: int, field: str = "workload") -> None:
        if not self.n_group:
            return
        if experts % self.n_group:
            raise ConfigError(f"{field}.n_group", f"{self.n_group} groups do not divide {experts} experts",
                              "use a divisor of the expert count, or 0 for no group limit")
        if not 0 < self.topk_group <= self.n_group:
            raise ConfigError(f"{field}.topk_group", f"must be in 1..{self.n_group}, got {self.topk_group}")
        if top_k > self.topk_group * experts // self.n_group:
            raise ConfigError(f"{field}.topk_group", f"top_k={top_k} experts do not fit in {self.topk_group} "
                              f"groups of {experts // self.n_group}", "raise topk_group or lower top_k")


def route(tokens_per_rank: int, ep: int, experts: int, top_k: int, weights: np.ndarray,
          rng: np.random.Generator, *, placed: bool = False, limit: GroupLimit = GroupLimit()) -> np.ndarray:
    """Chosen experts per token: array (ep, tokens, top_k). k draws with replacement, redrawn for
    the tokens that drew an expert twice (cheap: ~10 % of tokens for top-8 of 256 uniform).
    `placed`: experts sit by a `workloads.common.placement.Placement`, so ep need not divide them.
    `limit`: node-limited routing — each token first draws `topk_group` distinct groups (by their
    summed popularity), and its experts are then drawn inside those groups only."""
    if experts % ep and not placed:
        raise ConfigError("workload.ep", f"{ep} ranks do not divide {experts} experts",
                          "use an EP size that divides the number of experts")
    if not 0 < top_k <= experts:
        raise ConfigError("workload.top_k", f"must be in 1..{experts}, got {top_k}")
    limit.check(experts, top_k)
    n_tok = ep * tokens_per_rank
    if limit.n_group:
        return _route_grouped(n_tok, experts, top_k, weights, rng, limit).reshape(ep, tokens_per_rank, top_k)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return _distinct(lambda rows: np.searchsorted(cdf, rng.random((rows.size, top_k)), side="right"),
                     n_tok, top_k, experts).reshape(ep, tokens_per_rank, top_k)


def _distinct(draw_rows: Callable[[np.ndarray], np.ndarray], n_tok: int, k: int, hi: int) -> np.ndarray:
    """k distinct draws per row: `draw_rows(rows)` draws k values for each of `rows` (values ≥ hi
    clipped); rows that drew a value twice are drawn again (rejection: distinct draws ∝ weights)."""
    choice = np.empty((n_tok, k), dtype=np.int64)
    todo = np.arange(n_tok)
    for _ in range(1000):
        draw = np.minimum(draw_rows(todo), hi - 1)
        srt = np.sort(draw, axis=1)
        ok = (np.diff(srt, axis=1) != 0).all(axis=1)
        choice[todo[ok]] = draw[ok]
        todo = todo[~ok]
        if todo.size == 0:
            return choice
    raise ConfigError("workload.zipf_s", "expert popularity too concentrated to draw top_k distinct "
                      "experts", "lower the skew or top_k")


def _route_grouped(n_tok: int, experts: int, top_k: int, weights: np.ndarray, rng: np.random.Generator,
                   limit: GroupLimit) -> np.ndarray:
    """Node-limited draw: topk_group distinct groups ∝ group popularity, then top_k distinct
    experts ∝ popularity among the chosen groups' experts (a group drawn ∝ its weight, an expert
    inside it ∝ its weight)."""
    size = experts // limit.n_group
    w = np.asarray(weights, dtype=float) / np.sum(weights)
    gw = w.reshape(limit.n_group, size).sum(axis=1)
    gcdf = np.cumsum(gw) / gw.sum()
    groups = _successive(lambda r: np.searchsorted(gcdf, rng.random((r.size, limit.topk_group)), side="right"),
                         n_tok, limit.topk_group, limit.n_group)
    cdf = np.concatenate([[0.0], np.cumsum(w)])
    gsel = gw[groups]  # (n_tok, topk_group) weights of the chosen groups
    gsel_cdf = np.cumsum(gsel, axis=1)
    gsel_cdf /= gsel_cdf[:, -1:]

    def draw(rows: np.ndarray) -> np.ndarray:
        u = rng.random((rows.size, top_k))
        pos = np.minimum((u[..., None] >= gsel_cdf[rows][:, None, :]).sum(axis=2), limit.topk_group - 1)
        g = np.take_along_axis(groups[rows], pos, axis=1)
        # inside group g: the expert whose cumulative popularity interval holds the draw
        target = cdf[g * size] + rng.random((rows.size, top_k)) * gw[g]
        e = np.searchsorted(cdf, target, side="right") - 1
        return np.clip(e, g * size, g * size + size - 1)

    return _successive(draw, n_tok, top_k, experts)


def _successive(draw_rows: Callable[[np.ndarray], np.ndarray], n_tok: int, k: int, hi: int) -> np.ndarray:
    """k distinct draws per row, successively: a value already drawn earlier in its row is drawn
    again (sampling without replacement ∝ the weights; converges where whole-row rejection would
    not, e.g. top_k close to a small, skewed group's size)."""
    rows = np.arange(n_tok)
    choice = np.minimum(draw_rows(rows), hi - 1)
    earlier = np.tril(np.ones((k, k), dtype=bool), -1)
    for _ in range(10000):  # only the rows redrawn last round can hold a duplicate
        sub = choice[rows]
        dup = ((sub[:, :, None] == sub[:, None, :]) & earlier).any(axis=2)
        bad = dup.any(axis=1)
        rows, sub, dup = rows[bad], sub[bad], dup[bad]
        if rows.size == 0:
            return choice
        sub[dup] = np.minimum(draw_rows(rows), hi - 1)[dup]
        choice[rows] = sub
    raise ConfigError("workload.zipf_s", "expert popularity too concentrated to draw top_k distinct "
                      "experts in the allowed groups", "lower the skew or top_k, or raise topk_group")


def group_tokens(dest: np.ndarray, n: int) -> np.ndarray:
    """The (token, destination block) counts a node-deduplicating dispatch needs, for every node
    size a fabric could give the group: for each divisor g of n (ascending, from g = 1: the tokens
    per destination rank), the n × n/g matrix of tokens member s sends to at least one member of
    block j = members j·g … j·g+g−1, flattened and concatenated (the trace's `Op.group_tokens`).
    `dest`: (n, tokens, c) destination member of each routed copy (< 0: none)."""
    src, tokens, c = dest.shape
    assert src == n
    out = []
    for g in range(1, n + 1):
        if n % g:
            continue
        blk = np.where(dest >= 0, dest // g, -1)
        srt = np.sort(blk, axis=2)
        first = np.ones(srt.shape, dtype=bool)
        first[..., 1:] = srt[..., 1:] != srt[..., :-1]
        first &= srt >= 0
        s_idx = np.broadcast_to(np.arange(n)[:, None, None], srt.shape)
        out.append(np.bincount((s_idx * (n // g) + srt)[first], minlength=n * (n // g)))
    return np.concatenate(out).astype(float) if out else np.zeros(0)


def copies_matrix(choice: np.ndarray, ep: int, experts: int, per_expert: bool) -> np.ndarray:
    """Token copies from each source rank (row) to each destination rank (column)."""
    dest = choice // (experts // ep)  # (ep, tokens, k) destination rank of each selected expert
    out = np.zeros((ep, ep))
    for src in range(ep):
        d = dest[src]
        if per_expert:
            out[src] = np.bincount(d.ravel(), minlength=ep)
        else:  # one copy per distinct destination rank of each token
            hit = np.zeros((d.shape[0], ep), dtype=bool)
            np.put_along_axis(hit, d, True, axis=1)
            out[src] = hit.sum(axis=0)
    return out


# ---------------------------------------------------------------------------- over training
def zipf_exponent(schedule: SkewScheduleConfig, iteration: int) -> float:
    """``end + (start − end)·exp(−iteration / decay_iters)``: skew decays as the gate balances."""
    return schedule.end + (schedule.start - schedule.end) * math.exp(-iteration / schedule.decay_iters)


def dispatch_rows(ep: int, n_experts: int, top_k: int, tokens_per_rank: int, exponent: float,
                  seed: int, layer: int, iteration: int) -> np.ndarray:
    """ep × ep rows matrix: rows[i, j] = (token, expert) rows EP rank i sends to EP rank j. Each
    layer's placement of popularity is stable over training (seeded by layer only)."""
    shares = zipf_shares(n_experts, exponent, np.random.default_rng([seed, layer, 0]))
    rng = np.random.default_rng([seed, layer, iteration, 1])
    return by_rank(rng.multinomial(tokens_per_rank * top_k, shares, size=ep), ep)  # ep × n_experts -> ep × ep


# Tokens per EP rank routed token by token for a training layer (ASSUMPTION, a knob of speed, not
# of physics): the rest follow the same distribution, counts are scaled up. Routing all 4,096
# tokens × 64 ranks × 58 layers per iteration would take about a minute; 256 keeps the summed
# (token, rank) and (token, node) counts within ~1 % (relative noise ~ 1/sqrt(256 · ep · top_k)).
TRAIN_SAMPLE_TOKENS = 256


@dataclass(frozen=True)
class EpRouting:
    """One MoE layer's routing over an EP group, as the dispatch/combine needs it."""

    rows: np.ndarray  # ep × ep (token, expert) rows rank i sends to rank j (the experts' work)
    copies: np.ndarray  # ep × ep tokens rank i sends to rank j, once per distinct destination rank
    group_tokens: np.ndarray  # (token, block) counts of every block size (Op.group_tokens)


def model_group_limit(config: object) -> GroupLimit:
    """The node-limited routing a model's config states (DeepSeek-V3 and its successors: `n_group`
    expert groups, `topk_group` of them per token); none when it has no such fields or one group."""
    n, k = int(getattr(config, "n_group", 0) or 0), int(getattr(config, "topk_group", 0) or 0)
    return GroupLimit(n, k) if n > 1 and k > 0 else GroupLimit()


def ep_routing(ep: int, n_experts: int, top_k: int, tokens_per_rank: int, exponent: float, seed: int,
               layer: int, iteration: int, limit: GroupLimit = GroupLimit(),
               sample: int = TRAIN_SAMPLE_TOKENS) -> EpRouting:
    """Token-by-token routing of a training layer (`dispatch_rows`' popularity placement and
    skew), so a dispatch knows its distinct destination ranks and nodes: `sample` tokens per rank
    are routed, the counts scaled to `tokens_per_rank`."""
    shares = zipf_shares(n_experts, exponent, np.random.default_rng([seed, layer, 0]))
    n = min(sample, tokens_per_rank)
    choice = route(n, ep, n_experts, top_k, shares, np.random.default_rng([seed, layer, iteration, 1]),
                   limit=limit)
    scale = tokens_per_rank / n
    dest = choice // (n_experts // ep)
    rows = copies_matrix(choice, ep, n_experts, per_expert=True) * scale
    copies = copies_matrix(choice, ep, n_experts, per_expert=False) * scale
    return EpRouting(rows, copies, group_tokens(dest, ep) * scale)


def imbalance(rows: np.ndarray) -> float:
    """Max over mean rows received per EP rank (1 = perfectly balanced)."""
    recv = rows.sum(axis=0)
    return float(recv.max() / recv.mean())


# ---------------------------------------------------------------------------- expected load
@dataclass(frozen=True)
class RoutingModel:
    """Expected routing: uniform gives every rank tokens × top_k rows (each of ep ranks sends T·k
    rows spread over ep ranks); a Zipf skew makes costs follow the hottest rank (critical path)."""

    kind: str = "uniform"  # "uniform" | "zipf"
    skew: float = 0.0      # Zipf exponent for kind="zipf" (0 = uniform)
    seed: int = 0          # which experts are hot (random placement of popularity ranks)

    def __post_init__(self) -> None:
        if self.kind not in ("uniform", "zipf"):
            raise CostInputError(f"routing.kind: {self.kind!r}; valid options: uniform, zipf")
        if self.skew < 0:
            raise CostInputError(f"routing.skew: must be >= 0, got {self.skew}")

    def expert_share(self, n_experts: int) -> np.ndarray:
        """Fraction of routed rows each expert receives (sums to 1)."""
        if self.kind == "uniform" or self.skew == 0:
            return np.full(n_experts, 1.0 / n_experts)
        return zipf_shares(n_experts, self.skew, np.random.default_rng(self.seed))

    def rank_load(self, n_experts: int, ep: int) -> np.ndarray:
        """Relative load of each EP rank; mean 1."""
        if n_experts % ep:
            raise CostInputError(f"ep: {ep} does not divide n_routed_experts={n_experts}")
        return by_rank(self.expert_share(n_experts), ep) * ep

    def rows_on_rank(self, tokens: int, top_k: int, n_experts: int, ep: int) -> int:
        """Rows the hottest EP rank's experts process when every rank holds `tokens` tokens."""
        return int(math.ceil(tokens * top_k * float(self.rank_load(n_experts, ep).max())))
