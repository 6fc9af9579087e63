"""The cascade model (Craswell, Zoeter, Taylor & Ramsey, WSDM 2008), root of the cascade family.

The user scans top-down, clicks a result with probability α_qd and stops at the first click:

    P(C_k = 1) = α_k · Π_{j<k} (1 − α_j)

α is fitted by counting: α_qd = first clicks on (q, d) / times (q, d) was at or above the first click (every
shown rank in sessions without a click). The model cannot explain a second click; sessions with several
clicks are *truncated at their first click* (later clicks and ranks are ignored for fitting, and their count
is recorded as ``multi_click_sessions``). Under the model a click below another has probability 0, which
held-out evaluation clamps to 1e-6 (``common.PROB_EPS``): that cost is the model's real weakness.

:func:`cascade_family_probs` is the shared recursion of DCM, DBN and SDBN: after a click the user goes on
with probability ``after_click``, after a skipped result with ``after_skip``.
α carries a Beta prior (``prior``, ``ubi_pipeline.processors.click_models.priors``): α_qd is the posterior mean
(a + first clicks)/(a + b + examinations); the default empirical prior is rank-informed and fitted by
maximum Beta-binomial marginal likelihood on those counts. Unseen pairs get the prior (at the rank they are
shown at, when empirical) or α₀ = Σ first clicks / Σ examined impressions. Interval: the posterior Beta
(Wilson on the counts with ``prior="none"``).
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.base import RelevanceEstimate
from ubi_pipeline.processors.click_models.common import (
    safe_div,
    weighted_count,
)
from ubi_pipeline.processors.click_models.counting import CountingRates
from ubi_pipeline.processors.clicks.stats import SessionPatterns, SystemRankings


def click_extent(
    clicks: NDArray[np.bool_], shown: NDArray[np.bool_]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(first, last) clicked position per pattern, 0-based; -1 for both when there is no click."""
    c = clicks & shown
    k = c.shape[1]
    any_click = c.any(axis=1)
    first = np.where(any_click, c.argmax(axis=1), -1)
    last = np.where(any_click, k - 1 - c[:, ::-1].argmax(axis=1), -1)
    return first.astype(np.int64), last.astype(np.int64)


def cascade_family_probs(
    alpha: NDArray[np.float64],
    after_click: NDArray[np.float64],
    after_skip: NDArray[np.float64],
    clicks: NDArray[np.bool_] | None = None,
) -> NDArray[np.float64]:
    """Click probabilities of a top-down scan with examination ε_1 = 1 (loop over ranks, vectorised).

    ``alpha``, ``after_click`` and ``after_skip`` are [n, K] per position (NaN α = not shown). Full
    (``clicks`` None): P(C_k = 1) = ε_k α_k, ε_{k+1} = ε_k (α_k·after_click_k + (1 − α_k)·after_skip_k).
    Conditional on the observed ``clicks``: after a click ε_{k+1} = after_click_k, after a non-click
    ε_{k+1} = after_skip_k · ε_k(1 − α_k)/(1 − ε_k α_k) (Bayes: examined but not attracted).
    """
    n, k = alpha.shape
    eps = np.ones(n)
    out = np.full((n, k), np.nan)
    for r in range(k):
        a = alpha[:, r]
        shown = ~np.isnan(a)
        a0 = np.where(shown, a, 0.0)
        out[:, r] = np.where(shown, eps * a0, np.nan)
        if clicks is None:
            nxt = eps * (a0 * after_click[:, r] + (1.0 - a0) * after_skip[:, r])
        else:
            miss = 1.0 - eps * a0
            skipped = after_skip[:, r] * safe_div(eps * (1.0 - a0), miss, fill=0.0)
            nxt = np.where(clicks[:, r], after_click[:, r], skipped)
        eps = np.where(shown, nxt, eps)
    return out


