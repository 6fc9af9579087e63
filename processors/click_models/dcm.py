"""DCM, the dependent click model (Guo, Liu & Wang, WSDM 2009): a cascade that may go on after a click.

The user scans top-down, clicks with probability α_qd, goes on after a click at rank k with probability
λ_k and always goes on after a skipped result:

    ε_1 = 1,   ε_{k+1} = ε_k (1 − α_k (1 − λ_k)),   P(C_k = 1) = ε_k α_k

Fitted by counting, as in Guo et al.: every rank at or above the last click was examined (every shown rank
in a session without clicks), ranks below the last click are left out (the user may have stopped there);

    α_qd = clicks on (q, d) / examined impressions of (q, d)
    λ_k  = 1 − (sessions whose last click is at rank k) / (clicks at rank k)

α carries a Beta prior (``prior``, ``ubi_pipeline.processors.click_models.priors``): α_qd is the posterior mean
(a + clicks)/(a + b + examined impressions), the default empirical prior rank-informed and fitted by maximum
Beta-binomial marginal likelihood on those counts. λ_k is per rank, not per pair (thousands of clicks per
rank), and stays the counting estimate. Unseen pairs get the prior (at the rank they are shown at, when
empirical) or α₀ = Σ clicks / Σ examined impressions; ranks never clicked get the click-weighted mean λ.
Interval: the posterior Beta (Wilson on (clicks, examined impressions) with ``prior="none"``).
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.base import RelevanceEstimate
from ubi_pipeline.processors.click_models.cascade import cascade_family_probs, click_extent
from ubi_pipeline.processors.click_models.common import (
    safe_div,
    weighted_count,
)
from ubi_pipeline.processors.click_models.counting import CountingRates
from ubi_pipeline.processors.clicks.stats import SessionPatterns, SystemRankings


def last_click_counts(
    sessions: SessionPatterns,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_], NDArray[np.bool_], NDArray[np.int64]]:
    """Counting statistics shared with SDBN.

    Returns (examined impressions per pair, clicks on examined impressions per pair, examined mask [n, K],
    last-click mask [n, K], last click position per pattern (-1 = none)).
    """
    shown = sessions.docs >= 0
    c = sessions.clicks & shown
    _, last = click_extent(c, shown)
    pos = np.arange(sessions.max_rank)[None, :]
    examined = shown & ((last[:, None] < 0) | (pos <= last[:, None]))
    is_last = shown & (pos == last[:, None])
    w = np.broadcast_to(sessions.weight[:, None], shown.shape)
    n_pairs = len(sessions.pairs)
    exams = weighted_count(sessions.docs[examined], w[examined], n_pairs)
    clicks = weighted_count(sessions.docs[c], w[c], n_pairs)
    return exams, clicks, examined, is_last, last


class DCM(CountingRates):
    """Dependent click model: attractiveness per pair, continuation λ_k after a click at rank k."""

    name = "dcm"
    version = "1"

    def fit(self, sessions: SessionPatterns, systems: SystemRankings | None = None) -> Self:
        """Counting estimates of α (ranks at or above the last click) and λ_k (1 − last clicks / clicks)."""
        self._begin_fit(sessions)
        exams, clk, _, is_last, _ = last_click_counts(sessions)
        self.examinations, self.examined_clicks = exams, clk
        self.alpha_prior, self.alpha, self.prior_alpha = self._rate(clk, exams)
        w = sessions.weight.astype(np.float64)[:, None]
        shown = sessions.docs >= 0
        clicks_at = ((sessions.clicks & shown) * w).sum(axis=0)
        last_at = (is_last * w).sum(axis=0)
        lam = 1.0 - safe_div(last_at, clicks_at)
        overall = 1.0 - float(last_at.sum() / clicks_at.sum()) if clicks_at.sum() > 0 else 0.5
        self.lam = np.where(np.isnan(lam), overall, lam)
        self.rank_clicks = clicks_at
        return self._end_fit(sessions)

    def _inputs(self, sessions: SessionPatterns) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        a = self.log_features.gather(self.alpha, sessions, self.alpha_prior, self.prior_alpha)
        lam = np.broadcast_to(self.lam[None, : sessions.max_rank], a.shape)
        return a, lam

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """P(C_k = 1) = ε_k α_k with ε_{k+1} = ε_k (1 − α_k (1 − λ_k))."""
        self._require_fit(sessions)
        a, lam = self._inputs(sessions)
        return cascade_family_probs(a, lam, np.ones_like(a))

    def conditional_click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """Given the clicks above: ε = λ_j after a click at j, Bayes-updated on every skip since."""
        self._require_fit(sessions)
        a, lam = self._inputs(sessions)
        return cascade_family_probs(a, lam, np.ones_like(a), sessions.clicks)

    def relevance(self) -> RelevanceEstimate:
        """Score = α_qd, Wilson interval over (clicks, examined impressions); observations = examined impressions."""
        return self._alpha_estimate(self.examined_clicks)

    def parameters(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "version": self.version,
            "lambda": [round(float(x), 6) for x in self.lam],
            "prior_alpha": self.prior_alpha,
            "prior": self.alpha_prior.parameters(),
        }
