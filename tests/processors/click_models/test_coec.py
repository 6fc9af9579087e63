"""COEC on the hand-sized log of conftest.tiny_log, arithmetic written out; its prediction posterior."""

from __future__ import annotations

import numpy as np
import pytest
from click_logs import rankings_shown_in
from hypothesis import given, settings
from hypothesis import strategies as st

from ubi_pipeline.processors.click_models.coec import COEC, dispersion, quasi_poisson_posterior
from ubi_pipeline.processors.click_models.priors import (
    RANKING_FEATURES,
    BetaPrior,
    LogFeatures,
    SystemRankings,
    ranking_features,
    unseen_ranking_features,
)
from ubi_pipeline.processors.clicks.stats import SessionPatterns
from ubi_pipeline.processors.simulation import scenario, simulate

# ρ_1 = 0.4, ρ_2 = 1/6 (see test_ctr). Expected clicks sum ρ over every impression at its rank:
#   A: 5 impressions at rank 1, 1 at rank 2 -> 5*0.4 + 1/6 = 13/6;  4 clicks -> COEC = 4/(13/6) = 24/13 ≈ 1.846
#   B: 1 at rank 1, 3 at rank 2 -> 0.4 + 3/6 = 0.9;                 1 click  -> COEC = 1/0.9 ≈ 1.111
#   C: 4 at rank 1, 2 at rank 2 -> 1.6 + 2/6 = 29/15;               0 clicks -> COEC = 0
#   D: never shown -> prior 1
# (Using only the rank-1 CTR, as a shortcut would, gives A = 4/(6*0.4) = 1.667: a different number.)


def test_coec_scores(tiny_log: SessionPatterns) -> None:
    m = COEC(prior="none").fit(tiny_log)
    assert np.allclose(m.expected_clicks, [13 / 6, 0.9, 29 / 15, 0.0])
    rel = m.relevance()
    assert np.allclose(rel.score, [24 / 13, 1 / 0.9, 0.0, 1.0])


def test_coec_interval(tiny_log: SessionPatterns) -> None:
    rel = COEC(prior="none").fit(tiny_log).relevance()
    # Garwood 95 % interval for 1 Poisson count is [0.02532, 5.5716] (standard table: -ln 0.975 and
    # chi2_{0.975}(4)/2); divided by the 0.9 expected clicks of B
    assert rel.ci_low[1] == pytest.approx(0.025318 / 0.9, rel=1e-4)
    assert rel.ci_high[1] == pytest.approx(5.571643 / 0.9, rel=1e-4)
    # 0 clicks: lower bound 0, upper chi2_{0.975}(2)/2 = -ln(0.025) = 3.68888 over 29/15 expected
    assert rel.ci_low[2] == 0.0
    assert rel.ci_high[2] == pytest.approx(3.688879 / (29 / 15), rel=1e-5)
    assert np.isnan(rel.ci_low[3])  # never shown: no interval


def test_coec_click_probs(tiny_log: SessionPatterns) -> None:
    m = COEC(prior="none").fit(tiny_log)
    p = m.click_probs(tiny_log)
    # p1 = [A at rank 1, B at rank 2] -> [24/13 * 0.4, (1/0.9) * (1/6)]
    assert np.allclose(p[0], [24 / 13 * 0.4, 1 / 0.9 / 6])
    assert np.isnan(p[3, 1])
    probe = SessionPatterns(
        tiny_log.pairs,
        np.zeros(1, np.int64),
        np.array([[3, 0]]),
        np.zeros((1, 2), bool),
        np.ones(1, np.int64),
    )
    # unseen D at rank 1 -> prior COEC 1 * 0.4; A at rank 2 -> 24/13 * 1/6
    assert np.allclose(m.click_probs(probe), [[0.4, 24 / 13 / 6]])


# ----------------------------------------------------------------------------- the prediction posterior


def test_dispersion_by_hand(tiny_log: SessionPatterns) -> None:
    # φ = Σ ρ_k(1 − ρ_k) / Σ ρ_k over the impressions, ρ_1 = 0.4 (ρ(1 − ρ) = 0.24), ρ_2 = 1/6 (5/36):
    #   A: 5 at rank 1, 1 at rank 2 -> (1.2 + 5/36) / (13/6) = 241/390
    #   B: 1 at rank 1, 3 at rank 2 -> (0.24 + 15/36) / 0.9 = 197/270
    #   C: 4 at rank 1, 2 at rank 2 -> (0.96 + 10/36) / (29/15) = 557/870;  D never shown -> 1
    m = COEC().fit(tiny_log)
    assert np.allclose(m.phi, [241 / 390, 197 / 270, 557 / 870, 1.0])
    assert np.allclose(dispersion([0.0, 2.0], [0.0, 0.0]), [1.0, 1e-3])  # never shown; every result clicked


