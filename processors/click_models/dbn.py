"""DBN, the dynamic Bayesian network click model (Chapelle & Zhang, WWW 2009), fitted by EM.

    E_1 = 1;  C_k = 1 ⇔ E_k = 1 and A_k = 1,  P(A_k = 1) = α_qd;
    P(S_k = 1 | C_k = 1) = σ_qd,  S_k = 0 without a click;
    P(E_{k+1} = 1 | E_k = 1, S_k = 0) = γ,  E_{k+1} = 0 after satisfaction or once E_k = 0.

Relevance of (q, d) is α·σ, the probability that a result, once examined, satisfies (Chapelle & Zhang §4).

EM with an exact forward-backward over the weighted, deduplicated patterns. Every rank up to the last click
L was examined, and only clicks before L were unsatisfying, so the hidden part is the tail after L. With
N_j = P(no click at ranks j.. | E_j = 1) computed backward,

    N_j = (1 − α_j)(1 − γ + γ N_{j+1}),   Z = P(no click after L | C_L = 1) = σ_L + (1 − σ_L)(1 − γ + γ N_{L+1}),

the posteriors are P(S_L = 1 | C) = σ_L / Z, P(E_{L+1} = 1 | C) = (1 − σ_L) γ N_{L+1} / Z and, down the tail,
P(E_{j+1} = 1 | C) = P(E_j = 1 | C)·γ N_{j+1} / (1 − γ + γ N_{j+1}). Unexamined results keep A ~ α. The
M-step averages P(A = 1 | C) per pair over impressions (α), P(S = 1 | C) per pair over clicks (σ) and the
expected continuations over the expected chances to continue (γ). Each iteration loops over the K ranks,
vectorised across patterns; EM never lowers the likelihood and stops on a relative change below ``tol``.

Priors (``priors``): under ``empirical`` α takes PBM's rank-informed prior, fitted on the query's distinct
rankings (``priors.ranking_features``) and, when ``fit`` is given the systems that showed them, each system's
vote (``priors.system_features``), with a per-pair strength (``fit_prior(varying_strength=True)``); σ takes
the prior on the impression features (``LogFeatures``), its trials the clicks. The impression features with
one strength, which α had before, lost DBN's *full* held-out perplexity to the +1/+2 pseudo-count on PBM
traffic (hard scenario, 20,000 searches: 1.3738 against 1.3712), all of it at rank 1, where the full
prediction is α itself: DBN counts every result above the last click as examined, so on traffic whose
examination falls with the rank (θ_k = 1/k) the α of a pair shown low is biased low, a prior mean on where
the pair was shown learns that bias, and a held-out ranker that puts such a pair first finds it clicked far
more often (CTR 0.74-0.80 against 0.31-0.58 predicted, seed 0). Which systems chose the pair says how relevant it
is apart from where it was shown: with the votes DBN wins every row, full and conditional (1.3675 / 1.3712
there; docs/benchmarks.md, "Accuracy on the hard scenario").

Unseen pairs get the prior mean at the rank they are shown at: α from a second marginal-likelihood fit on
the ranking features alone at the final E-step (such a pair has no vote, as in PBM), σ from its prior at
``priors.unseen_features``; without an empirical prior, α₀ (impression-weighted mean posterior
attractiveness) and σ₀ (click-weighted mean σ). Interval (an approximation, not a bootstrap): Jeffreys intervals for α on the expected number of
examinations and for σ on the clicks, multiplied bound by bound (conservative for the product α·σ).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Self

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.base import FittedModel, RelevanceEstimate
from ubi_pipeline.processors.click_models.cascade import cascade_family_probs, click_extent
from ubi_pipeline.processors.click_models.common import (
    ClickModelError,
    beta_interval,
    check_sessions,
    gather,
    pair_support,
    plain_em,
    safe_div,
    squarem,
    weighted_count,
)
from ubi_pipeline.processors.click_models.dcm import last_click_counts
from ubi_pipeline.processors.click_models.pbm import log_beta_kernel
from ubi_pipeline.processors.click_models.priors import (
    DEFAULT_PRIOR,
    SYSTEM_FEATURE_PREFIX,
    BetaPrior,
    LogFeatures,
    SystemRankings,
    check_prior,
    fit_prior,
    fixed_prior,
    posterior_interval,
    prior_features,
    ranked_unseen,
    same_prior,
    unseen_positions,
    unseen_ranking_features,
    votes_record,
)
from ubi_pipeline.processors.clicks.stats import PairIndex, SessionPatterns

DEFAULT_MAX_ITER = 2000
DEFAULT_TOL = 1e-7
#: empirical priors: at most this many rounds of (refit the priors, run EM from where the last round stopped)
MAX_PRIOR_ROUNDS = 10
#: EM tolerance of the rounds before the prior has settled
ROUND_TOL = 1e-5


def dbn_click_probs(
    alpha: NDArray[np.float64],
    sigma: NDArray[np.float64],
    gamma: float,
    clicks: NDArray[np.bool_] | None = None,
) -> NDArray[np.float64]:
    """Full (``clicks`` None) or conditional click probabilities of a DBN with per-position α, σ."""
    after_click = gamma * (1.0 - np.nan_to_num(sigma))
    after_skip = np.full_like(alpha, gamma)
    return cascade_family_probs(alpha, after_click, after_skip, clicks)


class DbnStats(NamedTuple):
    """Expected sufficient statistics of one E-step and the log-likelihood of the parameters it used."""

    log_likelihood: float
    attracted: NDArray[np.float64]  # Σ w·P(A = 1 | C) per pair
    satisfied: NDArray[np.float64]  # Σ w·P(S = 1 | C) per pair
    examined: NDArray[np.float64]  # Σ w·P(E = 1 | C) per pair
    continued: float  # Σ w·P(E_j = 1, S_j = 0, E_{j+1} = 1 | C)
    could_continue: float  # Σ w·P(E_j = 1, S_j = 0 | C), over j with a result at j + 1


class _Layout(NamedTuple):
    """What stays fixed across EM iterations.

    Everything at or above the last click is known (examined; clicks above it unsatisfied), so it reduces to
    per-pair counts once. What EM must infer is the *tail*: the results below the last click (all results if
    there was none). DBN has no rank parameter, so a tail is fully described by the pair clicked last and the
    pairs shown after it; identical tails of different patterns are merged with their weights summed, and
    stored left-aligned and rank-major ([K, m]) so each step of the rank loop reads one contiguous row.
    """

    n_pairs: int
    idx: NDArray[np.int64]  # [K, m] pair id of the j-th result below the last click (0 where none)
    shown: NDArray[np.bool_]  # [K, m]
    has_click: NDArray[np.bool_]  # [m]
    last_doc: NDArray[np.int64]  # [m] pair clicked last (0 if no click)
    weight: NDArray[np.float64]  # [m] sessions sharing this tail
    imps: NDArray[np.float64]  # per pair, weighted impressions
    clicks: NDArray[np.float64]
    fixed_exams: NDArray[np.float64]  # per pair: impressions at or above the last click (surely examined)
    before_click: NDArray[np.float64]  # per pair: clicks above the last click (unsatisfied, went on)
    before_skip: NDArray[np.float64]  # per pair: skips above the last click (examined, not attracted)
    last_click: NDArray[np.float64]  # per pair: last clicks
    before_steps: float  # Σ w·(transitions above the last click), each surely a continuation


def _layout(sessions: SessionPatterns) -> _Layout:
    n_pairs = len(sessions.pairs)
    docs = sessions.docs
    shown = docs >= 0
    clicks = sessions.clicks & shown
    n, k = docs.shape
    _, last = click_extent(clicks, shown)
    pos = np.arange(k)[None, :]
    w = sessions.weight.astype(np.float64)
    wk = np.broadcast_to(w[:, None], (n, k))
    before = shown & (pos < last[:, None])
    examined = shown & (pos <= last[:, None])
    has_click = last >= 0
    rows = np.arange(n)
    last_doc = np.where(has_click, docs[rows, np.maximum(last, 0)], -1)

    def per_pair(mask: NDArray[np.bool_]) -> NDArray[np.float64]:
        return weighted_count(docs[mask], wk[mask], n_pairs)

    # tail key: (pair clicked last or -1, pairs shown below it left-aligned, -1 padded)
    key = np.full((n, k + 1), -1, dtype=np.int64)
    key[:, 0] = last_doc
    src = last[:, None] + 1 + np.arange(k)[None, :]
    inside = src < k
    key[:, 1:][inside] = docs[np.broadcast_to(rows[:, None], (n, k))[inside], src[inside]]
    uniq, inverse = np.unique(key, axis=0, return_inverse=True)
    tail_w = weighted_count(inverse.ravel(), w, len(uniq))
    tails = np.ascontiguousarray(uniq[:, 1:].T)
    return _Layout(
        n_pairs=n_pairs,
        idx=np.maximum(tails, 0),
        shown=tails >= 0,
        has_click=uniq[:, 0] >= 0,
        last_doc=np.maximum(uniq[:, 0], 0),
        weight=tail_w,
        imps=per_pair(shown),
        clicks=per_pair(clicks),
        fixed_exams=per_pair(examined),
        before_click=per_pair(before & clicks),
        before_skip=per_pair(before & ~clicks),
        last_click=weighted_count(last_doc[has_click], w[has_click], n_pairs),
        before_steps=float((w * np.maximum(last, 0)).sum()),
    )


def _xlogy(count: NDArray[np.float64], p: NDArray[np.float64]) -> float:
    """Σ count·ln p with 0·ln 0 = 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.where(count > 0, count * np.log(np.where(count > 0, p, 1.0)), 0.0).sum())


