"""Attention as production kernels compute it: which keys each query visits, and the cost.

transformers' reference modules compute sparse and windowed attention as dense masked
attention (every query against every key, the mask adding -inf), and MLA decode re-expands
the whole latent cache through `kv_b_proj` each step. A production kernel visits only the
keys the mask leaves open. This module reads, from a layer's own modules, which keys those
are, and prices the kernel in closed form. The projections around the kernel (q/kv/o,
compressors, the indexer's own projections) stay measured from the real modules
(`attn_hooks.py` cuts the kernel out of the measurement).

Token sets. A query at absolute position p (keys 0..p are causal; n = p + 1). Read from
transformers 5.24, site-packages/transformers/:

* Sliding window W: the `sliding_window` the layer passes to its attention interface
  (modeling_deepseek_v4.py:866 and every Llama-family model with a window), applied by
  masking_utils.py:97 `kv_idx > q_idx - sliding_window`: min(W, n) raw keys.
* Compressor of rate m (`self_attn.compressor.compress_rate`, DeepSeek-V4 CSA/HCA): entry w
  is visible iff w < (p + 1) // m (modeling_deepseek_v4.py:449 HCA block_bias, :589 CSA
  indexer `causal_threshold`): floor(n / m) compressed entries.
  - HCA (no indexer): the kernel visits all of them.
  - CSA (`compressor.indexer`): `top_k = min(index_topk, compressed_len)` with picks past the
    causal threshold dropped (:580-593): min(index_topk, floor(n / m)) entries; the indexer
    scores floor(n / m) compressed keys at index_n_heads x index_head_dim.
* DeepSeek-V3.2 DSA (`self_attn.indexer`, rate 1): scores masked by the causal mask, then
  `topk = min(self.index_topk, ...)` (modeling_deepseek_v32.py:235-242) and the attention
  mask keeps only those: the indexer scores n keys, attention visits min(index_topk, n).
* Otherwise n keys (dense causal; used only for MLA decode, see below).

Which layers are replaced: any layer with a window, a compressor or an indexer, in every
phase; MLA layers (`kv_lora_rank` on the layer) in decode. Dense layers keep the reference
measurement (which counts the full S x (context + S) rectangle, no causal skip).

Kernel forms (cube FLOPs count a multiply-add as 2; vector work is one op per score
element, the convention `counter.py` uses for fused attention kernels):

* Multi-head over the heads and dims of the q/k/v the layer hands its attention interface:
  2·H·(d_qk + d_v) cube and H vector per visited key. DeepSeek-V4 is not MLA in
  transformers 5.x: `kv_proj` makes one shared 512-wide head used as both K and V
  (:789 `num_key_value_groups = num_attention_heads`, :836 `cache.update(kv, kv, ...)`),
  so its kernel already runs over the latent-sized cache; there is nothing to absorb.
* MLA (DeepSeek-V3, V3.2; reference: `expand_kv` at modeling_deepseek_v32.py:434 runs
  `kv_b_proj` over every cached key), two kernel forms:
  - absorbed, MQA over the latent (FlashMLA decode and sparse kernels; DeepSeek-V3.2-Exp
    report §2 "DSA under the MQA mode of MLA"): per query token W_UK absorption 2·H·d_nope·r
    and W_UV up-projection 2·H·r·d_v; per visited key 2·H·(r + d_rope) + 2·H·r.
  - expanded, MHA (SGLang's short-prefill path for V3.2, sgl-project/sglang PR 11892; the
    indexer's top-k then only masks): `kv_b_proj` over all C + q keys 2·r·H·(d_nope + d_v),
    then 2·H·(d_qk + d_v) per key of the dense causal range.
  The kernel takes the form with fewer cube FLOPs; for decode that is always absorbed.
* Indexer (DeepGEMM-style MQA logits over the causal range, then top-k): cube 2·H_I·d_I,
  vector H_I (ReLU, weighted head sum) + 1 (top-k selection) per scored key.

Matmul shapes (`CoreCost.gemms`, (m, n, k, count)): QKᵀ as (q_len·g, kv_len, d_qk, B·H/g) and PV as
(q_len·g, d_v, kv_len, B·H/g) per sequence batch, g the query heads sharing one KV head, which the
kernels stack into rows (GQA groups; all H for MLA's latent MQA and the indexer); when queries visit different key counts (causal,
windowed, selected) the visited keys are spread over the queries as evenly as integers allow
(rows with ⌈keys/q⌉ and with ⌊keys/q⌋ keys), so Σ 2·m·n·k·count equals the cube FLOPs exactly. MLA
absorbed: the per-token absorption (tokens, r, d_nope, H) and up-projection (tokens, d_v, r, H), the
latent MQA as QKᵀ over r + d_rope and PV over r per query head (heads share the one latent KV
head: a kernel may pack them into rows). Expanded: `kv_b_proj` (keys, H·(d_nope + d_v), r, B), then
MHA. Indexer: (q, scored keys, index_head_dim, B·H_I). Backward: the forward's matmuls twice.

HBM bytes. Unfused: the kernel's ops' inputs + outputs (the counter's convention): indexer
logits (q_I, index keys, head weights in; fp32 logits out), top-k (logits in, int32 indices
out), attention (q, the KV entries it touches, out), MLA absorption / expansion matmuls.
Fused (`costs.py`): the measured KV-cache read minus the cached entries no query selects
(`kv_unread_bytes`; a decode query reads its top-k, not the whole cache).

Training backward: no gradient reaches the indexer (V3.2: `@torch.no_grad`,
modeling_deepseek_v32.py:178; V4: its scores only feed top-k), so the backward kernel is
the attention's: cube 2x the forward's (dQ, dK, dV, dP: four matmuls, as torch's
`sdpa_backward_flop_count`), vector one op per score element, bytes 2x the forward's.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from workloads.common.model_schema import AttentionKernels

from .flops import ragged
from .phase import CostPhase

ATTENTION_MODES = tuple(m.value for m in AttentionKernels)  # the schema's vocabulary (workloads.common.model_schema)
# Config attribute / override key that picks the mode when `ModelCosts(attention=...)` is not given.
ATTENTION_KEY = "modelcost_attention"


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention dims of a layer (per TP rank)."""

    heads: int
    rank: int   # kv_lora_rank r
    rope: int   # qk_rope_head_dim
    nope: int   # qk_nope_head_dim
    v: int      # v_head_dim


