"""Predict a candidate ranker's online metrics from logged sessions: direct method, IPS, SNIPS, doubly robust.

``predict(patterns, rankings)`` fits the click model on the log, evaluates every method on the logged query
distribution and puts a percentile bootstrap interval on each figure: searches are resampled (multinomially,
over the weighted patterns) and the click model and the propensities are *refitted* on every replicate, so the
interval carries the estimation error of the model, not only the query mix. What no resampling can show is
the bias of a wrong model or of documents the log never showed: the share of the candidate's top k resting
on the model's prior only (``prior_share``) and the share unsupported by any logged impression
(``unsupported_share``) are printed beside the figures for that reason.

Documents the log never showed for the query are valued from what the user knows about them
(:mod:`ubi_pipeline.processors.counterfactual.evidence`, argument ``evidence``): human grades, the log's hit lists below the
displayed depth, the candidate's own scores, and only then a prior: the median fitted click probability at
rank 1 of the *deep pairs* (shown at a mean display rank below K/2, the nearest the log has to the documents
it left out; ``unseen="deep"``, the default) or the click model's own prior (``unseen="prior"``). Each kind
of evidence gives each such document a range; ``Prediction.evidence_shares`` says what share of the
candidate's top k rests on each kind. Each figure carries three intervals:

* the bootstrap interval ``[low, high]`` (sampling error of the log and of the refitted model only);
* the *primary* interval ``[cal_low, cal_high]`` (the attribute names are those of the calibrated interval it
  replaces): the lower bootstrap quantile with every unseen document at the low end of its evidence's range
  (re-read on each replicate) and the upper quantile with them at the high end. It adds to the sampling error
  the uncertainty about the unseen documents, as a bound with all of them moving together (a sensitivity
  interval in the sense of partial identification, Manski, *Partial Identification of Probability
  Distributions*, 2003). A document with no evidence but the log ranges over every deep pair's click
  probability (``PRIOR_RANGE``), so the interval widens towards the prior-free one as the evidence thins.
  Checked on a generator the rules were not built on (``bench/counterfactual_heldout.py``);
* the prior-free interval ``[bound_low, bound_high]``: the same with the unseen documents anywhere in [0, 1]
  (what the log alone can say).

The kernels are :mod:`ubi_pipeline.processors.counterfactual.direct` and :mod:`ubi_pipeline.processors.counterfactual.ips`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models import get_model
from ubi_pipeline.processors.click_models.common import gather
from ubi_pipeline.processors.click_models.evaluate import evaluate, split_sessions
from ubi_pipeline.processors.click_models.pbm import PBM
from ubi_pipeline.processors.clicks.stats import CELL_CHUNK_PATTERNS, SessionPatterns
from ubi_pipeline.processors.counterfactual.direct import (
    LINEAR_METRICS,
    METRICS,
    PositionProbs,
    aggregate,
    dbn_position_probs,
    pbm_position_probs,
    prior_share,
    query_metrics,
)
from ubi_pipeline.processors.counterfactual.evidence import (
    PRIOR,
    PRIOR_RANGE,
    EvidenceArrays,
    UnseenEvidence,
    evidence_arrays,
    evidence_shares,
    slot_kinds,
    slot_values,
)
from ubi_pipeline.processors.counterfactual.ips import (
    DEFAULT_CLIP,
    LoggedArrays,
    dr_metrics,
    ips_metrics,
    ips_totals,
)
from ubi_pipeline.processors.propensity.common import PropensityError
from ubi_pipeline.processors.propensity.randomized import SwapSessions, arm_counts, swap_ratios
from ubi_pipeline.schemas.cli_names import COUNTERFACTUAL_METHODS as METHODS
from ubi_pipeline.schemas.cli_names import DEFAULT_REPLICATES
from ubi_pipeline.schemas.errors import UbiError

MODELS = ("pbm", "dbn")
#: The click models are fitted without a prior on α by default: the rank-informed empirical prior shrinks a
#: document the logging ranker showed deep towards "deep documents are poor", which is the belief a candidate
#: that promotes it contradicts. On ``bench/counterfactual.py`` (12 PBM pairs) it raised the direct method's MAE
#: of CTR@10 (README). ``model_options={"prior": ...}`` (``ubi predict --prior``) chooses another.
DEFAULT_MODEL_OPTIONS: dict[str, Any] = {"prior": "none"}


#: Documents the log never showed for a query (``unseen``): "deep" gives them, in the direct method and the doubly
#: robust point estimate, the median fitted click probability at rank 1 of the pairs the log showed below rank
#: K/2 (``_Fit.deep_click_probs``); "prior" keeps the click model's own prior (the mean over what was shown,
#: which the documents the logging ranker left out seldom reach).
UNSEEN_CHOICES = ("deep", "prior")


class PredictionError(UbiError):
    """A prediction cannot be made: bad options, or a candidate that shares no query with the log."""


@dataclass(frozen=True)
class CandidateArrays:
    """A candidate's rankings over the log's queries, as pair ids of the log's :class:`PairIndex`.

    ``docs[q, k-1]`` is the pair at rank k of query q's list: a logged pair id, ``unseen`` (= number of pairs)
    for a document the log never showed for q, -1 past the end of the list. ``rank_of_pair[p]`` is the rank
    the candidate gives pair p (0: not in its list); ``length[q]`` its list length for q (0: q not covered).
    """

    docs: NDArray[np.int64]
    rank_of_pair: NDArray[np.int64]
    length: NDArray[np.int64]
    unseen: int
    run_queries: int  # queries of the candidate
    matched_queries: int  # of those, how many the log has
    cut_docs: int  # ranked docs beyond the deepest rank K (ignored)
    doc_ids: tuple[tuple[str | None, ...], ...] = ()  # per query number, the doc id of each slot (None: empty)


def query_texts(patterns: SessionPatterns) -> list[str]:
    """The normalised text of each query number of ``patterns`` (via its :class:`PairIndex`)."""
    pairs = patterns.pairs
    n_q = int(max(pairs.query_index.max(initial=-1), patterns.query.max(initial=-1))) + 1
    texts = [""] * n_q
    for qi, text in zip(pairs.query_index.tolist(), pairs.queries.tolist(), strict=True):
        texts[qi] = str(text)
    return texts


def candidate_arrays(patterns: SessionPatterns, rankings: Mapping[str, Sequence[str]]) -> CandidateArrays:
    """Map ``rankings`` (normalised query text -> doc ids in rank order) onto the log's pairs, cut at K."""
    pairs = patterns.pairs
    k = patterns.max_rank
    texts = query_texts(patterns)
    q_of = {t: q for q, t in enumerate(texts)}
    pair_of = {(int(q), str(d)): p for p, (q, d) in enumerate(zip(pairs.query_index.tolist(), pairs.doc_ids.tolist(),
                                                                    strict=True))}
    unseen = len(pairs)
    docs = np.full((len(texts), k), -1, dtype=np.int64)
    rank_of_pair = np.zeros(len(pairs), dtype=np.int64)
    length = np.zeros(len(texts), dtype=np.int64)
    matched = cut = 0
    slot_docs: list[list[str | None]] = [[None] * k for _ in texts]
    for text, ranking in rankings.items():
        q = q_of.get(text)
        if q is None:
            continue
        matched += 1
        cut += max(len(ranking) - k, 0)
        for r, doc in enumerate(list(ranking)[:k]):
            p = pair_of.get((q, str(doc)))
            docs[q, r] = unseen if p is None else p
            slot_docs[q][r] = str(doc)
            if p is not None:
                rank_of_pair[p] = r + 1
        length[q] = min(len(ranking), k)
    return CandidateArrays(docs, rank_of_pair, length, unseen, len(rankings), matched, cut,
                           tuple(tuple(x) for x in slot_docs))