def test_quasi_poisson_posterior_by_hand() -> None:
    # prior Gamma(shape 2, rate 2) (mean 1); 3 clicks on 1.5 expected with φ = 0.5: counts 6 on 3,
    # (2 + 6)/(2 + 3) = 8/5; the score's Poisson posterior on the same counts is (2 + 3)/(2 + 1.5) = 10/7
    g = BetaPrior("empirical", np.array([2.0]), np.array([2.0]), family="gamma")
    assert quasi_poisson_posterior(g, [3.0], [1.5], [0.5])[0] == pytest.approx(8 / 5)
    assert g.posterior_mean(3.0, 1.5)[0] == pytest.approx(10 / 7)
    # φ = 1 is the Poisson posterior itself
    assert quasi_poisson_posterior(g, [3.0], [1.5], [1.0])[0] == pytest.approx(10 / 7)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.05, 20.0), st.floats(0.1, 500.0), st.floats(1e-3, 1.0), st.integers(0, 500),
       st.floats(0.01, 500.0))
def test_prediction_posterior_lies_between_prior_mean_and_mle(m: float, s: float, phi: float, c: int,
                                                              e: float) -> None:
    g = BetaPrior("empirical", np.array([m * s]), np.array([s]), family="gamma")
    post = float(quasi_poisson_posterior(g, [c], [e], [phi])[0])
    mle = c / e  # c/φ over E/φ: the scaling leaves the MLE where it is
    assert min(m, mle) * (1 - 1e-12) - 1e-12 <= post <= max(m, mle) * (1 + 1e-12) + 1e-12


@settings(max_examples=30, deadline=None)
@given(st.floats(0.05, 20.0), st.floats(0.1, 100.0), st.floats(1e-3, 1.0), st.floats(0.0, 3.0))
def test_prediction_posterior_converges_to_the_mle(m: float, s: float, phi: float, rate: float) -> None:
    g = BetaPrior("empirical", np.array([m * s]), np.array([s]), family="gamma")
    sizes = (10.0, 1_000.0, 100_000.0, 10_000_000.0)
    for e in sizes:
        c = round(rate * e)
        gap = abs(float(quasi_poisson_posterior(g, [c], [e], [phi])[0]) - c / e)
        # |post − mle| = s·|m − mle| / (s + E/φ): shrinks like φ/E
        assert gap <= s * abs(m - c / e) / (s + e / phi) * (1 + 1e-9) + 1e-12
    assert gap < 1e-3 * max(1.0, m)


@pytest.fixture(scope="module")
def hard_pbm() -> tuple[SessionPatterns, SystemRankings]:
    """2,000 searches of the hard scenario (PBM clicks, four rankers), seed 3, with their systems."""
    t = simulate(scenario("hard", sessions=2000, model="pbm", seed=3))
    return t.patterns(), t.system_rankings()


def test_prediction_and_score_are_different_posteriors(hard_pbm: tuple[SessionPatterns, SystemRankings]) -> None:
    log, systems = hard_pbm
    m = COEC().fit(log, systems)
    shown = m.expected_clicks > 0
    c, e = m.clicks.astype(float), m.expected_clicks
    # the score is the Poisson-Gamma posterior on the impression features, as before, whatever the systems
    score_prior = LogFeatures.from_sessions(log).prior("empirical", c, e, family="gamma")
    assert np.allclose(m.relevance().score[shown], score_prior.posterior_mean(c, e)[shown])
    assert np.allclose(COEC().fit(log).relevance().score, m.relevance().score)
    # the prediction is the quasi-Poisson posterior: prior refitted on c/φ, E/φ with the ranking features and votes
    assert m.pred_prior.feature_names[:3] == RANKING_FEATURES
    assert [n for n in m.pred_prior.feature_names if n.startswith("shown_by:")] == [
        f"shown_by:{name}" for name in systems.names]
    assert np.allclose(m.coec_pred[shown], m.pred_prior.posterior_mean(c / m.phi, e / m.phi)[shown])
    # φ < 1 everywhere (binomial clicks vary less than Poisson ones); the two posteriors differ
    assert (m.phi[shown] < 1).all() and not np.allclose(m.coec_pred[shown], m.coec[shown])
    # every prediction lies between its prior mean and the MLE c/E
    prior_mean, mle, pred = m.pred_prior.mean[shown], (c / np.where(shown, e, 1))[shown], m.coec_pred[shown]
    assert (pred >= np.minimum(prior_mean, mle) - 1e-12).all() and (pred <= np.maximum(prior_mean, mle) + 1e-12).all()
    # click_probs use the prediction: position k of a pattern is min(r̂·ρ_k, 1)
    p = m.click_probs(log)
    d = log.docs
    k = np.broadcast_to(np.arange(d.shape[1]), d.shape)
    ok = d >= 0
    assert np.allclose(p[ok], np.minimum(m.coec_pred[d[ok]] * m.rank_ctr[k[ok]], 1.0))
    params = m.relevance().parameters
    assert params["prediction"]["prior"]["features"] == list(m.pred_prior.feature_names)
    assert params["prediction"]["system_features"] == f"{len(systems.names)} systems"
    assert params["prior"]["features"] == ["mean_log_rank", "log_display_share"]


