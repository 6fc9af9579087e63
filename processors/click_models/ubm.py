"""UBM, the user browsing model (Dupret & Piwowarski, SIGIR 2008), fitted by EM over aggregated cells.

    P(C_k = 1 | clicks above) = γ_{k,k'} · α_qd

where k' is the rank of the previous click (0 = no click above k). Given the clicks above, the E-step of
a cell (pair, rank k, previous click k', clicked) is the PBM one with θ replaced by γ_{k,k'}:
P(E = 1 | C = 0) = γ(1 − α)/(1 − γα), P(A = 1 | C = 0) = (1 − γ)α/(1 − γα); so EM runs over the
(pair, k, k') cells with the same kernel as PBM (:func:`ubi_pipeline.processors.click_models.pbm.factorised_em`).

Only the products γ·α are identified: the model reports γ_{k,k'}/γ_{1,0} and the attractiveness on the
γ_{1,0} = 1 scale, α·γ_{1,0} (click probability at rank 1). The full (unconditional) P(C_k = 1) sums over
the distribution of the previous click rank, propagated rank by rank. Unseen pairs get the prior
α₀ = Σ clicks / Σ_impressions γ (clicks per expected examination); (k, k') combinations never observed use
the impression-weighted mean γ of rank k (or of all ranks, if rank k was never shown).
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.base import RelevanceEstimate
from ubi_pipeline.processors.click_models.common import (
    AnyArray,
    ClickModelError,
    check_sessions,
    pair_support,
    safe_div,
    weighted_count,
)
from ubi_pipeline.processors.click_models.pbm import ExaminationEM, initial_exam
from ubi_pipeline.processors.clicks.stats import (
    SessionPatterns,
    SystemRankings,
    UbmCells,
    ubm_cells_from_sessions,
)


def _check_ubm_cells(cells: UbmCells) -> None:
    n = len(cells.pair)
    for name in ("rank", "prev_click", "impressions", "clicks"):
        if len(getattr(cells, name)) != n:
            raise ClickModelError(f"UbmCells.{name} has {len(getattr(cells, name))} rows, expected {n}")
    if not n:
        return
    if cells.rank.min() < 1 or cells.rank.max() > cells.max_rank:
        raise ClickModelError(f"UbmCells.rank must lie in 1..{cells.max_rank}")
    if cells.prev_click.min() < 0 or (cells.prev_click >= cells.rank).any():
        raise ClickModelError("UbmCells.prev_click must lie in 0..rank-1 (0 = no click above)")
    if cells.pair.min() < 0 or cells.pair.max() >= len(cells.pairs):
        raise ClickModelError(f"UbmCells.pair ids must lie in 0..{len(cells.pairs) - 1}")
    if cells.clicks.min() < 0 or (cells.clicks > cells.impressions).any():
        raise ClickModelError("UbmCells clicks must be >= 0 and not exceed impressions")


def previous_click_rank(clicks: NDArray[np.bool_]) -> NDArray[np.int64]:
    """prev[s, k-1] = rank of the last click above rank k in pattern s (0 = none)."""
    n, k = clicks.shape
    clicked_rank = np.where(clicks, np.arange(1, k + 1), 0)
    prev = np.zeros((n, k), dtype=np.int64)
    if k > 1:
        prev[:, 1:] = np.maximum.accumulate(clicked_rank, axis=1)[:, :-1]
    return prev


def ubm_full_click_probs(alpha: NDArray[np.float64], gamma: NDArray[np.float64]) -> NDArray[np.float64]:
    """Unconditional P(C_k = 1) under UBM: propagate P(last click = j) down the ranks (loop over ranks only).

    ``alpha[n, K]`` per position (NaN = not shown: no click possible there), ``gamma[K, K]`` as γ[k-1, k'].
    """
    n, k = alpha.shape
    dist = np.zeros((n, k + 1))
    dist[:, 0] = 1.0
    out = np.full((n, k), np.nan)
    for r in range(k):
        a = alpha[:, r]
        shown = ~np.isnan(a)
        joint = dist[:, : r + 1] * gamma[r, : r + 1][None, :] * np.where(shown, a, 0.0)[:, None]
        p = joint.sum(axis=1)
        out[:, r] = np.where(shown, p, np.nan)
        dist[:, : r + 1] -= joint
        dist[:, r + 1] = p
    return out


class UBM(ExaminationEM):
    """User browsing model: examination γ_{k,k'} by rank and previous click rank, attractiveness α per pair."""

    name = "ubm"
    uses_systems = True  # the systems' votes enter the empirical prior (priors.system_features)
    version = "1"

    def fit(self, sessions: SessionPatterns, systems: SystemRankings | None = None) -> Self:
        """Aggregate to (pair, rank, previous click) cells, then run EM on them (see :meth:`fit_cells`);
        ``systems`` as for :meth:`PBM.fit`."""
        check_sessions(sessions)
        self._use_sessions(sessions, systems)
        self._fit_cells(ubm_cells_from_sessions(sessions))
        self.impressions, self.clicks, self.sessions = pair_support(sessions)
        return self

    def fit_cells(self, cells: UbmCells) -> Self:
        """EM over cells aggregated elsewhere (e.g. in DuckDB); ``sessions`` per pair = impressions then.

        The empirical prior then uses the cells' features (:func:`priors.rank_features`).
        """
        self._use_sessions(None)
        return self._fit_cells(cells)

    def _fit_cells(self, cells: UbmCells) -> Self:
        _check_ubm_cells(cells)
        k = self.max_rank = cells.max_rank
        imps = cells.impressions.astype(np.float64)
        clk = cells.clicks.astype(np.float64)
        exam_id = (cells.rank - 1) * k + cells.prev_click
        group_imps = weighted_count(exam_id, imps, k * k)
        gamma0 = initial_exam(weighted_count(exam_id, clk, k * k), group_imps)
        res = self._fit_em(cells.pairs, cells.pair, exam_id, cells.rank, imps, clk, gamma0)
        gamma = np.where(group_imps > 0, res.exam, np.nan).reshape(k, k)
        self.gamma_impressions = group_imps.reshape(k, k)
        self.gamma = _fill_unseen(gamma, self.gamma_impressions)
        self._fitted = True
        return self

    @property
    def gamma_ratio(self) -> NDArray[np.float64]:
        """γ_{k,k'}/γ_{1,0}, as [k-1, k'] (NaN where k' >= k or never observed)."""
        self._require_fit()
        g = np.where(self.gamma_impressions > 0, self.gamma, np.nan)
        return g / self.gamma[0, 0] if self.gamma[0, 0] > 0 else np.full_like(g, np.nan)

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """Unconditional P(C_k = 1), summing over where the previous click may have been."""
        self._require_fit(sessions)
        alpha = self._alpha_at(sessions)
        return ubm_full_click_probs(alpha, self.gamma)

    def conditional_click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """P(C_k = 1 | observed clicks above) = γ_{k,k'}·α with k' the observed previous click rank."""
        self._require_fit(sessions)
        k = sessions.max_rank
        alpha = self._alpha_at(sessions)
        prev = previous_click_rank(sessions.clicks & (sessions.docs >= 0))
        return alpha * self.gamma[np.arange(k)[None, :], prev]

    def relevance(self) -> RelevanceEstimate:
        """Score = α·γ_{1,0} (click probability at rank 1); see :meth:`ExaminationEM._em_relevance`."""
        self._require_fit()
        return self._em_relevance(self.gamma.ravel(), float(self.gamma[0, 0]))

    def parameters(self) -> dict[str, Any]:
        """Model-level parameters worth recording with every judgment (γ ratios as [rank-1][prev click])."""
        ratio = self.gamma_ratio
        return {
            "model": self.name,
            "version": self.version,
            "gamma_ratio": [
                [None if np.isnan(x) else round(float(x), 6) for x in row[: r + 1]]
                for r, row in enumerate(ratio)
            ],
            "iterations": self.iterations,
            "converged": self.converged,
            "log_likelihood": self.log_likelihood,
            "tol": self.tol,
            "prior_alpha": self.prior_alpha * float(self.gamma[0, 0]),
            "prior": self._prior_parameters(float(self.gamma[0, 0])),
            "score": "attractiveness on the gamma_{1,0} = 1 scale",
        }


def _fill_unseen(gamma: AnyArray, imps: AnyArray) -> NDArray[np.float64]:
    """Replace never-observed γ_{k,k'} by the impression-weighted mean γ of rank k (else of all ranks)."""
    g = gamma.copy()
    seen = ~np.isnan(g)
    w = np.where(seen, imps, 0.0)
    vals = np.where(seen, g, 0.0)
    row_mean = safe_div((vals * w).sum(axis=1), w.sum(axis=1))
    overall = float((vals * w).sum() / w.sum()) if w.sum() > 0 else 0.5
    row_mean = np.where(np.isnan(row_mean), overall, row_mean)
    return np.where(seen, g, row_mean[:, None])
