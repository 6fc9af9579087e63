"""Propensity estimators: hand-worked cases, recovery of θ on simulated logs, bootstrap, plot, ``ubi propensity``."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ubi_pipeline.cli import main
from ubi_pipeline.collector.ingest import ingest, parse_bulk, validate_items
from ubi_pipeline.processors.clicks.sessions import patterns_from_sessions
from ubi_pipeline.processors.clicks.stats import ClickCells, PairIndex, cells_from_sessions
from ubi_pipeline.processors.propensity import (
    PropensityError,
    SwapSessions,
    estimate_from_patterns,
    estimate_randomized,
    plot_curve,
)
from ubi_pipeline.processors.propensity.bootstrap import (
    BootstrapResult,
    CellMap,
    basic_log_interval,
    bias_and_se,
    bootstrap,
    resample_clusters,
    resample_weights,
)
from ubi_pipeline.processors.propensity.estimate import _bias_notes
from ubi_pipeline.processors.propensity.harvest import allpairs, harvest_stats, pair_fixed_effects
from ubi_pipeline.processors.propensity.randomized import randomized_ratios
from ubi_pipeline.processors.simulation import SimConfig, simulate
from ubi_pipeline.schemas.sessions import Session
from ubi_pipeline.store.duckdb_store import Store

TRUE = 1.0 / np.arange(1, 11)  # θ_k/θ_1 of the simulator's default (η = 1)


def cells(rows: list[tuple[int, int, int, int]], n_pairs: int, k: int) -> ClickCells:
    """ClickCells from (pair, rank, impressions, clicks) rows."""
    pairs = PairIndex(np.array(["q"] * n_pairs, dtype=object), np.array([f"d{i}" for i in range(n_pairs)], dtype=object),
                      np.zeros(n_pairs, dtype=np.int64))
    a = np.array(rows, dtype=np.int64)
    return ClickCells(pairs, a[:, 0], a[:, 1], a[:, 2], a[:, 3], k)


# ---------------------------------------------------------------- harvesting, by hand


def test_allpairs_two_ranks_by_hand() -> None:
    """Pair A: 400/1000 clicks at rank 1, 200/1000 at rank 2; pair B: 200/1000 and 100/1000.

    Weights m = 1000·1000/2000 = 500 each, so Ĉ_1 = 500·0.4 + 500·0.2 = 300, Ĉ_2 = 150, N = 1000. With one
    rank pair the likelihood is two free binomials: θ_1·c = 0.3, θ_2·c = 0.15, so θ_2/θ_1 = 0.5 exactly.
    """
    c = cells([(0, 1, 1000, 400), (0, 2, 1000, 200), (1, 1, 1000, 200), (1, 2, 1000, 100)], 2, 2)
    s = harvest_stats(c)
    assert s.clicks_k.tolist() == pytest.approx([300.0]) and s.clicks_k2.tolist() == pytest.approx([150.0])
    assert s.trials.tolist() == pytest.approx([1000.0]) and s.n_pairs.tolist() == [2]
    assert allpairs(c) == pytest.approx([1.0, 0.5], rel=1e-5)


def test_allpairs_chains_rank_pairs() -> None:
    """A at ranks 1, 2 (600, 300 of 1000: ratio 1/2); B at ranks 2, 3 (400, 200 of 1000: ratio 1/2).

    Two rank pairs, five parameters (θ_1..θ_3, c_12, c_23), four counts: the fit is exact, and rank 3, never
    shown next to rank 1, gets θ_3/θ_1 = (θ_2/θ_1)(θ_3/θ_2) = 0.25 through rank 2.
    """
    c = cells([(0, 1, 1000, 600), (0, 2, 1000, 300), (1, 2, 1000, 400), (1, 3, 1000, 200)], 2, 3)
    assert allpairs(c) == pytest.approx([1.0, 0.5, 0.25], rel=1e-5)


def test_allpairs_unlinked_ranks_are_nan_and_no_overlap_raises() -> None:
    c = cells([(0, 1, 100, 50), (0, 2, 100, 25), (1, 3, 100, 30), (1, 4, 100, 20)], 2, 4)
    r = allpairs(c)
    assert r[:2] == pytest.approx([1.0, 0.5], rel=1e-5) and np.isnan(r[2:]).all()
    with pytest.raises(PropensityError, match="two different ranks"):
        allpairs(cells([(0, 1, 100, 50), (1, 2, 100, 25)], 2, 2))


def test_pair_fixed_effects_two_ranks_by_hand() -> None:
    """Pair A: 30/100 clicks at rank 1, 30/300 at rank 2 (on its own θ_2/θ_1 = 1/3); pair B: 20/200 and
    10/100 (on its own 1). With t = θ_2/θ_1 the conditional score Σ_d [c_d2 − C_d·n_d2·t / (n_d1 + n_d2·t)] = 0
    reads 40 = 180t/(1 + 3t) + 30t/(2 + t), i.e. 15t² + 11t − 8 = 0 (hand algebra), so
    t = (√601 − 11)/30 = 0.4505102. A third pair seen at one rank only and a fourth never clicked carry no
    information about θ under the conditional likelihood: adding them changes nothing.
    """
    rows = [(0, 1, 100, 30), (0, 2, 300, 30), (1, 1, 200, 20), (1, 2, 100, 10)]
    expected = (np.sqrt(601.0) - 11.0) / 30.0
    assert pair_fixed_effects(cells(rows, 2, 2)) == pytest.approx([1.0, expected], rel=1e-8)
    more = rows + [(2, 1, 500, 250), (3, 1, 50, 0), (3, 2, 70, 0)]
    assert pair_fixed_effects(cells(more, 4, 2)) == pytest.approx([1.0, expected], rel=1e-8)
    # the AllPairs case above: every pair halves from rank 1 to rank 2, so both estimators give exactly 0.5
    same = [(0, 1, 1000, 400), (0, 2, 1000, 200), (1, 1, 1000, 200), (1, 2, 1000, 100)]
    assert pair_fixed_effects(cells(same, 2, 2)) == pytest.approx([1.0, 0.5], rel=1e-8)


def test_pair_fixed_effects_chains_weights_and_refusals() -> None:
    """Chained ranks as for AllPairs (0.25 at rank 3 through rank 2); cell weights of 3 are three copies of
    the log, which leave the estimate unchanged; unlinked ranks are NaN; no overlap, or no click at rank 1 on a
    pair shown elsewhere too, is refused."""
    rows = [(0, 1, 1000, 600), (0, 2, 1000, 300), (1, 2, 1000, 400), (1, 3, 1000, 200)]
    c = cells(rows, 2, 3)
    assert pair_fixed_effects(c) == pytest.approx([1.0, 0.5, 0.25], rel=1e-8)
    assert pair_fixed_effects(c, weights=np.full(4, 3.0)) == pytest.approx([1.0, 0.5, 0.25], rel=1e-8)
    r = pair_fixed_effects(cells([(0, 1, 100, 50), (0, 2, 100, 25), (1, 3, 100, 30), (1, 4, 100, 20)], 2, 4))
    assert r[:2] == pytest.approx([1.0, 0.5], rel=1e-8) and np.isnan(r[2:]).all()
    with pytest.raises(PropensityError, match="two different ranks"):
        pair_fixed_effects(cells([(0, 1, 100, 50), (1, 2, 100, 25)], 2, 2))
    with pytest.raises(PropensityError, match="rank 1"):
        pair_fixed_effects(cells([(0, 1, 100, 0), (0, 2, 100, 25)], 1, 2))


def test_pair_fixed_effects_is_not_biased_by_sparse_confounded_pairs() -> None:
    """20,000 pairs with 6 impressions each, shown where a ranker would put them: α ~ U(0.1, 1); pairs with
    α > 0.55 get 4 impressions at rank 1 and 1 at ranks 2 and 3, the others 1, 1 and 4. θ = (1, 0.5, 0.25).

    This is the setting where one free α per pair biases PBM EM (incidental parameters, rank confounded
    with relevance): on seeds 0-3 EM's rank-3 ratio was 4.5% to 6.9% low, the conditional estimate's within
    2.3% (its spread there is about 1.2%, from those seeds). Seed 0: each rank within 4% for the conditional
    estimate, EM's rank 3 more than 2.5% low and further from the truth than the conditional estimate.
    """
    from ubi_pipeline.processors.propensity.em import em_ratios

    rng = np.random.default_rng(0)
    n_pairs, theta = 20_000, np.array([1.0, 0.5, 0.25])
    alpha = rng.uniform(0.1, 1.0, n_pairs)
    imps = np.where((alpha > 0.55)[:, None], [4, 1, 1], [1, 1, 4]).reshape(-1)
    pair = np.repeat(np.arange(n_pairs), 3)
    rank = np.tile(np.arange(1, 4), n_pairs)
    clicks = rng.binomial(imps, theta[rank - 1] * alpha[pair])
    base = cells([(0, 1, 1, 0)], n_pairs, 3)  # the pair index of n_pairs pairs; the cells are set directly
    c = ClickCells(base.pairs, pair, rank, imps.astype(np.int64), clicks.astype(np.int64), 3)
    fe, em = pair_fixed_effects(c), em_ratios(c)
    assert np.all(np.abs(fe / theta - 1) < 0.04)
    assert em[2] / theta[2] - 1 < -0.025
    assert np.all(np.abs(fe - theta)[1:] < np.abs(em - theta)[1:])


# ---------------------------------------------------------------- randomised swaps, by hand


def swaps_by_hand(control: tuple[int, int] = (1, 1)) -> SwapSessions:
    """Control: 1000 searches, 600 clicks at rank 1 and 150 at rank 2 (θ=(1, .5), R1=.6, R2=.3).
    Swap (1,2): 1000 searches, 300 clicks at rank 1 (R2·θ_1) and 300 at rank 2 (R1·θ_2).
    Patterns (rank1, rank2) -> count: control TT 150, TF 450, FF 400; swap TT 90, TF 210, FT 210, FF 490.
    """
    tt, tf, ft, ff = [True, True], [True, False], [False, True], [False, False]
    return SwapSessions(
        arms=np.array([control, (1, 2)]),
        arm=np.array([0, 0, 0, 1, 1, 1, 1]),
        clicks=np.array([tt, tf, ff, tt, tf, ft, ff]),
        weight=np.array([150, 450, 400, 90, 210, 210, 490]),
    )


def test_swap_ratio_by_hand() -> None:
    """θ_2/θ_1 = (CTR_swap(2) + CTR_ctrl(2)) / (CTR_swap(1) + CTR_ctrl(1)) = (0.3 + 0.15)/(0.3 + 0.6) = 0.5."""
    assert randomized_ratios(swaps_by_hand()) == pytest.approx([1.0, 0.5])
    est = estimate_randomized(swaps_by_hand(), replicates=0)
    assert est.details["control"] == "marked control arm" and est.sessions == 2000
    assert est.support == {"arm_searches": [1000, 1000], "arm_clicks_at_rank": [600, 300]}
    # the same searches kept unmarked serve as the control when no marked control arm exists
    fallback = estimate_randomized(swaps_by_hand(control=(0, 0)), replicates=0)
    assert fallback.ratio == pytest.approx([1.0, 0.5]) and fallback.details["control"] == "unmarked searches"


def test_swap_without_control_or_arms_raises() -> None:
    s = swaps_by_hand()
    only_swap = SwapSessions(s.arms[1:], s.arm[3:] - 1, s.clicks[3:], s.weight[3:])
    with pytest.raises(PropensityError, match="no control"):
        randomized_ratios(only_swap)
    only_control = SwapSessions(s.arms[:1], s.arm[:3], s.clicks[:3], s.weight[:3])
    with pytest.raises(PropensityError, match="no randomised swap arm"):
        randomized_ratios(only_control)


# ---------------------------------------------------------------- recovery on simulated logs


@pytest.fixture(scope="module")
def pbm_log() -> object:
    """30,000 PBM sessions, η = 1, 3 rankers, a third of them in a rank-1 swap experiment."""
    return simulate(sessions=30_000, seed=21, randomize=1 / 3)


def mre(ratio: np.ndarray) -> float:
    return float(np.mean(np.abs(ratio[1:] - TRUE[1:]) / TRUE[1:]))


@pytest.mark.parametrize("method", ["em", "harvest"])
def test_em_and_harvest_recover_theta(pbm_log: object, method: str) -> None:
    """Tolerance: mean relative error <= 5% and every rank within 15%.

    At 30,000 sessions rank 10 has ~1,000 clicks, so its ratio has a relative standard error of roughly
    4-5% (the bootstrap of the next test agrees); 15% is three of those, 5% on the mean is the bench's target
    at 100,000 sessions applied here with less data.
    """
    est = estimate_from_patterns(pbm_log.patterns(), method, replicates=0)
    assert est.ratio[0] == 1.0
    assert mre(est.ratio) <= 0.05
    assert np.all(np.abs(est.ratio - TRUE) / TRUE <= 0.15)
    assert est.sessions == 30_000 and est.rank_pairs == 45  # every rank pair is linked by some (query, doc)


def test_randomized_recovers_theta_on_swap_marked_searches(pbm_log: object) -> None:
    """~10,000 searches in 10 arms: looser than harvesting (a tenth of the data per arm), MRE <= 8%."""
    est = estimate_randomized(pbm_log.swap_sessions(), replicates=0)
    assert 9_500 < est.sessions < 10_500 and est.rank_pairs == 9
    assert mre(est.ratio) <= 0.08


@pytest.mark.parametrize("method", ["em", "harvest"])
def test_bootstrap_interval_covers_truth(pbm_log: object, method: str) -> None:
    """Fixed seed, 40 replicates: the 95% intervals cover the true ratio at >= 8 of ranks 2..10.

    (With exact 95% coverage, 9 ranks miss 0.45 times on average; this seed is fixed, the check is that the
    intervals are neither too narrow nor centred elsewhere.)
    """
    est = estimate_from_patterns(pbm_log.patterns(), method, replicates=40, seed=3)
    assert est.replicates == 40
    covered = (est.ci_low[1:] <= TRUE[1:]) & (TRUE[1:] <= est.ci_high[1:])
    assert covered.sum() >= 8
    assert np.all(est.ci_low <= est.ratio + 1e-12) and np.all(est.ratio <= est.ci_high + 1e-12)
    assert np.all(est.ci_high[1:] - est.ci_low[1:] < 0.1)  # informative, not [0, 1]


def test_cut_to_fewer_ranks(pbm_log: object) -> None:
    est = estimate_from_patterns(pbm_log.patterns(), "harvest", max_rank=5, replicates=0)
    assert est.max_rank == 5 and mre(np.append(est.ratio, TRUE[5:])) <= 0.05


# ---------------------------------------------------------------- identifiability


def test_one_ranking_per_query_is_refused_with_what_would_help() -> None:
    """One ranker, one epoch: every (query, doc) always at the same rank, so θ is not identifiable.

    (Before this check EM printed a curve from "0 rank pairs linked by 0 (query, doc) pairs", without a note.)
    """
    patterns = simulate(SimConfig(sessions=600, seed=1, rankers=1)).patterns()
    for method in ("em", "harvest"):
        with pytest.raises(PropensityError) as exc:
            estimate_from_patterns(patterns, method, replicates=0)
        message = str(exc.value)
        assert "no (query, doc) was shown at two different ranks" in message
        for remedy in ("several rankers", "ranking changes over time", "randomised swap experiment"):
            assert remedy in message


def test_few_linking_pairs_are_noted_and_unlinked_ranks_are_nan() -> None:
    """Query q: 60 searches show [a, b, c], 60 show [b, a, c]. Only a and b move (between ranks 1 and 2):
    2 linking pairs (< 20) at ranks 1 and 2; c is always at rank 3, so nothing links rank 3 to rank 1."""
    s = [Session(f"x{i}", "q", ("a", "b", "c"), (1, 2, 3), (i % 2 == 0, i % 5 == 0, i % 7 == 0)) for i in range(60)]
    s += [Session(f"y{i}", "q", ("b", "a", "c"), (1, 2, 3), (i % 3 == 0, i % 4 == 0, i % 7 == 0)) for i in range(60)]
    est = estimate_from_patterns(patterns_from_sessions(s, max_rank=3), "em", replicates=0)
    assert est.ratio[0] == 1.0 and np.isfinite(est.ratio[1]) and np.isnan(est.ratio[2])
    assert est.support["pairs_at_other_ranks"] == [2, 2, 0]
    assert any("ranks [3] are not identifiable" in n for n in est.notes)
    assert any("ranks [1, 2] are linked to the others by fewer than 20 (query, doc) pairs" in n for n in est.notes)


def test_basic_log_interval_and_bias_by_hand() -> None:
    """θ̂ = (1, 0.5); replicate percentiles (1, 0.4) and (1, 0.7): basic interval of log θ at rank 2 is
    [0.5²/0.7, 0.5²/0.4] = [0.357143, 0.625]. Replicates 0.4, 0.6, 0.8 at rank 2: bias 0.6 − 0.5 = 0.1, SE 0.2."""
    boot = BootstrapResult(np.array([1.0, 0.4]), np.array([1.0, 0.7]), np.array([[1.0, 0.4], [1.0, 0.6], [1.0, 0.8]]),
                           0, 0.95)
    low, high = basic_log_interval(np.array([1.0, 0.5]), boot)
    assert low == pytest.approx([1.0, 0.357143], abs=1e-6) and high == pytest.approx([1.0, 0.625])
    bias, se = bias_and_se(np.array([1.0, 0.5]), boot)
    assert bias == pytest.approx([0.0, 0.1]) and se == pytest.approx([0.0, 0.2])


def test_bias_notes() -> None:
    """Rank 2: bias 0.05 over SE 0.01 (5 SE, +10% of 0.5); the estimate 0.5 is below the replicates' 0.52..0.6."""
    notes = _bias_notes("em", np.array([1.0, 0.5, 0.25]), np.array([0.0, 0.05, 0.001]), np.array([0.0, 0.01, 0.01]),
                        np.array([1.0, 0.52, 0.2]), np.array([1.0, 0.6, 0.3]))
    assert len(notes) == 2
    assert "exceeds 0.25 standard errors at ranks [2] (largest +10.0% of the estimate, at rank 2)" in notes[0]
    assert "incidental parameters" in notes[0]
    assert notes[1].startswith("at ranks [2] the estimate lies outside the central range of its own bootstrap")
    assert _bias_notes("harvest", np.ones(2), np.zeros(2), np.ones(2), np.ones(2), np.ones(2)) == []