def test_an_unseen_pair_is_predicted_by_the_prior_mean_at_its_rank(
        hard_pbm: tuple[SessionPatterns, SystemRankings]) -> None:
    log, systems = hard_pbm
    train = SessionPatterns(log.pairs, log.query[::2], log.docs[::2], log.clicks[::2], log.weight[::2])
    m = COEC().fit(train, rankings_shown_in(systems, train))
    # a pair of the log that the training half never showed, shown at ranks 1 and 3 of its query: the prediction
    # prior's mean at its ranking features (one ranking of R_q + 1 shows it), its votes at their mean (the fit
    # knows the training half's rankings only: no ranking it knows shows the pair)
    unseen = int(np.flatnonzero(m.expected_clicks == 0)[0])
    q = int(log.pairs.query_index[unseen])
    probe = SessionPatterns(log.pairs, np.array([q, q]), np.array([[unseen] + [-1] * 9, [-1, -1, unseen] + [-1] * 7]),
                            np.zeros((2, 10), bool), np.ones(2, np.int64))
    rankings = ranking_features(train.query, train.docs, log.pairs.query_index, len(log.pairs))[1]
    feats = unseen_ranking_features([1, 3], [q, q], rankings)
    want = m.pred_prior.mean_at(np.column_stack([feats, np.full((2, len(systems.names)), np.nan)]))
    assert np.isnan(m.coec_pred[unseen])
    p = m.click_probs(probe)
    assert p[0, 0] == pytest.approx(min(want[0] * m.rank_ctr[0], 1.0))
    assert p[1, 2] == pytest.approx(min(want[1] * m.rank_ctr[2], 1.0))
    assert want[0] != pytest.approx(want[1])  # the rank it is shown at counts
    # the per-pair strength: on the ranking features only (the votes enter the mean), one λ per feature + 1
    assert len(m.pred_prior.strength_coef) == len(RANKING_FEATURES) + 1
    assert np.ptp(m.pred_prior.b[m.expected_clicks > 0]) > 0
    # given the whole log's rankings (as --model auto gives them), the pair has features of its own, from the
    # rankings of the other half that show it: it is predicted by the prior's mean there, wherever it is shown
    whole = COEC().fit(train, systems)
    assert np.isnan(whole.coec_pred[unseen]) and np.isfinite(whole._features[unseen, 0])
    p = whole.click_probs(probe)
    mean = whole.pred_prior.a[unseen] / whole.pred_prior.b[unseen]
    assert p[0, 0] == pytest.approx(min(mean * whole.rank_ctr[0], 1.0))
    assert p[1, 2] == pytest.approx(min(mean * whole.rank_ctr[2], 1.0))


@pytest.mark.parametrize("prior", ["pseudocount", "none"])
def test_a_fixed_prior_predicts_with_the_score(tiny_log: SessionPatterns, prior: str) -> None:
    m = COEC(prior=prior).fit(tiny_log)
    assert np.array_equal(m.coec_pred, m.coec, equal_nan=True)
    # pseudo-count: (c + 1)/(E + 1) per pair, the baseline of the hard-scenario bench; A = 5 / (19/6) = 30/19
    if prior == "pseudocount":
        assert m.click_probs(tiny_log)[0, 0] == pytest.approx(30 / 19 * 0.4)
