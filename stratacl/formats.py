"""The numeric formats tensors and matmuls can be in (one vocabulary for the fabric's cube peaks,
`stratacl.fabric.FORMAT_FALLBACK`, and the workloads' tensor formats, `workloads/common/quant.py`)."""

from __future__ import annotations

from enum import StrEnum


class NumericFormat(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"
    int4 = "int4"  # group-wise scaled (GPTQ/AWQ-style W4)
    fp4 = "fp4"  # MXFP4
