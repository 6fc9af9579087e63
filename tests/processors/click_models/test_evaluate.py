"""Perplexity and log-likelihood: the two anchor values (1 and 2), a hand example, and the split."""

from __future__ import annotations

import numpy as np
import pytest
from click_logs import make_pairs, simulate

from ubi_pipeline.processors.click_models.base import RelevanceEstimate
from ubi_pipeline.processors.click_models.ctr import DCTR
from ubi_pipeline.processors.click_models.evaluate import evaluate, perplexity_per_rank, split_sessions
from ubi_pipeline.processors.clicks.stats import SessionPatterns


class Constant:
    """Predicts the same click probability everywhere (a test double with the ClickModel surface)."""

    name = "constant"
    version = "0"

    def __init__(self, p: float) -> None:
        self.p = p

    def fit(self, sessions: SessionPatterns) -> Constant:
        return self

    def click_probs(self, sessions: SessionPatterns) -> np.ndarray:
        return np.where(sessions.docs >= 0, self.p, np.nan)

    conditional_click_probs = click_probs

    def relevance(self) -> RelevanceEstimate:
        raise NotImplementedError


def _log(docs: list[list[int]], clicks: list[list[bool]], weight: list[int]) -> SessionPatterns:
    d = np.array(docs)
    return SessionPatterns(
        make_pairs(int(d.max()) + 1), np.zeros(len(d), np.int64), d, np.array(clicks), np.array(weight)
    )


def test_half_everywhere_gives_two() -> None:
    s, _ = simulate("pbm", seed=71, n_sessions=500, theta=np.full(10, 0.5))
    ev = evaluate(Constant(0.5), s)
    # log2 0.5 = -1 whatever the click: p_k = 2^1 = 2 at every rank, full and conditional
    assert np.allclose(ev.perplexity, 2.0) and np.allclose(ev.conditional_perplexity, 2.0)
    assert ev.perplexity_mean == pytest.approx(2.0)
    # ln P(session) = 10 ranks x ln 0.5
    assert ev.log_likelihood_per_session == pytest.approx(10 * np.log(0.5))


def test_perfect_model_gives_one() -> None:
    # deterministic data: pair 0 always clicked, pair 1 never; DCTR learns exactly 1 and 0
    s = _log([[0, 1], [1, 0]], [[True, False], [False, True]], [3, 2])
    ev = evaluate(DCTR(prior="none").fit(s), s)  # the MLE learns exactly 1 and 0
    # probabilities are clamped to 1e-6 from 0/1, so the best possible is 2^(-log2(1 - 1e-6)) ≈ 1 + 1.4e-6
    assert np.allclose(ev.perplexity, 1.0, atol=1e-5) and ev.perplexity_mean == pytest.approx(1.0, abs=1e-5)
    assert ev.log_likelihood == pytest.approx(0.0, abs=1e-4)


def test_perplexity_by_hand() -> None:
    # one rank predicted 0.8; clicked in 3 sessions, not in 1 (weights):
    # p = 2^(-(3 log2 0.8 + log2 0.2)/4) = 2^(-(3*(-0.321928) + (-2.321928))/4) = 2^(0.821928) = 1.76777
    probs = np.array([[0.8], [0.8]])
    clicks = np.array([[True], [False]])
    p = perplexity_per_rank(probs, clicks, np.array([3.0, 1.0]), np.ones((2, 1), bool))
    assert p[0] == pytest.approx(1.76777, rel=1e-5)


def test_rank_never_shown_is_nan() -> None:
    s = _log([[0, -1], [1, -1]], [[True, False], [False, False]], [1, 1])
    ev = evaluate(Constant(0.3), s)
    assert np.isnan(ev.perplexity[1]) and not np.isnan(ev.perplexity[0])
    assert ev.perplexity_mean == pytest.approx(ev.perplexity[0])  # mean over ranks with data only


def test_split_keeps_every_session_once() -> None:
    s, _ = simulate("pbm", seed=72, n_sessions=3000, theta=np.full(10, 0.5))
    train, test = split_sessions(s, 0.3, np.random.default_rng(0))
    assert train.n_sessions + test.n_sessions == s.n_sessions == 3000
    assert 0.25 < test.n_sessions / 3000 < 0.35
    assert train.pairs is s.pairs and (train.weight > 0).all() and (test.weight > 0).all()
