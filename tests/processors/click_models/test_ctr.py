"""GCTR, RCTR and DCTR on the hand-sized log of conftest.tiny_log, arithmetic written out."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from ubi_pipeline.processors.click_models import get_model
from ubi_pipeline.processors.click_models.common import ClickModelError
from ubi_pipeline.processors.click_models.ctr import DCTR, GCTR, RCTR
from ubi_pipeline.processors.clicks.stats import SessionPatterns

# Hand counts from tiny_log (weights 3, 1, 2, 4):
#   rank 1: impressions 3+1+2+4 = 10, clicks 3 (A in p1) + 1 (B in p2) = 4   -> ρ_1 = 0.4
#   rank 2: impressions 3+1+2   = 6,  clicks 1 (A in p2)                   -> ρ_2 = 1/6
#   global: 5 clicks / 16 impressions = 0.3125
#   A: impressions 3 (p1) + 1 (p2) + 2 (p3) = 6, clicks 3 + 1 = 4 -> 2/3
#   B: impressions 3 (p1) + 1 (p2) = 4, clicks 1                  -> 1/4
#   C: impressions 2 (p3) + 4 (p4) = 6, clicks 0                  -> 0
#   D: never shown
RHO = 0.3125


def test_gctr(tiny_log: SessionPatterns) -> None:
    m = GCTR().fit(tiny_log)
    assert m.global_ctr == pytest.approx(RHO)
    p = m.click_probs(tiny_log)
    assert p.shape == (4, 2)
    assert np.isnan(p[3, 1])  # nothing shown at rank 2 of p4
    assert np.allclose(p[~np.isnan(p)], RHO)
    rel = m.relevance()
    assert np.allclose(rel.score, RHO)
    ref = binomtest(5, 16).proportion_ci(method="wilson")  # scipy's Wilson interval as the reference
    assert rel.ci_low[0] == pytest.approx(ref.low) and rel.ci_high[0] == pytest.approx(ref.high)


def test_rctr(tiny_log: SessionPatterns) -> None:
    m = RCTR().fit(tiny_log)
    assert np.allclose(m.rank_ctr, [0.4, 1 / 6])
    p = m.click_probs(tiny_log)
    assert np.allclose(p[:3], [[0.4, 1 / 6]] * 3) and np.isnan(p[3, 1])
    # relevance = mean ρ_k over the pair's impressions: A = (5*0.4 + 1/6)/6 = 13/36
    # B = (1*0.4 + 3/6)/4 = 0.225, C = (4*0.4 + 2/6)/6 = 29/90, D unseen -> global 0.3125
    assert np.allclose(m.relevance().score, [13 / 36, 0.225, 29 / 90, RHO])


def test_dctr(tiny_log: SessionPatterns) -> None:
    m = DCTR(prior="none").fit(tiny_log)
    rel = m.relevance()
    assert np.allclose(rel.score, [2 / 3, 1 / 4, 0.0, RHO])  # D takes the prior (global CTR)
    assert rel.impressions.tolist() == [6, 4, 6, 0]
    assert rel.clicks.tolist() == [4, 1, 0, 0]
    assert rel.sessions.tolist() == [6, 4, 6, 0]
    ref = binomtest(4, 6).proportion_ci(method="wilson")
    assert rel.ci_low[0] == pytest.approx(ref.low) and rel.ci_high[0] == pytest.approx(ref.high)
    assert np.isnan(rel.ci_low[3])
    p = m.click_probs(tiny_log)
    assert np.allclose(p[0], [2 / 3, 1 / 4]) and np.allclose(p[3, 0], 0.0) and np.isnan(p[3, 1])
    # conditional = full for independent clicks
    assert np.array_equal(m.conditional_click_probs(tiny_log), p, equal_nan=True)


def test_unseen_pair_gets_prior(tiny_log: SessionPatterns) -> None:
    m = DCTR(prior="none").fit(tiny_log)
    probe = SessionPatterns(
        tiny_log.pairs,
        np.zeros(1, np.int64),
        np.array([[3, 0]]),
        np.zeros((1, 2), bool),
        np.ones(1, np.int64),
    )
    assert np.allclose(m.click_probs(probe), [[RHO, 2 / 3]])


def test_registry_and_errors(tiny_log: SessionPatterns) -> None:
    assert isinstance(get_model("ctr"), DCTR)
    with pytest.raises(ClickModelError, match="unknown click model"):
        get_model("nope")
    with pytest.raises(ClickModelError, match="fit"):
        GCTR().click_probs(tiny_log)