def test_em_interval_is_reflected_around_a_biased_estimate() -> None:
    """3,000 PBM sessions, 3 rankers: EM's replicates sit above its estimate (incidental-parameter bias), and
    the shipped interval is the basic one, [θ̂²/q_hi, θ̂²/q_lo], so it lies lower than the percentile interval.

    Why it matters (bench/propensity_coverage.py, 5 seeds x 5,000 sessions): the percentile interval covered
    the truth at 29 of 45 rank-seed cases, the basic one at 39.
    """
    est = estimate_from_patterns(simulate(SimConfig(sessions=3000, seed=4)).patterns(), "em", replicates=40, seed=1)
    bias = np.array(est.details["bootstrap_bias"][1:], dtype=float)
    assert est.details["interval"].startswith("basic bootstrap interval of log θ")
    assert np.mean(bias / est.ratio[1:]) > 0.01  # replicates run a few percent high
    q_lo, q_hi = est.ratio**2 / est.ci_high, est.ratio**2 / est.ci_low
    assert np.all(q_lo[1:] < q_hi[1:])
    assert np.mean((est.ci_low + est.ci_high)[1:]) < np.mean((q_lo + q_hi)[1:])  # shifted down, against the bias
    assert any("bootstrap estimate of bias" in n for n in est.notes)