@dataclass(frozen=True)
class Indexer:
    topk: int
    heads: int
    dim: int
    rate: int  # 1: scores raw tokens (V3.2 DSA); m: scores the compressor's entries (V4 CSA)


@dataclass(frozen=True)
class AttnStructure:
    """What a layer's modules say about its attention, before any call."""

    mla: Mla | None
    compress_rate: int  # 0: no compressor
    indexer: Indexer | None

    @property
    def sparse(self) -> bool:
        return self.compress_rate > 0 or self.indexer is not None

    def replaced(self, phase: str, window: int | None = None) -> bool:
        """Does a production kernel differ from the reference here?"""
        return self.sparse or window is not None or (self.mla is not None and phase == CostPhase.decode)


@dataclass(frozen=True)
class AttnCall:
    """The q/k/v a layer hands its attention interface (read at the call)."""

    heads: int
    kv_heads: int
    d_qk: int
    d_v: int
    window: int | None
    shared_kv: bool  # K and V are one tensor (DeepSeek-V4)


def read_structure(attn: nn.Module) -> AttnStructure:
    """Read MLA dims, the compressor and the indexer off a layer's attention module."""
    mla = None
    if getattr(attn, "kv_lora_rank", None) and hasattr(attn, "kv_b_proj"):
        mla = Mla(int(attn.num_heads), int(attn.kv_lora_rank), int(attn.qk_rope_head_dim),
                  int(attn.qk_nope_head_dim), int(attn.v_head_dim))
    comp = getattr(attn, "compressor", None)
    rate = int(getattr(comp, "compress_rate", 0) or 0) if comp is not None else 0
    ix = find_indexer(attn)
    indexer = None
    if ix is not None:
        heads = getattr(ix, "num_heads", None) or ix.n_heads  # V4 names it num_heads, V3.2 n_heads
        indexer = Indexer(int(ix.index_topk), int(heads), int(ix.head_dim), int(getattr(ix, "compress_rate", 1)))
    return AttnStructure(mla, rate, indexer)


def find_indexer(attn: nn.Module) -> nn.Module | None:
    return next((m for m in attn.modules() if hasattr(m, "index_topk")), None)


# ---- token sums: sum over n = a..b (n = position + 1) ---------------------------------------
def _tri(n: int) -> int:
    return n * (n + 1) // 2


def _cum_min(b: int, cap: int | None) -> int:
    """sum_{n=1..b} min(cap, n)."""
    if b <= 0:
        return 0
    if cap is None or b <= cap:
        return _tri(b)
    return _tri(cap) + cap * (b - cap)


def _cum_floor(b: int, m: int, cap: int | None) -> int:
    """sum_{n=1..b} min(cap, n // m)."""
    if b <= 0:
        return 0
    if cap is not None and b // m > cap:
        return _cum_floor(cap * m - 1, m, None) + cap * (b - cap * m + 1)
    q, r = divmod(b, m)
    return m * q * (q - 1) // 2 + q * (r + 1)


def sum_min(a: int, b: int, cap: int | None) -> int:
    """sum_{n=a..b} min(cap, n) (cap None: no cap)."""
    return _cum_min(b, cap) - _cum_min(a - 1, cap)


