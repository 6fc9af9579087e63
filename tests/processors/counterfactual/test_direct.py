"""Direct-method kernels on lists small enough to work out by hand (the numbers in comments)."""

from __future__ import annotations

import numpy as np
import pytest

from ubi_pipeline.processors.counterfactual.direct import (
    aggregate,
    dbn_position_probs,
    pbm_position_probs,
    prior_share,
    query_metrics,
)


def test_pbm_two_ranks_by_hand() -> None:
    # θ = (1, 0.5), α = (0.4, 0.2): P(C) = (0.4, 0.1); first click F = (0.4, 0.1·(1 − 0.4) = 0.06)
    probs = pbm_position_probs(np.array([1.0, 0.5]), np.array([[0.4, 0.2]]))
    assert probs.click[0] == pytest.approx([0.4, 0.1])
    assert probs.first[0] == pytest.approx([0.4, 0.06])
    m = query_metrics(probs, k=1)
    assert m.clicks_k[0] == pytest.approx(0.4) and m.shown_k[0] == 1
    assert m.clicks[0] == pytest.approx(0.5)
    assert m.abandon[0] == pytest.approx(1 - 0.46)  # = (1 − 0.4)(1 − 0.1) = 0.54
    assert m.rr[0] == pytest.approx(0.4 + 0.06 / 2)  # 0.43


def test_dbn_two_ranks_by_hand() -> None:
    # α = (0.5, 0.4), σ_1 = 0.6, γ = 0.8: ε_2 = 0.5·0.8·(1 − 0.6) + 0.5·0.8 = 0.56, P(C_2) = 0.56·0.4 = 0.224;
    # first click at 2 needs a skip at 1 and going on: F_2 = 0.5·0.8·0.4 = 0.16
    probs = dbn_position_probs(np.array([[0.5, 0.4]]), np.array([[0.6, 0.3]]), 0.8)
    assert probs.click[0] == pytest.approx([0.5, 0.224])
    assert probs.first[0] == pytest.approx([0.5, 0.16])
    m = query_metrics(probs, k=2)
    assert m.abandon[0] == pytest.approx(0.34)
    assert m.rr[0] == pytest.approx(0.5 + 0.16 / 2)


def test_cascade_is_dbn_with_sigma_and_gamma_one() -> None:
    # cascade: P(C_k) = α_k Π_{j<k}(1 − α_j), and the first click is the only one
    alpha = np.array([[0.3, 0.5, 0.2]])
    probs = dbn_position_probs(alpha, np.ones((1, 3)), 1.0)
    expected = [0.3, 0.7 * 0.5, 0.7 * 0.5 * 0.2]
    assert probs.click[0] == pytest.approx(expected)
    assert probs.first[0] == pytest.approx(expected)


def test_short_lists_and_aggregation_over_queries() -> None:
    # query 0 shows one result (α 0.5), query 1 two (α 0.2, 0.2); θ = (1, 1); query 1 is searched 3 times as often
    alpha = np.array([[0.5, np.nan], [0.2, 0.2]])
    m = query_metrics(pbm_position_probs(np.ones(2), alpha), k=2)
    assert m.shown_k.tolist() == [1.0, 2.0]
    out = aggregate(m, np.array([1.0, 3.0]))
    # CTR@2 = (1·0.5 + 3·0.4) / (1·1 + 3·2) = 1.7 / 7; clicks/search = 1.7 / 4
    assert out["ctr@k"] == pytest.approx(1.7 / 7)
    assert out["clicks_per_search"] == pytest.approx(1.7 / 4)
    # abandonment = (1·0.5 + 3·0.64) / 4
    assert out["abandonment"] == pytest.approx((0.5 + 3 * 0.64) / 4)


def test_prior_share_counts_prior_results_in_the_top_k_only() -> None:
    shown = np.array([[True, True, True], [True, True, False]])
    on_prior = np.array([[False, True, True], [True, False, False]])
    # top 2: query 0 has 1 of 2 on the prior (weight 1), query 1 has 1 of 2 (weight 3): (1 + 3) / (2 + 6)
    assert prior_share(on_prior, shown, np.array([1.0, 3.0]), 2) == pytest.approx(0.5)
    assert prior_share(on_prior, shown, np.array([1.0, 3.0]), 1) == pytest.approx(3 / 4)
