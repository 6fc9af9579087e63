"""Click-through-rate baselines: global (GCTR), per rank (RCTR) and per (query, doc) pair (DCTR).

Counting models (Chuklin, Markov & de Rijke, *Click Models for Web Search*, 2015, ch. 3):

- GCTR: P(C_k = 1) = ρ = Σ clicks / Σ impressions, one number for every rank and document.
- RCTR: P(C_k = 1) = ρ_k = clicks at rank k / impressions at rank k.
- DCTR: P(C_k = 1) = ρ_qd = clicks of (q, d) / impressions of (q, d), whatever the rank.

Clicks are independent of one another in all three, so the conditional click probabilities equal the full
ones. Ranks never shown in training (RCTR) are predicted with the global CTR ρ.

DCTR's ρ_qd carries a Beta prior (``prior``, see ``ubi_pipeline.processors.click_models.priors``): the score is the
posterior mean (a + clicks)/(a + b + impressions), exact here since the counts are the model's own trials;
the default empirical prior is rank-informed and fitted by maximum Beta-binomial marginal likelihood. Unseen
pairs get the prior at the rank they are shown at (empirical) or the global CTR ρ. GCTR and RCTR have no
per-pair parameter; they accept ``prior`` for a uniform interface and record that it does not apply.
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.base import FittedModel, RelevanceEstimate
from ubi_pipeline.processors.click_models.common import (
    check_sessions,
    pair_support,
    safe_div,
    weighted_count,
    wilson_interval,
)
from ubi_pipeline.processors.click_models.priors import (
    DEFAULT_PRIOR,
    LogFeatures,
    beta_posterior_interval,
    check_prior,
)
from ubi_pipeline.processors.clicks.stats import PairIndex, SessionPatterns, SystemRankings


def _rank_counts(sessions: SessionPatterns) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(impressions, clicks) per rank 1..K."""
    shown = sessions.docs >= 0
    w = sessions.weight.astype(np.float64)[:, None]
    return (shown * w).sum(axis=0), ((sessions.clicks & shown) * w).sum(axis=0)


class CountingModel(FittedModel):
    """Shared state of the counting baselines: support per pair and per rank, global CTR."""

    name = "_counting"
    version = "1"

    def __init__(self, prior: str = DEFAULT_PRIOR) -> None:
        self.prior = check_prior(prior, self.name)

    def _fit_counts(self, sessions: SessionPatterns) -> None:
        check_sessions(sessions)
        self.pairs: PairIndex = sessions.pairs
        self.max_rank = sessions.max_rank
        self.impressions, self.clicks, self.sessions = pair_support(sessions)
        self.rank_impressions, self.rank_clicks = _rank_counts(sessions)
        total_i, total_c = self.rank_impressions.sum(), self.rank_clicks.sum()
        self.global_ctr = float(total_c / total_i) if total_i > 0 else 0.0
        self.rank_ctr = safe_div(self.rank_clicks, self.rank_impressions, fill=self.global_ctr)
        self._fitted = True

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        raise NotImplementedError

    def conditional_click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """Clicks are independent under CTR models: the conditional probabilities are the full ones."""
        return self.click_probs(sessions)

    def _counted(
        self,
        score: NDArray[np.float64],
        lo: NDArray[np.float64],
        hi: NDArray[np.float64],
        params: dict[str, Any],
    ) -> RelevanceEstimate:
        # every impression is a trial of a CTR
        parameters = {"model": self.name, "version": self.version, **params}
        if self.name in ("gctr", "rctr"):
            parameters["prior"] = {"kind": "none", "note": "no per-pair parameter to put a prior on"}
        return self._estimate(score, lo, hi, self.impressions.astype(np.float64), parameters)