def dbn_e_step(
    lay: _Layout, alpha: NDArray[np.float64], sigma: NDArray[np.float64], gamma: float
) -> DbnStats:
    """Exact posteriors of A, S, E given the clicks, over the merged tails (loop over ranks only)."""
    k, m = lay.idx.shape
    a = np.where(lay.shown, alpha[lay.idx], 0.0)
    g = gamma

    # backward: N[j] = P(no click from the j-th tail result on | examined there); 1 past the end of the list
    big_n = np.ones((k + 1, m))
    for j in range(k - 1, -1, -1):
        big_n[j] = np.where(lay.shown[j], (1.0 - a[j]) * (1.0 - g + g * big_n[j + 1]), 1.0)
    sig_l = sigma[lay.last_doc]
    # Z = P(no click below the last click | clicked there); without clicks, P(no click at all) = N_1
    z = np.where(lay.has_click, sig_l + (1.0 - sig_l) * (1.0 - g + g * big_n[0]), big_n[0])
    z = np.maximum(z, 1e-300)

    # log P(C) = above-the-last-click part (per-pair counts) + Σ_tails w ln Z
    log_likelihood = (
        _xlogy(lay.before_click + lay.last_click, alpha)
        + _xlogy(lay.before_click, 1.0 - sigma)
        + _xlogy(lay.before_skip, 1.0 - alpha)
        + _xlogy(np.array([lay.before_steps]), np.array([g]))
        + float((lay.weight * np.log(z)).sum())
    )

    # forward: e[j] = P(E = 1 | C) at the j-th tail result
    start = np.where(lay.has_click, (1.0 - sig_l) * g * big_n[0] / z, 1.0)
    e = np.zeros((k, m))
    e[0] = np.where(lay.shown[0], start, 0.0)
    for j in range(1, k):
        denom = 1.0 - g + g * big_n[j]
        ratio = np.divide(g * big_n[j], denom, out=np.zeros(m), where=denom > 0)
        e[j] = np.where(lay.shown[j], e[j - 1] * ratio, 0.0)

    w = lay.weight
    post_s = np.where(lay.has_click, sig_l / z, 0.0)
    # continuation chances: from the last click into the tail, and between consecutive tail results
    into_tail = lay.has_click & lay.shown[0]
    could = float((w * np.where(into_tail, 1.0 - post_s, 0.0)).sum())
    could += float((w[None, :] * np.where(lay.shown[1:], e[:-1], 0.0)).sum())
    went = float((w * np.where(into_tail, e[0], 0.0)).sum()) + float((w[None, :] * e[1:]).sum())
    wk = np.broadcast_to(w[None, :], (k, m))[lay.shown]
    d = lay.idx[lay.shown]
    e_s = e[lay.shown]
    return DbnStats(
        log_likelihood,
        lay.clicks + weighted_count(d, wk * (1.0 - e_s) * a[lay.shown], lay.n_pairs),
        weighted_count(lay.last_doc, w * post_s, lay.n_pairs),
        lay.fixed_exams + weighted_count(d, wk * e_s, lay.n_pairs),
        lay.before_steps + went,
        lay.before_steps + could,
    )


