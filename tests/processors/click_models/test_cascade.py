"""Cascade: counting by hand (first-click truncation), predictions, recovery on cascade traffic."""

from __future__ import annotations

import numpy as np
import pytest
from click_logs import simulate

from ubi_pipeline.processors.click_models.cascade import Cascade, click_extent
from ubi_pipeline.processors.clicks.stats import SessionPatterns

# tiny_log under the cascade model (examined = at or above the first click; later clicks dropped):
#   p1 [A, B] click A, w3 -> A examined 3, first clicks 3
#   p2 [B, A] clicks B, A, w1 -> B examined 1, first click 1 (A's click is after the first: dropped)
#   p3 [A, C] no click, w2 -> A, C examined 2 each
#   p4 [C] no click, w4 -> C examined 4
# α_A = 3/5 = 0.6, α_B = 1/1 = 1, α_C = 0/6 = 0, prior = 4 first clicks / 12 examinations = 1/3
# below a first click: rank 2 of p1 (w3, not clicked) and of p2 (w1, clicked) -> residual q_2 = 1/4, q_1 = 0


def test_counts_by_hand(tiny_log: SessionPatterns) -> None:
    m = Cascade(prior="none").fit(tiny_log)
    assert m.examinations.tolist() == [5, 1, 6, 0]
    assert np.allclose(m.alpha[:3], [0.6, 1.0, 0.0]) and np.isnan(m.alpha[3])
    assert m.prior_alpha == pytest.approx(1 / 3)
    assert m.multi_click_sessions == 1
    assert np.allclose(m.relevance().score, [0.6, 1.0, 0.0, 1 / 3])


def test_predictions_by_hand(tiny_log: SessionPatterns) -> None:
    m = Cascade(prior="none").fit(tiny_log)
    assert m.residual_ctr.tolist() == [0.0, 0.25]
    full = m.click_probs(tiny_log)
    # p1 [A, B]: P(C_1) = 0.6, P(C_2) = (1 - 0.6)·α_B + 0.6·q_2 = 0.4 + 0.15 = 0.55
    assert np.allclose(full[0], [0.6, 0.55])
    cond = m.conditional_click_probs(tiny_log)
    # after the click on A the cascade user has stopped: rank 2 gets the residual q_2 = 0.25;
    # p3 without clicks: C keeps α_C = 0
    assert np.allclose(cond[0], [0.6, 0.25]) and np.allclose(cond[2], [0.6, 0.0])
    assert np.isnan(full[3, 1]) and np.isnan(cond[3, 1])


def test_likelihood_factorises_at_the_first_click(tiny_log: SessionPatterns) -> None:
    # ln P(session) from the conditional probabilities = cascade part up to the first click + residual part
    # below it, by hand: p1 ln 0.6 + ln 0.75; p2 ln 1 + ln 0.25; p3 ln 0.4 + ln 1; p4 ln 1
    from ubi_pipeline.processors.click_models.evaluate import evaluate

    m = Cascade(prior="none").fit(tiny_log)
    by_hand = 3 * (np.log(0.6) + np.log(0.75)) + np.log(0.25) + 2 * np.log(0.4)
    assert evaluate(m, tiny_log).log_likelihood == pytest.approx(by_hand, abs=1e-5)  # 1e-6 clamps on p = 0, 1


def test_residual_is_the_same_under_every_prior(tiny_log: SessionPatterns) -> None:
    # q has no per-pair parameter: the pseudo-count baseline and ours predict below a first click alike
    qs = [Cascade(prior=p).fit(tiny_log).residual_ctr for p in ("empirical", "pseudocount", "none")]
    assert all(np.array_equal(q, qs[0]) for q in qs)


def test_click_extent() -> None:
    clicks = np.array([[False, True, True, False], [False, False, False, False]])
    first, last = click_extent(clicks, np.ones_like(clicks))
    assert first.tolist() == [1, -1] and last.tolist() == [2, -1]


def test_recovers_attractiveness() -> None:
    s, alpha = simulate("cascade", seed=31)
    m = Cascade().fit(s)
    assert m.multi_click_sessions == 0  # cascade traffic never clicks twice
    assert not m.residual_ctr.any()  # so nothing is clicked below a first click: the plain cascade
    well = m.examinations >= 200
    assert well.sum() > 100
    # stated tolerance: mean |α̂ - α| < 0.03 over pairs examined >= 200 times (binomial s.e. <= 0.035 each)
    assert np.abs(m.alpha - alpha)[well].mean() < 0.03