def test_propensity_command_refuses_a_single_ranker_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traffic = simulate(sessions=300, seed=2, rankers=1)
    traffic.write_bulk(tmp_path / "s.ndjson")
    with Store(tmp_path / "s.duckdb") as s:
        ingest(s, validate_items(parse_bulk((tmp_path / "s.ndjson").read_bytes())), source="test")
    assert main(["propensity", "--db", str(tmp_path / "s.duckdb"), "--method", "em", "--no-plot"]) == 2
    text = " ".join(capsys.readouterr().err.split())
    assert "PBM EM cannot tell position from relevance" in text and "several rankers" in text


# ---------------------------------------------------------------- bootstrap machinery


@given(st.lists(st.integers(0, 50), min_size=1, max_size=30).filter(lambda w: sum(w) > 0), st.integers(0, 2**32 - 1))
@settings(max_examples=50, deadline=None)
def test_resampling_keeps_the_number_of_sessions(weights: list[int], seed: int) -> None:
    w = np.array(weights)
    out = resample_weights(w, np.random.default_rng(seed))
    assert out.sum() == w.sum() and (out[w == 0] == 0).all() and (out >= 0).all()


def test_bootstrap_of_a_proportion_matches_the_binomial_standard_error() -> None:
    """1,000 sessions, 300 clicked: the bootstrap SE of the click rate is ≈ sqrt(.3·.7/1000) = 0.0145."""
    w = np.array([300, 700])
    res = bootstrap(w, lambda b: np.array([b[0] / b.sum()]), replicates=2000, seed=1)
    assert res.samples[:, 0].std() == pytest.approx(0.0145, rel=0.1)
    # the 95% percentile interval is about ±1.96 SE around 0.3
    assert res.low[0] == pytest.approx(0.3 - 1.96 * 0.0145, abs=0.004)
    assert res.high[0] == pytest.approx(0.3 + 1.96 * 0.0145, abs=0.004)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=30), st.integers(0, 2**31 - 1))
