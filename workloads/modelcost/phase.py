"""What a measured shape runs: a serving phase or a training pass."""

from __future__ import annotations

from enum import StrEnum


class CostPhase(StrEnum):
    """A member equals its plain string, which callers pass and the disk cache's keys hold."""

    prefill = "prefill"
    decode = "decode"  # one new token per sequence over a KV cache of `context` tokens
    train_fwd = "train_fwd"
    train_bwd = "train_bwd"  # the backward alone (its forward runs unpriced)
    # the forward's ops selective op activation checkpointing runs again before the backward
    # (torchtitan's op policy, counter.SAC_SAVE), with the bytes of the outputs it saves
    train_sac = "train_sac"
