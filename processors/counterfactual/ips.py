"""Inverse propensity scoring under the item-position model, clipped and self-normalised. Pure numpy.

Item-position model (Joachims, Swaminathan & Schnabel, WSDM 2017; for evaluation: Li, Kim, Kveton, Muthukrishnan,
Vinay & Wen, KDD 2018): a click on document d at rank k has probability θ_k·α_qd. A candidate ranking π that puts
d at rank k' expects θ_k'·α_qd clicks on it per search of q. Over the logged searches of q (N_q of them) d was
examined E_qd = Σ_s θ_{k_s(d)} times in expectation and clicked C_qd times, E[C_qd] = α_qd·E_qd, so each
logged click on d counts

    ρ_qd = θ_k' · N_q / E_qd           (the candidate's examination over the log's mean examination of d)

towards the candidate, and V̂_IPS = Σ_q Σ_d min(ρ_qd, M)·C_qd / Σ_q N_q estimates the candidate's expected
clicks per search (restricted to ranks <= k: clicks@k). With ρ unclipped it is unbiased for every document
the log examined at least once for that query; documents the log never showed add nothing (the estimate is
biased low by their share, which is reported). ``M`` clips large weights (documents shown rarely or deep);
the share of the candidate's examination whose weight was clipped is reported with the clip level. Only the
ratios θ_k/θ_1 matter. With the empirical logging marginals in E_qd this is the PBM estimator of Li et al.

SNIPS (Swaminathan & Joachims, NeurIPS 2015): the weights' control variate Σ_d min(ρ, M)·E_qd / N_q has the
known expectation Σ_{k'} θ_k' (the candidate's examination mass), so V̂_SNIPS = V̂_IPS · (candidate
examination) / (clipped, supported examination): it rescales for what clipping removed and for documents the
log never showed (as if they were as attractive as the supported ones, examination-weighted).

Doubly robust (Dudík, Langford & Li, ICML 2011), here per document under the item-position model: the direct
method's prediction plus the IPS-weighted residual of the model at the logged positions,
V̂_DR = V̂_DM + Σ_q Σ_d min(ρ_qd, M)·(C_qd − Ĉ_qd) / Σ_q N_q with Ĉ_qd the clicks the model predicts for d's
logged impressions. Unclipped under PBM it replaces the model's α̂ by C/E where the log supports the pair and
keeps the model where it does not.

Abandonment and the reciprocal rank of the first click are not sums of per-document clicks, so item-level
IPS does not estimate them; only the direct method does.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.clicks.stats import CELL_CHUNK_PATTERNS
from ubi_pipeline.schemas.cli_names import DEFAULT_CLIP


class LoggedArrays(NamedTuple):
    """A log as weighted patterns: ``docs[s, k-1]`` pair id at rank k (-1: none), ``clicks``, ``weight``.

    ``pair_query[p]`` is the query number of pair p; ``query[s]`` the query number of pattern s.
    """

    query: NDArray[np.int64]  # [n]
    docs: NDArray[np.int64]  # [n, K]
    clicks: NDArray[np.bool_]  # [n, K]
    weight: NDArray[np.float64]  # [n]
    pair_query: NDArray[np.int64]  # [P]
    n_queries: int


class IpsTotals(NamedTuple):
    """Sums over the covered queries, each weighted by its logged searches (divide by ``searches``)."""

    searches: float  # Σ_q N_q over covered queries
    shown_k: float  # Σ_q N_q · (candidate results at ranks <= k)
    clicks_k: float  # Σ_q Σ_d min(ρ, M) C_qd over the candidate's top k
    clicks: float  # the same over the candidate's whole list
    exposure_k: float  # Σ_q N_q Σ_{k' <= k} θ_k' (candidate examination mass, top k)
    exposure: float
    supported_k: float  # Σ_q Σ_d min(ρ, M) E_qd over the top k (= supported, clipped examination)
    supported: float
    clipped_k: float  # Σ_q N_q θ_k' over top-k documents whose weight was clipped
    unsupported_k: float  # Σ_q N_q · (top-k results never shown for q in the log, unseen documents included)
    residual_k: float  # Σ min(ρ, M)(C − Ĉ) over the top k (0 without predictions)
    residual: float
    max_weight: float  # largest unclipped ρ among supported documents


def pair_log_counts(
    log: LoggedArrays, theta: NDArray[np.float64], predicted: NDArray[np.float64] | None = None,
    chunk: int = CELL_CHUNK_PATTERNS,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Per pair (E, C, Ĉ) and per query N: expected examinations Σ w θ_k, clicks, predicted clicks; searches.

    Summed ``chunk`` patterns at a time (``ubi_pipeline.processors.clicks.stats.CELL_CHUNK_PATTERNS``), so the per-slot temporaries
    stay small whatever the log's size (at 50M events they were the report's peak, README "scale")."""
    n_pairs = len(log.pair_query)
    k = log.docs.shape[1]
    exam = np.zeros(n_pairs)
    clk = np.zeros(n_pairs)
    pred = np.zeros(n_pairs)
    step = max(int(chunk), 1)
    for lo in range(0, log.docs.shape[0], step):
        docs = log.docs[lo:lo + step]
        shown = docs >= 0
        w = np.broadcast_to(log.weight[lo:lo + step, None], docs.shape)[shown]
        pair = docs[shown]
        rank = np.broadcast_to(np.arange(k), docs.shape)[shown]
        exam += np.bincount(pair, weights=w * theta[rank], minlength=n_pairs)
        clk += np.bincount(pair, weights=w * log.clicks[lo:lo + step][shown], minlength=n_pairs)
        if predicted is not None:
            pred += np.bincount(pair, weights=w * np.nan_to_num(predicted[lo:lo + step][shown]), minlength=n_pairs)
    searches = np.bincount(log.query, weights=log.weight, minlength=log.n_queries).astype(np.float64)
    return exam, clk, pred, searches