@dataclass(frozen=True)
class Figure:
    """One predicted metric: point estimate, percentile bootstrap interval, primary and prior-free intervals.

    ``bound_low``/``bound_high`` widen the bootstrap interval by letting every document the log never showed
    (for that query) take any click probability at rank 1 in [0, 1] instead of the model's prior: the lower
    bootstrap quantile with them at 0, the upper with them at 1. What the log cannot say stays unsaid; the
    width says how much of the prediction is a guess. ``cal_low``/``cal_high``: the *primary* interval, the
    same with each unseen document over the range its evidence gives (module docstring): the interval to
    read by default. NaN where a method has no such interval (SNIPS).
    """

    value: float
    low: float
    high: float
    bound_low: float = float("nan")
    bound_high: float = float("nan")
    cal_low: float = float("nan")
    cal_high: float = float("nan")

    def to_json(self) -> dict[str, float | None]:
        def num(x: float) -> float | None:
            return round(float(x), 6) if np.isfinite(x) else None

        return {"value": num(self.value), "ci_low": num(self.low), "ci_high": num(self.high),
                "prior_free_low": num(self.bound_low), "prior_free_high": num(self.bound_high),
                "calibrated_low": num(self.cal_low), "calibrated_high": num(self.cal_high)}


@dataclass(frozen=True)
class Prediction:
    """The candidate's predicted online metrics per method, with what they rest on."""

    model: str
    k: int
    clip: float
    propensity: str  # where IPS's θ came from: "pbm" (EM on the log) or "randomized" (swap experiment)
    theta_ratio: list[float]
    searches: int  # logged searches of the queries the candidate ranks (the distribution predicted on)
    logged_searches: int
    covered_queries: int
    logged_queries: int
    run_queries: int
    cut_docs: int
    prior_share: float
    unsupported_share: float
    clipped_share: float
    max_weight: float
    replicates: int
    confidence: float
    figures: dict[str, dict[str, Figure]] = field(default_factory=dict)  # method -> metric -> figure
    model_choice: dict[str, float] = field(default_factory=dict)  # auto: held-out log-likelihood per session
    notes: tuple[str, ...] = ()
    unseen: str = "prior"  # what unseen documents' click probability rests on (UNSEEN_CHOICES)
    #: (point, low, high): rank-1 click probability of unseen documents resting on the prior, in the point
    #: estimate and the primary interval (quantiles PRIOR_RANGE of the deep pairs' fitted click probabilities)
    unseen_click: tuple[float, float, float] = (float("nan"), float("nan"), float("nan"))
    #: share of the candidate's top k (search-weighted) resting on each kind of evidence (``EVIDENCE_KINDS``)
    evidence_shares: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return round(float(x), 6) if np.isfinite(x) else None

        return {
            "model": self.model, "k": self.k, "clip": self.clip, "propensity": self.propensity,
            "theta_ratio": [num(x) for x in self.theta_ratio],
            "searches": self.searches, "logged_searches": self.logged_searches,
            "covered_queries": self.covered_queries, "logged_queries": self.logged_queries,
            "run_queries": self.run_queries, "cut_docs": self.cut_docs,
            "prior_share": num(self.prior_share), "unsupported_share": num(self.unsupported_share),
            "clipped_share": num(self.clipped_share), "max_weight": num(self.max_weight),
            "bootstrap": {"replicates": self.replicates, "confidence": self.confidence,
                          "scheme": "searches resampled, click model and propensities refitted per replicate"},
            "methods": {m: {metric.replace("@k", f"@{self.k}"): f.to_json() for metric, f in figs.items()}
                        for m, figs in self.figures.items()},
            "model_choice": {name: num(v) for name, v in self.model_choice.items()},
            "unseen": {"basis": self.unseen, "click_at_rank_1": num(self.unseen_click[0]),
                       "calibrated_range": [num(self.unseen_click[1]), num(self.unseen_click[2])]},
            "evidence_shares": {kind: num(v) for kind, v in self.evidence_shares.items()},
            "notes": list(self.notes),
        }


