"""What the counting models of the cascade family share (Cascade, DCM, SDBN): a rate per pair counted as
successes over trials, smoothed by the ``--prior`` chosen, with its interval.

Each model counts its own successes and trials (first clicks over examinations for the cascade, clicks over
impressions at or above the last click for DCM and SDBN, last clicks over clicks for SDBN's satisfaction);
this base turns the counts into the posterior-mean rate, the pooled rate the prior falls back on, and the
interval: Wilson's score interval without a prior, the equal-tailed Beta posterior interval with one.
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.base import FittedModel, RelevanceEstimate
from ubi_pipeline.processors.click_models.common import check_sessions, pair_support, wilson_interval
from ubi_pipeline.processors.click_models.priors import (
    DEFAULT_PRIOR,
    BetaPrior,
    LogFeatures,
    beta_posterior_interval,
    check_prior,
)
from ubi_pipeline.processors.clicks.stats import SessionPatterns


class CountingRates(FittedModel):
    """A click model whose per-pair parameters are counted rates under a prior (``prior``: empirical,
    pseudocount or none, ``priors.check_prior``)."""

    log_features: LogFeatures
    alpha_prior: BetaPrior
    alpha: NDArray[np.float64]
    prior_alpha: float
    examinations: NDArray[np.float64]

    def __init__(self, prior: str = DEFAULT_PRIOR) -> None:
        self.prior = check_prior(prior, self.name)

    def _begin_fit(self, sessions: SessionPatterns) -> None:
        """Check the patterns and take their pairs, depth and prior features."""
        check_sessions(sessions)
        self.pairs = sessions.pairs
        self.max_rank = sessions.max_rank
        self.log_features = LogFeatures.from_sessions(sessions)

    def _rate(self, successes: NDArray[np.float64], trials: NDArray[np.float64]
              ) -> tuple[BetaPrior, NDArray[np.float64], float]:
        """(prior, posterior-mean rate per pair with NaN where there was no trial, pooled rate Σs/Σn or 0.5)."""
        prior = self.log_features.prior(self.prior, successes, trials)
        rate = np.where(trials > 0, prior.posterior_mean(successes, trials), np.nan)
        total = trials.sum()
        pooled = float(successes.sum() / total) if total > 0 else 0.5
        return prior, rate, pooled

    def _end_fit(self, sessions: SessionPatterns) -> Self:
        """Count the displayed support per pair and mark the model fitted."""
        self.impressions, self.clicks, self.sessions = pair_support(sessions)
        self._fitted = True
        return self

    def _interval(self, prior: BetaPrior, successes: NDArray[np.float64], trials: NDArray[np.float64]
                  ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Wilson's interval without a prior, else the Beta posterior's equal-tailed interval."""
        if self.prior == "none":
            return wilson_interval(successes, trials)
        return beta_posterior_interval(prior, successes, trials)

    def _alpha_estimate(self, successes: NDArray[np.float64]) -> RelevanceEstimate:
        """Score = α with its interval over (``successes``, examinations); pairs never examined score the
        prior's rate; observations = examinations."""
        self._require_fit()
        lo, hi = self._interval(self.alpha_prior, successes, self.examinations)
        score = np.where(np.isnan(self.alpha), self._unexamined(self.alpha_prior, self.prior_alpha), self.alpha)
        return self._estimate(score, lo, hi, self.examinations, self.parameters())

    def parameters(self) -> dict[str, Any]:
        """The fitted model's parameters worth recording with its judgments."""
        raise NotImplementedError

    def _unexamined(self, prior: BetaPrior, pooled: float) -> NDArray[np.float64]:
        """The rate of pairs never examined: the empirical prior's own mean for them (it uses their display
        ranks), else the pooled rate."""
        if prior.kind == "empirical":
            return np.asarray(prior.mean)
        return np.full(len(self.pairs), pooled)
