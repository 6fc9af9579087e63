"""Priors on per-pair parameters: posterior-mean laws, a hand-worked case, EM monotonicity, the interface."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from click_logs import random_log, simulate
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from scipy.optimize import check_grad
from scipy.special import betaln

from ubi_pipeline.processors.click_models import MODEL_NAMES, get_model
from ubi_pipeline.processors.click_models.common import ClickModelError
from ubi_pipeline.processors.click_models.dbn import _layout, dbn_em
from ubi_pipeline.processors.click_models.pbm import factorised_em
from ubi_pipeline.processors.click_models.priors import (
    RANKING_FEATURES,
    BetaPrior,
    _beta_binomial_objective,
    _gamma_poisson_objective,
    fit_prior,
    fixed_prior,
    rank_features,
    ranking_features,
    unique_rows,
    unseen_ranking_features,
)
from ubi_pipeline.processors.clicks.stats import PairIndex, SessionPatterns, cells_from_sessions
from ubi_pipeline.processors.simulation import scenario
from ubi_pipeline.processors.simulation import simulate as simulate_traffic
from ubi_pipeline.processors.simulation.clicks import examination_curve


@settings(max_examples=60, deadline=None)
@given(st.floats(0.01, 0.99), st.floats(0.1, 500.0), st.integers(0, 1000), st.integers(0, 1000))
def test_posterior_mean_lies_between_prior_mean_and_mle(m: float, s: float, x: int, extra: int) -> None:
    n = x + extra
    prior = BetaPrior("empirical", np.array([m * s]), np.array([(1 - m) * s]))
    post = float(prior.posterior_mean(x, n)[0])
    if n == 0:
        assert post == pytest.approx(m)
        return
    mle = x / n
    assert min(m, mle) - 1e-12 <= post <= max(m, mle) + 1e-12


@settings(max_examples=30, deadline=None)
@given(st.floats(0.01, 0.99), st.floats(0.1, 100.0), st.floats(0.0, 1.0))
def test_posterior_mean_converges_to_the_mle(m: float, s: float, rate: float) -> None:
    prior = BetaPrior("empirical", np.array([m * s]), np.array([(1 - m) * s]))
    gaps = []
    for n in (10, 1_000, 100_000, 10_000_000):
        x = round(rate * n)
        gaps.append(abs(float(prior.posterior_mean(x, n)[0]) - x / n))
    # |post − mle| = s·|m − mle|/(s + n) <= s/(s + n): shrinks like 1/n
    assert all(g <= s / (s + n) + 1e-12 for g, n in zip(gaps, (10, 1_000, 100_000, 10_000_000), strict=True))
    assert gaps[-1] < 1e-5


def test_hand_worked_beta_binomial() -> None:
    # prior Beta(2, 6) (mean 0.25, strength 8); 3 clicks in 4 trials:
    # posterior mean (2 + 3)/(8 + 4) = 5/12; pseudo-count (3 + 1)/(4 + 2) = 2/3; MLE 3/4
    emp = BetaPrior("empirical", np.array([2.0]), np.array([6.0]))
    assert emp.posterior_mean(3, 4)[0] == pytest.approx(5 / 12)
    assert fixed_prior("pseudocount", 1).posterior_mean(3, 4)[0] == pytest.approx(2 / 3)
    assert fixed_prior("none", 1).posterior_mean(3, 4)[0] == pytest.approx(3 / 4)
    # Gamma (COEC): shape 2, rate 2 (mean 1); 3 clicks on 1.5 expected: (2 + 3)/(2 + 1.5) = 10/7
    g = BetaPrior("empirical", np.array([2.0]), np.array([2.0]), family="gamma")
    assert g.posterior_mean(3, 1.5)[0] == pytest.approx(10 / 7)


def test_empirical_bayes_recovers_a_known_beta() -> None:
    # 4,000 pairs, α ~ Beta(3, 9) (mean 0.25, strength 12), 30 trials each; no informative features
    rng = np.random.default_rng(5)
    alpha = rng.beta(3.0, 9.0, 4000)
    n = np.full(4000, 30.0)
    x = rng.binomial(30, alpha).astype(float)
    p = fit_prior(x, n, np.full((4000, 2), np.nan))
    assert p.mean[0] == pytest.approx(0.25, abs=0.01)  # stated tolerance from 4,000 pairs
    assert p.strength == pytest.approx(12.0, rel=0.2)
    # the fitted optimum is a maximum of the Beta-binomial marginal likelihood (checked against scipy's betaln)
    def marginal(a: float, b: float) -> float:
        return float((betaln(x + a, n - x + b) - betaln(a, b)).sum())

    a0, b0 = float(p.a[0]), float(p.b[0])
    assert p.log_marginal == pytest.approx(marginal(a0, b0), rel=1e-6)
    assert marginal(a0, b0) >= max(marginal(a0 * 1.1, b0 * 1.1), marginal(a0 * 0.9, b0 * 0.9))


def test_varying_strength_gradient_is_exact() -> None:
    rng = np.random.default_rng(4)
    n = rng.integers(1, 40, 300).astype(float)
    x = rng.binomial(n.astype(int), 0.3).astype(float)
    design = np.column_stack([np.ones(300), rng.normal(size=(300, 2))])
    f = _beta_binomial_objective(x, n, design, (-4.0, 14.0), design)
    point = np.array([-0.8, 0.3, -0.2, 2.0, 0.5, -0.4])
    assert check_grad(lambda p: f(p)[0], lambda p: f(p)[1], point) < 1e-5 * max(1.0, np.abs(f(point)[1]).max())
    # with one strength (no strength design) it is the former objective: parameters (β, ln s)
    g = _beta_binomial_objective(x, n, design, (-4.0, 14.0))
    assert g(point[:4])[0] == pytest.approx(f(np.array([-0.8, 0.3, -0.2, 2.0, 0.0, 0.0]))[0])


def test_gamma_varying_strength_gradient_is_exact() -> None:
    # COEC's prediction prior: the negative-binomial marginal with ln s_i = λ·w_i (and the slopes' hyperprior)
    rng = np.random.default_rng(6)
    e = rng.uniform(0.2, 30.0, 300)
    x = rng.poisson(e * rng.gamma(3.0, 1 / 3.0, 300)).astype(float)
    design = np.column_stack([np.ones(300), rng.normal(size=(300, 2))])
    f = _gamma_poisson_objective(x, e, design, (-4.0, 14.0), design)
    point = np.array([0.1, 0.3, -0.2, 1.5, 0.5, -0.4])
    assert check_grad(lambda p: f(p)[0], lambda p: f(p)[1], point) < 1e-5 * max(1.0, np.abs(f(point)[1]).max())
    g = _gamma_poisson_objective(x, e, design, (-4.0, 14.0))  # one strength: parameters (β, ln s)
    assert g(point[:4])[0] == pytest.approx(f(np.array([0.1, 0.3, -0.2, 1.5, 0.0, 0.0]))[0])
    assert check_grad(lambda p: g(p)[0], lambda p: g(p)[1], point[:4]) < 1e-5 * max(1.0, np.abs(g(point[:4])[1]).max())


def test_gamma_varying_strength_recovers_two_known_strengths() -> None:
    # 6,000 rates in two halves told apart by one feature: r ~ Gamma(mean 1, shape 2) and Gamma(mean 1, shape 40),
    # 20 expected clicks each (Poisson clicks); the per-pair strength (the Gamma's rate, = shape at mean 1) finds
    # both within 35%, and the mean 1
    rng = np.random.default_rng(9)
    group = np.repeat([0.0, 1.0], 3000)
    shape = np.where(group == 0, 2.0, 40.0)
    e = np.full(6000, 20.0)
    x = rng.poisson(e * rng.gamma(shape, 1.0 / shape)).astype(float)
    p = fit_prior(x, e, np.column_stack([group, np.full(6000, np.nan)]), family="gamma", varying_strength=True)
    assert float(np.median(p.b[group == 0])) == pytest.approx(2.0, rel=0.35)
    assert float(np.median(p.b[group == 1])) == pytest.approx(40.0, rel=0.35)
    assert p.mean[0] == pytest.approx(1.0, abs=0.05) and p.family == "gamma" and len(p.strength_coef) == 3


def _two_strength_log() -> tuple[np.random.Generator, NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """6,000 pairs in two halves told apart by one feature: α ~ Beta(mean 0.3, strength 5) and Beta(mean 0.3,
    strength 60), 20 trials each; returns the generator (for more draws), the group, trials and successes."""
    rng = np.random.default_rng(8)
    group = np.repeat([0.0, 1.0], 3000)
    s_true = np.where(group == 0, 5.0, 60.0)
    alpha = rng.beta(0.3 * s_true, 0.7 * s_true)
    return rng, group, np.full(6000, 20.0), rng.binomial(20, alpha).astype(float)


def test_varying_strength_recovers_two_known_strengths() -> None:
    # 6,000 pairs in two halves told apart by one feature: α ~ Beta(mean 0.3, strength 5) and
    # Beta(mean 0.3, strength 60), 20 trials each. The heteroscedastic fit finds both strengths (within 35%,
    # a few standard errors at 3,000 pairs each); a single strength lands in between.
    rng, group, n, x = _two_strength_log()
    feats = np.column_stack([group, np.full(6000, np.nan)])
    p = fit_prior(x, n, feats, varying_strength=True)
    s_fit = p.a + p.b
    assert float(np.median(s_fit[group == 0])) == pytest.approx(5.0, rel=0.35)
    assert float(np.median(s_fit[group == 1])) == pytest.approx(60.0, rel=0.35)
    assert p.mean[0] == pytest.approx(0.3, abs=0.02)
    one = fit_prior(x, n, feats)
    assert 5.0 < one.strength < 60.0
    assert p.log_marginal > one.log_marginal  # one more free parameter, and the truth has it


def test_a_warm_start_from_the_last_inverse_hessian_reaches_the_same_prior() -> None:
    # EM refits the prior every round from the last fit. Starting BFGS from that fit's inverse Hessian (not the
    # identity) must land on the same maximum of the marginal likelihood (BFGS gtol 1e-7 on the scaled
    # objective leaves ~1e-5 in the coefficients); a start whose matrix is not positive
    # definite is ignored, not an error. Data: the two-strength log of the test above.
    rng, group, n, x = _two_strength_log()
    feats = np.column_stack([group, rng.normal(size=6000)])
    cold = fit_prior(x, n, feats, varying_strength=True)
    assert cold.hess_inv is not None and cold.hess_inv.shape == (6, 6)
    again = fit_prior(x * 1.001, n, feats, varying_strength=True)  # a slightly moved log, as in the next EM round
    warm = fit_prior(x * 1.001, n, feats, varying_strength=True, start=cold)
    np.testing.assert_allclose(warm.coef, again.coef, atol=1e-4)
    np.testing.assert_allclose(warm.strength_coef, again.strength_coef, atol=1e-4)
    bad = dataclasses.replace(cold, hess_inv=-np.eye(6))
    assert fit_prior(x, n, feats, varying_strength=True, start=bad).coef == pytest.approx(cold.coef, abs=1e-4)


@settings(max_examples=60)
@given(st.integers(1, 300), st.integers(1, 6), st.integers(0, 10**6))
def test_unique_rows_finds_what_numpy_unique_finds(n: int, width: int, seed: int) -> None:
    # small values make repeated rows common; the reference is np.unique(axis=0) (order aside)
    a = np.random.default_rng(seed).integers(-1, 3, size=(n, width))
    np.testing.assert_array_equal(np.unique(unique_rows(a), axis=0), np.unique(a, axis=0))
    assert len(unique_rows(a)) == len(np.unique(a, axis=0))


def test_unique_rows_falls_back_to_numpy_on_a_hash_collision() -> None:
    # with every multiplier 1 the hash is the row sum: [1, 2] and [2, 1] collide, and must stay two rows
    a = np.array([[1, 2], [2, 1], [1, 2], [0, 3]])
    got = unique_rows(a, multipliers=np.ones(2, dtype=np.uint64))
    np.testing.assert_array_equal(got, np.unique(a, axis=0))


def test_rank_informed_mean_follows_display_ranks() -> None:
    theta = examination_curve(10, 1.0)
    s, _ = simulate("pbm", seed=3, n_sessions=20_000, theta=theta)
    c = cells_from_sessions(s)
    feats = rank_features(c.pair, c.rank, c.impressions, s.pairs.query_index, len(s.pairs))
    m = get_model("dctr").fit(s)
    prior = m.ctr_prior
    shown = ~np.isnan(feats[:, 0])
    # the rankers put relevant pairs high: the prior mean falls with the mean log display rank
    hi, lo = feats[shown, 0] < np.quantile(feats[shown, 0], 0.2), feats[shown, 0] > np.quantile(feats[shown, 0], 0.8)
    assert prior.mean[shown][hi].mean() > prior.mean[shown][lo].mean()
    assert prior.coef[1] < 0


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_pbm_em_with_a_prior_never_lowers_the_log_posterior(seed: int, accelerate: bool) -> None:
    rng = np.random.default_rng(seed)
    cells = cells_from_sessions(random_log(rng, int(rng.integers(5, 60)), 4, int(rng.integers(2, 8))))
    n = len(cells.pairs)
    res = factorised_em(cells.pair, cells.rank - 1, cells.impressions.astype(float), cells.clicks.astype(float),
                        rng.uniform(0.05, 0.95, 4), rng.uniform(0.05, 0.95, n), max_iter=60, tol=1e-12,
                        accelerate=accelerate, prior_a=rng.uniform(0.1, 5, n), prior_b=rng.uniform(0.1, 5, n))
    trace = np.array(res.log_likelihood)
    assert (np.diff(trace) >= -1e-9 * np.abs(trace[:-1])).all()


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_dbn_em_with_priors_never_lowers_the_log_posterior(seed: int) -> None:
    rng = np.random.default_rng(seed)
    s = random_log(rng, int(rng.integers(5, 40)), 4, int(rng.integers(2, 8)))
    n = len(s.pairs)
    res = dbn_em(_layout(s), rng.uniform(0.05, 0.95, n), rng.uniform(0.05, 0.95, n), 0.8, max_iter=40,
                 tol=1e-12, accelerate=False, alpha_prior=(rng.uniform(0.1, 5, n), rng.uniform(0.1, 5, n)),
                 sigma_prior=(rng.uniform(0.1, 5, n), rng.uniform(0.1, 5, n)))
    trace = np.array(res.log_likelihood)
    assert (np.diff(trace) >= -1e-9 * np.abs(trace[:-1])).all()


LOG, _ = simulate("pbm", seed=8, n_sessions=4000, n_queries=40, theta=examination_curve(10))


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("prior", ["empirical", "pseudocount", "none"])
def test_every_model_takes_the_prior_keyword_and_records_it(name: str, prior: str) -> None:
    rel = get_model(name, prior=prior).fit(LOG).relevance()
    recorded = rel.parameters["prior"]
    if name in ("gctr", "rctr"):
        assert recorded["kind"] == "none"  # no per-pair parameter
        return
    kinds = {recorded["kind"]} if "kind" in recorded else {recorded["alpha"]["kind"], recorded["sigma"]["kind"]}
    assert kinds == {prior}
    if prior == "empirical":
        first = recorded if "kind" in recorded else recorded["alpha"]
        # an intercept and one coefficient per feature; PBM, UBM and DBN (its α) use the three ranking features
        assert len(first["coef"]) == 1 + len(first["features"]) and first["strength"] > 0
        assert len(first["features"]) == (3 if name in ("pbm", "ubm", "dbn") else 2)


def test_unknown_prior_is_refused() -> None:
    with pytest.raises(ClickModelError, match="prior must be one of empirical, pseudocount, none"):
        get_model("pbm", prior="flat")


def test_pseudocount_is_pyclicks_convention_on_ctr() -> None:
    # DCTR with pseudo-counts: (clicks + 1)/(impressions + 2) exactly
    m = get_model("dctr", prior="pseudocount").fit(LOG)
    shown = m.impressions > 0
    assert np.allclose(m.pair_ctr[shown], (m.clicks[shown] + 1) / (m.impressions[shown] + 2))


def _two_query_log() -> SessionPatterns:
    # query 0: ranking A = (d0, d1, d2) in two patterns (clicks differ) of 5 and 1 searches, ranking B = (d1, d3)
    # in 2 searches; query 1: one ranking (d4, d5, d6); d7 (query 1) never shown
    pairs = PairIndex(np.array(["q0"] * 4 + ["q1"] * 4, dtype=object),
                      np.array([f"d{i}" for i in range(8)], dtype=object), np.array([0] * 4 + [1] * 4))
    docs = np.array([[0, 1, 2], [0, 1, 2], [1, 3, -1], [4, 5, 6]])
    clicks = np.array([[1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0]], dtype=bool)
    return SessionPatterns(pairs, np.array([0, 0, 0, 1]), docs, clicks, np.array([5, 1, 2, 3]))


def test_ranking_features_by_hand() -> None:
    log = _two_query_log()
    feats, per_query = ranking_features(log.query, log.docs, log.pairs.query_index, len(log.pairs))
    assert per_query.tolist() == [2.0, 1.0]  # rankings per query, however many searches showed each
    ln2, ln3 = np.log(2.0), np.log(3.0)
    # z1: mean ln rank over the rankings showing the pair (d1: rank 2 in A, rank 1 in B)
    assert np.allclose(feats[:7, 0], [0.0, ln2 / 2, ln3, ln2, 0.0, ln2, ln3])
    # z2: ln(rankings showing it / rankings of its query)
    assert np.allclose(feats[:7, 1], [-ln2, 0.0, -ln2, -ln2, 0.0, 0.0, 0.0])
    # z3: consensus of A = mean over d0, d1, d2 of the share of the other ranking (B) showing it = (0 + 1 + 0)/3,
    # of B = (1 + 0)/2; d1 is in both: (1/3 + 1/2)/2 = 5/12; query 1 has no other ranking: NaN
    assert np.allclose(feats[:4, 2], [1 / 3, 5 / 12, 1 / 3, 1 / 2])
    assert np.isnan(feats[4:, 2]).all()
    assert np.isnan(feats[7]).all()  # never shown


def test_unseen_ranking_features_by_hand() -> None:
    f = unseen_ranking_features(np.array([1, 4]), np.array([0, 5]), np.array([2.0, 1.0]))
    # rank 1 in query 0 (2 rankings): one ranking of 3 shows it; query 5 unknown: R = 0, one of 1
    assert np.allclose(f[:, 0], [0.0, np.log(4.0)]) and np.allclose(f[:, 1], [-np.log(3.0), 0.0])
    assert np.isnan(f[:, 2]).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_ranking_features_count_rankings_not_searches(seed: int) -> None:
    # re-weighting the searches (how often each ranking was served) or their clicks changes no ranking feature
    rng = np.random.default_rng(seed)
    log = random_log(rng, int(rng.integers(2, 40)), 4, int(rng.integers(2, 12)))
    a, ra = ranking_features(log.query, log.docs, log.pairs.query_index, len(log.pairs))
    other = SessionPatterns(log.pairs, log.query, log.docs, rng.random(log.docs.shape) < 0.5,
                            rng.integers(1, 100, size=len(log.weight)))
    b, rb = ranking_features(other.query, other.docs, other.pairs.query_index, len(other.pairs))
    assert np.allclose(a, b, equal_nan=True) and np.array_equal(ra, rb)
    shown = ~np.isnan(a[:, 0])
    assert (a[shown, 1] <= 1e-12).all()  # a share of rankings
    z3 = a[:, 2][~np.isnan(a[:, 2])]
    assert ((z3 >= 0) & (z3 <= 1)).all()


def test_pbm_and_ubm_priors_use_ranking_features_on_sessions_and_cell_features_on_cells() -> None:
    # hard scenario, PBM clicks: rankings that agree with the query's other rankings showed relevant pairs,
    # so the fitted prior mean rises with the consensus (coefficient of z3 > 0)
    traffic = simulate_traffic(scenario("hard", sessions=5_000, model="pbm", seed=11))
    log = traffic.patterns()
    for name in ("pbm", "ubm"):
        m = get_model(name).fit(log)
        rec = m.relevance().parameters["prior"]
        assert tuple(rec["features"]) == RANKING_FEATURES
        assert m.alpha_prior.coef[3] > 0
    cells = get_model("pbm").fit_cells(cells_from_sessions(log))
    assert tuple(cells.relevance().parameters["prior"]["features"]) == ("mean_log_rank", "log_display_share")


@settings(max_examples=40)
@given(st.integers(2, 200), st.integers(1, 5), st.integers(1, 7), st.integers(0, 10**6))
def test_unique_rows_in_chunks_is_the_whole_answer_in_the_same_order(n: int, width: int, chunk: int,
                                                                      seed: int) -> None:
    """Comparing equal-hash neighbours a few at a time changes nothing: the same rows in the same order as one
    chunk, and the collision fallback still found when the colliding pair sits in a later chunk."""
    a = np.random.default_rng(seed).integers(-1, 3, size=(n, width))
    np.testing.assert_array_equal(unique_rows(a, chunk=chunk), unique_rows(a, chunk=10**9))
    b = np.array([[0, 0]] * 20 + [[1, 2], [2, 1]])  # row-sum hash: 19 equal pairs first, the collision last
    got = unique_rows(b, multipliers=np.ones(2, dtype=np.uint64), chunk=chunk)
    np.testing.assert_array_equal(got, np.unique(b, axis=0))