def ordering(figure: Figure, logged_low: float, logged_high: float) -> str:
    """The candidate against a logged system: "above", "below" or "undetermined" (the intervals overlap).

    Read on the primary interval: only when it lies wholly above (below) the logged system's interval is there
    a direction; a method without a primary interval (SNIPS) is always undetermined.
    """
    low, high = figure.cal_low, figure.cal_high
    if not (np.isfinite(low) and np.isfinite(high)):
        return "undetermined"
    if low > logged_high:
        return "above"
    if high < logged_low:
        return "below"
    return "undetermined"


def _check(model: str, methods: Sequence[str], k: int, clip: float, replicates: int, confidence: float) -> None:
    if model not in (*MODELS, "auto"):
        raise PredictionError(f"--model {model!r}: choose one of {', '.join((*MODELS, 'auto'))}")
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise PredictionError(f"--method {','.join(bad) or '(none)'}: choose from {', '.join(METHODS)} or all")
    if k < 1:
        raise PredictionError(f"k must be at least 1, got {k}")
    if not clip >= 1.0:
        raise PredictionError(f"the clip level is a weight cap >= 1, got {clip}")
    if replicates < 0:
        raise PredictionError(f"bootstrap replicates must be >= 0, got {replicates}")
    if not 0.0 < confidence < 1.0:
        raise PredictionError(f"confidence must lie strictly between 0 and 1, got {confidence}")