def ips_totals(
    log: LoggedArrays,
    cand_rank: NDArray[np.int64],
    cand_len: NDArray[np.int64],
    theta: NDArray[np.float64],
    k: int,
    clip: float = DEFAULT_CLIP,
    predicted: NDArray[np.float64] | None = None,
) -> IpsTotals:
    """The sums behind IPS, SNIPS and the DR correction (module docstring).

    ``cand_rank[p]`` is the rank (1-based) the candidate gives pair p, 0 when it does not rank it;
    ``cand_len[q]`` the length of the candidate's list for query q (0: the candidate does not cover q);
    ``theta`` examination per rank on any scale (only ratios matter), long enough for both lists;
    ``predicted`` the model's P(C = 1) at each logged position ([n, K]) for the DR residual.
    """
    exam, clk, pred, n_q = pair_log_counts(log, theta, predicted)
    covered = cand_len > 0
    searches = float(n_q[covered].sum())
    in_list = cand_rank > 0
    theta_c = np.where(in_list, theta[np.maximum(cand_rank, 1) - 1], 0.0)
    nq_p = n_q[log.pair_query]
    supported = in_list & (exam > 0)
    rho = np.where(supported, theta_c * nq_p / np.where(exam > 0, exam, 1.0), 0.0)
    rho_c = np.minimum(rho, clip)
    top = in_list & (cand_rank <= k)
    kk = np.minimum(cand_len, k)
    exposure_q = np.cumsum(np.concatenate([[0.0], theta]))
    shown_k = float((n_q * kk).sum())
    return IpsTotals(
        searches=searches,
        shown_k=shown_k,
        clicks_k=float((rho_c * clk)[top].sum()),
        clicks=float((rho_c * clk)[in_list].sum()),
        exposure_k=float((n_q * exposure_q[kk]).sum()),
        exposure=float((n_q * exposure_q[cand_len]).sum()),
        supported_k=float((rho_c * exam)[top].sum()),
        supported=float((rho_c * exam)[in_list].sum()),
        clipped_k=float((nq_p * theta_c)[top & (rho > clip)].sum()),
        unsupported_k=shown_k - float(nq_p[top & supported].sum()),
        residual_k=float((rho_c * (clk - pred))[top].sum()),
        residual=float((rho_c * (clk - pred))[in_list].sum()),
        max_weight=float(rho[supported].max()) if supported.any() else float("nan"),
    )


def ips_metrics(t: IpsTotals, self_normalise: bool = False) -> dict[str, float]:
    """CTR@k and clicks per search from :class:`IpsTotals`; SNIPS rescales by exposure / supported exposure."""
    if t.searches <= 0:
        return {"ctr@k": float("nan"), "clicks_per_search": float("nan")}
    ck, c = t.clicks_k, t.clicks
    if self_normalise:
        ck = ck * t.exposure_k / t.supported_k if t.supported_k > 0 else float("nan")
        c = c * t.exposure / t.supported if t.supported > 0 else float("nan")
    return {"ctr@k": ck / t.shown_k if t.shown_k > 0 else float("nan"), "clicks_per_search": c / t.searches}


def dr_metrics(t: IpsTotals, dm_clicks_k: float, dm_clicks: float) -> dict[str, float]:
    """Doubly robust CTR@k and clicks per search: the DM sums (Σ_q N_q·clicks) plus the clipped IPS residual."""
    if t.searches <= 0:
        return {"ctr@k": float("nan"), "clicks_per_search": float("nan")}
    ck = dm_clicks_k + t.residual_k
    return {"ctr@k": ck / t.shown_k if t.shown_k > 0 else float("nan"),
            "clicks_per_search": (dm_clicks + t.residual) / t.searches}