@settings(max_examples=50, deadline=None)
def test_cluster_resampling_draws_whole_queries(queries: list[int], seed: int) -> None:
    """Each replicate multiplies all patterns of a query by one draw m_q, and Σ_q m_q = number of queries."""
    cluster = np.array(queries, dtype=np.int64)
    weights = np.arange(1, len(queries) + 1, dtype=np.int64)
    w = resample_clusters(weights, cluster, np.random.default_rng(seed))
    assert w.dtype == np.int64 and np.all(w % weights == 0)
    factor = w // weights
    total = 0
    for q in np.unique(cluster):
        f = factor[cluster == q]
        assert np.all(f == f[0])
        total += int(f[0])
    assert total == len(np.unique(cluster))


def test_query_bootstrap_widens_with_clustering() -> None:
    """Every search repeated 4 times: the same evidence per query, four times as many "independent" searches.

    A session bootstrap believes the copies and its intervals shrink by about √4 = 2 (measured ratio of
    mean widths between 0.4 and 0.6 here); the query-cluster bootstrap draws the same queries with the same
    seed, and the pair fixed-effects estimate is unchanged by scaling every count, so its intervals are
    identical to the digit. On the original log the two schemes agree within 25% (sessions are independent
    given the catalog in this simulator: the cluster bootstrap costs nothing when there is no clustering).
    """
    log = simulate(sessions=4_000, seed=8)
    base = log.patterns()
    copies = type(base)(base.pairs, base.query, base.docs, base.clicks, base.weight * 4)

    def width(p: object, unit: str) -> np.ndarray:
        est = estimate_from_patterns(p, "harvest", replicates=60, seed=1, unit=unit)
        assert est.replicates == 60
        return est.ci_high[1:] - est.ci_low[1:]

    q1, q4 = width(base, "query"), width(copies, "query")
    s1, s4 = width(base, "session"), width(copies, "session")
    assert q4 == pytest.approx(q1, rel=1e-9)
    assert 0.4 < s4.mean() / s1.mean() < 0.6
    assert 0.75 < q1.mean() / s1.mean() < 1.25


