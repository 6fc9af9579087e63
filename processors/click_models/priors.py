"""Priors on per-pair click-model parameters: empirical-Bayes, rank-informed Beta (and Gamma) priors.

Every per-pair probability φ_i of a click model (attractiveness α, satisfaction σ, a pair's CTR) gets a Beta
prior whose mean depends on where the logging rankers displayed the pair:

    φ_i ~ Beta(m_i·s, (1 − m_i)·s),     m_i = logistic(β₀ + β₁·z₁ᵢ + β₂·z₂ᵢ)

    z₁ᵢ = impression-weighted mean of ln(rank) over the pair's impressions   (where the rankers put it)
    z₂ᵢ = ln(impressions of the pair / searches of its query)               (how often they showed it at all)

(features standardised over the pairs with data). The rankers that produced a log put relevant documents
high and show them often, so (z₁, z₂) carry relevance information that raw CTR keeps by accident and a
position-debiased model would otherwise throw away. This is regression EM in spirit (Wang, Golbandi,
Bendersky, Metzler & Najork, "Position bias estimation for unbiased learning to rank in personal search",
WSDM 2018: relevance is a regression on features, fitted inside the same EM), with the display ranks as the
features and a Beta-binomial link instead of a GBDT; Beta priors on DBN parameters go back to Chapelle &
Zhang (WWW 2009), and Beta-binomial shrinkage of CTRs is standard in ads.

Hyperparameters (β, s) are estimated from the log by **empirical Bayes, maximising the marginal likelihood**
of each pair's successes x_i in n_i trials:

    L(β, s) = Σ_i ln B(x_i + a_i, n_i − x_i + b_i) − ln B(a_i, b_i),   a_i = m_i s, b_i = (1 − m_i) s

(the Beta-binomial; x_i, n_i may be fractional expected counts). For an EM model the trials are the pair's
expected examinations Σ_impressions P(E) under the current examination parameters, and the successes its
clicks. Marginal likelihood rather than moments because the pairs' trial counts differ by orders of magnitude:
moment matching has to weigh pairs by hand, the marginal likelihood weighs each by what its counts say, and it
also yields the strength s that trades prior against data, which moments on sparse pairs estimate badly
(their sampling variance swamps the between-pair variance). It is maximised by BFGS with the exact gradient.

PBM and UBM (``varying_strength``) let the strength vary per pair too, on the same features:

    φ_i ~ Beta(m_i·s_i, (1 − m_i)·s_i),     ln s_i = λ₀ + λ₁·z₁ᵢ + λ₂·z₂ᵢ

a heteroscedastic Beta-binomial (a dispersion model beside the mean model, as in Williams, "Extra-binomial
variation in logistic linear models", Appl. Statist. 1982), with (β, λ) maximising the same marginal
likelihood. The rankers' judgment is not equally sure everywhere: how far the pairs spread around m_i
differs between pairs shown at the top and pairs shown low or rarely, and one strength for all shrinks the
first too hard and the second too little. On the hard scenario's PBM traffic it raised relevance recovery
(Kendall τ, all pairs) from 0.619 to 0.630 at 20,000 searches and from 0.743 to 0.752 at 200,000.

PBM and UBM fitted on session patterns take the features over the query's distinct **rankings** instead
(:func:`ranking_features`; a ranking is a distinct list of docs shown for the query, counted once however many
searches showed it), with R_q the query's rankings and ρ_i those that show pair i:

    z₁ᵢ = mean over ρ_i of ln(rank),     z₂ᵢ = ln(|ρ_i| / R_q),     z₃ᵢ = mean over r in ρ_i of c_r,
    c_r = mean over the docs d of ranking r of (rankings of the query other than r that show d) / (R_q − 1)

z₃ is the *consensus* of the rankings that chose the pair: how far they agree with the query's other
rankings, the agreement rank aggregation trusts (Dwork, Kumar, Naor & Sivakumar, "Rank aggregation methods for
the Web", WWW 2001); a pair that only a ranking unlike the others shows is likelier to be a weak ranker's
choice. Counting rankings instead of impressions keeps (z₁, z₂) free of the noise of which ranker happened to
serve a rare query's few searches: on the hard scenario's PBM traffic at 200,000 searches the impression
share of the pairs with 1-9 impressions is mostly that noise, and the prior mean followed it. Measured there
(Kendall τ-b per query, all pairs; seed 0 / seed 7): 0.752 / 0.752 → 0.766 / 0.764 at 200,000 searches,
0.630 / 0.638 → 0.652 / 0.659 at 20,000 and 0.531 / 0.557 → 0.536 / 0.563 at 2,000, with held-out
perplexity a little lower at every size. Cells aggregated elsewhere
(``fit_cells``) do not say which searches shared a ranking: there the impression features above are used.

When the log says which *system* showed each ranking (:class:`SystemRankings`, beside the patterns), PBM and
UBM add each system's vote to the prior mean (:func:`system_features`: v_is, the mean reciprocal rank system s
gave pair i over its rankings of the query), one coefficient per system, so the fit learns how far each
ranker's choices predict relevance; the votes enter the mean, not the per-pair strength, and a log of one
system has none. The rankings the features are computed over are those of the sessions *and* of the
systems given (:func:`prior_features`), which may cover more searches: a model selection passes every
search's, so that a held-out search's ranking, known before its clicks, counts in the prior of the pairs it
shows; a pair only such rankings show takes the fitted prior's mean at its own features
(:func:`ranked_unseen`). The per-pair strength's slopes λ_j (j >= 1) carry a N(0, 1) hyperprior
(:data:`STRENGTH_SLOPE_SD`), which keeps BFGS off flat ridges where the clipped strength has no gradient.

Given the prior, the estimate is the posterior mean (a_i + x_i)/(a_i + b_i + n_i): with little support it is
the rankers' prior m_i, with much it is the clicks' MLE x_i/n_i. Inside EM the M-step uses this on the
complete-data counts; it is the exact maximiser of ℓ + Σ_i a_i ln φ_i + b_i ln(1 − φ_i), so EM never lowers
that log posterior. Intervals are equal-tailed posterior Beta intervals.

Three choices, the keyword ``prior`` of every model:

* ``"empirical"`` (default): the rank-informed empirical-Bayes prior above;
* ``"pseudocount"``: PyClick's convention (counts start at 1 success in 2 trials), i.e. a = b = 1, posterior
  mean (x + 1)/(n + 2): the baseline to beat, written here, not copied;
* ``"none"``: a = b = 0, the unregularised maximum-likelihood estimate.

COEC's per-pair parameter is a ratio, not a probability: it gets the conjugate Gamma prior instead
(clicks ~ Poisson(r·E), r ~ Gamma(m s, s) with the same log-linear mean in (z₁, z₂); marginal: the negative
binomial), with ``"pseudocount"`` meaning one click in one expected click (prior COEC 1). COEC's click
predictions use a second Gamma prior, on quasi-Poisson counts, with the ranking features, the systems' votes
and a per-pair strength (``varying_strength`` with ``family="gamma"``; see ``click_models.coec``).

Pure numpy/scipy; no I/O.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.special import betaincinv, digamma, expit, gammaincinv, gammaln

from ubi_pipeline.processors.click_models.common import CONFIDENCE, AnyArray, ClickModelError, weighted_count
from ubi_pipeline.processors.clicks.stats import SessionPatterns, SystemRankings, cells_from_sessions

PRIORS = ("empirical", "pseudocount", "none")
DEFAULT_PRIOR = "empirical"
FEATURES: tuple[str, ...] = ("mean_log_rank", "log_display_share")
#: the features of :func:`ranking_features` (PBM and UBM fitted on session patterns)
RANKING_FEATURES: tuple[str, ...] = ("mean_log_rank_over_rankings", "log_ranking_share", "ranking_consensus")
#: strength s is kept inside [e^-4, e^14]: beyond, the likelihood is flat and BFGS would wander
_LOG_S_RANGE = (-4.0, 14.0)
_M_EPS = 1e-6
#: the rank-informed mean needs at least this many pairs with data per coefficient, else the prior mean is one
#: number for all pairs: the "ten events per variable" rule of thumb for logistic regression (Peduzzi et al.,
#: J. Clin. Epidemiol. 1996), which keeps a tiny log from separating perfectly and extrapolating to 0 or 1
MIN_PAIRS_PER_FEATURE = 10
#: standard deviation of the Gaussian hyperprior on the slopes of a per-pair strength (``varying_strength``):
#: on standardised features, one standard deviation of a feature then changes the strength by a factor of
#: about e^±1 a priori, and the data can move it far beyond; it only keeps the fit off flat ridges
STRENGTH_SLOPE_SD = 1.0


def check_prior(prior: str, model: str) -> str:
    """The prior name, lower-cased; raises ``ClickModelError`` naming the choices otherwise."""
    key = str(prior).strip().lower()
    if key not in PRIORS:
        raise ClickModelError(f"{model}: prior must be one of {', '.join(PRIORS)}, got {prior!r}")
    return key


@dataclass(frozen=True)
class BetaPrior:
    """Per-pair Beta(a_i, b_i) pseudo-counts, and how they were obtained (for the judgments' parameters)."""

    kind: str  # empirical | pseudocount | none
    a: NDArray[np.float64]
    b: NDArray[np.float64]
    coef: tuple[float, ...] = ()  # β₀, β₁, β₂ on standardised features (empirical only)
    strength: float = float("nan")  # s = a + b (empirical); 2 for pseudocount, 0 for none
    feature_mean: tuple[float, ...] = ()
    feature_std: tuple[float, ...] = ()
    log_marginal: float = float("nan")
    family: str = "beta"  # "gamma" for COEC (a = shape, b = rate)
    strength_coef: tuple[float, ...] = ()  # λ of a per-pair strength s_i = exp(λ·z_i) (varying_strength)
    feature_names: tuple[str, ...] = FEATURES  # what the columns of the features were
    #: BFGS's inverse-Hessian estimate at the optimum (empirical fits only): the next EM round's refit starts
    #: from it instead of the identity, so a warm-started fit takes a few steps, not ~16. Not recorded.
    hess_inv: NDArray[np.float64] | None = field(default=None, repr=False, compare=False)

    @property
    def mean(self) -> NDArray[np.float64]:
        """Prior mean per pair (NaN where a + b = 0, i.e. no prior)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.a / (self.a + self.b) if self.family == "beta" else self.a / self.b

    def mean_at(self, features: NDArray[np.float64]) -> NDArray[np.float64]:
        """Prior mean of pairs with these raw features (empirical priors only; NaN otherwise)."""
        if self.kind != "empirical":
            return np.full(len(features), np.nan)
        mean, std = np.asarray(self.feature_mean), np.asarray(self.feature_std)
        with np.errstate(invalid="ignore", divide="ignore"):
            z = np.where(std > 0, (features - mean) / np.where(std > 0, std, 1.0), 0.0)
        eta = np.column_stack([np.ones(len(features)), np.nan_to_num(z)]) @ np.asarray(self.coef)
        if self.family == "beta":
            return np.asarray(np.clip(expit(eta), _M_EPS, 1.0 - _M_EPS))
        return np.asarray(np.exp(np.clip(eta, -30.0, 30.0)))

    def posterior_mean(self, successes: AnyArray, trials: AnyArray) -> NDArray[np.float64]:
        """(a + x)/(a + b + n) (Beta) or (a + x)/(b + n) (Gamma; n = expected clicks); NaN with no prior and no data."""
        x = np.asarray(successes, dtype=np.float64)
        n = np.asarray(trials, dtype=np.float64)
        den = self.a + self.b + n if self.family == "beta" else self.b + n
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, (self.a + x) / np.where(den > 0, den, 1.0), np.nan)

    def parameters(self) -> dict[str, Any]:
        """Plain-JSON record of the prior, stored with every judgment."""
        if self.kind == "none":
            return {"kind": "none", "estimate": "maximum likelihood"}
        if self.kind == "pseudocount":
            return {"kind": "pseudocount", "family": self.family,
                    "pseudo_counts": [1.0, 1.0] if self.family == "beta" else [1.0, 1.0],
                    "estimate": "posterior mean"}
        return {
            "kind": "empirical",
            "family": self.family,
            "mean": "logistic" if self.family == "beta" else "log-linear",
            "features": list(self.feature_names),
            "coef": [round(c, 6) for c in self.coef],
            "feature_mean": [round(c, 6) for c in self.feature_mean],
            "feature_std": [round(c, 6) for c in self.feature_std],
            "strength": round(self.strength, 6),
            **({"strength_coef": [round(c, 6) for c in self.strength_coef],
                "strength_per_pair": "exp(strength_coef . [1, z]); 'strength' is its median over the pairs"}
               if self.strength_coef else {}),
            "log_marginal_likelihood": round(self.log_marginal, 4),
            "fitted_by": "empirical Bayes: maximum marginal likelihood",
            "estimate": "posterior mean",
        }


def fixed_prior(kind: str, n: int, family: str = "beta") -> BetaPrior:
    """``pseudocount`` (a = b = 1) or ``none`` (a = b = 0) for ``n`` pairs."""
    v = 1.0 if kind == "pseudocount" else 0.0
    return BetaPrior(kind, np.full(n, v), np.full(n, v), strength=2.0 * v if family == "beta" else v,
                     family=family)


# ----------------------------------------------------------------------------- features


def query_searches(
    cell_pair: AnyArray, cell_rank: AnyArray, imps: AnyArray, query_of_pair: AnyArray, n_pairs: int
) -> NDArray[np.float64]:
    """Searches per query, counted as its impressions at rank 1 (every search shows one result there).

    A query never shown at rank 1 (lists cut above) counts its most-shown pair's impressions instead.
    """
    w = np.asarray(imps, dtype=np.float64)
    pair = np.asarray(cell_pair, dtype=np.int64)
    q = np.asarray(query_of_pair, dtype=np.int64)
    n_q = int(q.max()) + 1 if len(q) else 0
    if not n_q:
        return np.zeros(0)
    shown = weighted_count(pair, w, n_pairs)
    first = np.asarray(cell_rank) == 1
    searches = weighted_count(q[pair[first]], w[first], n_q)
    most = np.zeros(n_q)
    np.maximum.at(most, q, shown)
    return np.where(searches > 0, searches, most)


def rank_features(
    cell_pair: AnyArray, cell_rank: AnyArray, imps: AnyArray, query_of_pair: AnyArray, n_pairs: int
) -> NDArray[np.float64]:
    """[n_pairs, 2] raw features (z₁ mean ln rank, z₂ ln display share); NaN for pairs never shown."""
    w = np.asarray(imps, dtype=np.float64)
    pair = np.asarray(cell_pair, dtype=np.int64)
    shown = weighted_count(pair, w, n_pairs)
    log_rank = weighted_count(pair, w * np.log(np.asarray(cell_rank, dtype=np.float64)), n_pairs)
    q = np.asarray(query_of_pair, dtype=np.int64)
    searches = query_searches(pair, cell_rank, w, q, n_pairs)
    with np.errstate(invalid="ignore", divide="ignore"):
        z1 = np.where(shown > 0, log_rank / shown, np.nan)
        share = shown / np.where(searches[q] > 0, searches[q], np.nan) if len(searches) else shown
        z2 = np.where(shown > 0, np.log(np.minimum(share, 1.0)), np.nan)
    return np.column_stack([z1, z2])


def unseen_features(ranks: AnyArray, queries: AnyArray, searches: NDArray[np.float64]) -> NDArray[np.float64]:
    """Features of a pair the training log never showed, displayed at ``ranks``: z₁ = ln rank, z₂ = ln 1/(S + 1).

    ``searches`` per training query (S); a query beyond them counts as never searched (z₂ = 0).
    """
    r = np.asarray(ranks, dtype=np.float64)
    q = np.asarray(queries, dtype=np.int64)
    inside = (q >= 0) & (q < len(searches))
    s = np.where(inside, searches[np.clip(q, 0, max(len(searches) - 1, 0))] if len(searches) else 0.0, 0.0)
    return np.column_stack([np.log(r), -np.log1p(s)])


def unique_rows(a: NDArray[np.int64], multipliers: NDArray[np.uint64] | None = None,
                chunk: int = 200_000) -> NDArray[np.int64]:
    """The distinct rows of an integer matrix (in no particular order), exactly as ``np.unique(a, axis=0)``
    finds them, about ten times faster: rows are grouped by a 64-bit multiplicative hash and one row kept
    per group; if any group holds two different rows (a hash collision, never seen here) the answer comes
    from ``np.unique`` instead, so the result never depends on the hash (``multipliers``, one per column,
    exist for the test of that fallback).

    Memory: besides the answer, a few arrays of one value per row; the hash is summed a column at a time and
    rows of equal hash are compared ``chunk`` neighbours at a time, so no copy of ``a`` is made (at 50M events
    the report's fits held four copies of a 2M x 11 matrix at once here)."""
    if len(a) < 2:
        return a.copy()
    # fixed random odd multipliers: two different rows of small integers collide only if Σ_j Δ_j·m_j ≡ 0
    # (mod 2^64), which random m_j make a 2^-64 event (multipliers in arithmetic progression would not)
    mult = np.asarray(
        np.random.default_rng(0x5EED).integers(0, 2**63, size=a.shape[1], dtype=np.uint64) * np.uint64(2)
        + np.uint64(1) if multipliers is None else multipliers, dtype=np.uint64)
    h = np.zeros(len(a), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(a.shape[1]):  # arithmetic modulo 2^64, the same sum as over the whole row at once
            h += a[:, j].astype(np.uint64) * mult[j]
    order = np.argsort(h, kind="stable")
    hs = h[order]
    del h
    same_hash = hs[1:] == hs[:-1]
    del hs
    pairs = np.flatnonzero(same_hash)  # order[i] and order[i + 1] share a hash: they must be the same row
    for start in range(0, len(pairs), max(1, int(chunk))):
        i = pairs[start:start + chunk]
        if np.any(a[order[i]] != a[order[i + 1]]):
            return np.unique(a, axis=0)
    return a[order[np.concatenate([[True], ~same_hash])]]


def ranking_features(
    query: AnyArray, docs: AnyArray, query_of_pair: AnyArray, n_pairs: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """[n_pairs, 3] features over the distinct rankings of each query, and the number of rankings per query.

    ``query``/``docs`` per session pattern (``docs[s, k-1]`` the pair at rank k, -1 where none); a *ranking*
    is a distinct (query, list of docs), counted once however many searches showed it. With ρ(r) the rankings
    of the pair's query that show it and R_q the query's rankings:

    * z₁ = mean over ρ of ln(rank in that ranking) (over its slots, should a ranking show it twice);
    * z₂ = ln(|ρ| / R_q), the share of the query's rankings that show the pair;
    * z₃ = mean over ρ of c_r, the *consensus* of ranking r: the mean, over the docs r shows, of the share of
      the query's other rankings that show that doc too (NaN when the query has one ranking).

    Counting rankings rather than impressions keeps the features free of the sampling noise of which ranker
    served each search (a rare query's impression shares are mostly that noise), and z₃ says how far the
    rankings that chose the pair agree with the rest: a doc only a ranking unlike all the others shows is
    likelier to be one a weak ranker put there. NaN for pairs no ranking shows.
    """
    q_pat = np.asarray(query, dtype=np.int64)
    d = np.asarray(docs, dtype=np.int64)
    q_pair = np.asarray(query_of_pair, dtype=np.int64)
    n_q = int(q_pair.max()) + 1 if len(q_pair) else 0
    if not len(d) or not n_q:
        return np.full((n_pairs, 3), np.nan), np.zeros(n_q)
    rankings = unique_rows(np.column_stack([q_pat, d]))
    r_query, r_docs = rankings[:, 0], rankings[:, 1:]
    shown = r_docs >= 0
    slot_rank = np.broadcast_to(np.arange(1, r_docs.shape[1] + 1), r_docs.shape)[shown]
    slot_ranking = np.broadcast_to(np.arange(len(rankings))[:, None], r_docs.shape)[shown]
    slot_pair = r_docs[shown]
    per_query = np.bincount(r_query, minlength=n_q).astype(np.float64)
    slots = np.bincount(slot_pair, minlength=n_pairs).astype(np.float64)
    log_rank = np.bincount(slot_pair, weights=np.log(slot_rank), minlength=n_pairs)
    # rankings showing the pair (a list showing a doc twice counts once)
    once = np.unique(slot_ranking * np.int64(n_pairs) + slot_pair) % n_pairs
    count = np.bincount(once, minlength=n_pairs).astype(np.float64)
    others = per_query[r_query][slot_ranking] - 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        z1 = np.where(slots > 0, log_rank / np.where(slots > 0, slots, 1.0), np.nan)
        z2 = np.where(count > 0, np.log(count / np.where(per_query[q_pair] > 0, per_query[q_pair], 1.0)), np.nan)
        other_share = np.where(others > 0, (count[slot_pair] - 1.0) / np.where(others > 0, others, 1.0), np.nan)
    ok = np.isfinite(other_share)
    n_slots = np.bincount(slot_ranking[ok], minlength=len(rankings)).astype(np.float64)
    sums = np.bincount(slot_ranking[ok], weights=other_share[ok], minlength=len(rankings))
    with np.errstate(invalid="ignore", divide="ignore"):
        consensus = np.where(n_slots > 0, sums / np.where(n_slots > 0, n_slots, 1.0), np.nan)
    has = np.isfinite(consensus[slot_ranking])
    c_sum = np.bincount(slot_pair[has], weights=consensus[slot_ranking][has], minlength=n_pairs)
    c_n = np.bincount(slot_pair[has], minlength=n_pairs).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        z3 = np.where(c_n > 0, c_sum / np.where(c_n > 0, c_n, 1.0), np.nan)
    return np.column_stack([z1, z2, z3]), per_query


#: at most this many systems get a feature of their own (the ones that showed the most rankings); a log of more
#: systems keeps the rest out of the prior's features (they still count in every other feature)
MAX_SYSTEMS = 8
#: the column names of :func:`system_features` are this prefix and the system's name
SYSTEM_FEATURE_PREFIX = "shown_by:"


def system_features(systems: SystemRankings, query_of_pair: AnyArray, n_pairs: int
                    ) -> tuple[NDArray[np.float64], tuple[str, ...]]:
    """[n_pairs, S] *votes* of the systems for each pair, and the column names (S = 0 with fewer than 2 systems).

    With R_qs the distinct rankings system s showed for query q and rank_r(i) the rank at which ranking r
    shows pair i:

        v_is = (1/|R_qs|) · Σ_{r in R_qs} [r shows i] / rank_r(i)     (NaN where s never served the pair's query)

    the mean reciprocal rank system s gave the pair: 1 when s always put it first, 0 when s served the query
    and never showed it. Rankers of differing quality disagree, and which system showed a pair, and how high,
    is evidence of its relevance that the pooled display ranks (z₁, z₂) blur and its clicks may not carry at
    all: the empirical Bayes fit learns how far to trust each system (a coefficient per system), as regression
    EM learns a relevance model on any feature of the pair (Wang et al., WSDM 2018). On the hard scenario's PBM
    traffic (seed 0) it took PBM's τ-b on the pairs with 1-9 impressions at 200,000 searches from 0.131 to
    about 0.47 (raw CTR 0.187). A log of one system has no such column (the prior is the ranking-feature
    prior alone); with more than :data:`MAX_SYSTEMS`, the systems that showed the most rankings get one.
    A ranking counts once however many searches showed it (as in :func:`ranking_features`), and a list
    showing a doc twice votes for it at its first rank.
    """
    n_sys = len(systems.names)
    q_pair = np.asarray(query_of_pair, dtype=np.int64)
    if n_sys < 2 or not len(systems.docs):
        return np.zeros((n_pairs, 0)), ()
    rows = unique_rows(np.column_stack([systems.query, systems.system, systems.docs]).astype(np.int64))
    r_query, r_sys, r_docs = rows[:, 0], rows[:, 1], rows[:, 2:]
    per_sys = np.bincount(r_sys, minlength=n_sys)
    keep = np.sort(np.argsort(-per_sys, kind="stable")[:MAX_SYSTEMS])
    keep = keep[per_sys[keep] > 0]
    if len(keep) < 2:
        return np.zeros((n_pairs, 0)), ()
    col_of = np.full(n_sys, -1, dtype=np.int64)
    col_of[keep] = np.arange(len(keep))
    n_q = int(max(q_pair.max() if len(q_pair) else -1, r_query.max())) + 1
    served = np.zeros((n_q, len(keep)))  # |R_qs|
    c = col_of[r_sys]
    ok = c >= 0
    np.add.at(served, (r_query[ok], c[ok]), 1.0)
    votes = np.zeros((n_pairs, len(keep)))  # Σ over s's rankings of 1/rank of the pair
    shown = (r_docs >= 0) & ok[:, None]
    slot_row = np.broadcast_to(np.arange(len(rows))[:, None], r_docs.shape)[shown]
    slot_rank = np.broadcast_to(np.arange(1, r_docs.shape[1] + 1), r_docs.shape)[shown]
    slot_pair = r_docs[shown]
    key = slot_row * np.int64(n_pairs) + slot_pair
    order = np.lexsort((slot_rank, key))  # a list showing a doc twice: its first (highest) slot votes
    first = order[np.concatenate([[True], key[order][1:] != key[order][:-1]])] if len(key) else order
    np.add.at(votes, (slot_pair[first], c[slot_row[first]]), 1.0 / slot_rank[first])
    denom = served[q_pair] if len(q_pair) else np.zeros((0, len(keep)))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(denom > 0, votes / np.where(denom > 0, denom, 1.0), np.nan)
    return out, tuple(SYSTEM_FEATURE_PREFIX + systems.names[j] for j in keep)


@dataclass(frozen=True)
class PriorFeatures:
    """The features of a rank-informed prior mean for each pair, as PBM, UBM, DBN's α and COEC's prediction
    take them: :func:`ranking_features`, then the systems' votes (:func:`system_features`) when the log says
    which system showed which ranking and there are at least two; with the training queries' ranking counts
    (for pairs no training ranking showed) and a note of what was used, for the rows' parameters."""

    features: NDArray[np.float64]
    rankings: NDArray[np.float64]
    names: tuple[str, ...]
    vote_names: tuple[str, ...]
    note: str


def prior_features(sessions: SessionPatterns, systems: SystemRankings | None) -> PriorFeatures:
    """:class:`PriorFeatures` of ``sessions``' pairs; ``systems`` None: the ranking features alone.

    The features are computed over the rankings of ``sessions`` *and* those of ``systems``, which may cover more
    searches than ``sessions`` do (:func:`log_rankings`): a model selection fits on the training searches'
    clicks but passes every search's rankings, since rankings are what the log shows for a search before any
    click (a covariate of the prior mean, as a ranking is the input of every click prediction), and only the
    held-out clicks are what is predicted. The judgments (``ubi process``) fit on every search, so their
    features are the same either way."""
    n_pairs = len(sessions.pairs)
    if systems is not None:
        systems.check(n_pairs)
    query, docs = log_rankings(sessions, systems)
    feats, rankings = ranking_features(query, docs, sessions.pairs.query_index, n_pairs)
    if systems is None:
        return PriorFeatures(feats, rankings, RANKING_FEATURES, (),
                             "not given: the sessions came without the systems that showed them")
    votes, vote_names = system_features(systems, sessions.pairs.query_index, n_pairs)
    if not vote_names:
        n = len(systems.names)
        return PriorFeatures(feats, rankings, RANKING_FEATURES, (), f"{n} system{'s' if n != 1 else ''}: no vote")
    return PriorFeatures(np.column_stack([feats, votes]), rankings, RANKING_FEATURES + vote_names, vote_names,
                         f"{len(vote_names)} systems")


def log_rankings(sessions: SessionPatterns, systems: SystemRankings | None
                 ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(query, docs) rows of the rankings of ``sessions`` followed by those of ``systems`` (if given), docs
    padded with -1 to the wider of the two; :func:`ranking_features` counts each distinct ranking once, so a
    ranking in both counts once, and ``systems`` of the same searches change no feature."""
    query = np.asarray(sessions.query, dtype=np.int64)
    docs = np.asarray(sessions.docs, dtype=np.int64)
    if systems is None or not len(systems.docs):
        return query, docs
    width = max(docs.shape[1], systems.docs.shape[1])

    def pad(d: NDArray[np.int64]) -> NDArray[np.int64]:
        return np.pad(d, ((0, 0), (0, width - d.shape[1])), constant_values=-1)

    return (np.concatenate([query, np.asarray(systems.query, dtype=np.int64)]),
            np.concatenate([pad(docs), pad(np.asarray(systems.docs, dtype=np.int64))]))


def votes_record(note: str, unseen: Any, prior: Any) -> dict[str, Any]:
    """What a rows' prior record says of the systems' votes: ``note`` (:attr:`PriorFeatures.note`), and the
    prior of pairs no training ranking showed when it is a fit of its own (``unseen`` is not ``prior``)."""
    out: dict[str, Any] = {"system_features": note}
    if unseen is not prior:
        out["unseen_pairs"] = {"features": list(unseen.feature_names), "coef": [round(c, 6) for c in unseen.coef],
                               "note": "prior mean of pairs no training ranking showed (they have no vote)"}
    return out


def unseen_positions(alpha: NDArray[np.float64], sessions: SessionPatterns
                     ) -> tuple[NDArray[np.bool_], NDArray[np.int64], NDArray[np.int64]]:
    """Where ``sessions`` show a pair with no fitted parameter (``alpha`` NaN or beyond it: no training
    ranking showed the pair): the [n, K] mask, and each such position's rank and query, the input of
    :func:`unseen_ranking_features`."""
    d = sessions.docs
    inside = (d >= 0) & (d < len(alpha))
    fitted = np.zeros(d.shape, dtype=bool)
    fitted[inside] = ~np.isnan(alpha[d[inside]])
    unseen = (d >= 0) & ~fitted
    ranks = np.broadcast_to(np.arange(1, d.shape[1] + 1), d.shape)[unseen]
    queries = np.broadcast_to(sessions.query[:, None], d.shape)[unseen]
    return unseen, ranks, queries


def ranked_unseen(unseen: NDArray[np.bool_], sessions: SessionPatterns, features: NDArray[np.float64] | None
                  ) -> NDArray[np.bool_]:
    """Of the ``unseen`` positions (:func:`unseen_positions`), those whose pair has features of its own: shown by
    a ranking the prior's features were computed over (:func:`prior_features` with the rankings of searches
    beyond the training ones), though by no training search. Such a pair's prior mean is the fitted prior's at
    its own features (its posterior without data), not a guess from the rank it is shown at."""
    if features is None or not len(features):
        return np.zeros(unseen.shape, dtype=bool)
    d = sessions.docs
    inside = unseen & (d < len(features))
    out = np.zeros(unseen.shape, dtype=bool)
    out[inside] = np.isfinite(features[d[inside], 0])
    return out


def unseen_ranking_features(ranks: AnyArray, queries: AnyArray, rankings: NDArray[np.float64]) -> NDArray[np.float64]:
    """:func:`ranking_features` of a pair no training ranking showed, displayed at ``ranks``: z₁ = ln rank,
    z₂ = ln 1/(R_q + 1) (one ranking of R_q + 1 shows it), z₃ NaN (its ranking is not known: the prior takes
    the mean consensus). ``rankings`` per training query (R_q); a query beyond them has R_q = 0."""
    r = np.asarray(ranks, dtype=np.float64)
    q = np.asarray(queries, dtype=np.int64)
    inside = (q >= 0) & (q < len(rankings))
    n_r = np.where(inside, rankings[np.clip(q, 0, max(len(rankings) - 1, 0))] if len(rankings) else 0.0, 0.0)
    return np.column_stack([np.log(r), -np.log1p(n_r), np.full(len(r), np.nan)])


def standardise(feats: NDArray[np.float64], use: NDArray[np.bool_]
                 ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Design matrix [1, (z − mean)/std] (0 where a feature is NaN or constant), and the mean and std used."""
    f = feats[use]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN feature column is dropped below
        mean = np.nanmean(f, axis=0) if len(f) else np.zeros(feats.shape[1])
        std = np.nanstd(f, axis=0) if len(f) else np.ones(feats.shape[1])
    mean = np.nan_to_num(mean)
    std = np.where(np.nan_to_num(std) > 1e-9, np.nan_to_num(std), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(std > 0, (feats - mean) / np.where(std > 0, std, 1.0), 0.0)
    z = np.nan_to_num(z)
    return np.column_stack([np.ones(len(feats)), z]), mean, std


# ----------------------------------------------------------------------------- empirical Bayes


def _penalised(total: float, grad: NDArray[np.float64], lam: NDArray[np.float64], p: int, n: int,
               slopes_given: bool) -> tuple[float, NDArray[np.float64]]:
    """The objectives' common tail: with per-pair strengths, the N(0, :data:`STRENGTH_SLOPE_SD`²) hyperprior on
    the slopes λ_j (j >= 1) added to the log-likelihood ``total`` and its gradient (whose first ``p`` entries are
    β's); then both negated and scaled by 1/N, for a minimiser."""
    if slopes_given:
        slopes = lam[1:] / STRENGTH_SLOPE_SD**2
        total -= 0.5 * float(lam[1:] @ slopes)
        grad[p + 1:] -= slopes
    scale = 1.0 / max(n, 1)
    return -total * scale, -grad * scale


def _beta_binomial_objective(
    x: NDArray[np.float64], n: NDArray[np.float64], design: NDArray[np.float64], log_s_range: tuple[float, float],
    strength_design: NDArray[np.float64] | None = None,
) -> Any:
    """−(1/N)·Σ_i ln BetaBin(x_i | n_i, m_i s_i, (1 − m_i) s_i) and its gradient, m_i = logistic(β·z_i).

    ``strength_design`` None: one strength, parameters (β, ln s); else ln s_i = λ·w_i on its rows w_i,
    parameters (β, λ), with a N(0, :data:`STRENGTH_SLOPE_SD`²) hyperprior on each slope λ_j (j >= 1): the
    objective is then −(1/N)·(Σ_i ln BetaBin − Σ_j λ_j²/(2σ²)). The gradient of the likelihood is zero where
    ln s_i is clipped to ``log_s_range``; without the hyperprior BFGS could drift there along slopes that
    cancel (seen: λ of ±4,400 on two correlated features, sending some pairs' strength to e^-4, i.e. no prior).
    """
    p = design.shape[1]
    sd = np.ones((len(x), 1)) if strength_design is None else strength_design

    def f(params: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        beta, lam = params[:p], params[p:]
        log_s_raw = sd @ lam
        s = np.exp(np.clip(log_s_raw, *log_s_range))
        m = np.clip(expit(design @ beta), _M_EPS, 1.0 - _M_EPS)
        a, b = m * s, (1.0 - m) * s
        ll = (gammaln(x + a) + gammaln(n - x + b) - gammaln(n + s)
              - gammaln(a) - gammaln(b) + gammaln(s))
        common = digamma(s) - digamma(n + s)
        da = digamma(x + a) - digamma(a) + common
        db = digamma(n - x + b) - digamma(b) + common
        d_eta = s * m * (1.0 - m) * (da - db)
        inside = (log_s_raw > log_s_range[0]) & (log_s_raw < log_s_range[1])
        d_logs = np.where(inside, a * da + b * db, 0.0)
        grad = np.concatenate([design.T @ d_eta, sd.T @ d_logs])
        return _penalised(float(ll.sum()), grad, lam, p, len(x), strength_design is not None)

    return f


def _gamma_poisson_objective(
    x: NDArray[np.float64], e: NDArray[np.float64], design: NDArray[np.float64], log_s_range: tuple[float, float],
    strength_design: NDArray[np.float64] | None = None,
) -> Any:
    """−(1/N)·Σ_i ln NegBin(x_i | m_i s_i, s_i / (s_i + e_i)) and its gradient, ln m_i = β·z_i (COEC's marginal).

    ``strength_design`` None: one strength, parameters (β, ln s); else ln s_i = λ·w_i with the N(0,
    :data:`STRENGTH_SLOPE_SD`²) hyperprior on the slopes λ_j (j >= 1), as :func:`_beta_binomial_objective`.
    """
    sd = np.ones((len(x), 1)) if strength_design is None else strength_design
    p = design.shape[1]

    def f(params: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        beta, lam = params[:p], params[p:]
        log_s_raw = sd @ lam
        log_s = np.clip(log_s_raw, *log_s_range)
        s = np.exp(log_s)
        a = np.exp(np.clip(design @ beta, -30.0, 30.0)) * s
        ll = gammaln(x + a) - gammaln(a) + a * log_s - (a + x) * np.log(s + e)
        da = digamma(x + a) - digamma(a) + log_s - np.log(s + e)
        ds = a / s - (a + x) / (s + e)
        inside = (log_s_raw > log_s_range[0]) & (log_s_raw < log_s_range[1])
        grad = np.concatenate([design.T @ (a * da), sd.T @ np.where(inside, a * da + s * ds, 0.0)])
        return _penalised(float(ll.sum()), grad, lam, p, len(x), strength_design is not None)

    return f


def _positive_definite(m: NDArray[np.float64]) -> bool:
    """Whether ``m`` is finite, symmetric and positive definite (what BFGS requires of a starting inverse Hessian)."""
    if not np.all(np.isfinite(m)) or not np.array_equal(m, m.T):
        return False
    try:
        np.linalg.cholesky(m)
    except np.linalg.LinAlgError:
        return False
    return True


def fit_prior(
    successes: AnyArray,
    trials: AnyArray,
    features: NDArray[np.float64],
    *,
    family: str = "beta",
    start: BetaPrior | None = None,
    varying_strength: bool = False,
    feature_names: tuple[str, ...] = FEATURES,
    strength_features: int | None = None,
) -> BetaPrior:
    """Empirical-Bayes prior: (β, s) maximising the Beta-binomial (or Gamma-Poisson) marginal likelihood.

    ``successes``/``trials`` per pair (trials: expected examinations or impressions; for ``gamma``, the
    expected clicks); ``features`` from :func:`rank_features`. Pairs without trials do not enter the fit and
    get the prior at the mean features. ``start`` warm-starts from an earlier fit (EM rounds).
    ``varying_strength``: the strength is per pair, ln s_i = λ·z_i on the same standardised features (a
    heteroscedastic Beta-binomial, Williams, Appl. Statist. 1982; for ``gamma``, the negative binomial's
    shape likewise: COEC's prediction prior), fitted jointly with β;
    ``strength`` then records the median s_i over the pairs with trials. ``feature_names`` name the columns
    of ``features`` in the prior's record. ``strength_features`` (with ``varying_strength``): the per-pair
    strength uses only the first that many features (the rest enter the mean only); None: all of them.
    """
    n = np.maximum(np.asarray(trials, dtype=np.float64), 0.0)
    x = np.asarray(successes, dtype=np.float64)
    x = np.clip(x, 0.0, n) if family == "beta" else np.maximum(x, 0.0)
    use = n > 0
    if use.sum() < MIN_PAIRS_PER_FEATURE * (features.shape[1] + 1):  # too few pairs for a regression
        features = np.full_like(features, np.nan)
    design, f_mean, f_std = standardise(features, use)
    p = design.shape[1]
    varying = varying_strength
    sp = p if strength_features is None else min(p, strength_features + 1)  # columns of the strength's design
    q = sp if varying else 1
    if start is not None and start.kind == "empirical" and len(start.coef) == p:
        lam0 = (np.asarray(start.strength_coef) if len(start.strength_coef) == q
                else np.append(np.log(start.strength), np.zeros(q - 1)))
        x0 = np.append(np.asarray(start.coef), lam0)
    else:
        rate = x[use].sum() / max(n[use].sum(), 1e-12) if use.any() else 0.5
        if family == "beta":
            rate = float(np.clip(rate, 1e-4, 1 - 1e-4))
            eta0 = np.log(rate / (1.0 - rate))
        else:
            eta0 = np.log(max(rate, 1e-4))
        x0 = np.zeros(p + q)
        x0[0], x0[p] = eta0, np.log(10.0)
    # the prior may not weigh more than the whole log it was fitted on: s <= Σ trials. Without this bound a
    # log whose few pairs happen to agree (no visible spread between pairs) would get s -> infinity and
    # intervals of zero width.
    log_s_range = (_LOG_S_RANGE[0], float(min(_LOG_S_RANGE[1], np.log(max(n[use].sum(), 1.0)))))
    log_s_range = (min(log_s_range), log_s_range[1])
    x0[p] = float(np.clip(x0[p], *log_s_range))
    if use.sum() >= 2:
        if family == "beta":
            objective = _beta_binomial_objective(x[use], n[use], design[use], log_s_range,
                                                 design[use, :sp] if varying else None)
        else:
            objective = _gamma_poisson_objective(x[use], n[use], design[use], log_s_range,
                                                 design[use, :sp] if varying else None)
        options: dict[str, Any] = {"maxiter": 200, "gtol": 1e-7}
        warm = start.hess_inv if start is not None and start.kind == "empirical" else None
        if warm is not None and warm.shape == (p + q, p + q):
            warm = (warm + warm.T) / 2.0  # BFGS checks exact symmetry; its update keeps it only to rounding
            if _positive_definite(warm):
                options["hess_inv0"] = warm
        res = minimize(objective, x0, jac=True, method="BFGS", options=options)
        params = res.x if np.all(np.isfinite(res.x)) else x0
        hess_inv = np.asarray(res.hess_inv) if np.all(np.isfinite(res.x)) else None
        log_marginal = -float(objective(params)[0]) * int(use.sum())
    else:  # one pair or none: nothing to learn a spread from; a weak prior at the pooled rate
        params, log_marginal, hess_inv = x0, float("nan"), None
    beta, lam = params[:p], params[p:]
    eta = design @ beta
    if varying:
        s_i = np.exp(np.clip(design[:, :sp] @ lam, *log_s_range))
        s = float(np.median(s_i[use])) if use.any() else float(np.exp(lam[0]))
    else:
        s = float(np.exp(np.clip(lam[0], *log_s_range)))
        s_i = np.full(len(eta), s)
    if family == "beta":
        m = np.clip(expit(eta), _M_EPS, 1.0 - _M_EPS)
        a, b = m * s_i, (1.0 - m) * s_i
    else:
        a, b = np.exp(np.clip(eta, -30.0, 30.0)) * s_i, s_i
    return BetaPrior("empirical", a, b, tuple(float(c) for c in beta), s, tuple(float(v) for v in f_mean),
                     tuple(float(v) for v in f_std), log_marginal, family,
                     tuple(float(c) for c in lam) if varying else (), tuple(feature_names), hess_inv)


def make_prior(
    kind: str,
    successes: AnyArray,
    trials: AnyArray,
    features: NDArray[np.float64] | None,
    *,
    family: str = "beta",
    start: BetaPrior | None = None,
) -> BetaPrior:
    """The prior of ``kind`` for these pairs (``features`` only needed for ``empirical``)."""
    n_pairs = len(np.asarray(trials))
    if kind != "empirical":
        return fixed_prior(kind, n_pairs, family)
    if features is None:
        raise ClickModelError("an empirical prior needs the pairs' rank features")
    return fit_prior(successes, trials, features, family=family, start=start)


def same_prior(p: BetaPrior, q: BetaPrior, tol: float = 1e-2) -> bool:
    """Whether two empirical fits agree: coefficients and log strength within ``tol`` (far inside their
    sampling error, so further rounds would not change an estimate visibly)."""
    if p.kind != q.kind or len(p.coef) != len(q.coef):
        return False
    if p.kind != "empirical":
        return True
    if len(p.strength_coef) != len(q.strength_coef):
        return False
    if p.strength_coef and np.max(np.abs(np.subtract(p.strength_coef, q.strength_coef))) >= tol:
        return False
    return bool(np.max(np.abs(np.subtract(p.coef, q.coef))) < tol
                and abs(np.log(p.strength) - np.log(q.strength)) < tol)


# ----------------------------------------------------------------------------- intervals


def posterior_interval(
    mean: AnyArray, concentration: AnyArray, confidence: float = CONFIDENCE
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Equal-tailed interval of Beta(m·c, (1 − m)·c): the posterior with mean m and total count c.

    ``c`` is prior strength plus the pair's (effective) trials; NaN where c <= 0 or m is NaN.
    """
    m = np.clip(np.asarray(mean, dtype=np.float64), 1e-12, 1.0 - 1e-12)
    c = np.asarray(concentration, dtype=np.float64)
    ok = (c > 0) & np.isfinite(m)
    tail = (1.0 - confidence) / 2.0
    cc = np.where(ok, c, 1.0)
    with np.errstate(invalid="ignore"):
        lo = betaincinv(m * cc, (1.0 - m) * cc, tail)
        hi = betaincinv(m * cc, (1.0 - m) * cc, 1.0 - tail)
    lo, hi = np.fmin(lo, m), np.fmax(hi, m)
    return np.where(ok, lo, np.nan), np.where(ok, hi, np.nan)


def gamma_posterior_interval(
    shape: AnyArray, rate: AnyArray, confidence: float = CONFIDENCE
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Equal-tailed interval of Gamma(shape, rate); NaN where either is not positive."""
    a = np.asarray(shape, dtype=np.float64)
    r = np.asarray(rate, dtype=np.float64)
    ok = (a > 0) & (r > 0)
    tail = (1.0 - confidence) / 2.0
    aa, rr = np.where(ok, a, 1.0), np.where(ok, r, 1.0)
    lo = gammaincinv(aa, tail) / rr  # gamma.ppf; scipy.special, because scipy.stats is slow to import
    hi = gammaincinv(aa, 1.0 - tail) / rr
    return np.where(ok, lo, np.nan), np.where(ok, hi, np.nan)


# ----------------------------------------------------------------------------- shared by the models


class LogFeatures:
    """The rank features of a training log's pairs and its searches per query, for fitting and predicting.

    Built from session patterns (``from_sessions``) or from PBM-style cells (``from_cells``).
    """

    def __init__(self, features: NDArray[np.float64], searches: NDArray[np.float64]) -> None:
        self.features = features
        self.searches = searches

    @classmethod
    def from_cells(cls, pair: AnyArray, rank: AnyArray, imps: AnyArray, query_of_pair: AnyArray,
                   n_pairs: int) -> LogFeatures:
        return cls(rank_features(pair, rank, imps, query_of_pair, n_pairs),
                   query_searches(pair, rank, imps, query_of_pair, n_pairs))

    @classmethod
    def from_sessions(cls, sessions: SessionPatterns) -> LogFeatures:
        c = cells_from_sessions(sessions)
        return cls.from_cells(c.pair, c.rank, c.impressions, sessions.pairs.query_index, len(sessions.pairs))

    def prior(self, kind: str, successes: AnyArray, trials: AnyArray, *, family: str = "beta",
              start: BetaPrior | None = None) -> BetaPrior:
        """:func:`make_prior` on these pairs' features."""
        return make_prior(kind, successes, trials, self.features, family=family, start=start)

    def gather(self, values: NDArray[np.float64], sessions: SessionPatterns, prior: BetaPrior,
               fallback: float) -> NDArray[np.float64]:
        """Per shown position, ``values`` of its pair; a pair without a value (never shown in training, or NaN)
        gets the empirical prior's mean at the rank it is shown at, else ``fallback``; NaN where nothing shown."""
        d = sessions.docs
        n = len(values)
        out = np.full(d.shape, np.nan)
        inside = (d >= 0) & (d < n)
        out[inside] = values[d[inside]]
        unseen = (d >= 0) & np.isnan(out)
        if unseen.any():
            if prior.kind == "empirical":
                ranks = np.broadcast_to(np.arange(1, d.shape[1] + 1), d.shape)[unseen]
                queries = np.broadcast_to(sessions.query[:, None], d.shape)[unseen]
                out[unseen] = prior.mean_at(unseen_features(ranks, queries, self.searches))
            else:
                out[unseen] = fallback
        return out


def beta_posterior_interval(prior: BetaPrior, successes: AnyArray, trials: AnyArray,
                            confidence: float = CONFIDENCE) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Equal-tailed interval of the posterior Beta(a + x, b + n − x); NaN where the pair has no trials."""
    n = np.asarray(trials, dtype=np.float64)
    x = np.clip(np.asarray(successes, dtype=np.float64), 0.0, n)
    mean = prior.posterior_mean(x, n)
    lo, hi = posterior_interval(mean, prior.a + prior.b + n, confidence)
    return np.where(n > 0, lo, np.nan), np.where(n > 0, hi, np.nan)