def sum_floor(a: int, b: int, m: int, cap: int | None = None) -> int:
    """sum_{n=a..b} min(cap, n // m)."""
    return _cum_floor(b, m, cap) - _cum_floor(a - 1, m, cap)


@dataclass(frozen=True)
class TokenSums:
    """Keys summed over one sequence's queries."""

    visited: int   # keys the sparse/windowed kernel visits (window + selected + compressed)
    dense: int     # the same without the indexer's selection (masked MHA visits these)
    scored: int    # keys the indexer scores
    touched: int   # distinct KV entries the sparse kernel reads (all queries together)
    unread: int    # cached entries eligible for selection that no query reads
    stored: int    # KV entries the kernel's inputs hold (cached + new; window cache: window)


def token_sums(s: AttnStructure, window: int | None, context: int, q_len: int) -> TokenSums:
    a, b = context + 1, context + q_len
    raw_cap = window
    ix = s.indexer
    if ix is not None and ix.rate == 1:  # DSA selects among raw tokens
        raw_cap = ix.topk if raw_cap is None else min(raw_cap, ix.topk)
    raw_dense = sum_min(a, b, window)
    raw = sum_min(a, b, raw_cap)
    raw_stored = min(context + q_len, q_len + window - 1) if window else context + q_len
    raw_touched = min(raw_stored, q_len * raw_cap) if raw_cap else raw_stored
    raw_unread = context - min(context, q_len * ix.topk) if ix is not None and ix.rate == 1 else 0
    comp = comp_dense = comp_stored = comp_touched = comp_unread = 0
    if s.compress_rate:
        m = s.compress_rate
        sel = ix.topk if ix is not None and ix.rate == m else None
        comp_dense = sum_floor(a, b, m)
        comp = sum_floor(a, b, m, sel)
        comp_stored = (context + q_len) // m
        comp_touched = min(comp_stored, q_len * sel) if sel else comp_stored
        cached = context // m
        comp_unread = cached - min(cached, q_len * sel) if sel else 0
    scored = sum_floor(a, b, ix.rate) if ix is not None else 0
    return TokenSums(raw + comp, raw_dense + comp_dense, scored, raw_touched + comp_touched,
                     raw_unread + comp_unread, raw_stored + comp_stored)


@dataclass(frozen=True)
class CoreCost:
    """Per-rank cost of one layer's attention kernel (plus indexer) at one shape."""

    form: str               # "mha" | "mla_absorbed" | "mla_expanded"
    cube_flops: int
    vector_flops: int
    hbm_bytes: int          # the kernel ops' inputs + outputs
    kv_unread_bytes: int    # cached KV bytes no query reads (subtracted from the fused read)
    visited_keys: int       # summed over all queries of all sequences
    scored_keys: int
    gemms: tuple[tuple[int, int, int, int], ...] = ()  # (m, n, k, count); Σ 2·m·n·k·count = cube_flops


@dataclass(frozen=True)
class _Part:
    cube: int
    vector: int
    hbm: int
    entry_bytes: int  # bytes of one stored KV entry this form reads
    gemms: tuple[tuple[int, int, int, int], ...] = ()