def test_bootstrap_unit_defaults_and_refusals(pbm_log: object) -> None:
    est = estimate_from_patterns(pbm_log.patterns(), "harvest", replicates=5)
    assert "queries" in est.scheme and est.details["interval"] == "percentile"
    assert "sessions" in estimate_from_patterns(pbm_log.patterns(), "harvest", replicates=5, unit="session").scheme
    with pytest.raises(PropensityError, match="bootstrap unit"):
        estimate_from_patterns(pbm_log.patterns(), "harvest", replicates=5, unit="pair")
    with pytest.raises(PropensityError, match="marginal"):
        estimate_from_patterns(pbm_log.patterns(), "marginal", replicates=5, unit="query")
    with pytest.raises(PropensityError, match="one cluster per pattern"):
        bootstrap(np.ones(3, dtype=np.int64), lambda w: w.astype(float), replicates=2, clusters=np.zeros(2))


def test_cell_map_reaggregates_like_cells_from_sessions(pbm_log: object) -> None:
    p = pbm_log.patterns()
    cmap = CellMap(p)
    a, b = cmap.cells(), cells_from_sessions(p)
    for name in ("pair", "rank", "impressions", "clicks"):
        assert (getattr(a, name) == getattr(b, name)).all()


# ---------------------------------------------------------------- plot


