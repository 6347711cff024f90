"""Activation checkpointing as torchtitan offers it (`activation_checkpoint.mode` and
`selective_ac_option`, torchtitan/distributed/activation_checkpoint.py):

* `none`: every block keeps what autograd saves;
* `full`: every transformer block is checkpointed: only its input is kept, its whole forward
  runs again before its backward;
* `selective_layer` (`selective_ac_option` = k): every k-th block is checkpointed in full, the
  others keep their activations; torchtitan counts the blocks it wraps from 1, so block i
  (0-based) is checkpointed when (i + 1) % k == 0;
* `selective_op` (`selective_ac_option` = "op"): every block runs under torchtitan's selective
  op policy: the outputs of the ops in its `_save_list` (mm — all but every second one of a
  block —, the fused SDPA kernel, reduce_scatter, max) are saved, every other op runs again
  before the block's backward (`workloads/modelcost/counter.py` measures both halves).

Only transformer blocks are wrapped (`Unit.decoder`); the embedding and the LM head keep their
activations in every mode.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .blocks import Unit


class AcMode(StrEnum):
    none = "none"
    full = "full"
    selective_layer = "selective_layer"
    selective_op = "selective_op"


def unit_ac(mode: AcMode, every: int, units: tuple[Unit, ...], i: int) -> AcMode:
    """How unit i is checkpointed under `mode`: none, full or selective_op."""
    unit = units[i]
    if not unit.decoder or mode == AcMode.none:
        return AcMode.none
    if mode == AcMode.selective_layer:
        ordinal = sum(u.decoder for u in units[:i]) + 1  # torchtitan's wrap counter
        return AcMode.full if ordinal % every == 0 else AcMode.none
    return mode


def kept_bytes(unit: Unit, ac: AcMode) -> float:
    """Activations a unit keeps from its forward to its backward (its checkpointed input apart)."""
    if ac == AcMode.full:
        return 0.0
    if ac == AcMode.selective_op:
        return unit.sac_saved_bytes
    return unit.saved_bytes