def _qk_pv(keys: int, q_len: int, d_qk: int, d_v: int, batch_heads: int,
           pack: int = 1) -> tuple[tuple[int, int, int, int], ...]:
    """QKᵀ and PV of `q_len` queries visiting `keys` keys in all (per sequence and head): queries
    with kv keys each as (rows, kv, d_qk, B·H) and (rows, d_v, kv, B·H), the keys spread over the
    queries as evenly as integers allow (causal and windowed ranges differ per query; the
    shapes keep the total exact). `pack`: query heads that share one KV head, which production
    kernels stack into the rows of one matmul (FlashMLA's `get_mla_metadata(cache_seqlens,
    s_q * h_q // h_kv, h_kv)`; FlashAttention's GQA packing): rows × pack, count ÷ pack."""
    out = []
    for kv, rows in ragged(keys, q_len):
        out += [(rows * pack, kv, d_qk, batch_heads // pack), (rows * pack, d_v, kv, batch_heads // pack)]
    return tuple(out)


def _heads_per_kv(heads: int, kv_heads: int) -> int:
    """Query heads per KV head (GQA group); 1 when they do not divide evenly."""
    return heads // kv_heads if kv_heads > 0 and heads % kv_heads == 0 else 1


def _mha(call: AttnCall, ts: TokenSums, n_seq: int, q_len: int, dt: int) -> _Part:
    h = call.heads
    q_bytes = q_len * h * call.d_qk * dt
    out_bytes = q_len * h * call.d_v * dt
    entry = call.kv_heads * (call.d_qk if call.shared_kv else call.d_qk + call.d_v) * dt
    hbm = n_seq * (q_bytes + ts.touched * entry + out_bytes)
    return _Part(n_seq * ts.visited * h * 2 * (call.d_qk + call.d_v), n_seq * ts.visited * h, hbm, entry,
                 _qk_pv(ts.visited, q_len, call.d_qk, call.d_v, n_seq * h, _heads_per_kv(h, call.kv_heads)))


def _mla_absorbed(mla: Mla, ts: TokenSums, n_seq: int, q_len: int, dt: int) -> _Part:
    h, r = mla.heads, mla.rank
    absorb = 2 * h * mla.nope * r + 2 * h * r * mla.v          # per query token
    per_key = h * (2 * (r + mla.rope) + 2 * r)
    entry = (r + mla.rope) * dt
    w = h * r * (mla.nope + mla.v) * dt                         # W_UK and W_UV
    io = q_len * h * (mla.nope + r + (r + mla.rope) + r + r + mla.v) * dt
    hbm = n_seq * (io + ts.touched * entry) + w
    cube = n_seq * (q_len * absorb + ts.visited * per_key)
    tokens = n_seq * q_len
    # absorption W_UK (nope -> r) and up-projection W_UV (r -> v) per head, then MQA over the
    # latent: scores over r + rope, values over r (one shared KV head; stated per query head)
    gemms = ((tokens, r, mla.nope, h), (tokens, mla.v, r, h),
             *_qk_pv(ts.visited, q_len, r + mla.rope, r, n_seq * h, pack=h))
    return _Part(cube, n_seq * ts.visited * h, hbm, entry, tuple(g for g in gemms if g[0] > 0))


def _mla_expanded(mla: Mla, ts: TokenSums, n_seq: int, q_len: int, context: int, dt: int) -> _Part:
    h, r = mla.heads, mla.rank
    keys = context + q_len                                      # expand_kv runs over all of them
    d_qk = mla.nope + mla.rope
    expand = 2 * keys * r * h * (mla.nope + mla.v)
    attn = ts.dense * h * 2 * (d_qk + mla.v)
    kv = keys * h * (d_qk + mla.v) * dt
    hbm = n_seq * (keys * r * dt + 2 * kv + q_len * h * (d_qk + mla.v) * dt) + r * h * (mla.nope + mla.v) * dt
    gemms = ((keys, h * (mla.nope + mla.v), r, n_seq), *_qk_pv(ts.dense, q_len, d_qk, mla.v, n_seq * h))
    return _Part(n_seq * (expand + attn), n_seq * ts.dense * h, hbm, (r + mla.rope) * dt, gemms)


def core_cost(s: AttnStructure, call: AttnCall, phase: str, n_seq: int, q_len: int, context: int,
              dtype_bytes: int) -> CoreCost:
    """The production kernel's cost for one layer at one shape (per rank)."""
    dt = dtype_bytes
    ts = token_sums(s, call.window, context, q_len)
    if s.mla is None:
        form, part = "mha", _mha(call, ts, n_seq, q_len, dt)
    else:
        absorbed = _mla_absorbed(s.mla, ts, n_seq, q_len, dt)
        expanded = _mla_expanded(s.mla, ts, n_seq, q_len, context, dt)
        form, part = ("mla_absorbed", absorbed) if absorbed.cube <= expanded.cube else ("mla_expanded", expanded)
    visited = ts.dense if form == "mla_expanded" else ts.visited
    unread = 0 if form == "mla_expanded" else n_seq * ts.unread * part.entry_bytes
    if phase == CostPhase.train_bwd:  # dQ, dK, dV, dP: the forward's matmuls twice over (listed
        # twice, not at twice the count: the backward kernel's blocks are its heads' key tiles)
        return CoreCost(form, 2 * part.cube, part.vector, 2 * part.hbm, 0, n_seq * visited, 0,
                        part.gemms + part.gemms)
    cube, vector, hbm = part.cube, part.vector, part.hbm
    gemms = part.gemms
    ix = s.indexer
    if ix is not None:
        scored = n_seq * ts.scored
        cube += scored * 2 * ix.heads * ix.dim
        # the indexer's heads score one shared key each (MQA logits): packed into rows like attention
        gemms += tuple((rows * ix.heads, kv, ix.dim, n_seq) for kv, rows in ragged(ts.scored, q_len))
        vector += scored * (ix.heads + 1)
        index_keys = (context + q_len) // ix.rate
        tokens = n_seq * q_len
        logits = scored * 4
        hbm += (tokens * ix.heads * ix.dim * dt + n_seq * index_keys * ix.dim * dt + tokens * ix.heads * 4
                + 2 * logits + tokens * ix.topk * 4)
    return CoreCost(form, cube, vector, hbm, unread, n_seq * visited, n_seq * ts.scored, gemms)
