"""COEC: clicks over expected clicks (Zhang & Jones, "Comparing click logs and editorial labels", SIGIR 2007).

    COEC(q, d) = Σ_s c_s(q, d) / Σ_{impressions i of (q, d)} ρ_{k(i)}

where ρ_k is the global CTR at rank k (clicks at k / impressions at k over all pairs) and the denominator sums
over *every* impression of the pair at the rank it was shown at (docs/ubi.md: the Search Relevance
Workbench's shortcut does not). COEC = 1 means "clicked as often as an average result at the same ranks";
it is unbounded above.

As a click model it predicts P(C_k = 1) = min(COEC(q, d)·ρ_k, 1), independent across ranks, so the conditional
probabilities equal the full ones. Unseen pairs get the prior COEC = 1 (an average result).

Prior (``prior``, see ``processors.click_models.priors``): COEC is a rate ratio, so its conjugate prior is a
Gamma: c ~ Poisson(r·E), r ~ Gamma(m·s, s), score = posterior mean (m·s + c)/(s + E). The default empirical
prior has a log-linear rank-informed mean m and strength s fitted by maximum negative-binomial marginal
likelihood; ``pseudocount`` is one click in one expected click, (c + 1)/(E + 1) (prior COEC 1); ``none``
is c/E. Unseen pairs score the prior (at the rank they are shown at, when empirical; else 1).

Interval: the expected clicks E are treated as fixed (they rest on all pairs' data). With a prior, the
posterior Gamma(a + c, s + E) interval; with ``none``, the clicks c as Poisson, giving the exact Garwood
interval [χ²_{a/2}(2c)/2, χ²_{1−a/2}(2c+2)/2] / E.
"""

from __future__ import annotations

from typing import Self

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaincinv

from processors.click_models.base import RelevanceEstimate
from processors.click_models.common import CONFIDENCE, AnyArray, safe_div
from processors.click_models.ctr import _CountingModel, expected_clicks
from processors.click_models.priors import LogFeatures, gamma_posterior_interval
from processors.stats import SessionPatterns

PRIOR_COEC = 1.0


def coec_scores(clicks: AnyArray, expected: AnyArray) -> NDArray[np.float64]:
    """COEC = clicks / expected clicks, NaN where nothing was expected (pair never shown)."""
    return safe_div(clicks, expected)


def poisson_ratio_interval(
    clicks: AnyArray, expected: AnyArray, confidence: float = CONFIDENCE
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Garwood (exact Poisson) interval of clicks, divided by the expected clicks."""
    c = np.asarray(clicks, dtype=np.float64)
    tail = (1.0 - confidence) / 2.0
    # chi2.ppf(q, 2k) / 2 is gammaincinv(k, q) (scipy.special: scipy.stats is slow to import)
    lo = np.where(c > 0, gammaincinv(np.maximum(c, 1e-300), tail), 0.0)
    hi = gammaincinv(c + 1.0, 1.0 - tail)
    return safe_div(lo, expected), safe_div(hi, expected)


class COEC(_CountingModel):
    """Clicks over expected clicks per (query, doc), expected clicks from the global per-rank CTR."""

    name = "coec"

    def fit(self, sessions: SessionPatterns) -> Self:
        """ρ_k per rank, then COEC(q, d) = posterior mean of clicks(q, d) over Σ_impressions ρ_k."""
        self._fit_counts(sessions)
        self.expected_clicks = expected_clicks(sessions, self.rank_ctr)
        self.log_features = LogFeatures.from_sessions(sessions)
        self.coec_prior = self.log_features.prior(self.prior, self.clicks, self.expected_clicks, family="gamma")
        post = self.coec_prior.posterior_mean(self.clicks, self.expected_clicks)
        self.coec = np.where(self.expected_clicks > 0, post, np.nan)
        return self

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        self._require_fit(sessions)
        k = sessions.max_rank
        ratio = self.log_features.gather(self.coec, sessions, self.coec_prior, PRIOR_COEC)
        return np.minimum(ratio * self.rank_ctr[None, :k], 1.0)

    def relevance(self) -> RelevanceEstimate:
        """Score = COEC with its interval; never-shown pairs score the prior 1 with no interval."""
        self._require_fit()
        if self.prior == "none":
            lo, hi = poisson_ratio_interval(self.clicks, self.expected_clicks)
        else:
            p = self.coec_prior
            lo, hi = gamma_posterior_interval(p.a + self.clicks, p.b + self.expected_clicks)
            lo = np.where(self.expected_clicks > 0, lo, np.nan)
            hi = np.where(self.expected_clicks > 0, hi, np.nan)
        score = np.where(np.isnan(self.coec), PRIOR_COEC, self.coec)
        return self._counted(
            score,
            lo,
            hi,
            {
                "rank_ctr": self.rank_ctr.tolist(),
                "prior_unseen": PRIOR_COEC,
                "prior": self.coec_prior.parameters(),
            },
        )
