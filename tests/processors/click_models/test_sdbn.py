"""SDBN: counting by hand, predictions by hand, recovery on DBN traffic with γ = 1."""

from __future__ import annotations

import numpy as np
import pytest
from click_logs import simulate

from ubi_pipeline.processors.click_models.sdbn import SDBN
from ubi_pipeline.processors.clicks.stats import SessionPatterns

# tiny_log, examined = at or above the last click (see test_dcm): α_A = 4/6, α_B = 1, α_C = 0, α₀ = 5/13
# σ = last clicks / clicks: A is the last click in p1 (w3) and p2 (w1) -> 4/4 = 1; B: 0/1 = 0;
# C never clicked -> prior σ₀ = 4 last clicks / 5 clicks = 0.8
# relevance α·σ: A 2/3, B 0, C 0·0.8 = 0, D (unseen) α₀·σ₀ = (5/13)(0.8) = 4/13


def test_counts_by_hand(tiny_log: SessionPatterns) -> None:
    m = SDBN(prior="none").fit(tiny_log)
    assert np.allclose(m.alpha[:3], [2 / 3, 1.0, 0.0])
    assert np.allclose(m.sigma[:2], [1.0, 0.0]) and np.isnan(m.sigma[2])
    assert m.prior_sigma == pytest.approx(0.8)
    assert np.allclose(m.relevance().score, [2 / 3, 0.0, 0.0, 4 / 13])


def test_predictions_by_hand(tiny_log: SessionPatterns) -> None:
    m = SDBN(prior="none").fit(tiny_log)
    # full, p1 [A, B]: ε_2 = 1 - α_A σ_A = 1/3 -> P(C_2) = 1/3·α_B
    assert np.allclose(m.click_probs(tiny_log)[0], [2 / 3, 1 / 3])
    # conditional, p2 [B, A] clicked B: ε_2 = 1 - σ_B = 1 -> α_A = 2/3
    assert np.allclose(m.conditional_click_probs(tiny_log)[1], [1.0, 2 / 3])


def test_recovers_attractiveness_and_satisfaction() -> None:
    sigma = np.random.default_rng(51).uniform(0.2, 0.8, 1000)
    s, alpha = simulate("dbn", seed=52, satisfaction=sigma, gamma=1.0)
    m = SDBN().fit(s)
    well = m.examinations >= 200
    assert np.abs(m.alpha - alpha)[well].mean() < 0.03
    clicked = m.examined_clicks >= 100
    assert clicked.sum() > 100
    # σ̂ from >= 100 clicks: binomial s.e. <= 0.05; stated tolerance on the mean error 0.04
    assert np.abs(m.sigma - sigma)[clicked].mean() < 0.04
