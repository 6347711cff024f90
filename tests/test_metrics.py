"""Metric helpers: nccl-tests conventions are covered in test_closed_forms; interval unions here."""

from __future__ import annotations

import pytest

from stratacl.metrics import union_length


def test_union_length_merges_overlaps_and_keeps_gaps() -> None:
    # [0,2) ∪ [1,3) ∪ [5,6) ∪ [5.5,5.7) = 3 + 1
    assert union_length([5.0, 0.0, 1.0, 5.5], [6.0, 2.0, 3.0, 5.7]) == pytest.approx(4.0)
    assert union_length([], []) == 0.0
