"""What every click model offers, so that judgments, propensities and benchmarks treat them alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Self, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.common import ClickModelError, check_rank, check_sessions
from ubi_pipeline.processors.clicks.stats import PairIndex, SessionPatterns, SystemRankings


@dataclass(frozen=True)
class RelevanceEstimate:
    """A model's relevance estimate per (query, doc) pair, with its support and interval.

    Arrays are aligned with ``pairs``; ``ci_low``/``ci_high`` are NaN where the model gives no interval.
    ``score`` is on the model's own scale (CTR, attractiveness, satisfaction-based relevance, COEC ratio).
    ``impressions``, ``clicks`` and ``sessions`` count what was displayed; ``observations`` is the support
    the score itself rests on, in the model's own terms: impressions the cascade family counts as examined
    (at or above the first/last click), expected examinations for the EM models (Σ impressions · P(E)),
    every impression for CTR and COEC. A pair never examined under the model scores the prior with no
    interval and 0 observations. ``None`` (a model that does not say) means every impression was observed.
    """

    pairs: PairIndex
    score: NDArray[np.float64]
    ci_low: NDArray[np.float64]
    ci_high: NDArray[np.float64]
    impressions: NDArray[np.int64]
    clicks: NDArray[np.int64]
    sessions: NDArray[np.int64]
    parameters: dict[str, Any] = field(default_factory=dict)  # model-level parameters worth recording
    observations: NDArray[np.float64] | None = None  # the model's own support per pair (see above)

    def support(self) -> NDArray[np.float64]:
        """``observations``, or the displayed impressions when the model did not report them."""
        src = self.impressions if self.observations is None else self.observations
        return np.asarray(src, dtype=np.float64)


@runtime_checkable
class ClickModel(Protocol):
    """A click model: fit on weighted session patterns, predict clicks, estimate relevance.

    ``click_probs`` gives the full (unconditional) P(C_k = 1) per pattern and rank;
    ``conditional_click_probs`` gives P(C_k = c_k | clicks above) for the observed clicks, which is what the
    log-likelihood and conditional perplexity use. Both are [n_patterns, K] arrays (NaN where nothing shown).
    Pairs unseen in training get the model's prior.
    """

    name: str
    version: str
    #: whether ``fit`` uses ``systems`` (a caller may skip reading them from the store when it does not)
    uses_systems: bool

    def fit(self, sessions: SessionPatterns, systems: SystemRankings | None = None) -> Self:
        """Fit on the weighted patterns. ``systems`` (which system showed which ranking) feeds the empirical
        prior of the models whose prior takes it (PBM, UBM, DBN, COEC: ``priors.system_features``); the
        others accept and ignore it, so that every caller fits every model alike."""
        ...

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]: ...

    def conditional_click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]: ...

    def relevance(self) -> RelevanceEstimate: ...


class FittedModel:
    """What every click model class shares: the guard against use before ``fit`` and the relevance record.

    ``fit`` sets ``pairs``, ``max_rank``, the per-pair support (``impressions``, ``clicks``, ``sessions``)
    and finally ``_fitted``.
    """

    name: str
    uses_systems = False
    pairs: PairIndex
    max_rank: int
    impressions: NDArray[np.int64]
    clicks: NDArray[np.int64]
    sessions: NDArray[np.int64]
    _fitted = False

    def _require_fit(self, sessions: SessionPatterns | None = None) -> None:
        """Raise unless fitted; with ``sessions``, also check them and that their ranks were fitted."""
        if not self._fitted:
            raise ClickModelError(f"{self.name}: call fit() before predicting")
        if sessions is not None:
            check_sessions(sessions)
            check_rank(self.max_rank, sessions, self.name)

    def _estimate(
        self,
        score: NDArray[np.float64],
        lo: NDArray[np.float64],
        hi: NDArray[np.float64],
        observations: NDArray[np.float64],
        parameters: dict[str, Any],
    ) -> RelevanceEstimate:
        """The model's :class:`RelevanceEstimate`, with the pair support counted at fit time."""
        return RelevanceEstimate(
            pairs=self.pairs,
            score=score,
            ci_low=lo,
            ci_high=hi,
            impressions=self.impressions,
            clicks=self.clicks,
            sessions=self.sessions,
            parameters=parameters,
            observations=observations,
        )
