"""What a measured shape runs: a serving phase or a training pass."""

from __future__ import annotations

from enum import StrEnum


class CostPhase(StrEnum):
    """A member equals its plain string, which callers pass and the disk cache's keys hold."""

    prefill = "prefill"
    decode = "decode"  # one new token per sequence over a KV cache of `context` tokens
    train_fwd = "train_fwd"
    train_bwd = "train_bwd"  # the backward alone (its forward runs unpriced)