def residual_rank_ctr(
    clicks: NDArray[np.bool_], shown: NDArray[np.bool_], first: NDArray[np.int64], weight: NDArray[np.int64]
) -> NDArray[np.float64]:
    """q_k = clicks at rank k below the session's first click / results shown there (0 where none were)."""
    k = shown.shape[1]
    below = shown & (first[:, None] >= 0) & (np.arange(k)[None, :] > first[:, None])
    w = np.asarray(weight, dtype=np.float64)[:, None]
    return safe_div(((clicks & below) * w).sum(axis=0), (below * w).sum(axis=0), fill=0.0)


class Cascade(CountingRates):
    """Cascade model: attractiveness per (query, doc), the user stops at the first click."""

    name = "cascade"
    version = "2"

    def fit(self, sessions: SessionPatterns, systems: SystemRankings | None = None) -> Self:
        """α_qd = first clicks / impressions at or above the first click (all ranks if none)."""
        self._begin_fit(sessions)
        shown = sessions.docs >= 0
        first, _ = click_extent(sessions.clicks, shown)
        pos = np.arange(self.max_rank)[None, :]
        examined = shown & ((first[:, None] < 0) | (pos <= first[:, None]))
        first_click = shown & (pos == first[:, None])
        w = np.broadcast_to(sessions.weight[:, None], shown.shape)
        n_pairs = len(self.pairs)
        self.examinations = weighted_count(sessions.docs[examined], w[examined], n_pairs)
        self.first_clicks = weighted_count(sessions.docs[first_click], w[first_click], n_pairs)
        self.alpha_prior, self.alpha, self.prior_alpha = self._rate(self.first_clicks, self.examinations)
        self.residual_ctr = residual_rank_ctr(sessions.clicks, shown, first, sessions.weight)
        n_clicks = (sessions.clicks & shown).sum(axis=1)
        self.multi_click_sessions = int(sessions.weight[n_clicks > 1].sum())
        self.n_sessions = sessions.n_sessions
        return self._end_fit(sessions)

    def _alpha(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        return self.log_features.gather(self.alpha, sessions, self.alpha_prior, self.prior_alpha)

    def _residual(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        k = sessions.max_rank
        q = np.zeros(k)
        q[: min(k, len(self.residual_ctr))] = self.residual_ctr[:k]
        return np.broadcast_to(q[None, :], sessions.docs.shape)

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """P(C_k = 1) = ε_k α_k + (1 − ε_k) q_k, ε_k = Π_{j<k}(1 − α_j) (no click above)."""
        self._require_fit(sessions)
        a = self._alpha(sessions)
        first = cascade_family_probs(a, np.zeros_like(a), np.ones_like(a))  # ε_k α_k
        shown = ~np.isnan(a)
        keep = np.where(shown, 1.0 - np.nan_to_num(a), 1.0)
        eps = np.cumprod(np.column_stack([np.ones(len(a)), keep[:, :-1]]), axis=1)
        return np.where(shown, first + (1.0 - eps) * self._residual(sessions), np.nan)

    def conditional_click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """α_k while no click has happened above rank k, else the residual rate q_k."""
        self._require_fit(sessions)
        a = self._alpha(sessions)
        p = cascade_family_probs(a, np.zeros_like(a), np.ones_like(a), sessions.clicks)
        shown = ~np.isnan(a)
        first, _ = click_extent(sessions.clicks, shown)
        below = (first[:, None] >= 0) & (np.arange(a.shape[1])[None, :] > first[:, None])
        return np.where(shown & below, self._residual(sessions), p)

    def relevance(self) -> RelevanceEstimate:
        """Score = α_qd with its Wilson interval over (first clicks, examinations); observations = examinations."""
        return self._alpha_estimate(self.first_clicks)

    def parameters(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "version": self.version,
            "prior_alpha": self.prior_alpha,
            "prior": self.alpha_prior.parameters(),
            "multi_click_sessions": self.multi_click_sessions,
            "sessions": self.n_sessions,
            "multi_click_handling": "alpha fitted truncated at the first click; below it the residual rank CTR q_k",
            "residual_ctr": [round(float(q), 6) for q in self.residual_ctr],
        }
