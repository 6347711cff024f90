"""Build validation.csv (the table `python -m stratacl.validate` runs) from the public sources.

Run once when a source row is added: `python stratacl/data/kernels/build_table.py`. Every row's
FLOPs and bytes follow from its stated shape by the rules below; the role (calibrate | check) is
fixed here by rule BEFORE any parameter is fitted: within each group, in source order, every third
row (the 3rd, 6th, ...) is a check row; groups of one or two rows calibrate (single stated figures
with nothing else to fit on) unless marked check below because they are a different kernel than the
class they check (sparse attention against the dense classes) or another die. The 910C rows
follow the same rule: the six CANN grouped GEMM rows of Table 10 (3rd and 6th check), the two
CANN MLA figures calibrate (one each, nothing else to fit on).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).parent
DEEPGEMM = ("DeepGEMM README @327ec92 (2025-04-09), Performance; MIT (c) 2025 DeepSeek; "
            "deepgemm_h800_fp8.csv")
FLASHMLA = "FlashMLA README (deepseek-ai/FlashMLA, 2026-04); MIT (c) 2025 DeepSeek"
CANN = ("Serving LLMs on Huawei CloudMatrix384 (arXiv 2506.12708 v2) §5.5.2-5.5.3; cann_910c.csv")
CM384_INT8_TFLOPS = 752.0  # the die's INT8 peak (conf/fabric/cloudmatrix384.yaml); Table 10's HBM column implies it
CM384_BF16_TFLOPS = 376.0  # the die's BF16 peak (2506.12708, conf/fabric/cloudmatrix384.yaml)
FA3 = ("FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608) Fig. 5 forward, no causal mask, "
       "head dim 128, H100 SXM5 BF16 (bar labels; H800 = H100 SXM compute and HBM)")
COLS = ("id", "group", "role", "fabric", "kernel", "format", "core", "gemms", "flops", "hbm_bytes",
        "measured", "unit", "source", "note")
TableRow = dict[str, object]  # one validation.csv row by column (COLS)


def gemms_str(gemms: Iterable[tuple[int, int, int, int]]) -> str:
    return ";".join("x".join(str(x) for x in g) for g in gemms)


def by_rule(rows: list[TableRow]) -> list[TableRow]:
    """Every third row of a group (in source order) checks; the others calibrate."""
    for i, r in enumerate(rows):
        r.setdefault("role", "check" if i % 3 == 2 else "calibrate")
    return rows


def deepgemm() -> list[TableRow]:
    groups: dict[str, list[TableRow]] = {}
    with (HERE / "deepgemm_h800_fp8.csv").open() as f:
        for r in csv.DictReader(f):
            g, m, n, k = int(r["groups"]), int(r["m_per_group"]), int(r["n"]), int(r["k"])
            kind = r["kind"]
            kernel = "gemm" if kind == "dense" else "grouped_gemm"
            # FP8 A (m×k) and B (n×k) per group, BF16 D (m×n): DeepGEMM's own byte count
            groups.setdefault(kind, []).append({
                "id": f"deepgemm_{kind}_{g}x{m}_{n}_{k}", "group": f"h800 fp8 {kind}", "fabric": "hgx_h800",
                "kernel": kernel, "format": "fp8", "core": "cube", "gemms": gemms_str([(m, n, k, g)]),
                "flops": 2 * m * n * k * g, "hbm_bytes": g * (m * k + n * k + 2 * m * n),
                "measured": float(r["tflops"]), "unit": "TFLOPS", "source": DEEPGEMM,
                "note": f"{kind}: {g} group(s) of m={m}" + (" (max per group)" if kind == "grouped_masked" else "")})
    return [r for rows in groups.values() for r in by_rule(rows)]


def fa3() -> list[TableRow]:
    rows: list[TableRow] = []
    for s, tf in ((512, 467), (1024, 565), (2048, 625), (4096, 638), (8192, 646), (16384, 648)):
        b, h, d = 16384 // s, 16, 128  # FA3's benchmark: batch·seqlen = 16k, hidden = heads·hdim = 2048
        rows.append({"id": f"fa3_fwd_hd128_s{s}", "group": "h800 bf16 attention_prefill", "fabric": "hgx_h800",
                     "kernel": "attention_prefill", "format": "bf16", "core": "cube",
                     "gemms": gemms_str([(s, s, d, b * h), (s, d, s, b * h)]),
                     "flops": 4 * b * h * s * s * d, "hbm_bytes": 4 * b * s * h * d * 2,
                     "measured": float(tf), "unit": "TFLOPS", "source": FA3,
                     "note": f"batch {b}, 16 heads, seqlen {s}; Q, K, V, O in BF16 once"})
    return by_rule(rows)


def mla_decode(b: int, s_q: int, h_q: int, kv: int, kv_elt: int) -> tuple[str, int, int]:
    """Absorbed MLA decode: the query heads of a token share one latent KV head (d_qk 576, d_v 512),
    so they are the m rows of one matmul per (batch, query token)."""
    m = s_q * h_q
    gemms = [(m, kv, 576, b), (m, 512, kv, b)]
    flops = 2 * m * kv * 576 * b + 2 * m * kv * 512 * b
    hbm = b * kv * kv_elt + b * m * (576 + 512) * 2
    return gemms_str(gemms), flops, hbm


def flashmla() -> list[TableRow]:
    rows: list[TableRow] = []
    for name, shape, value, unit, stated in (
            ("memory_bound", (128, 1, 16), 3000.0, "GBps", "'up to 3000 GB/s memory-bound'; shape ASSUMED "
             "(not stated): batch 128, 1 query token, 16 heads (TP 8), kv 8192, BF16 latent KV"),
            ("compute_bound", (128, 2, 128), 660.0, "TFLOPS", "'up to 660 TFLOPS compute-bound'; shape "
             "ASSUMED (not stated): batch 128, 2 query tokens (MTP), 128 heads, kv 8192")):
        g, f, h = mla_decode(*shape, 8192, 576 * 2)
        rows.append({"id": f"flashmla_dense_decode_{name}", "group": "h800 bf16 attention_decode",
                     "role": "calibrate", "fabric": "hgx_h800", "kernel": "attention_decode", "format": "bf16",
                     "core": "cube", "gemms": g, "flops": f, "hbm_bytes": h, "measured": value, "unit": unit,
                     "source": FLASHMLA, "note": stated})
    # token-level sparse decode: each query token attends its own top-2048 tokens; FP8 KV cache
    # stored as 656 B per token (FlashMLA's FP8 format: 512 FP8 + scales + 64 BF16 RoPE dims)
    b, s_q, h_q, topk = 128, 2, 128, 2048
    gemms = [(h_q, topk, 576, b * s_q), (h_q, 512, topk, b * s_q)]
    rows.append({"id": "flashmla_sparse_decode_compute_bound", "group": "h800 sparse attention (other kernel)",
                 "role": "check", "fabric": "hgx_h800", "kernel": "attention_decode", "format": "bf16",
                 "core": "cube", "gemms": gemms_str(gemms), "flops": 2 * h_q * topk * 1088 * b * s_q,
                 "hbm_bytes": b * s_q * topk * 656 + b * s_q * h_q * 1088 * 2, "measured": 410.0,
                 "unit": "TFLOPS", "source": FLASHMLA,
                 "note": "token-level sparse decode, FP8 KV, BF16 matmul: 410 TFLOPS; shape ASSUMED: batch "
                 "128, 2 query tokens, 128 heads, top-k 2048"})
    tokens = 8192
    gemms = [(128, 2048, 576, tokens), (128, 512, 2048, tokens)]
    rows.append({"id": "flashmla_sparse_prefill", "group": "h800 sparse attention (other kernel)",
                 "role": "check", "fabric": "hgx_h800", "kernel": "attention_prefill", "format": "bf16",
                 "core": "cube", "gemms": gemms_str(gemms), "flops": 2 * 128 * 2048 * 1088 * tokens,
                 "hbm_bytes": tokens * 2048 * 576 * 2 + tokens * 128 * 1088 * 2, "measured": 640.0,
                 "unit": "TFLOPS", "source": FLASHMLA,
                 "note": "sparse MLA prefill forward 'up to 640 TFLOPS'; shape ASSUMED: 8192 tokens, 128 "
                 "heads, top-k 2048 (each token's selected KV read from HBM)"})
    s, b, h, d = 8192, 2, 16, 128
    rows.append({"id": "b200_dense_mha_prefill_fwd", "group": "b200 bf16 attention_prefill (carried)",
                 "role": "check", "fabric": "dgx_b200", "kernel": "attention_prefill", "format": "bf16",
                 "core": "cube", "gemms": gemms_str([(s, s, d, b * h), (s, d, s, b * h)]),
                 "flops": 4 * b * h * s * s * d, "hbm_bytes": 4 * b * s * h * d * 2, "measured": 1460.0,
                 "unit": "TFLOPS", "source": FLASHMLA + " (as reported by NVIDIA)",
                 "note": "dense MHA prefill forward on B200; shape ASSUMED: FA3's batch 2, 16 heads, seqlen "
                 "8192, head dim 128; checks the H800-derived fraction carried to B200"})
    return rows


def cann_910c() -> list[TableRow]:
    """The CANN rows on one 910C die: INT8 grouped GEMM (Table 10), MLA decode (Tables 8-9)."""
    gg: list[TableRow] = []
    mla: list[TableRow] = []
    with (HERE / "cann_910c.csv").open() as f:
        for r in csv.DictReader(f):
            util = float(r["utilization_pct"]) / 100
            if r["kernel"] == "int8_grouped_gemm":
                g, m, n, k = int(r["groups"]), int(r["m"]), int(r["n"]), int(r["k"])
                # INT8 A (m×k) and B (n×k) per group, BF16 D (m×n): this count reproduces the
                # table's own hbm_GBps at the 752 TOPS peak to 0.2 %
                gg.append({
                    "id": f"cann_int8_grouped_gemm_{g}x{m}_{n}_{k}", "group": "910c int8 grouped_gemm",
                    "fabric": "cloudmatrix384", "kernel": "grouped_gemm", "format": "int8", "core": "cube",
                    "gemms": gemms_str([(m, n, k, g)]), "flops": 2 * m * n * k * g,
                    "hbm_bytes": g * (m * k + n * k + 2 * m * n), "measured": round(util * CM384_INT8_TFLOPS, 2),
                    "unit": "TFLOPS", "source": CANN + " Table 10",
                    "note": f"{r['utilization_pct']} % of the {CM384_INT8_TFLOPS:.0f} TOPS INT8 peak; {g} groups "
                    f"of m={m}; {r['hbm_GBps']} GB/s sustained; tile 128 x 152"})
            elif r["bound"] == "compute":
                g_, f_, h_ = mla_decode(128, 2, 128, 8192, 576 * 2)
                mla.append({
                    "id": "cann_mla_decode_compute_bound", "group": "910c bf16 attention_decode",
                    "role": "calibrate", "fabric": "cloudmatrix384", "kernel": "attention_decode",
                    "format": "bf16", "core": "cube", "gemms": g_, "flops": f_, "hbm_bytes": h_,
                    "measured": round(util * CM384_BF16_TFLOPS, 2), "unit": "TFLOPS", "source": CANN + " Table 8",
                    "note": f"{r['utilization_pct']} % of the {CM384_BF16_TFLOPS:.0f} TFLOPS BF16 peak, "
                    "compute-bound; shape ASSUMED (not stated) = the FlashMLA compute-bound row it is "
                    "compared with: batch 128, 2 query tokens (MTP), 128 heads, kv 8192, BF16 latent KV"})
            else:
                g_, f_, h_ = mla_decode(128, 1, 16, 8192, 576 * 2)
                mla.append({
                    "id": "cann_mla_decode_memory_bound", "group": "910c bf16 attention_decode",
                    "role": "calibrate", "fabric": "cloudmatrix384", "kernel": "attention_decode",
                    "format": "bf16", "core": "cube", "gemms": g_, "flops": f_, "hbm_bytes": h_,
                    "measured": float(r["hbm_GBps"]), "unit": "GBps", "source": CANN + " Table 9",
                    "note": f"{r['hbm_GBps']} of 1600 GB/s ({r['utilization_pct']} %), memory-bound; shape "
                    "ASSUMED (not stated) = the FlashMLA memory-bound row it is compared with: batch 128, "
                    "1 query token, 16 heads, kv 8192, BF16 latent KV"})
    return by_rule(gg) + mla


if __name__ == "__main__":
    rows = deepgemm() + fa3() + flashmla() + cann_910c()
    with (HERE / "validation.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS)
        w.writeheader()
        w.writerows({k: r[k] for k in COLS} for r in rows)
    print(f"wrote {len(rows)} rows")
