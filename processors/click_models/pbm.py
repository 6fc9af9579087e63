"""PBM, the position-based model, fitted by EM over aggregated (pair, rank) cells.

    P(C_k = 1) = θ_k · α_qd      (examination at rank k, times attractiveness of (q, d))

(Richardson et al., WWW 2007; Chuklin, Markov & de Rijke, *Click Models for Web Search*, 2015, §3.4.)
EM (Wang et al., "Position bias estimation for unbiased learning to rank", WSDM 2018): a click means
examined and attractive; for a non-click

    P(E = 1 | C = 0) = θ(1 − α) / (1 − θα),     P(A = 1 | C = 0) = (1 − θ)α / (1 − θα),

and the M-step averages these posteriors per rank (θ) and per pair (α). Both depend only on the cell
(pair, rank, clicked), so each iteration is a few ``bincount`` calls over the unique cells, never over
sessions. EM never lowers the log-likelihood; it stops when the relative change falls below ``tol``.

Only the products θ_k·α are identifiable, so the model reports the ratios θ_k/θ_1 and the attractiveness on
the θ_1 = 1 scale, α·θ_1 ("click probability if shown at rank 1"); both are invariant along the likelihood
ridge. Unseen pairs get the prior α₀ = Σ clicks / Σ_impressions θ_k (clicks per expected examination).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Self

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.base import FittedModel, RelevanceEstimate
from ubi_pipeline.processors.click_models.common import (
    AnyArray,
    ClickModelError,
    bernoulli_loglik,
    beta_interval,
    check_cells,
    check_sessions,
    gather,
    pair_support,
    plain_em,
    safe_div,
    squarem,
    weighted_count,
)
from ubi_pipeline.processors.click_models.priors import (
    DEFAULT_PRIOR,
    FEATURES,
    SYSTEM_FEATURE_PREFIX,
    BetaPrior,
    SystemRankings,
    check_prior,
    fit_prior,
    fixed_prior,
    posterior_interval,
    prior_features,
    query_searches,
    rank_features,
    ranked_unseen,
    same_prior,
    unseen_features,
    unseen_positions,
    unseen_ranking_features,
    votes_record,
)
from ubi_pipeline.processors.clicks.fixed_effects import FixedEffectsError, pair_fixed_effects
from ubi_pipeline.processors.clicks.identifiability import IDENTIFIED, UNIDENTIFIED, Identifiability, assess
from ubi_pipeline.processors.clicks.stats import ClickCells, PairIndex, SessionPatterns, cells_from_sessions

DEFAULT_MAX_ITER = 500
DEFAULT_TOL = 1e-8
#: empirical prior: at most this many rounds of (refit the prior, run EM); they stop earlier once two refits of
#: the prior agree (``priors.same_prior``: 4-10 rounds). With examination held fixed (PBM on a linked log,
#: :meth:`PBM._fixed_exam`) the rounds only move the prior and α, and that converges. With examination fitted
#: in the rounds (UBM; PBM when a rank is not linked) it is early stopping, not convergence: the rounds
#: maximise no single objective (EM raises the log posterior at a fixed prior, the refit the prior's marginal
#: likelihood at fixed examination), and past the first few they creep, by a factor of about 0.95 a round,
#: towards a flatter examination curve whose rank slope the rank-informed prior mean absorbs. Run to their
#: limit they measured worse on every log tried (docs/position-bias.md, "Sparse logs and priors": held-out perplexity, τ, θ error)
MAX_PRIOR_ROUNDS = 10
#: EM tolerance of the rounds before the prior has settled
ROUND_TOL = 1e-5


class EmResult(NamedTuple):
    """Result of the factorised EM: examination per group, attractiveness per pair, and the trace."""

    exam: NDArray[np.float64]
    alpha: NDArray[np.float64]
    log_likelihood: list[float]  # of every accepted parameter point, in order (never decreasing)
    iterations: int
    converged: bool


def factorised_em(
    cell_pair: NDArray[np.int64],
    cell_exam: NDArray[np.int64],
    impressions: NDArray[np.float64],
    clicks: NDArray[np.float64],
    exam0: NDArray[np.float64],
    alpha0: NDArray[np.float64],
    max_iter: int = DEFAULT_MAX_ITER,
    tol: float = DEFAULT_TOL,
    accelerate: bool = True,
    prior_a: NDArray[np.float64] | None = None,
    prior_b: NDArray[np.float64] | None = None,
    fix_exam: bool = False,
) -> EmResult:
    """EM for P(C) = e[cell_exam]·α[cell_pair] over aggregated cells (PBM: exam = rank; UBM: (rank, prev click)).

    Pure kernel: all arrays are per cell except ``exam0`` (per examination group) and ``alpha0``, ``prior_a``,
    ``prior_b`` (per pair). ``accelerate`` uses SQUAREM extrapolation with a monotonicity safeguard
    (``common.squarem``). With a Beta prior (a, b) on α the M-step is the complete-data posterior mean
    α = (a + Σ P(A = 1 | C)) / (a + b + impressions), the maximiser of ℓ + Σ a ln α + b ln(1 − α): the
    trace is that log posterior and never decreases. Without a prior (a = b = 0) it is the MLE, and the
    scale ridge is removed by rescaling max e = 1 (with a prior the ridge is gone: the prior sets the scale).
    """
    n_pairs, n_exam = len(alpha0), len(exam0)
    imps = impressions.astype(np.float64)
    clk = clicks.astype(np.float64)
    non = imps - clk
    pa = np.zeros(n_pairs) if prior_a is None else np.asarray(prior_a, dtype=np.float64)
    pb = np.zeros(n_pairs) if prior_b is None else np.asarray(prior_b, dtype=np.float64)
    has_prior = bool((pa + pb > 0).any())
    pair_imps = weighted_count(cell_pair, imps, n_pairs)
    exam_imps = weighted_count(cell_exam, imps, n_exam)
    e_fixed, a_fixed = exam_imps == 0, pair_imps == 0  # no data: keep the start value

    def step(x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        e, a = x[:n_exam], x[n_exam:]
        ec, ac = e[cell_exam], a[cell_pair]
        p = ec * ac
        ll = bernoulli_loglik(p, clk, imps)
        if has_prior:
            ll += log_beta_kernel(a, pa, pb, ~a_fixed)
        with np.errstate(divide="ignore", invalid="ignore"):
            miss = 1.0 - p  # P(C = 0); > 0 wherever a non-click was observed (EM keeps it so)
            post_e = np.where(miss > 0, ec * (1.0 - ac) / miss, 0.0)
            post_a = np.where(miss > 0, (1.0 - ec) * ac / miss, 0.0)
        e_new = safe_div(weighted_count(cell_exam, clk + non * post_e, n_exam), exam_imps, fill=0.0)
        e_new = np.where(e_fixed | fix_exam, e, e_new)
        attracted = weighted_count(cell_pair, clk + non * post_a, n_pairs)
        a_new = safe_div(pa + attracted, pa + pb + pair_imps, fill=0.0)
        a_new = np.where(a_fixed, a, a_new)
        # Only e·α is identified by the likelihood; sliding along that ridge so that max e = 1 changes no
        # probability (α·max e <= 1 stays a probability) and keeps EM from creeping along the ridge.
        top = e_new[~e_fixed].max() if (~e_fixed).any() else 1.0
        if top > 0 and not has_prior:
            e_new = np.where(e_fixed, e_new, e_new / top)
            a_new = np.where(a_fixed, a_new, np.minimum(a_new * top, 1.0))
        return ll, np.concatenate([e_new, a_new])

    x0 = np.concatenate([exam0.astype(np.float64), alpha0.astype(np.float64)])
    run = squarem(step, x0, max_iter, tol) if accelerate else plain_em(step, x0, max_iter, tol)
    return EmResult(
        run.params[:n_exam], run.params[n_exam:], run.log_likelihood, run.iterations, run.converged
    )


def log_beta_kernel(
    a: NDArray[np.float64], pa: NDArray[np.float64], pb: NDArray[np.float64], use: NDArray[np.bool_]
) -> float:
    """Σ over ``use`` of pa·ln a + pb·ln(1 − a) (the log prior up to a constant; 0·ln 0 = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = np.where(use & (pa > 0), pa * np.log(np.where(pa > 0, a, 1.0)), 0.0)
        t2 = np.where(use & (pb > 0), pb * np.log1p(-np.where(pb > 0, a, 0.0)), 0.0)
    return float(t1.sum() + t2.sum())


def expected_examined(
    cell_pair: AnyArray,
    cell_exam: AnyArray,
    imps: AnyArray,
    clicks: AnyArray,
    exam: AnyArray,
    alpha: AnyArray,
    n_pairs: int,
) -> NDArray[np.float64]:
    """Per pair, clicks + Σ_non-clicks P(E = 1 | C = 0) = e(1 − α)/(1 − eα): its examined trials given the data.

    These are the trials of the Beta-binomial marginal the empirical prior is fitted on: with them the
    binomial α^c (1 − α)^(n − c) has the same score (derivative in α) at the current α as the PBM likelihood
    Π (eα)^c (1 − eα)^(1 − c) of the pair's impressions, and n >= c always.
    """
    e = np.asarray(exam, dtype=np.float64)[cell_exam]
    a = np.asarray(alpha, dtype=np.float64)[cell_pair]
    with np.errstate(divide="ignore", invalid="ignore"):
        post_e = np.where(1.0 - e * a > 0, e * (1.0 - a) / (1.0 - e * a), 0.0)
    c = np.asarray(clicks, dtype=np.float64)
    return weighted_count(cell_pair, c + (np.asarray(imps, dtype=np.float64) - c) * post_e, n_pairs)


def initial_exam(group_clicks: AnyArray, group_imps: AnyArray) -> NDArray[np.float64]:
    """Start examination at the group CTR relative to the best group, kept inside (0.05, 0.95)."""
    ctr = safe_div(group_clicks, group_imps, fill=0.0)
    top = ctr.max() if len(ctr) and ctr.max() > 0 else 1.0
    return np.clip(ctr / top * 0.95, 0.05, 0.95)


def initial_alpha(
    cell_pair: AnyArray,
    cell_exam: AnyArray,
    imps: AnyArray,
    clicks: AnyArray,
    exam0: AnyArray,
    n_pairs: int,
) -> NDArray[np.float64]:
    """Start attractiveness at clicks per expected examination (COEC-like), kept inside (0.01, 0.99)."""
    expected = weighted_count(cell_pair, imps * exam0[cell_exam], n_pairs)
    got = weighted_count(cell_pair, clicks, n_pairs)
    return np.clip(safe_div(got, expected, fill=0.5), 0.01, 0.99)


def effective_trials(
    alpha: AnyArray,
    cell_pair: AnyArray,
    cell_exam: AnyArray,
    imps: AnyArray,
) -> NDArray[np.float64]:
    """Per pair, the number of fully-examined trials carrying the same Fisher information about α.

    With examination e known, one impression carries I(α) = e / (α(1 − eα)); a Beta/binomial count of n
    examined trials has variance α(1 − α)/n. Matching the two gives n_eff = Σ_impressions e(1 − α)/(1 − eα),
    which is the impression count when e = 1 and shrinks for impressions rarely examined. α is kept inside
    [0.01, 0.99] here so that the weight stays defined at the boundary.
    """
    a = np.clip(alpha, 0.01, 0.99)[cell_pair]
    weight = cell_exam * (1.0 - a) / (1.0 - cell_exam * a)
    return weighted_count(cell_pair, imps * weight, len(alpha))


def _unit_max(exam: NDArray[np.float64], alpha: NDArray[np.float64], exam_imps: NDArray[np.float64]
              ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Slide along the scale ridge e·α so that the largest examination with data is 1 (no probability changes)."""
    top = float(exam[exam_imps > 0].max()) if (exam_imps > 0).any() else 1.0
    return (exam / top, np.minimum(alpha * top, 1.0)) if top > 0 else (exam, alpha)


def _distinct_cells(pairs: PairIndex, pair: NDArray[np.int64], rank: NDArray[np.int64], imps: NDArray[np.float64],
                    clk: NDArray[np.float64], k: int) -> ClickCells:
    """PBM cells (one row per displayed (pair, rank), ranks 1..k) from cells that may split them (UBM: by
    previous click)."""
    key, inv = np.unique(pair.astype(np.int64) * k + (rank - 1), return_inverse=True)
    return ClickCells(pairs, key // k, key % k + 1, np.rint(weighted_count(inv, imps, len(key))).astype(np.int64),
                      np.rint(weighted_count(inv, clk, len(key))).astype(np.int64), k)


class ExaminationEM(FittedModel):
    """What PBM and UBM share: P(C) = examination(group) · α(pair), fitted by :func:`factorised_em` on cells.

    The two differ only in what indexes examination (the rank; the rank and previous click rank) and in how
    that examination is reported. ``prior`` (``ubi_pipeline.processors.click_models.priors``) chooses the prior on α:
    ``empirical`` alternates EM at a fixed prior with an empirical-Bayes refit of the rank-informed prior on
    (clicks, expected examinations), with a per-pair strength (``priors.fit_prior(varying_strength=True)``),
    on the pairs' features over the query's distinct rankings when fitted on session patterns
    (``priors.ranking_features``; on the cells' impression features with ``fit_cells``),
    until two refits of the prior agree (at most
    :data:`MAX_PRIOR_ROUNDS` rounds, an early stop: see there; each round's EM starts where the last one stopped).
    On a log where no pair links rank 1 to another rank (``identifiability.assess``: unidentified) it stops after
    one round: the examination curve then rests on the prior alone, and each further round only slides along
    that ridge. ``converged`` is true only when the rounds stopped on agreement and the last EM converged; the
    prior's record says why not (``schedule``).
    """

    def __init__(
        self, max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL, prior: str = DEFAULT_PRIOR
    ) -> None:
        if max_iter < 1 or tol <= 0:
            raise ClickModelError(f"{self.name.upper()} needs max_iter >= 1 and tol > 0, got {max_iter}, {tol}")
        self.max_iter = max_iter
        self.tol = tol
        self.prior = check_prior(prior, self.name)

    def _fit_em(
        self,
        pairs: PairIndex,
        pair: NDArray[np.int64],
        exam_id: NDArray[np.int64],
        rank: NDArray[np.int64],
        imps: NDArray[np.float64],
        clk: NDArray[np.float64],
        exam0: NDArray[np.float64],
    ) -> EmResult:
        """Run EM from ``exam0`` and set α (NaN for pairs never shown), the prior α and the pair support.

        The empirical prior's features are those :meth:`_use_sessions` set from the session patterns
        (:func:`priors.ranking_features`), else the cells' own (:func:`priors.rank_features`).
        """
        self.pairs = pairs
        n_pairs = len(pairs)
        alpha0 = initial_alpha(pair, exam_id, imps, clk, exam0, n_pairs)
        pair_imps = weighted_count(pair, imps, n_pairs)
        pair_clk = weighted_count(pair, clk, n_pairs)
        exam_imps = weighted_count(exam_id, imps, len(exam0))
        if self.prior != "empirical":
            self.alpha_prior = fixed_prior(self.prior, n_pairs)
            res = factorised_em(pair, exam_id, imps, clk, exam0, alpha0, self.max_iter, self.tol,
                                prior_a=self.alpha_prior.a, prior_b=self.alpha_prior.b)
            self.prior_rounds = 0
            self.rounds_note = {}
            iterations, converged = res.iterations, res.converged
        else:
            self._searches = query_searches(pair, rank, imps, pairs.query_index, n_pairs)
            ranked = getattr(self, "_session_features", None)
            if ranked is not None and len(ranked[0]) == n_pairs:
                feats, self._rankings, names = ranked
            else:
                feats, self._rankings = rank_features(pair, rank, imps, pairs.query_index, n_pairs), None
                names = FEATURES
            self._features = feats
            exam, alpha = exam0.astype(np.float64), alpha0
            prior: BetaPrior | None = None
            distinct = _distinct_cells(pairs, pair, rank, imps, clk, self.max_rank)
            ident = assess(distinct)
            # examination fixed in advance where the model can (PBM on a log whose ranks are all linked): the
            # rounds then only refit the prior and α, and converge (no ridge left to creep along)
            fixed = self._fixed_exam(distinct, ident)
            if fixed is not None:
                exam = fixed
                alpha = initial_alpha(pair, exam_id, imps, clk, exam, n_pairs)
            # nothing links rank 1 to another rank: θ_k/θ_1 rests on the prior alone and every round slides
            # further along that ridge (measured on the 1M-event bench store: τ 0.476 after one round, 0.403
            # after ten, 0.399 after 33), so one round, reported as not converged
            cap = 1 if ident.verdict == UNIDENTIFIED else MAX_PRIOR_ROUNDS
            iterations, settled, rounds = 0, False, 0
            while rounds < cap:
                rounds += 1
                if prior is not None:  # the scale ridge: put max e = 1 before refitting the prior
                    exam, alpha = _unit_max(exam, alpha, exam_imps)
                examined = expected_examined(pair, exam_id, imps, clk, exam, alpha, n_pairs)
                new = fit_prior(pair_clk, examined, feats, start=prior, varying_strength=True, feature_names=names,
                                strength_features=sum(not n.startswith(SYSTEM_FEATURE_PREFIX) for n in names))
                # early stopping, not convergence: see MAX_PRIOR_ROUNDS
                settled = prior is not None and same_prior(prior, new)
                prior = new
                # rounds before the last only need to get close; the last one converges fully
                tol = self.tol if settled or rounds == cap else max(self.tol, ROUND_TOL)
                res = factorised_em(pair, exam_id, imps, clk, exam, alpha, self.max_iter, tol,
                                    prior_a=prior.a, prior_b=prior.b, fix_exam=fixed is not None)
                iterations += res.iterations
                exam, alpha = res.exam, res.alpha
                if settled:
                    break
            self.alpha_prior = prior if prior is not None else fixed_prior("none", n_pairs)
            self.prior_rounds = rounds
            self.rounds_note = self._rounds_note(settled, cap, ident, fixed is not None)
            converged = res.converged and settled
            self._unseen_prior = self.alpha_prior
            n_plain = sum(not n.startswith(SYSTEM_FEATURE_PREFIX) for n in names)
            if prior is not None and n_plain < len(names):
                # a pair no training ranking showed has no vote: its prior mean comes from the same marginal
                # likelihood on the features it does have, at the final E-step (see _alpha_at)
                examined = expected_examined(pair, exam_id, imps, clk, res.exam, res.alpha, n_pairs)
                self._unseen_prior = fit_prior(pair_clk, examined, feats[:, :n_plain], varying_strength=True,
                                               feature_names=names[:n_plain])
        self.alpha = np.where(pair_imps > 0, res.alpha, np.nan)
        self.log_likelihood_trace = res.log_likelihood
        self.log_likelihood = bernoulli_loglik(res.exam[exam_id] * res.alpha[pair], clk, imps)
        self.iterations = iterations
        self.converged = converged
        expected = float((imps * res.exam[exam_id]).sum())  # expected examinations
        self.prior_alpha = min(max(float(clk.sum()) / expected, 0.0), 1.0) if expected > 0 else 0.5
        self._cells = (pair, exam_id, imps)
        self.impressions = pair_imps.astype(np.int64)
        self.clicks = pair_clk.astype(np.int64)
        self.sessions = self.impressions.copy()
        return res

    def _fixed_exam(self, cells: ClickCells, ident: Identifiability) -> NDArray[np.float64] | None:
        """Examination per group to hold fixed through the empirical prior's rounds, or None to fit it in them."""
        return None

    @staticmethod
    def _rounds_note(settled: bool, cap: int, ident: Identifiability, fixed: bool) -> dict[str, Any]:
        """The schedule's record for the rows' parameters: how examination was fitted, why the rounds stopped."""
        out: dict[str, Any] = {"stopped": "two refits of the prior agreed" if settled else "round cap"}
        if fixed:
            out["examination"] = ("fixed before the rounds: the pair fixed-effects conditional likelihood "
                                  "(ubi_pipeline.processors.propensity.harvest)")
        else:
            out["examination"] = "fitted in the rounds"
            out["note"] = "early stopping: run to their limit the rounds measured worse (docs/position-bias.md, Sparse logs and priors)"
        if ident.verdict == UNIDENTIFIED:
            out["why"] = ("no pair links rank 1 to another rank (identifiability: unidentified), so the examination "
                          "curve rests on the prior alone and further rounds slide along that ridge without settling: "
                          "one round")
        elif not settled:
            out["why"] = (f"two refits of the prior still differed after {cap} rounds"
                          + (f"; ranks {', '.join(map(str, ident.unlinked_ranks))} are not linked to rank 1, so "
                             "their examination rests on the prior alone" if ident.unlinked_ranks else ""))
        return out

    def _em_relevance(self, exam: NDArray[np.float64], first: float) -> RelevanceEstimate:
        """Score = α·``first`` (click probability at the top) with its interval.

        ``exam`` is examination by ``exam_id``. The interval is the posterior Beta of α with the posterior
        mean as its mean and, as its count, the prior strength a + b plus the Fisher-matched trials
        (:func:`effective_trials`); without a prior, the Jeffreys interval on those trials. The uncertainty of
        examination (shared by all pairs) is ignored. Observations: Σ_impressions min(exam/first, 1).
        """
        self._require_fit()
        first = first if first > 0 else 1.0
        raw = np.where(np.isnan(self.alpha), self.prior_alpha, self.alpha)
        score = raw * first
        cell_pair, exam_id, imps = self._cells
        examined = np.minimum(exam / first, 1.0)[exam_id]
        n_eff = effective_trials(score, cell_pair, examined, imps)
        observations = weighted_count(cell_pair, imps * examined, len(self.pairs))
        if self.prior == "none":
            lo, hi = beta_interval(score * n_eff, n_eff)
        else:
            # on α's own scale (the prior's), then onto the score's
            n_raw = effective_trials(raw, cell_pair, np.minimum(exam, 1.0)[exam_id], imps)
            lo, hi = posterior_interval(raw, self.alpha_prior.a + self.alpha_prior.b + n_raw)
            lo = np.where(observations > 0, lo * first, np.nan)
            hi = np.where(observations > 0, np.minimum(hi * first, 1.0), np.nan)
        return self._estimate(score, lo, hi, observations, self.parameters())

    def _alpha_at(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """α per shown position; a pair unseen in training gets the prior: rank-informed (at the rank it is
        shown, :func:`priors.unseen_features`) under the empirical prior, else ``prior_alpha``.

        With the systems' votes, an unseen pair's prior mean is that of a second marginal-likelihood fit on the
        features it has (the ranking features, no votes: no training ranking showed it). Putting its votes at
        their mean instead left it the mean pair's prior: the rank it is shown at, which the votes had taken
        over from z₁, no longer counted (hard scenario, 2,000 cascade searches, seed 7: 221 held-out bits on
        those positions against 136; PBM's held-out perplexity 1.1530 against 1.1326)."""
        alpha = gather(self.alpha, sessions.docs, self.prior_alpha)
        if self.prior != "empirical":
            return alpha
        unseen, ranks, queries = unseen_positions(self.alpha, sessions)
        if unseen.any():
            unseen_feats = (unseen_features(ranks, queries, self._searches) if self._rankings is None
                            else unseen_ranking_features(ranks, queries, self._rankings))
            alpha[unseen] = self._unseen_prior.mean_at(unseen_feats)
            own = ranked_unseen(unseen, sessions, getattr(self, "_features", None))
            alpha[own] = self.alpha_prior.mean[sessions.docs[own]]
        return alpha

    def _use_sessions(self, sessions: SessionPatterns | None, systems: SystemRankings | None = None) -> None:
        """Fit the next empirical prior on :func:`priors.ranking_features` of ``sessions`` (None: on the cells'),
        followed by the systems' votes (:func:`priors.system_features`) when ``systems`` says which system
        showed which ranking (none with fewer than two systems). Records in ``_systems_note`` what was used."""
        self._system_names: tuple[str, ...] = ()
        if sessions is None or self.prior != "empirical":
            self._session_features = None
            self._systems_note = "not used: cells carry no rankings" if sessions is None else "not used"
            return
        f = prior_features(sessions, systems)
        self._systems_note, self._system_names = f.note, f.vote_names
        self._session_features = (f.features, f.rankings, f.names)

    def _prior_parameters(self, first: float) -> dict[str, Any]:
        """The prior's record; the prior mean coefficients are on α's raw scale (times ``first`` for the score)."""
        out = {**self.alpha_prior.parameters(), "rounds": self.prior_rounds, "score_scale": round(first, 6)}
        if self.rounds_note:
            out["schedule"] = self.rounds_note
        if self.prior == "empirical":
            out.update(votes_record(getattr(self, "_systems_note", "not used"),
                                    getattr(self, "_unseen_prior", self.alpha_prior), self.alpha_prior))
        return out

    def parameters(self) -> dict[str, Any]:
        raise NotImplementedError


class PBM(ExaminationEM):
    """Position-based model: examination θ_k per rank times attractiveness α per (query, doc), fitted by EM."""

    name = "pbm"
    uses_systems = True  # the systems' votes enter the empirical prior (priors.system_features)
    version = "1"

    def fit(self, sessions: SessionPatterns, systems: SystemRankings | None = None) -> Self:
        """Aggregate the patterns to (pair, rank) cells, then run EM on them (see :meth:`fit_cells`).

        ``systems`` (which system showed which ranking) adds the systems' votes to the empirical prior's
        features (:func:`priors.system_features`)."""
        check_sessions(sessions)
        self._use_sessions(sessions, systems)
        self._fit_cells(cells_from_sessions(sessions))
        self.impressions, self.clicks, self.sessions = pair_support(sessions)
        return self

    def fit_cells(self, cells: ClickCells) -> Self:
        """EM over cells aggregated elsewhere (e.g. in DuckDB); ``sessions`` per pair = impressions then.

        The empirical prior then uses the cells' features (:func:`priors.rank_features`): cells do not say
        which searches shared a ranking.
        """
        self._use_sessions(None)
        return self._fit_cells(cells)

    def _fit_cells(self, cells: ClickCells) -> Self:
        check_cells(cells)
        k = self.max_rank = cells.max_rank
        imps = cells.impressions.astype(np.float64)
        clk = cells.clicks.astype(np.float64)
        exam_id = cells.rank - 1
        self.rank_impressions = weighted_count(exam_id, imps, k)
        theta0 = initial_exam(weighted_count(exam_id, clk, k), self.rank_impressions)
        self.theta = self._fit_em(cells.pairs, cells.pair, exam_id, cells.rank, imps, clk, theta0).exam
        self._fitted = True
        return self

    def _fixed_exam(self, cells: ClickCells, ident: Identifiability) -> NDArray[np.float64] | None:
        """θ by the pair fixed-effects conditional likelihood when every displayed rank is linked to rank 1.

        Given a pair's total clicks, its clicks at the ranks it was shown at are multinomial in n_k·θ_k whatever
        its attractiveness (Hausman, Hall & Griliches, Econometrica 1984; ``ubi_pipeline.processors.clicks.fixed_effects``), so
        θ needs neither the per-pair α nor the prior. Fitted jointly with them instead, θ and the rank-informed
        prior mean trade off along a ridge (both fall with the rank), and the rounds creep along it towards a
        flatter curve. Measured on the hard scenario's PBM traffic (docs/benchmarks.md, "Click models"; 6 logs): θ error 2-5
        times lower from 20,000 searches up, held-out perplexity and τ equal or better on 4 of the 6 (the other
        two lose 0.0017 of perplexity at 2,000 searches and 0.0035 of τ in one bucket). None (θ fitted in the rounds,
        as UBM's γ always is) when a rank is not linked or no linked pair was clicked.
        """
        if ident.verdict != IDENTIFIED or len(ident.displayed_ranks) < 2:
            return None
        try:
            ratio = pair_fixed_effects(cells)
        except FixedEffectsError:
            return None
        shown = np.isin(np.arange(1, len(ratio) + 1), ident.displayed_ranks)
        if not np.all(np.isfinite(ratio[shown])) or np.any(ratio[shown] <= 0):
            return None
        top = float(ratio[shown].max())
        return np.where(shown, np.clip(ratio / top, 1e-6, 1.0), 0.5)

    @property
    def theta_ratio(self) -> NDArray[np.float64]:
        """θ_k/θ_1, the identifiable examination curve (NaN for ranks never shown)."""
        self._require_fit()
        t = np.where(self.rank_impressions > 0, self.theta, np.nan)
        return t / t[0] if t[0] > 0 else np.full_like(t, np.nan)

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """P(C_k = 1) = θ_k·α_qd (the prior for unseen pairs, see :meth:`ExaminationEM._alpha_at`)."""
        self._require_fit(sessions)
        alpha = self._alpha_at(sessions)
        return alpha * self.theta[None, : sessions.max_rank]

    def conditional_click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """Clicks are independent given the parameters: the conditional probabilities are the full ones."""
        return self.click_probs(sessions)

    def relevance(self) -> RelevanceEstimate:
        """Score = α·θ_1 (click probability at rank 1); see :meth:`ExaminationEM._em_relevance`."""
        self._require_fit()
        return self._em_relevance(self.theta, float(self.theta[0]))

    def parameters(self) -> dict[str, Any]:
        """Model-level parameters worth recording with every judgment."""
        return {
            "model": self.name,
            "version": self.version,
            "theta_ratio": [None if np.isnan(x) else round(float(x), 6) for x in self.theta_ratio],
            "iterations": self.iterations,
            "converged": self.converged,
            "log_likelihood": self.log_likelihood,
            "tol": self.tol,
            "prior_alpha": self.prior_alpha * float(self.theta[0]),
            "prior": self._prior_parameters(float(self.theta[0])),
            "score": "attractiveness on the theta_1 = 1 scale",
        }
