"""The systems' votes in the PBM/UBM prior: a hand-worked case, the one-system degeneration, the store path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click_logs import make_pairs, rankings_shown_in, unseen_positions
from scipy.special import betaln

from ubi_pipeline.collector.ingest import ingest, parse_bulk, validate_items
from ubi_pipeline.processors.click_models.common import clamp
from ubi_pipeline.processors.click_models.evaluate import evaluate
from ubi_pipeline.processors.click_models.pbm import PBM
from ubi_pipeline.processors.click_models.priors import (
    MAX_SYSTEMS,
    RANKING_FEATURES,
    STRENGTH_SLOPE_SD,
    SYSTEM_FEATURE_PREFIX,
    SystemRankings,
    _beta_binomial_objective,
    prior_features,
    system_features,
    unique_rows,
    unseen_ranking_features,
)
from ubi_pipeline.processors.click_models.ubm import UBM
from ubi_pipeline.processors.clicks.holdout import holdout_flags
from ubi_pipeline.processors.clicks.sessions import read_sessions
from ubi_pipeline.processors.clicks.stats import SessionPatterns, StatsError
from ubi_pipeline.processors.clicks.system_rankings import read_system_rankings
from ubi_pipeline.processors.simulation import scenario, simulate
from ubi_pipeline.reports.systems import load_searches
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.systems import system_name
from ubi_pipeline.store.client import reading
from ubi_pipeline.store.duckdb_store import Store


def _rankings(rows: list[tuple[int, int, list[int]]], names: tuple[str, ...], k: int = 3) -> SystemRankings:
    docs = np.full((len(rows), k), -1, dtype=np.int64)
    for i, (_, _, d) in enumerate(rows):
        docs[i, : len(d)] = d
    return SystemRankings(names, np.array([q for q, _, _ in rows], dtype=np.int64),
                          np.array([s for _, s, _ in rows], dtype=np.int64), docs)


def test_votes_hand_worked() -> None:
    # query 0 has pairs 0-3, query 1 pair 4. System A (0) showed query 0 as [0, 1] and [0, 2] (the first twice:
    # one ranking however often shown) and query 1 as [4]; system B (1) showed query 0 as [1, 3, 3] (pair 3 twice
    # in one list: it votes at its first rank, 2). v_is = mean over s's rankings of the query of 1/rank (0 absent):
    #   pair 0: A (1/1 + 1/1)/2 = 1,   B 0/1 = 0      pair 1: A (1/2 + 0)/2 = 0.25, B 1/1 = 1
    #   pair 2: A (0 + 1/2)/2 = 0.25,  B 0            pair 3: A 0, B (1/2)/1 = 0.5
    #   pair 4: A 1/1 = 1,             B never served query 1: NaN
    sr = _rankings([(0, 0, [0, 1]), (0, 0, [0, 1]), (0, 0, [0, 2]), (1, 0, [4]), (0, 1, [1, 3, 3])], ("A", "B"))
    votes, names = system_features(sr, np.array([0, 0, 0, 0, 1]), 5)
    assert names == (SYSTEM_FEATURE_PREFIX + "A", SYSTEM_FEATURE_PREFIX + "B")
    expected = np.array([[1.0, 0.0], [0.25, 1.0], [0.25, 0.0], [0.0, 0.5], [1.0, np.nan]])
    np.testing.assert_array_equal(votes, expected)


def test_one_system_has_no_vote_and_keeps_the_prior() -> None:
    traffic = simulate(scenario("hard", sessions=1500, seed=2, model="pbm", rankers=1, ranker_noise=(0.5,)))
    patterns = traffic.patterns()
    sr = traffic.system_rankings()
    assert len(sr.names) == 1
    votes, names = system_features(sr, patterns.pairs.query_index, len(patterns.pairs))
    assert votes.shape == (len(patterns.pairs), 0) and names == ()
    for cls in (PBM, UBM):
        plain, given = cls().fit(patterns), cls().fit(patterns, sr)
        np.testing.assert_array_equal(plain.alpha, given.alpha)  # the same prior, the same EM: identical
        assert plain.alpha_prior.coef == given.alpha_prior.coef
        assert given._unseen_prior is given.alpha_prior  # no vote: unseen pairs keep the one prior
        assert given.parameters()["prior"]["system_features"] == "1 system: no vote"
        assert plain.parameters()["prior"]["system_features"].startswith("not given")


def test_systems_past_the_cap_get_no_column() -> None:
    n = MAX_SYSTEMS + 2
    # system j shows j + 1 distinct lists of query 0, each with pair j first: the systems with the fewest
    # rankings (0 and 1) are the ones left out
    rows = [(0, j, [j, 20 + r]) for j in range(n) for r in range(j + 1)]
    sr = _rankings(rows, tuple(f"s{j}" for j in range(n)))
    votes, names = system_features(sr, np.zeros(40, dtype=np.int64), 40)
    assert names == tuple(SYSTEM_FEATURE_PREFIX + f"s{j}" for j in range(2, n))
    assert votes.shape == (40, MAX_SYSTEMS)
    assert votes[5, 3] == 1.0  # pair 5 is in every ranking of s5 (column 3)


def test_bad_system_rankings_are_named() -> None:
    sr = _rankings([(0, 2, [0])], ("A", "B"))
    # SystemRankings is a click-log record (processors.clicks.stats): its errors are the statistics' own
    with pytest.raises(StatsError, match=r"system\[0\] = 2"):
        sr.check(3)
    with pytest.raises(StatsError, match="beyond the 1 pairs"):
        _rankings([(0, 0, [0, 1])], ("A",)).check(1)


def test_votes_raise_the_prior_mean_of_the_good_rankers_choices() -> None:
    """On the hard scenario the best ranker's vote gets a larger coefficient than the worst ranker's, and the
    fit records the systems used."""
    traffic = simulate(scenario("hard", sessions=4000, seed=3, model="pbm"))
    model = PBM().fit(traffic.patterns(), traffic.system_rankings())
    prior = model.parameters()["prior"]
    names = prior["features"]
    coef = dict(zip(names, prior["coef"][1:], strict=True))
    best = SYSTEM_FEATURE_PREFIX + system_name("ubi-sim", {"ranker": "ranker-a"})
    worst = SYSTEM_FEATURE_PREFIX + system_name("ubi-sim", {"ranker": "ranker-d"})
    assert coef[best] > coef[worst]
    assert prior["system_features"] == "4 systems"


def test_store_path_gives_the_simulators_rankings(tmp_path: Path) -> None:
    """Records -> ingest -> ubi_pipeline.processors.clicks.system_rankings gives the distinct (query, system, ranking) of the arrays,
    with the system named as ubi_pipeline.reports.systems names it."""
    traffic = simulate(scenario("hard", sessions=800, seed=5, model="pbm", crawler_share=0.0))
    db, path = tmp_path / "sim.duckdb", tmp_path / "sim.ndjson"
    traffic.write_bulk(path)
    with Store(db) as store:
        ingest(store, validate_items(parse_bulk(path.read_bytes())), source="test")
    data = read_sessions(db, Settings(db=db), max_rank=10)

    def keyed(sr: SystemRankings, pairs: object) -> set[tuple[str, str, tuple[str, ...]]]:
        q_text = {int(qi): str(t) for qi, t in zip(pairs.query_index, pairs.queries, strict=True)}
        return {(q_text[int(q)], sr.names[int(s)], tuple(str(pairs.doc_ids[d]) for d in row if d >= 0))
                for q, s, row in zip(sr.query, sr.system, sr.docs, strict=True)}

    stored = read_system_rankings(str(db), data.patterns.pairs, 10)
    simulated = traffic.system_rankings()
    assert keyed(stored, data.patterns.pairs) == keyed(simulated, traffic.patterns().pairs)
    with reading(db) as con:
        searched = set(load_searches(con).column("system").to_pylist())
    assert set(stored.names) == searched
    # the training fold: only the rankings of the searches holdout_flags keeps for training
    held = holdout_flags(traffic.query_ids(), 0.25)
    train = read_system_rankings(str(db), data.patterns.pairs, 10, holdout=0.25)
    assert keyed(train, data.patterns.pairs) == keyed(traffic.system_rankings(searches=~held), traffic.patterns().pairs)


def test_unique_rows_keeps_system_and_query_apart() -> None:
    # the same list shown by two systems is two rankings (the votes' dedupe is per (query, system, list))
    a = np.array([[0, 0, 1, 2], [0, 1, 1, 2], [0, 0, 1, 2]])
    assert len(unique_rows(a)) == 2


def test_strength_slopes_carry_a_gaussian_hyperprior() -> None:
    """The varying-strength objective is −(1/N)(Σ ln BetaBin − Σ_j λ_j²/2σ²), σ = STRENGTH_SLOPE_SD = 1; the
    Beta-binomial terms by hand from betaln (the binomial coefficient cancels between objectives, so it is
    left out, as the objective leaves it out)."""
    rng = np.random.default_rng(4)
    n = rng.integers(1, 30, size=50).astype(np.float64)
    x = np.floor(n * rng.uniform(size=50))
    design = np.column_stack([np.ones(50), rng.normal(size=50)])
    beta, lam = np.array([-0.5, 0.2]), np.array([1.5, 0.7])
    f = _beta_binomial_objective(x, n, design, (-4.0, 14.0), design)
    m = 1.0 / (1.0 + np.exp(-(design @ beta)))
    s = np.exp(design @ lam)
    ll = betaln(x + m * s, n - x + (1 - m) * s) - betaln(m * s, (1 - m) * s)
    assert STRENGTH_SLOPE_SD == 1.0
    assert f(np.append(beta, lam))[0] == pytest.approx(-(ll.sum() - 0.5 * 0.7**2) / 50, rel=1e-12)


def test_a_pair_no_training_ranking_showed_takes_the_vote_free_prior() -> None:
    """A held-out position whose pair no training ranking showed has no vote: its α is the mean of the prior fitted
    on the ranking features alone, and that predicts those positions better than the voted prior with the votes
    put at their mean (hard scenario, 2,000 cascade searches, seed 7: on m10-pbm 136 against 221 bits)."""
    traffic = simulate(scenario("hard", sessions=2000, seed=7, model="cascade"))
    held = holdout_flags(traffic.query_ids(), 0.25)
    train, test = traffic.patterns(searches=~held), traffic.patterns(searches=held)
    model = PBM().fit(train, traffic.system_rankings(searches=~held))
    unseen_prior = model._unseen_prior
    assert unseen_prior.feature_names == RANKING_FEATURES
    assert len(unseen_prior.coef) == len(RANKING_FEATURES) + 1 < len(model.alpha_prior.coef)
    assert model.parameters()["prior"]["unseen_pairs"]["features"] == list(RANKING_FEATURES)
    unseen, ranks, queries = unseen_positions(model, test)
    assert unseen.sum() > 100
    feats = unseen_ranking_features(ranks, queries, model._rankings)
    alpha = model._alpha_at(test)[unseen]
    np.testing.assert_allclose(alpha, unseen_prior.mean_at(feats), rtol=1e-12)
    n_votes = len(model.alpha_prior.coef) - len(unseen_prior.coef)
    imputed = model.alpha_prior.mean_at(np.column_stack([feats, np.full((len(feats), n_votes), np.nan)]))
    clicks, weight = test.clicks[unseen], np.broadcast_to(test.weight[:, None], test.docs.shape)[unseen]
    theta = model.theta[np.nonzero(unseen)[1]]

    def bits(a: np.ndarray) -> float:
        p = clamp(a * theta)
        return float(-(weight * np.where(clicks, np.log2(p), np.log2(1.0 - p))).sum())

    assert bits(alpha) < bits(imputed) - 20.0


def test_prior_features_count_the_rankings_of_searches_beyond_the_sessions() -> None:
    # query 0, pairs 0-2. The training search shows [0, 1] (system A); a held-out search shows [2, 0] (system B).
    # Fitted on the training search alone, the features are those of one ranking: pair 0 z1 = ln 1 = 0, z2 = ln 1/1
    # = 0; pair 1 z1 = ln 2, z2 = 0; pair 2 none (NaN). Given both searches' rankings (R_q = 2; consensus c_r of
    # each ranking = mean over its docs of the share of the other ranking showing them = (1 + 0)/2 = 0.5):
    #   pair 0: z1 = (ln 1 + ln 2)/2, z2 = ln 2/2 = 0, z3 = 0.5;  pair 1: ln 2, ln 1/2, 0.5;  pair 2: ln 1, ln 1/2, 0.5
    # and the votes (mean reciprocal rank per system): pair 0 A 1, B 1/2; pair 1 A 1/2, B 0; pair 2 A 0, B 1.
    train = SessionPatterns(make_pairs(3), np.zeros(1, np.int64), np.array([[0, 1]]), np.zeros((1, 2), bool),
                            np.ones(1, np.int64))
    systems = _rankings([(0, 0, [0, 1]), (0, 1, [2, 0])], ("A", "B"), k=2)
    alone = prior_features(train, rankings_shown_in(systems, train))
    np.testing.assert_array_equal(alone.features[:2, :2], [[0.0, 0.0], [np.log(2), 0.0]])
    assert np.isnan(alone.features[2]).all() and np.isnan(alone.features[:, 2]).all()
    f = prior_features(train, systems)
    ln2 = np.log(2)
    np.testing.assert_allclose(f.features, [[ln2 / 2, 0.0, 0.5, 1.0, 0.5], [ln2, -ln2, 0.5, 0.5, 0.0],
                                            [0.0, -ln2, 0.5, 0.0, 1.0]], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(f.rankings, [2.0])
    # the systems of the same searches as the sessions change no ranking feature
    np.testing.assert_array_equal(alone.features[:, :3], prior_features(train, None).features)


def test_a_pair_only_held_out_rankings_showed_takes_the_prior_at_its_own_features() -> None:
    """Given every search's rankings, a held-out position whose pair no *training* search showed is predicted by the
    fitted prior's mean at the pair's own features (its posterior without data), not by the vote-free guess from
    the rank it is shown at; given the training searches' rankings only, by that guess (as before)."""
    traffic = simulate(scenario("hard", sessions=2000, seed=7, model="cascade"))
    held = holdout_flags(traffic.query_ids(), 0.25)
    train, test = traffic.patterns(searches=~held), traffic.patterns(searches=held)
    model = PBM().fit(train, traffic.system_rankings())
    unseen, ranks, queries = unseen_positions(model, test)
    assert unseen.sum() > 100
    alpha = model._alpha_at(test)
    np.testing.assert_allclose(alpha[unseen], model.alpha_prior.mean[test.docs[unseen]], rtol=1e-12)
    only_train = PBM().fit(train, traffic.system_rankings(searches=~held))
    feats = unseen_ranking_features(ranks, queries, only_train._rankings)
    np.testing.assert_allclose(only_train._alpha_at(test)[unseen], only_train._unseen_prior.mean_at(feats), rtol=1e-12)


def test_the_held_out_rankings_win_the_row_pbm_lost_on_dbn_traffic() -> None:
    """Issue 10's last lost row (hard scenario, 2,000 DBN searches, seed 7): PBM's held-out conditional perplexity
    1.1590 against 1.1586 for +1/+2 with the training searches' rankings only (measured; it stays so), 1.1389 with
    every search's rankings (bench/accuracy_hard.py): the 37 held-out searches that put first a pair with 1-2
    unclicked training impressions are a ranking's judgment the prior's features now see."""
    traffic = simulate(scenario("hard", sessions=2000, seed=7, model="dbn"))
    held = holdout_flags(traffic.query_ids(), 0.25)
    train, test = traffic.patterns(searches=~held), traffic.patterns(searches=held)
    base = evaluate(PBM(prior="pseudocount").fit(train), test).conditional_perplexity_mean
    ours = evaluate(PBM().fit(train, traffic.system_rankings()), test).conditional_perplexity_mean
    hidden = evaluate(PBM().fit(train, traffic.system_rankings(searches=~held)), test).conditional_perplexity_mean
    assert base == pytest.approx(1.1586, abs=5e-5) and hidden == pytest.approx(1.1590, abs=5e-5)
    assert ours < base - 0.015