def choose_model(patterns: SessionPatterns, seed: int = 0, options: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Held-out log-likelihood per session of each of :data:`MODELS` (80/20 session split, seeded)."""
    train, test = split_sessions(patterns, 0.2, np.random.default_rng([seed, 0xA070]))
    if test.n_sessions == 0 or train.n_sessions == 0:
        return {name: float("nan") for name in MODELS}
    out = {}
    for name in MODELS:
        fitted = get_model(name, **dict(options or {})).fit(train)
        out[name] = evaluate(fitted, test).log_likelihood_per_session
    return out


def model_rejects_pbm(choice: Mapping[str, float]) -> bool:
    """Whether a model choice (``choose_model``) found another model likelier than PBM on held-out sessions."""
    pbm = choice.get("pbm", float("nan"))
    return bool(np.isfinite(pbm) and any(np.isfinite(v) and v > pbm for n, v in choice.items() if n != "pbm"))


class _Fit:
    """A click model (and PBM for θ) fitted on one (re)sampled log, with the arrays the estimators need."""

    def __init__(self, patterns: SessionPatterns, model: str, swaps: SwapSessions | None,
                 swap_weight: NDArray[np.float64] | None, options: Mapping[str, Any]) -> None:
        self.pbm = PBM(**dict(options)).fit(patterns)
        self.model: Any = self.pbm if model == "pbm" else get_model(model, **dict(options)).fit(patterns)
        k = patterns.max_rank
        raw = np.asarray(self.pbm.theta, dtype=np.float64)[:k]
        theta = raw / raw[0] if raw[0] > 0 else np.ones(k)
        self.propensity = "pbm"
        if swaps is not None:
            try:
                ratios = swap_ratios(arm_counts(swaps, swap_weight))[0][:k]
            except PropensityError:  # no swap arm with clicks in this (re)sample: keep the PBM curve
                ratios = np.full(k, np.nan)
            if np.isfinite(ratios[1:]).any():
                theta = np.where(np.isfinite(ratios) & (ratios > 0), ratios, theta)
                self.propensity = "randomized"
        self.theta = theta

    def deep_click_probs(self, patterns: SessionPatterns) -> NDArray[np.float64]:
        """Fitted click probability at rank 1 of every pair the log showed, on average, below rank K/2.

        The logging ranker put them lowest of what it showed: of the documents the log knows, the nearest to
        those it never showed (which it ranked lower still). Every fitted pair when none lies that deep.
        """
        a1, seen, mean_rank = self.pair_summary(patterns)
        ok = np.isfinite(a1) & (seen > 0)
        deep = ok & (mean_rank > patterns.max_rank / 2)
        return a1[deep] if deep.any() else a1[ok]

    def pair_summary(self, patterns: SessionPatterns
                     ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """Per pair: fitted click probability at rank 1, impressions in ``patterns``, mean displayed rank."""
        m = self.model
        alpha = np.asarray(m.alpha, dtype=np.float64)
        scale = float(np.asarray(m.theta, dtype=np.float64)[0]) if m.name == "pbm" else 1.0
        a1 = np.clip(alpha * scale, 0.0, 1.0)
        n = len(alpha)
        seen, rank_sum = np.zeros(n), np.zeros(n)
        # per-slot arrays summed CELL_CHUNK_PATTERNS patterns at a time (a 50M-event log: 2M patterns x 10 ranks)
        for lo in range(0, len(patterns.docs), CELL_CHUNK_PATTERNS):
            docs = patterns.docs[lo:lo + CELL_CHUNK_PATTERNS]
            shown = docs >= 0
            weight = patterns.weight[lo:lo + CELL_CHUNK_PATTERNS, None]
            w = np.broadcast_to(weight, docs.shape)[shown].astype(np.float64)
            pair = docs[shown]
            rank = np.broadcast_to(np.arange(1, docs.shape[1] + 1), docs.shape)[shown]
            seen += np.bincount(pair, weights=w, minlength=n)[:n]
            rank_sum += np.bincount(pair, weights=w * rank, minlength=n)[:n]
        mean_rank = rank_sum / np.where(seen > 0, seen, 1.0)
        return a1, seen, mean_rank

    def position_probs(self, cand: CandidateArrays, unseen: float | NDArray[np.float64] | None = None,
                       sigma: float | None = None) -> tuple[PositionProbs, NDArray[np.bool_]]:
        """Per-position probabilities of the candidate's lists and where they rest on the prior only.

        Parameters per position come from the model itself (``_alpha_at`` / ``_params_at``), so a pair the log
        never showed gets the model's prior as the model defines it (rank-informed under the empirical prior).
        ``unseen``: the click probability at rank 1 given to documents on the prior instead of the prior: one
        for all, or one per slot ([Q, K]; NaN keeps the prior there). ``sigma``: DBN's satisfaction of those
        documents instead of its prior (PBM has none).
        """
        m = self.model
        lists = SessionPatterns(m.pairs, np.arange(len(cand.length), dtype=np.int64), cand.docs,
                                np.zeros(cand.docs.shape, dtype=bool), np.ones(len(cand.length), dtype=np.int64))
        on_prior = (cand.docs >= 0) & ((cand.docs >= len(m.alpha)) |
                                        np.isnan(m.alpha[np.clip(cand.docs, 0, max(len(m.alpha) - 1, 0))]))
        if m.name == "pbm":
            theta = np.asarray(m.theta, dtype=np.float64)
            alpha = (m._alpha_at(lists) if hasattr(m, "_alpha_at")
                     else gather(m.alpha, cand.docs, m.prior_alpha))
            if unseen is not None:  # α on the raw EM scale: click probability at rank 1 is α·θ_1
                raw = np.asarray(unseen, dtype=np.float64) / (theta[0] if theta[0] > 0 else 1.0)
                alpha = np.where(on_prior & np.isfinite(raw), raw, alpha)
            return pbm_position_probs(theta, alpha), on_prior
        if hasattr(m, "_params_at"):
            alpha, sigma_at = m._params_at(lists)
        else:
            alpha, sigma_at = gather(m.alpha, cand.docs, m.prior_alpha), gather(m.sigma, cand.docs, m.prior_sigma)
        if unseen is not None:
            u = np.asarray(unseen, dtype=np.float64)
            alpha = np.where(on_prior & np.isfinite(u), u, alpha)
        if sigma is not None:
            sigma_at = np.where(on_prior, sigma, sigma_at)
        return dbn_position_probs(alpha, sigma_at, float(m.gamma)), on_prior


def _logged(patterns: SessionPatterns, n_queries: int) -> LoggedArrays:
    return LoggedArrays(patterns.query, patterns.docs, patterns.clicks, patterns.weight.astype(np.float64),
                        patterns.pairs.query_index, n_queries)


def _bounds(figs: dict[str, float], extremes: Sequence[dict[str, float]], lo: str = ":lo", hi: str = ":hi") -> None:
    """Add ``<metric>:lo`` / ``<metric>:hi``, the metric with unseen documents at the two extremes."""
    for metric in [m for m in figs if ":" not in m]:
        vals = [e[metric] for e in extremes if metric in e]
        if vals:
            figs[f"{metric}{lo}"], figs[f"{metric}{hi}"] = min(vals), max(vals)


def _unseen_clicks(w: NDArray[np.float64], on_prior: NDArray[np.bool_], shown: NDArray[np.bool_],
                   theta: NDArray[np.float64], a1: NDArray[np.float64] | float, k: int) -> tuple[float, float]:
    """Expected clicks (in the top k, in all) of the unseen slots at rank-1 click probability ``a1``, θ-scaled."""
    n = on_prior.shape[1]
    kk = min(k, n)
    per = w[:, None] * (on_prior & shown) * theta[None, :n] * np.nan_to_num(np.broadcast_to(a1, on_prior.shape))
    return float(per[:, :kk].sum()), float(per.sum())


def _once(patterns: SessionPatterns, cand: CandidateArrays, model: str, methods: Sequence[str], k: int, clip: float,
          swaps: SwapSessions | None, swap_weight: NDArray[np.float64] | None,
          options: Mapping[str, Any], unseen: str, ev: EvidenceArrays) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """Every method's metrics on one (re)sampled log, and the diagnostics of this fit."""
    fit = _Fit(patterns, model, swaps, swap_weight, options)
    n_q = len(cand.length)
    log = _logged(patterns, n_q)
    searches_q = np.bincount(patterns.query, weights=patterns.weight.astype(np.float64), minlength=n_q)
    w = np.where(cand.length > 0, searches_q, 0.0)
    a1, seen, mean_rank = fit.pair_summary(patterns)
    ok = np.isfinite(a1) & (seen > 0)
    deep = ok & (mean_rank > patterns.max_rank / 2)
    ref = a1[deep] if deep.any() else a1[ok]
    u_mid = float(np.median(ref)) if len(ref) else float("nan")
    _, on_prior = fit.position_probs(cand)
    kinds = slot_kinds(ev, on_prior)
    values = slot_values(ev, kinds, a1, seen, mean_rank, cand.rank_of_pair, ref, u_mid)
    point_at = values.point.copy()
    if unseen != "deep":  # the model's own prior for the slots resting on the prior only
        point_at[kinds == PRIOR] = np.nan
    lo_at, hi_at = values.low, values.high
    u_lo, u_hi = np.quantile(ref, PRIOR_RANGE).tolist() if len(ref) else [0.0, 1.0]
    probs, _ = fit.position_probs(cand, unseen=point_at)
    qm = query_metrics(probs, k)
    # a satisfied click ends the scan (DBN): the fewest clicks with unseen documents satisfying most, the most
    # with them satisfying least; their satisfaction rests on no evidence, so it spans the fitted pairs' range
    sig = np.asarray(getattr(fit.model, "sigma", []), dtype=np.float64)
    sig = sig[np.isfinite(sig)]
    s_lo, s_hi = np.quantile(sig, PRIOR_RANGE).tolist() if len(sig) else (None, None)
    extremes = [query_metrics(fit.position_probs(cand, unseen=a, sigma=s)[0], k)
                for a, s in ((0.0, None), (1.0, 0.0 if len(sig) else None))]
    calibrated = [query_metrics(fit.position_probs(cand, unseen=a, sigma=s)[0], k)
                  for a, s in ((lo_at, s_hi), (hi_at, s_lo))]
    out: dict[str, dict[str, float]] = {}
    if "dm" in methods:
        out["dm"] = aggregate(qm, w)
        _bounds(out["dm"], [aggregate(e, w) for e in extremes])
        _bounds(out["dm"], [aggregate(c, w) for c in calibrated], ":clo", ":chi")
    predicted = fit.model.click_probs(patterns) if "dr" in methods else None
    totals = ips_totals(log, cand.rank_of_pair, cand.length, fit.theta, k, clip, predicted)
    if "ips" in methods:
        out["ips"] = ips_metrics(totals)
        # IPS gives documents without support nothing: the lower end; at most θ_k' clicks each: the upper
        def plus(a: NDArray[np.float64] | float) -> dict[str, float]:
            ck, ca = _unseen_clicks(w, on_prior, probs.shown, fit.theta, a, k)
            return ips_metrics(totals._replace(clicks_k=totals.clicks_k + ck, clicks=totals.clicks + ca))

        _bounds(out["ips"], [out["ips"], plus(1.0)])
        _bounds(out["ips"], [plus(lo_at), plus(hi_at)], ":clo", ":chi")
    if "snips" in methods:
        out["snips"] = ips_metrics(totals, self_normalise=True)
    if "dr" in methods:
        out["dr"] = dr_metrics(totals, float((w * qm.clicks_k).sum()), float((w * qm.clicks).sum()))
        _bounds(out["dr"], [dr_metrics(totals, float((w * e.clicks_k).sum()), float((w * e.clicks).sum()))
                            for e in extremes])
        _bounds(out["dr"], [dr_metrics(totals, float((w * c.clicks_k).sum()), float((w * c.clicks).sum()))
                            for c in calibrated], ":clo", ":chi")
    diag = {
        "prior_share": prior_share(on_prior, probs.shown, w, k),
        "unsupported_share": totals.unsupported_k / totals.shown_k if totals.shown_k > 0 else float("nan"),
        "clipped_share": totals.clipped_k / totals.exposure_k if totals.exposure_k > 0 else float("nan"),
        "max_weight": totals.max_weight,
        "theta": fit.theta,
        "propensity": fit.propensity,
        "searches": float(w.sum()),
        "unseen_click": (u_mid, u_lo, u_hi),
        "deep_pairs": len(ref),
        "evidence_shares": evidence_shares(np.where(probs.shown, kinds, -1), w, k),
    }
    return out, diag


#: The refitted model's bias (the replicates' mean less the point: the click model's maximum likelihood is
#: biased where many pairs have few impressions, the incidental-parameter problem) widens the primary interval
#: on the side the bias points to, by this multiple of it: on ``bench/counterfactual_heldout.py --seed-block 0``
#: the bootstrap's estimate was about half the error of the shown documents' part (exponential examination).
BIAS_WIDEN = 2.0


def _widen_for_bias(low: float, high: float, point: float, replicates: Sequence[float]) -> tuple[float, float]:
    """The primary interval widened towards where the model's bias would put the truth (``BIAS_WIDEN``)."""
    r = np.asarray(replicates, dtype=np.float64)
    r = r[np.isfinite(r)]
    if len(r) < 2 or not (np.isfinite(point) and np.isfinite(low) and np.isfinite(high)):
        return low, high
    bias = float(r.mean()) - point  # the estimate sits about this far from the truth, on the other side
    return (low, high - BIAS_WIDEN * bias) if bias < 0 else (low - BIAS_WIDEN * bias, high)


def _quantiles(values: Sequence[float], tail: float) -> tuple[float, float]:
    r = np.asarray(values, dtype=np.float64)
    r = r[np.isfinite(r)]
    if not len(r):
        return float("nan"), float("nan")
    lo, hi = np.quantile(r, [tail, 1.0 - tail])
    return float(lo), float(hi)


def predict(
    patterns: SessionPatterns,
    rankings: Mapping[str, Sequence[str]],
    *,
    model: str = "pbm",
    methods: Sequence[str] = METHODS,
    k: int = 10,
    clip: float = DEFAULT_CLIP,
    replicates: int = DEFAULT_REPLICATES,
    confidence: float = 0.95,
    seed: int = 0,
    swaps: SwapSessions | None = None,
    model_options: Mapping[str, Any] | None = None,
    unseen: str = "deep",
    evidence: UnseenEvidence | None = None,
    progress: Callable[[int], None] | None = None,
) -> Prediction:
    """The candidate ``rankings`` (normalised query text -> doc ids) predicted from the logged ``patterns``.

    ``model``: pbm, dbn, or auto (the better held-out log-likelihood of the two). ``methods``: any of dm, ips,
    snips, dr. ``swaps``: the log's randomised swap experiment; when given, IPS uses its θ_k/θ_1 (Joachims et
    al., WSDM 2017) instead of the PBM fit's. ``clip``: the IPS weight cap M. ``replicates``: bootstrap
    replicates (0: point estimates only). ``unseen``: "deep" (default) or "prior", what documents the log never
    showed rest on in the direct method and DR (module docstring). ``evidence``: human grades, the log's hit
    lists below the displayed depth and the candidate's scores, which value those documents before any prior
    (:mod:`ubi_pipeline.processors.counterfactual.evidence`). ``progress(done)`` is called after each replicate.
    """
    _check(model, methods, k, clip, replicates, confidence)
    if unseen not in UNSEEN_CHOICES:
        raise PredictionError(f"unseen={unseen!r}: choose one of {', '.join(UNSEEN_CHOICES)}")
    options = dict(DEFAULT_MODEL_OPTIONS if model_options is None else model_options)
    if patterns.n_sessions == 0:
        raise PredictionError("the log holds no sessions to predict from")
    cand = candidate_arrays(patterns, rankings)
    if not (cand.length > 0).any():
        raise PredictionError(f"none of the candidate's {cand.run_queries} queries was logged; a prediction needs "
                              "the candidate to rank queries the log has (query ids are matched as normalised text)")
    texts = query_texts(patterns)
    texts += [""] * (len(cand.length) - len(texts))
    ev = evidence_arrays(texts, [list(x) for x in cand.doc_ids], patterns.pairs.query_index,
                         [str(d) for d in patterns.pairs.doc_ids], cand.docs >= 0, evidence, k)
    choice: dict[str, float] = {}
    if model == "auto":
        choice = choose_model(patterns, seed, options)
        finite = {n: v for n, v in choice.items() if np.isfinite(v)}
        model = max(finite, key=finite.__getitem__) if finite else "pbm"
    point, diag = _once(patterns, cand, model, methods, k, clip, swaps, None, options, unseen, ev)
    rng = np.random.default_rng([seed, 0xCF])
    n = patterns.n_sessions
    p = patterns.weight / n
    reps: dict[str, dict[str, list[float]]] = {m: {x: [] for x in point[m]} for m in point}
    for b in range(replicates):
        wb = rng.multinomial(n, p)
        keep = wb > 0
        boot = SessionPatterns(patterns.pairs, patterns.query[keep], patterns.docs[keep], patterns.clicks[keep],
                               wb[keep].astype(np.int64))
        sw = None
        if swaps is not None:
            total = int(swaps.weight.sum())
            sw = rng.multinomial(total, swaps.weight / total).astype(np.float64) if total else None
        values, _ = _once(boot, cand, model, methods, k, clip, swaps, sw, options, unseen, ev)
        for m, figs in values.items():
            for x, v in figs.items():
                reps[m][x].append(v)
        if progress is not None:
            progress(b + 1)
    tail = (1.0 - confidence) / 2.0
    ips_rejected = model_rejects_pbm(choice)
    figures: dict[str, dict[str, Figure]] = {}
    for m in point:
        figures[m] = {}
        for x in METRICS:
            if x not in point[m]:
                continue
            lo, hi = _quantiles(reps[m][x], tail)
            b_lo = _quantiles(reps[m].get(f"{x}:lo", []), tail)[0] if f"{x}:lo" in point[m] else np.nan
            b_hi = _quantiles(reps[m].get(f"{x}:hi", []), tail)[1] if f"{x}:hi" in point[m] else np.nan
            if replicates == 0 and f"{x}:lo" in point[m]:
                b_lo, b_hi = point[m][f"{x}:lo"], point[m][f"{x}:hi"]
            c_lo = _quantiles(reps[m].get(f"{x}:clo", []), tail)[0] if f"{x}:clo" in point[m] else np.nan
            c_hi = _quantiles(reps[m].get(f"{x}:chi", []), tail)[1] if f"{x}:chi" in point[m] else np.nan
            if replicates == 0 and f"{x}:clo" in point[m]:
                c_lo, c_hi = point[m][f"{x}:clo"], point[m][f"{x}:chi"]
            c_lo, c_hi = _widen_for_bias(float(c_lo), float(c_hi), point[m][x], reps[m][x])
            b_lo, b_hi = _widen_for_bias(float(b_lo), float(b_hi), point[m][x], reps[m][x])
            if m == "ips" and ips_rejected:  # its weights rest on the item-position model the log rejects
                c_lo = c_hi = np.nan
            figures[m][x] = Figure(point[m][x], lo, hi, float(b_lo), float(b_hi), float(c_lo), float(c_hi))
    notes = []
    if ips_rejected and "ips" in methods:
        notes.append("ips has no primary interval: its propensities assume the position-based model, which the "
                     "log's held-out likelihood rejects for dbn")
    if any(m != "dm" for m in methods):
        notes.append(f"ips, snips and dr estimate only {' and '.join(LINEAR_METRICS)} (sums of per-document clicks); "
                     "abandonment and rr_first_click come from dm")
    if cand.run_queries > cand.matched_queries:
        notes.append(f"{cand.run_queries - cand.matched_queries} of the candidate's {cand.run_queries} queries were "
                     "never logged and are left out (no traffic to predict on)")
    return Prediction(
        model=model, k=k, clip=clip, propensity=str(diag["propensity"]),
        theta_ratio=[float(x) for x in diag["theta"]], searches=int(round(diag["searches"])),
        logged_searches=n, covered_queries=int((cand.length > 0).sum()), logged_queries=len(cand.length),
        run_queries=cand.run_queries, cut_docs=cand.cut_docs, prior_share=diag["prior_share"],
        unsupported_share=diag["unsupported_share"], clipped_share=diag["clipped_share"],
        max_weight=diag["max_weight"], replicates=replicates, confidence=confidence, figures=figures,
        model_choice=choice, notes=tuple(notes), unseen=unseen,
        unseen_click=tuple(float(x) for x in diag["unseen_click"]),  # type: ignore[arg-type]
        evidence_shares=dict(diag["evidence_shares"]),
    )
