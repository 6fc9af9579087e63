"""Direct method: a candidate ranking's expected online metrics under a fitted click model.

Pure numpy kernels. Per-position parameters are [Q, K] arrays, one row per query and one column per rank of
the candidate's list, NaN where the list has no result at that rank. A click model gives, per position, the
marginal click probability P(C_k = 1) and the probability that the first (top-most) click is at rank k;
every metric below is a function of those two (click-model-based metrics, Chuklin, Serdyukov & de Rijke,
CIKM 2013):

    clicks@k      = Σ_{j<=k} P(C_j = 1)                      (expected clicks in the top k)
    CTR@k         = Σ_q w_q clicks@k(q) / Σ_q w_q shown@k(q)  (pooled over searches, as ``ubi_pipeline.reports.online``)
    clicks/search = Σ_q w_q Σ_j P(C_j = 1) / Σ_q w_q
    abandonment   = Σ_q w_q (1 − Σ_j F_j(q)) / Σ_q w_q        (F_j = P(first click at rank j))
    RR first      = Σ_q w_q Σ_j F_j(q)/j / Σ_q w_q            (0 without a click)

with w_q the number of logged searches of query q. PBM (clicks independent given the parameters):
P(C_j) = θ_j α_j, F_j = θ_j α_j Π_{i<j} (1 − θ_i α_i). DBN (Chapelle & Zhang, WWW 2009; the cascade model
is DBN with σ = γ = 1): P(C_j) from the DBN recursion, and before the first click every step follows a skip,
so F_j = α_j Π_{i<j} γ (1 − α_i).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.dbn import dbn_click_probs

METRICS: tuple[str, ...] = ("ctr@k", "clicks_per_search", "abandonment", "rr_first_click")
#: metrics linear in the clicks of a search: what item-level IPS can estimate
LINEAR_METRICS: tuple[str, ...] = ("ctr@k", "clicks_per_search")


class PositionProbs(NamedTuple):
    """Per query and rank: marginal click probability and probability of the first click there (0 if unshown)."""

    click: NDArray[np.float64]  # [Q, K]
    first: NDArray[np.float64]  # [Q, K]
    shown: NDArray[np.bool_]  # [Q, K]


def pbm_position_probs(theta: NDArray[np.float64], alpha: NDArray[np.float64]) -> PositionProbs:
    """PBM: P(C_j) = θ_j α_j and F_j = P(C_j) Π_{i<j} (1 − P(C_i)); α NaN where nothing is shown."""
    shown = ~np.isnan(alpha)
    k = alpha.shape[1]
    p = np.where(shown, theta[None, :k] * np.nan_to_num(alpha), 0.0)
    none_above = np.cumprod(np.hstack([np.ones((len(p), 1)), 1.0 - p[:, :-1]]), axis=1)
    return PositionProbs(p, p * none_above, shown)


def dbn_position_probs(alpha: NDArray[np.float64], sigma: NDArray[np.float64], gamma: float) -> PositionProbs:
    """DBN: marginals by the DBN recursion; F_j = α_j Π_{i<j} γ (1 − α_i) (a list that ends stops the scan)."""
    shown = ~np.isnan(alpha)
    a = np.nan_to_num(alpha)
    p = np.nan_to_num(dbn_click_probs(np.where(shown, alpha, np.nan), np.nan_to_num(sigma), gamma))
    reach = np.cumprod(np.hstack([np.ones((len(a), 1)), gamma * (1.0 - a[:, :-1])]), axis=1)
    # a gap in the list ends the scan (cascade_family_probs keeps ε across a gap; lists here have no gaps)
    return PositionProbs(np.where(shown, p, 0.0), np.where(shown, a * reach, 0.0), shown)


class QueryMetrics(NamedTuple):
    """Expected per-search quantities per query (each [Q])."""

    clicks_k: NDArray[np.float64]
    shown_k: NDArray[np.float64]
    clicks: NDArray[np.float64]
    abandon: NDArray[np.float64]
    rr: NDArray[np.float64]


def query_metrics(probs: PositionProbs, k: int) -> QueryMetrics:
    """Per-query expected clicks@k, results shown@k, clicks, P(no click) and E[1/rank of the first click]."""
    kk = min(k, probs.click.shape[1])
    ranks = np.arange(1, probs.click.shape[1] + 1, dtype=np.float64)
    return QueryMetrics(
        probs.click[:, :kk].sum(axis=1),
        probs.shown[:, :kk].sum(axis=1).astype(np.float64),
        probs.click.sum(axis=1),
        1.0 - probs.first.sum(axis=1),
        (probs.first / ranks[None, :]).sum(axis=1),
    )


def aggregate(m: QueryMetrics, weight: NDArray[np.float64]) -> dict[str, float]:
    """The four metrics over the query distribution ``weight`` (logged searches per query)."""
    w = np.asarray(weight, dtype=np.float64)
    total = float(w.sum())
    if total <= 0:
        return {name: float("nan") for name in METRICS}
    shown = float((w * m.shown_k).sum())
    return {
        "ctr@k": float((w * m.clicks_k).sum()) / shown if shown > 0 else float("nan"),
        "clicks_per_search": float((w * m.clicks).sum()) / total,
        "abandonment": float((w * m.abandon).sum()) / total,
        "rr_first_click": float((w * m.rr).sum()) / total,
    }


def prior_share(on_prior: NDArray[np.bool_], shown: NDArray[np.bool_], weight: NDArray[np.float64], k: int) -> float:
    """Share of the candidate's top-k results (search-weighted) whose parameters are the model's prior only."""
    kk = min(k, shown.shape[1])
    w = np.asarray(weight, dtype=np.float64)[:, None]
    den = float((w * shown[:, :kk]).sum())
    return float((w * (on_prior[:, :kk] & shown[:, :kk])).sum()) / den if den > 0 else float("nan")