def test_plot_writes_a_png(tmp_path: Path, pbm_log: object) -> None:
    est = estimate_from_patterns(pbm_log.patterns(), "harvest", replicates=10)
    out = plot_curve([est], tmp_path / "sub" / "curve.png", truth=TRUE)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (770, 462)  # 7.0 x 4.2 inches at 110 dpi
    assert len(data) > 10_000  # lines and labels, not an empty canvas


# ---------------------------------------------------------------- ubi propensity on a store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """2,000 simulated searches (half in the swap experiment) imported through the collector's ingest stage."""
    d = tmp_path_factory.mktemp("prop")
    traffic = simulate(sessions=2000, seed=13, randomize=0.5)
    traffic.write_bulk(d / "sim.ndjson")
    traffic.write_truth(d / "truth.json")
    with Store(d / "sim.duckdb") as s:
        result = ingest(s, validate_items(parse_bulk((d / "sim.ndjson").read_bytes())), source="test")
    assert result.rejected == 0
    return d / "sim.duckdb", d / "truth.json"


@pytest.mark.parametrize("method", ["harvest", "randomized"])
def test_propensity_json_shape(store: tuple[Path, Path], method: str, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    db, truth = store
    png = tmp_path / "p.png"
    code = main(["propensity", "--db", str(db), "--method", method, "--bootstrap", "20", "--json",
                 "--plot", str(png), "--truth", str(truth)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    # filters and the ordinal bases in use come with the sessions, which the randomized method does not build
    sessions = {"filters", "ordinal_bases", "suggested_setting"}
    assert set(out) == {"db", "max_rank", "estimates", "skipped", "plot"} | (set() if method == "randomized" else sessions)
    (est,) = out["estimates"]
    assert est["method"] == method and out["max_rank"] == 10 and out["plot"] == str(png)
    assert [r["rank"] for r in est["ranks"]] == list(range(1, 11))
    assert est["ranks"][0]["ratio"] == 1.0
    assert all(r["ci_low"] <= r["ratio"] <= r["ci_high"] for r in est["ranks"])
    assert est["bootstrap"] == {"replicates": 20, "scheme": est["bootstrap"]["scheme"]}
    assert "multinomial" in est["bootstrap"]["scheme"]
    assert ("queries" if method == "harvest" else "sessions") in est["bootstrap"]["scheme"]
    if method == "harvest":
        assert est["relative_error"] < 0.15  # 2,000 searches: a rough curve, but the right one
        assert est["sessions"] == 2000 and est["rank_pairs"] == 45
        assert set(est["ranks"][0]) == {"rank", "ratio", "ci_low", "ci_high", "impressions", "clicks",
                                        "pairs_at_other_ranks"}
        assert sum(r["impressions"] for r in est["ranks"]) == 20_000
        assert out["filters"]["sessions"] == 2000
    else:
        # ~100 searches per arm: only the shape and the rough level are checked here (recovery is tested above)
        assert est["relative_error"] < 0.4
        assert 850 < est["sessions"] < 1150 and est["details"]["control"] == "marked control arm"
        assert set(est["ranks"][0]) == {"rank", "ratio", "ci_low", "ci_high", "arm_searches", "arm_clicks_at_rank"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_propensity_shows_bootstrap_progress_on_a_terminal_only(store: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: the replicates done out of the total and the time elapsed, on stderr, when stderr is a terminal;
    nothing in a pipe and nothing under --json (stdout then holds only the JSON document)."""
    from rich.console import Console

    db, _ = store
    args = ["propensity", "--db", str(db), "--method", "harvest", "--bootstrap", "5", "--no-plot"]
    assert main(args) == 0
    assert "bootstrap" not in capsys.readouterr().err  # stderr is a pipe under pytest
    monkeypatch.setattr(Console, "is_terminal", property(lambda self: True))
    assert main(args) == 0
    assert "bootstrap (harvest)" in capsys.readouterr().err
    assert main([*args, "--json"]) == 0
    captured = capsys.readouterr()
    assert "bootstrap" not in captured.err and json.loads(captured.out)["estimates"][0]["method"] == "harvest"


def test_propensity_table_and_default_plot_path(store: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    db, _ = store
    assert main(["propensity", "--db", str(db), "--method", "em", "--bootstrap", "10"]) == 0
    text = capsys.readouterr().out
    assert "PBM EM" in text and "2,000 sessions" in text and "45 rank pairs" in text
    assert Path(f"{db}.propensity-em.png").exists()


def test_propensity_randomized_without_markers_says_how_to_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traffic = simulate(sessions=200, seed=2)
    traffic.write_bulk(tmp_path / "s.ndjson")
    with Store(tmp_path / "s.duckdb") as s:
        ingest(s, validate_items(parse_bulk((tmp_path / "s.ndjson").read_bytes())), source="test")
    assert main(["propensity", "--db", str(tmp_path / "s.duckdb"), "--method", "randomized", "--no-plot"]) == 2
    assert "--randomize" in capsys.readouterr().err


def test_marginal_em_is_monotone_and_recovers_theta() -> None:
    """PBM with attractiveness integrated out: the marginal log-likelihood never decreases, and on 20,000
    simulated sessions (40 queries x 20 docs, 3 rankers, θ_k = 1/k) θ̂_k/θ̂_1 is within 0.05 of the truth at
    every rank (stated tolerance; ranks 2-10 measured 1-6% relative error at 50,000 sessions)."""
    from ubi_pipeline.processors.clicks.stats import cells_from_sessions
    from ubi_pipeline.processors.propensity.marginal import marginal_em
    from ubi_pipeline.processors.simulation import SimConfig, simulate

    traffic = simulate(SimConfig(sessions=20_000, seed=4, model="pbm", rankers=3))
    fit = marginal_em(cells_from_sessions(traffic.patterns()))
    trace = np.array(fit.log_likelihood)
    assert (np.diff(trace) >= -1e-9 * np.abs(trace[:-1])).all()
    truth = traffic.truth.theta / traffic.truth.theta[0]
    assert fit.converged and np.abs(fit.theta / fit.theta[0] - truth).max() < 0.05
    assert fit.strength > 0 and len(fit.coef) == 3


def test_marginal_is_a_method_of_estimate_from_patterns() -> None:
    from ubi_pipeline.processors.propensity import estimate_from_patterns
    from ubi_pipeline.processors.simulation import SimConfig, simulate

    patterns = simulate(SimConfig(sessions=3000, seed=2, model="pbm", rankers=3)).patterns()
    # 2 replicates (was 5; each is a refit, ~2 s here): what is checked is the wiring (method, normalisation,
    # interval kind) and that low <= high, which a swapped or unsorted percentile pair breaks with two as with five
    est = estimate_from_patterns(patterns, "marginal", replicates=2, seed=1)
    assert est.method == "marginal" and est.ratio[0] == 1.0 and np.isfinite(est.ratio).all()
    assert est.details["interval"] == "percentile" and (est.ci_low <= est.ci_high).all()


def test_marginal_refit_reaches_the_replicates_own_maximum() -> None:
    """A bootstrap replicate refitted by :class:`Refit` (BFGS from the full log's fit) lands where
    :func:`marginal_em` run from scratch on the same replicate does.

    3,000 simulated sessions (40 queries x 20 docs, 3 rankers), 3 multinomial replicates. Measured: the two
    routes differ by 6e-5 to 9e-5 in θ̂_k/θ̂_1 (20,000 sessions: 6e-5 to 8e-5; 50,000 hard-scenario searches:
    5e-5 to 8e-5; EM stops on a relative change of 1e-9 in the log-likelihood, BFGS on a gradient of 1e-5
    per pair), while the replicates themselves move 0.023 to 0.031 from the full log's estimate. The test
    allows 1e-3: a twentieth of that spread, ten times the measured gap.
    """
    from ubi_pipeline.processors.propensity.marginal import Refit, marginal_em

    patterns = simulate(SimConfig(sessions=3000, seed=2, model="pbm", rankers=3)).patterns()
    cmap = CellMap(patterns)
    full = cmap.cells()
    fit = marginal_em(full)
    refit = Refit(full, fit)
    rng = np.random.default_rng(3)
    spread = []
    for _ in range(3):
        cells_b = cmap.cells(resample_weights(patterns.weight, rng))
        cold = marginal_em(cells_b).ratio
        warm = refit.ratios(cells_b)
        assert np.isfinite(warm).all()
        assert np.abs(warm - cold).max() < 1e-3
        spread.append(np.abs(cold - fit.ratio).max())
    assert max(spread) > 3e-3  # the replicates did move: the check above is not a refit returning its start


def test_marginal_bootstrap_interval_matches_the_cold_refits() -> None:
    """``estimate_from_patterns(method="marginal")``'s interval against the one the cold refits gave (each
    replicate fitted by ``marginal_em`` from its own start, as before issue 26): the same seed draws the same
    resamples, so the percentile ends can differ only by the refits' own gap (< 1e-3, previous test). Measured:
    at most 1.0e-4 at either end, with widths 0.033-0.047 at ranks 2-10. Allowed: 2e-3 at each end, under a
    tenth of every width (and widths above 0.02, so the comparison is not between two empty intervals).
    """
    from ubi_pipeline.processors.propensity.marginal import marginal_ratios

    patterns = simulate(SimConfig(sessions=3000, seed=2, model="pbm", rankers=3)).patterns()
    est = estimate_from_patterns(patterns, "marginal", replicates=12, seed=5)
    cmap = CellMap(patterns)
    old = bootstrap(patterns.weight, lambda w: marginal_ratios(cmap.cells(w)), replicates=12, seed=5)
    width = est.ci_high[1:] - est.ci_low[1:]
    assert (width > 0.02).all()
    assert np.abs(est.ci_low - old.low).max() < 2e-3 and np.abs(est.ci_high - old.high).max() < 2e-3
    assert est.replicates == 12 and est.scheme.startswith("multinomial resampling of sessions")


def test_em_replicates_without_unclicked_pairs_reach_the_same_maximum() -> None:
    """``em.replicate_ratios`` fits a replicate on the pairs clicked at least once, to a relative gain of 1e-9;
    a pair never clicked has maximum-likelihood α = 0 and moves nothing, so θ̂_k/θ̂_1 is that of all the cells
    (``em_ratios``, to 1e-10) up to EM's stopping rules.

    3,000 simulated sessions (40 queries x 20 docs, 3 rankers), 3 replicates. Measured with these seeds: 2.0e-5
    to 5.3e-5 apart, while the replicates moved 2.6e-2 to 5.3e-2 from the full log's estimate. Allowed: 5e-4,
    a fiftieth of that spread. A log whose only clicks are at rank 1 would
    lose every other rank without the unclicked pairs: then all cells are used (the second case).
    """
    from ubi_pipeline.processors.propensity.em import em_ratios, replicate_ratios

    patterns = simulate(SimConfig(sessions=3000, seed=2, model="pbm", rankers=3)).patterns()
    cmap = CellMap(patterns)
    rng = np.random.default_rng(0)
    for _ in range(3):
        cells_b = cmap.cells(resample_weights(patterns.weight, rng))
        unclicked = np.bincount(cells_b.pair, weights=cells_b.clicks, minlength=len(cells_b.pairs))[cells_b.pair] == 0
        assert unclicked.sum() > 100  # there is something to leave out
        assert np.abs(replicate_ratios(cells_b) - em_ratios(cells_b)).max() < 5e-4
    # pair 0 clicked at ranks 1 and 2; pair 1 shown at ranks 2 and 3, never clicked: without it rank 3 has no cell
    c = cells([(0, 1, 100, 50), (0, 2, 100, 25), (1, 2, 100, 0), (1, 3, 100, 0)], 2, 3)
    assert np.array_equal(replicate_ratios(c), em_ratios(c), equal_nan=True)
