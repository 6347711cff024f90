"""Prefix reuse of serving: a two-tier KV block cache keyed by the trace's prefix-block ids.

Tiers (`workload.prefix_cache`):
- HBM: per prefill instance, the KV space its dies' allocator model leaves (memory.MemoryPlan.kv)
  less one longest prompt per die kept for the prompts in flight; a request's cached blocks are
  assumed to sit on the die it is scheduled on (cache-aware DP routing, as SGLang's router does).
- DRAM pool: CloudMatrix-Infer's elastic memory service (EMS, arXiv 2506.12708; REFERENCE §1 "CPU on
  UB ... DRAM pooled over UB (EMS)"): the host DRAM of the deployment's nodes, pooled over UB and
  shared by every prefill instance; a block there is fetched into the die's HBM over the fabric
  (the die's port and its node's CPU port). Every newly prefilled block is written through to the
  pool (Mooncake, FAST 2025: the prefill node stores the incremental KV back into the CPU-memory
  pool), which also loads the host port.

Lookup is a longest-prefix match (an id names its whole prefix: a radix-tree match, vLLM automatic
prefix caching / SGLang RadixAttention), block by block in HBM, else in the pool, stopping at the
first block in neither. At least one prompt token is always computed (vLLM recomputes the last
token of a full hit to produce the first output token). Each tier evicts its least recently used
block (vLLM's free-block queue and SGLang's radix cache both evict LRU). Every block of a prefilled
request is then (re)inserted, so a tier's contents follow the same reference stream whatever hit —
LRU's inclusion property: a larger tier never holds fewer of the blocks asked for.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


class LruBlocks:
    """A set of block ids of bounded size that evicts the least recently used."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, int(capacity))
        self._ids: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, block: int) -> bool:
        return block in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def touch(self, block: int) -> None:
        """Insert or refresh `block` as most recently used, evicting the LRU block beyond capacity."""
        if not self.capacity:
            return
        self._ids[block] = None
        self._ids.move_to_end(block)
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)


@dataclass(frozen=True)
class Hit:
    """What a request's lookup found: blocks and tokens reused from each tier."""

    hbm_blocks: int = 0
    pool_blocks: int = 0
    hbm_tokens: int = 0
    pool_tokens: int = 0

    @property
    def blocks(self) -> int:
        return self.hbm_blocks + self.pool_blocks

    @property
    def tokens(self) -> int:
        return self.hbm_tokens + self.pool_tokens


MISS = Hit()


def block_tokens(input_tokens: int, n_blocks: int, block: int) -> np.ndarray:
    """Tokens of each of a prompt's blocks: full blocks, the last one holding the rest."""
    sizes = np.full(n_blocks, block, dtype=np.int64)
    if n_blocks:
        sizes[-1] = input_tokens - block * (n_blocks - 1)
    return sizes


class PrefixCache:
    """The HBM tier of each prefill instance and the shared DRAM pool (capacities in blocks)."""

    def __init__(self, instances: int, hbm_blocks: int, pool_blocks: int, block: int) -> None:
        self.hbm = [LruBlocks(hbm_blocks) for _ in range(instances)]
        self.pool = LruBlocks(pool_blocks)
        self.block = block

    def lookup(self, instance: int, ids: np.ndarray, input_tokens: int) -> Hit:
        """The longest cached prefix of a prompt (touching what it hits), at most `input_tokens` − 1
        tokens."""
        hbm, sizes = self.hbm[instance], block_tokens(input_tokens, len(ids), self.block)
        h = p = ht = pt = 0
        for b, n in zip(ids.tolist(), sizes.tolist(), strict=True):
            n = min(n, input_tokens - 1 - ht - pt)
            if n <= 0:
                break
            if b in hbm:
                hbm.touch(b)
                h, ht = h + 1, ht + n
            elif b in self.pool:
                self.pool.touch(b)
                p, pt = p + 1, pt + n
            else:
                break
        return Hit(h, p, ht, pt)

    def insert(self, instance: int, ids: np.ndarray) -> None:
        """A prefilled prompt's blocks, most recent last: into its instance's HBM and the pool."""
        hbm = self.hbm[instance]
        for b in ids.tolist():
            hbm.touch(b)
            self.pool.touch(b)


def tier_blocks(kv_per_die: float, dies: int, kv_tok: float, longest_prompt: int, hbm_share: float,
                pool_bytes: float, block: int) -> tuple[int, int]:
    """(HBM blocks of one prefill instance, DRAM-pool blocks): an instance's `dies` dies each give
    `hbm_share` of the KV space their allocator model leaves (`kv_per_die`) beyond one longest
    prompt in flight; the pool its `pool_bytes`. A block holds `block` tokens' KV."""
    block_bytes = block * kv_tok
    if block_bytes <= 0:
        return 0, 0
    spare = max(0.0, kv_per_die - kv_tok * longest_prompt) * hbm_share
    return int(dies * spare // block_bytes), int(pool_bytes // block_bytes)


def prefix_metrics(req, kv_tok: float) -> dict[str, float]:  # noqa: ANN001 - the request frame
    """Hit rates (blocks, tokens; per tier) over `req`'s prefilled requests, the KV bytes the
    pool served and the reused prefixes' KV bytes sent on to decode (the whole prompt's KV goes)."""
    done = req[req["prefill_start_s"].notna()]
    blocks = float(done["prefix_blocks"].sum())
    tokens = float(done["input_tokens"].sum())
    hb, pb = float(done["hbm_hit_blocks"].sum()), float(done["pool_hit_blocks"].sum())
    ht, pt = float(done["hbm_hit_tokens"].sum()), float(done["pool_hit_tokens"].sum())
    return {"prefix_hit_rate_blocks": (hb + pb) / blocks if blocks else 0.0,
            "prefix_hit_rate_tokens": (ht + pt) / tokens if tokens else 0.0,
            "prefix_hbm_hit_rate_blocks": hb / blocks if blocks else 0.0,
            "prefix_pool_hit_rate_blocks": pb / blocks if blocks else 0.0,
            "prefix_pool_fetch_GB": pt * kv_tok / 1e9,
            "prefix_kv_to_decode_GB": (ht + pt) * kv_tok / 1e9}
