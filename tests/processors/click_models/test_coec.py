"""COEC on the hand-sized log of conftest.tiny_log, arithmetic written out."""

from __future__ import annotations

import numpy as np
import pytest

from processors.click_models.coec import COEC
from processors.stats import SessionPatterns

# ρ_1 = 0.4, ρ_2 = 1/6 (see test_ctr). Expected clicks sum ρ over every impression at its rank:
#   A: 5 impressions at rank 1, 1 at rank 2 -> 5*0.4 + 1/6 = 13/6;  4 clicks -> COEC = 4/(13/6) = 24/13 ≈ 1.846
#   B: 1 at rank 1, 3 at rank 2 -> 0.4 + 3/6 = 0.9;                 1 click  -> COEC = 1/0.9 ≈ 1.111
#   C: 4 at rank 1, 2 at rank 2 -> 1.6 + 2/6 = 29/15;               0 clicks -> COEC = 0
#   D: never shown -> prior 1
# (Using only the rank-1 CTR, as a shortcut would, gives A = 4/(6*0.4) = 1.667: a different number.)


def test_coec_scores(tiny_log: SessionPatterns) -> None:
    m = COEC(prior="none").fit(tiny_log)
    assert np.allclose(m.expected_clicks, [13 / 6, 0.9, 29 / 15, 0.0])
    rel = m.relevance()
    assert np.allclose(rel.score, [24 / 13, 1 / 0.9, 0.0, 1.0])


def test_coec_interval(tiny_log: SessionPatterns) -> None:
    rel = COEC(prior="none").fit(tiny_log).relevance()
    # Garwood 95 % interval for 1 Poisson count is [0.02532, 5.5716] (standard table: -ln 0.975 and
    # chi2_{0.975}(4)/2); divided by the 0.9 expected clicks of B
    assert rel.ci_low[1] == pytest.approx(0.025318 / 0.9, rel=1e-4)
    assert rel.ci_high[1] == pytest.approx(5.571643 / 0.9, rel=1e-4)
    # 0 clicks: lower bound 0, upper chi2_{0.975}(2)/2 = -ln(0.025) = 3.68888 over 29/15 expected
    assert rel.ci_low[2] == 0.0
    assert rel.ci_high[2] == pytest.approx(3.688879 / (29 / 15), rel=1e-5)
    assert np.isnan(rel.ci_low[3])  # never shown: no interval


def test_coec_click_probs(tiny_log: SessionPatterns) -> None:
    m = COEC(prior="none").fit(tiny_log)
    p = m.click_probs(tiny_log)
    # p1 = [A at rank 1, B at rank 2] -> [24/13 * 0.4, (1/0.9) * (1/6)]
    assert np.allclose(p[0], [24 / 13 * 0.4, 1 / 0.9 / 6])
    assert np.isnan(p[3, 1])
    probe = SessionPatterns(
        tiny_log.pairs,
        np.zeros(1, np.int64),
        np.array([[3, 0]]),
        np.zeros((1, 2), bool),
        np.ones(1, np.int64),
    )
    # unseen D at rank 1 -> prior COEC 1 * 0.4; A at rank 2 -> 24/13 * 1/6
    assert np.allclose(m.click_probs(probe), [[0.4, 24 / 13 / 6]])