class GCTR(CountingModel):
    """Global CTR: one click probability ρ for every result (the weakest baseline)."""

    name = "gctr"

    def fit(self, sessions: SessionPatterns, systems: SystemRankings | None = None) -> Self:
        """ρ = Σ_s w_s·clicks_s / Σ_s w_s·shown_s."""
        self._fit_counts(sessions)
        return self

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        self._require_fit(sessions)
        return np.where(sessions.docs >= 0, self.global_ctr, np.nan)

    def relevance(self) -> RelevanceEstimate:
        """Every pair scores ρ (GCTR carries no per-pair information); the interval is ρ's Wilson interval."""
        self._require_fit()
        n = len(self.pairs)
        lo, hi = wilson_interval(np.array([self.rank_clicks.sum()]), np.array([self.rank_impressions.sum()]))
        return self._counted(
            np.full(n, self.global_ctr), np.full(n, lo[0]), np.full(n, hi[0]), {"ctr": self.global_ctr}
        )


class RCTR(CountingModel):
    """Rank CTR: click probability ρ_k per rank, the same for every document."""

    name = "rctr"

    def fit(self, sessions: SessionPatterns, systems: SystemRankings | None = None) -> Self:
        """ρ_k = clicks at rank k / impressions at rank k (global CTR for ranks never shown)."""
        self._fit_counts(sessions)
        self.expected_clicks = expected_clicks(sessions, self.rank_ctr)
        return self

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        self._require_fit(sessions)
        k = sessions.max_rank
        return np.where(sessions.docs >= 0, self.rank_ctr[None, :k], np.nan)

    def relevance(self) -> RelevanceEstimate:
        """A pair scores the mean ρ_k over its impressions (what RCTR predicts for it); no interval."""
        self._require_fit()
        score = safe_div(self.expected_clicks, self.impressions, fill=self.global_ctr)
        nan = np.full(len(self.pairs), np.nan)
        return self._counted(score, nan, nan.copy(), {"rank_ctr": self.rank_ctr.tolist()})


def expected_clicks(sessions: SessionPatterns, rank_ctr: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per pair, Σ over its impressions of the CTR at the impression's rank: Σ_s w_s·ρ_{k(s)}."""
    d = sessions.docs
    shown = d >= 0
    per_pos = np.broadcast_to(rank_ctr[None, : d.shape[1]], d.shape)
    w = np.broadcast_to(sessions.weight[:, None], d.shape)
    return weighted_count(d[shown], (per_pos * w)[shown], len(sessions.pairs))


class DCTR(CountingModel):
    """Document (pair) CTR: click probability ρ_qd per (query, doc), whatever the rank it was shown at."""

    name = "dctr"

    def fit(self, sessions: SessionPatterns, systems: SystemRankings | None = None) -> Self:
        """ρ_qd = posterior mean of (clicks, impressions) of (q, d) under the prior (MLE with ``none``)."""
        self._fit_counts(sessions)
        self.log_features = LogFeatures.from_sessions(sessions)
        imps = self.impressions.astype(np.float64)
        self.ctr_prior = self.log_features.prior(self.prior, self.clicks, imps)
        post = self.ctr_prior.posterior_mean(self.clicks, imps)
        self.pair_ctr = np.where(imps > 0, post, np.nan)  # NaN = never shown -> prior at prediction
        return self

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        self._require_fit(sessions)
        return self.log_features.gather(self.pair_ctr, sessions, self.ctr_prior, self.global_ctr)

    def relevance(self) -> RelevanceEstimate:
        """Score = ρ_qd with its 95 % interval (posterior Beta; Wilson without a prior); never-shown pairs score
        the global CTR, no interval."""
        self._require_fit()
        if self.prior == "none":
            lo, hi = wilson_interval(self.clicks, self.impressions)
        else:
            lo, hi = beta_posterior_interval(self.ctr_prior, self.clicks, self.impressions)
        score = np.where(np.isnan(self.pair_ctr), self.global_ctr, self.pair_ctr)
        return self._counted(score, lo, hi, {"global_ctr": self.global_ctr, "prior_unseen": "global CTR",
                                             "prior": self.ctr_prior.parameters()})