class DbnFit(NamedTuple):
    alpha: NDArray[np.float64]
    sigma: NDArray[np.float64]
    gamma: float
    stats: DbnStats  # E-step at the final parameters
    log_likelihood: list[float]  # of every accepted parameter point (never decreasing)
    iterations: int
    converged: bool


def dbn_em(
    lay: _Layout,
    alpha0: NDArray[np.float64],
    sigma0: NDArray[np.float64],
    gamma0: float,
    max_iter: int = DEFAULT_MAX_ITER,
    tol: float = DEFAULT_TOL,
    fit_gamma: bool = True,
    accelerate: bool = True,
    alpha_prior: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None,
    sigma_prior: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None,
) -> DbnFit:
    """EM for DBN (pure kernel); ``fit_gamma=False`` keeps γ fixed; ``accelerate`` uses ``common.squarem``.

    With Beta priors (a, b) per pair on α and σ the M-step takes complete-data posterior means
    (a + Σ P(A = 1 | C))/(a + b + impressions) and (a + Σ P(S = 1 | C))/(a + b + clicks), the maximisers of the
    log-likelihood plus Σ a ln φ + b ln(1 − φ); the trace is that log posterior and never decreases.
    """
    n_pairs, imps, clk = lay.n_pairs, lay.imps, lay.clicks
    zero = np.zeros(n_pairs)
    aa, ab = alpha_prior if alpha_prior is not None else (zero, zero)
    sa, sb = sigma_prior if sigma_prior is not None else (zero, zero)
    has_prior = bool((aa + ab + sa + sb > 0).any())

    def split(x: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
        return x[:n_pairs], x[n_pairs : 2 * n_pairs], float(x[-1])

    def step(x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        alpha, sigma, gamma = split(x)
        st = dbn_e_step(lay, alpha, sigma, gamma)
        ll = st.log_likelihood
        if has_prior:
            ll += log_beta_kernel(alpha, aa, ab, imps > 0) + log_beta_kernel(sigma, sa, sb, clk > 0)
        alpha = np.where(imps > 0, safe_div(aa + st.attracted, aa + ab + imps, fill=0.0), alpha)
        sigma = np.where(clk > 0, safe_div(sa + st.satisfied, sa + sb + clk, fill=0.0), sigma)
        if fit_gamma and st.could_continue > 0:
            gamma = min(max(st.continued / st.could_continue, 0.0), 1.0)
        return ll, np.concatenate([alpha, sigma, [gamma]])

    x0 = np.concatenate([alpha0, sigma0, [gamma0]]).astype(np.float64)
    run = squarem(step, x0, max_iter, tol) if accelerate else plain_em(step, x0, max_iter, tol)
    alpha, sigma, gamma = split(run.params)
    return DbnFit(
        alpha,
        sigma,
        gamma,
        dbn_e_step(lay, alpha, sigma, gamma),
        run.log_likelihood,
        run.iterations,
        run.converged,
    )


class DBN(FittedModel):
    """Dynamic Bayesian network: attractiveness α and satisfaction σ per pair, persistence γ, fitted by EM."""

    name = "dbn"
    uses_systems = True  # the systems' votes enter the empirical prior (priors.system_features)
    version = "1"

    def __init__(
        self,
        max_iter: int = DEFAULT_MAX_ITER,
        tol: float = DEFAULT_TOL,
        gamma: float | None = None,
        prior: str = DEFAULT_PRIOR,
    ) -> None:
        if max_iter < 1 or tol <= 0:
            raise ClickModelError(f"DBN needs max_iter >= 1 and tol > 0, got {max_iter}, {tol}")
        if gamma is not None and not 0.0 < gamma <= 1.0:
            raise ClickModelError(f"a fixed DBN gamma must lie in (0, 1], got {gamma}")
        self.max_iter = max_iter
        self.tol = tol
        self.fixed_gamma = gamma
        self.prior = check_prior(prior, self.name)

    def fit(self, sessions: SessionPatterns, systems: SystemRankings | None = None) -> Self:
        """EM from the SDBN counting estimates (α, σ clipped into [0.01, 0.99]) and γ = 0.9.

        ``systems`` (which system showed which ranking, ``priors.SystemRankings``) adds the systems' votes to
        the empirical prior on α, as in PBM and UBM; without it, or with one system, α's prior rests on the
        ranking features alone.
        """
        check_sessions(sessions)
        self.pairs: PairIndex = sessions.pairs
        self.max_rank = sessions.max_rank
        lay = _layout(sessions)
        exams, clk, _, _, _ = last_click_counts(sessions)
        alpha0 = np.clip(safe_div(clk, exams, fill=clk.sum() / max(exams.sum(), 1.0)), 0.01, 0.99)
        sigma0 = np.clip(safe_div(lay.last_click, lay.clicks, fill=0.5), 0.01, 0.99)
        gamma0 = self.fixed_gamma if self.fixed_gamma is not None else 0.9
        fit_gamma = self.fixed_gamma is None
        n_pairs = lay.n_pairs
        if self.prior != "empirical":
            self.alpha_prior = self.sigma_prior = fixed_prior(self.prior, n_pairs)
            res = dbn_em(lay, alpha0, sigma0, gamma0, self.max_iter, self.tol, fit_gamma=fit_gamma,
                         alpha_prior=(self.alpha_prior.a, self.alpha_prior.b),
                         sigma_prior=(self.sigma_prior.a, self.sigma_prior.b))
            iterations, converged, rounds = res.iterations, res.converged, 0
        else:
            # alternate: refit both priors on the current E-step's counts, then EM at those priors
            self.log_features = feats = LogFeatures.from_sessions(sessions)
            a_feats, self._rankings, a_names = self._alpha_features(sessions, systems)
            self._alpha_feats = a_feats
            n_plain = sum(not n.startswith(SYSTEM_FEATURE_PREFIX) for n in a_names)

            def alpha_fit(examined: NDArray[np.float64], start: BetaPrior | None, cols: int) -> BetaPrior:
                return fit_prior(lay.clicks, examined, a_feats[:, :cols], start=start, varying_strength=True,
                                 feature_names=a_names[:cols], strength_features=min(cols, n_plain))
            st = dbn_e_step(lay, alpha0, sigma0, gamma0)
            a_prior: BetaPrior | None = None
            s_prior: BetaPrior | None = None
            alpha, sigma, gamma = alpha0, sigma0, gamma0
            iterations, rounds, settled = 0, 0, False
            while rounds < MAX_PRIOR_ROUNDS:
                rounds += 1
                # α: clicks on the expected examinations; σ: expected satisfactions on the clicks
                new_a = alpha_fit(st.examined, a_prior, len(a_names))
                new_s = feats.prior("empirical", st.satisfied, lay.clicks, start=s_prior)
                settled = (a_prior is not None and s_prior is not None and same_prior(a_prior, new_a)
                           and same_prior(s_prior, new_s))
                a_prior, s_prior = new_a, new_s
                tol = self.tol if settled or rounds == MAX_PRIOR_ROUNDS else max(self.tol, ROUND_TOL)  # only the last round converges fully
                res = dbn_em(lay, alpha, sigma, gamma, self.max_iter, tol, fit_gamma=fit_gamma,
                             alpha_prior=(a_prior.a, a_prior.b), sigma_prior=(s_prior.a, s_prior.b))
                iterations += res.iterations
                alpha, sigma, gamma, st = res.alpha, res.sigma, res.gamma, res.stats
                if settled:
                    break
            self.alpha_prior = a_prior if a_prior is not None else fixed_prior("none", n_pairs)
            self.sigma_prior = s_prior if s_prior is not None else fixed_prior("none", n_pairs)
            converged = res.converged and settled
            self._unseen_prior = self.alpha_prior
            if a_prior is not None and n_plain < len(a_names):
                self._unseen_prior = alpha_fit(res.stats.examined, None, n_plain)
        self.prior_rounds = rounds
        self.impressions, self.clicks, self.sessions = pair_support(sessions)
        self.alpha = np.where(self.impressions > 0, res.alpha, np.nan)
        self.sigma = np.where(self.clicks > 0, res.sigma, np.nan)
        self.gamma = res.gamma
        self.log_likelihood_trace = res.log_likelihood
        self.iterations = iterations
        self.converged = converged
        self.log_likelihood = res.stats.log_likelihood
        self.expected_examinations = res.stats.examined
        imps = self.impressions.sum()
        self.prior_alpha = float(res.stats.attracted.sum() / imps) if imps > 0 else 0.5
        self.prior_sigma = (
            float(res.stats.satisfied.sum() / self.clicks.sum()) if self.clicks.sum() > 0 else 0.5
        )
        self._fitted = True
        return self

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """P(C_k = 1) = ε_k α_k with ε_1 = 1, ε_{k+1} = ε_k γ (1 − α_k σ_k)."""
        self._require_fit(sessions)
        a, s = self._params_at(sessions)
        return dbn_click_probs(a, s, self.gamma)

    def conditional_click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        """P(C_k = 1 | clicks above): ε = γ(1 − σ_j) after a click at j, Bayes-updated on every skip since."""
        self._require_fit(sessions)
        a, s = self._params_at(sessions)
        return dbn_click_probs(a, s, self.gamma, sessions.clicks)

    def _params_at(self, sessions: SessionPatterns) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """α and σ per shown position; unseen pairs get the priors (rank-informed when empirical)."""
        if self.prior != "empirical":
            return (gather(self.alpha, sessions.docs, self.prior_alpha),
                    gather(self.sigma, sessions.docs, self.prior_sigma))
        alpha = gather(self.alpha, sessions.docs, self.prior_alpha)
        unseen, ranks, queries = unseen_positions(self.alpha, sessions)
        if unseen.any():
            alpha[unseen] = self._unseen_prior.mean_at(unseen_ranking_features(ranks, queries, self._rankings))
            own = ranked_unseen(unseen, sessions, self._alpha_feats)
            alpha[own] = self.alpha_prior.mean[sessions.docs[own]]
        return alpha, self.log_features.gather(self.sigma, sessions, self.sigma_prior, self.prior_sigma)

    def _alpha_features(self, sessions: SessionPatterns, systems: SystemRankings | None
                        ) -> tuple[NDArray[np.float64], NDArray[np.float64], tuple[str, ...]]:
        """Features of α's prior: the ranking features, then the systems' votes (none with fewer than two
        systems); the training queries' ranking counts (for unseen pairs); the feature names. Records in
        ``_systems_note`` what was used."""
        f = prior_features(sessions, systems)
        self._systems_note = f.note
        return f.features, f.rankings, f.names

    def relevance(self) -> RelevanceEstimate:
        """Score = α·σ; interval = product of the Jeffreys bounds of α (on expected examinations) and σ.

        Observations: the expected examinations Σ P(E = 1 | clicks) of the pair.
        """
        self._require_fit()
        emp = self.prior == "empirical"
        a = np.where(np.isnan(self.alpha), self.alpha_prior.mean if emp else self.prior_alpha, self.alpha)
        s = np.where(np.isnan(self.sigma), self.sigma_prior.mean if emp else self.prior_sigma, self.sigma)
        exams = self.expected_examinations
        if self.prior == "none":
            a_lo, a_hi = beta_interval(a * exams, exams)
            s_lo, s_hi = beta_interval(s * self.clicks, self.clicks.astype(np.float64))
        else:  # posterior Beta with the posterior mean and count prior strength + trials
            pa, ps = self.alpha_prior, self.sigma_prior
            a_lo, a_hi = posterior_interval(a, pa.a + pa.b + exams)
            s_lo, s_hi = posterior_interval(s, ps.a + ps.b + self.clicks)
            a_lo, a_hi = np.where(exams > 0, a_lo, np.nan), np.where(exams > 0, a_hi, np.nan)
        # no clicks: σ is unconstrained by data, so the product's interval spans [0, α_hi]
        s_lo, s_hi = np.where(self.clicks > 0, s_lo, 0.0), np.where(self.clicks > 0, s_hi, 1.0)
        return self._estimate(
            a * s, a_lo * s_lo, a_hi * s_hi, self.expected_examinations, self.parameters()
        )

    def parameters(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "version": self.version,
            "gamma": round(self.gamma, 6),
            "gamma_fixed": self.fixed_gamma is not None,
            "iterations": self.iterations,
            "converged": self.converged,
            "log_likelihood": self.log_likelihood,
            "tol": self.tol,
            "prior_alpha": self.prior_alpha,
            "prior_sigma": self.prior_sigma,
            "prior": {"alpha": self._alpha_prior_parameters(), "sigma": self.sigma_prior.parameters(),
                      "rounds": self.prior_rounds},
            "score": "alpha * sigma",
        }

    def _alpha_prior_parameters(self) -> dict[str, Any]:
        """α's prior record; under ``empirical`` also which systems voted and the unseen pairs' prior."""
        out = self.alpha_prior.parameters()
        if self.prior == "empirical":
            out.update(votes_record(getattr(self, "_systems_note", "not used"),
                                    getattr(self, "_unseen_prior", self.alpha_prior), self.alpha_prior))
        return out
