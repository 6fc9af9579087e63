"""SDBN, the simplified DBN (Chapelle & Zhang, WWW 2009, §5): DBN with persistence γ = 1, fitted by counting.

With γ = 1 an unsatisfied user always goes on, so every rank at or above the last click was examined (every
shown rank in a session without clicks) and the last click is where the user was satisfied. Ranks below the
last click are left out, as in the paper's counting estimator:

    α_qd = clicks on (q, d) / examined impressions of (q, d)
    σ_qd = sessions whose last click is on (q, d) / clicks on (q, d)

Relevance is α·σ. Predictions use the DBN recursions with γ = 1. Both α and σ carry Beta priors (``prior``,
``ubi_pipeline.processors.click_models.priors``; default: rank-informed, empirical Bayes by maximum Beta-binomial marginal
likelihood, each on its own counts) and are posterior means. Unseen pairs get the prior (at the rank they are
shown at, when empirical) or α₀ = Σ clicks / Σ examined impressions and σ₀ = Σ last clicks / Σ clicks.
Interval: posterior Beta bounds of α and σ (Wilson with ``prior="none"``), multiplied bound by bound
(conservative for the product).
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.base import RelevanceEstimate
from ubi_pipeline.processors.click_models.common import (
    weighted_count,
)
from ubi_pipeline.processors.click_models.counting import CountingRates
from ubi_pipeline.processors.click_models.dbn import dbn_click_probs
from ubi_pipeline.processors.click_models.dcm import last_click_counts
from ubi_pipeline.processors.clicks.stats import SessionPatterns, SystemRankings


class SDBN(CountingRates):
    """Simplified DBN (γ = 1): attractiveness and satisfaction per pair by counting."""

    name = "sdbn"
    version = "1"

    def fit(self, sessions: SessionPatterns, systems: SystemRankings | None = None) -> Self:
        """α = clicks / examined impressions, σ = last clicks / clicks (examined = at or above the last click)."""
        self._begin_fit(sessions)
        exams, clk, _, is_last, _ = last_click_counts(sessions)
        w = np.broadcast_to(sessions.weight[:, None], is_last.shape)
        last = weighted_count(sessions.docs[is_last], w[is_last], len(self.pairs))
        self.examinations, self.examined_clicks, self.last_clicks = exams, clk, last
        self.alpha_prior, self.alpha, self.prior_alpha = self._rate(clk, exams)
        self.sigma_prior, self.sigma, self.prior_sigma = self._rate(last, clk)
        return self._end_fit(sessions)

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """P(C_k = 1) = ε_k α_k, ε_1 = 1, ε_{k+1} = ε_k (1 − α_k σ_k)."""
        self._require_fit(sessions)
        a = self.log_features.gather(self.alpha, sessions, self.alpha_prior, self.prior_alpha)
        s = self.log_features.gather(self.sigma, sessions, self.sigma_prior, self.prior_sigma)
        return dbn_click_probs(a, s, 1.0)

    def conditional_click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """P(C_k = 1 | clicks above): ε = 1 − σ_j after a click at j, Bayes-updated on every skip since."""
        self._require_fit(sessions)
        a = self.log_features.gather(self.alpha, sessions, self.alpha_prior, self.prior_alpha)
        s = self.log_features.gather(self.sigma, sessions, self.sigma_prior, self.prior_sigma)
        return dbn_click_probs(a, s, 1.0, sessions.clicks)

    def relevance(self) -> RelevanceEstimate:
        """Score = α·σ; interval = product of the Wilson bounds of α and σ (σ unbounded without clicks).

        Observations: the examined impressions α is counted on (at or above the last click).
        """
        self._require_fit()
        a = np.where(np.isnan(self.alpha), self._unexamined(self.alpha_prior, self.prior_alpha), self.alpha)
        s = np.where(np.isnan(self.sigma), self._unexamined(self.sigma_prior, self.prior_sigma), self.sigma)
        a_lo, a_hi = self._interval(self.alpha_prior, self.examined_clicks, self.examinations)
        s_lo, s_hi = self._interval(self.sigma_prior, self.last_clicks, self.examined_clicks)
        s_lo, s_hi = (
            np.where(self.examined_clicks > 0, s_lo, 0.0),
            np.where(self.examined_clicks > 0, s_hi, 1.0),
        )
        return self._estimate(a * s, a_lo * s_lo, a_hi * s_hi, self.examinations, self.parameters())

    def parameters(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "version": self.version,
            "gamma": 1.0,
            "prior_alpha": self.prior_alpha,
            "prior_sigma": self.prior_sigma,
            "prior": {"alpha": self.alpha_prior.parameters(), "sigma": self.sigma_prior.parameters()},
            "score": "alpha * sigma",
        }
