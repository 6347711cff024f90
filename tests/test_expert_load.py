"""The router's expert load derived from a measured figure (workloads/common/expert_load.py)."""

from __future__ import annotations

import numpy as np
import pytest

from stratacl.errors import ConfigError
from workloads.common.expert_load import (
    NO_BALANCER_CENTRE,
    NO_BALANCER_HIGH,
    NO_BALANCER_LOW,
    DieLoad,
    ExpertLoadConfig,
    describe_law,
    router_exponent,
    router_shares,
    static_imbalance,
    zipf_for_imbalance,
)
from workloads.common.placement import contiguous, eplb


def test_the_derived_exponent_reproduces_the_measured_imbalance() -> None:
    for target in (NO_BALANCER_LOW, NO_BALANCER_CENTRE, NO_BALANCER_HIGH):
        s = zipf_for_imbalance(target, 256, 64)
        assert static_imbalance(s, 256, 64) == pytest.approx(target, rel=1e-3)
    # a steeper measured load needs a steeper law; the same load on fewer ranks too
    lo, mid, hi = (zipf_for_imbalance(x, 256, 64) for x in (NO_BALANCER_LOW, NO_BALANCER_CENTRE, NO_BALANCER_HIGH))
    assert 0 < lo < mid < hi
    assert zipf_for_imbalance(NO_BALANCER_CENTRE, 256, 32) > mid


def test_imbalance_grows_with_the_ep_size_and_vanishes_without_skew() -> None:
    # LMSYS large-scale EP (2025-05-05): "as the number of ranks scales, imbalances grow"
    s = zipf_for_imbalance(NO_BALANCER_CENTRE, 256, 64)
    ratios = [static_imbalance(s, 256, ep) for ep in (8, 16, 32, 64, 128, 256)]
    assert all(a < b for a, b in zip(ratios, ratios[1:], strict=False))
    assert static_imbalance(0.0, 256, 64) == pytest.approx(1.0)


def test_a_balancing_placement_leaves_less_than_the_contiguous_one() -> None:
    shares = router_shares("zipf", 0.0, ExpertLoadConfig(), 256, seed=0)
    assert shares.sum() == pytest.approx(1.0) and (shares > 0).all()
    flat = DieLoad.of(contiguous(256, 64).die_rows(shares, 8) * 64)
    packed = DieLoad.of(eplb(shares, 64, 8, 32, 0, 0.0).die_rows(shares, 8) * 64)
    assert flat.mean == pytest.approx(8.0) and packed.mean == pytest.approx(8.0)  # rows are conserved
    assert 1.0 <= packed.ratio < flat.ratio


def test_the_knob_overrides_the_figure_and_the_notes_say_which() -> None:
    load = ExpertLoadConfig()
    assert router_exponent(0.6, load, 256) == 0.6
    assert router_exponent(0.0, load, 256) == zipf_for_imbalance(load.imbalance, 256, load.ep)
    assert describe_law("zipf", 0.6, load, 256) == (0.6, "workload.zipf_s")
    s, why = describe_law("zipf", 0.0, load, 256)
    assert s == router_exponent(0.0, load, 256) and "UltraEP" in why
    assert describe_law("uniform", 0.0, load, 256)[0] == 0.0
    assert np.allclose(router_shares("uniform", 0.0, load, 8, seed=0), 1 / 8)


def test_a_figure_out_of_any_zipf_laws_reach_is_refused() -> None:
    with pytest.raises(ConfigError, match="workload.expert_load.imbalance"):
        zipf_for_imbalance(1000.0, 256, 64)
    with pytest.raises(ConfigError, match="workload.expert_load.ep"):
        zipf_for_imbalance(NO_BALANCER_CENTRE, 256, 7)
    # a model with fewer experts than the figure's ranks is placed on its own expert blocks
    assert zipf_for_imbalance(NO_BALANCER_CENTRE, 64, 64) > 0
