"""Paired comparisons, Holm, and offline vs online ordering."""

from __future__ import annotations

import itertools
from dataclasses import asdict, replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from ubi_pipeline.reports.compare import (
    CompareError,
    compare_block,
    compare_pair,
    compare_systems,
    holm,
    ordering,
    with_holm,
)
from ubi_pipeline.reports.intervals import sign_flip_pvalue


def test_holm_by_hand():
    # sorted: 0.01 x4 = 0.04; 0.03 x3 = 0.09; 0.04 x2 = 0.08 -> running max 0.09; 0.5 x1 = 0.5
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    # capped at 1, NaN left out of m: m = 2 -> 0.6 x2 = 1.2 -> 1; 0.7 x1 -> max(1, 0.7) = 1
    out = holm([0.6, float("nan"), 0.7])
    assert out[0] == 1.0 and np.isnan(out[1]) and out[2] == 1.0


@given(st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_holm_never_lowers_a_p_value_and_keeps_the_order(ps):
    adj = holm(ps)
    assert all(a >= p - 1e-15 and a <= 1.0 for a, p in zip(adj, ps, strict=True))
    order = np.argsort(ps, kind="stable")
    assert all(adj[order[i]] <= adj[order[i + 1]] + 1e-15 for i in range(len(ps) - 1))


def test_randomisation_test_matches_exact_enumeration():
    d = np.array([0.3, -0.1, 0.25, 0.05, 0.4, -0.2, 0.15, 0.1, -0.05, 0.2])
    observed = abs(d.mean())
    # exact: all 2^10 sign patterns
    means = [abs((np.array(s) * d).mean()) for s in itertools.product((-1, 1), repeat=10)]
    exact = np.mean([m >= observed - 1e-12 for m in means])
    p = sign_flip_pvalue(d, n_perm=20_000, seed=1)
    assert p == pytest.approx(exact, abs=0.01)
    assert sign_flip_pvalue(d, n_perm=20_000, seed=1) == p  # fixed seed, same answer


def test_compare_pair_by_hand():
    ids = ["q1", "q2", "q3", "q4", "q5"]
    base = np.array([0.2, 0.5, 0.4, 0.9, 0.3])
    other = np.array([0.4, 0.5, 0.7, 0.8, 0.6])  # differences +0.2, 0, +0.3, -0.1, +0.3
    c = compare_pair("new", "old", "ndcg@10", "human", (ids, base), (ids[::-1], other[::-1]), n_boot=2000,
                     n_perm=5000)
    assert c.queries == 5
    assert (c.wins, c.losses, c.ties) == (3, 1, 1)
    assert c.diff == pytest.approx(0.14)  # (0.2 + 0 + 0.3 - 0.1 + 0.3) / 5
    assert c.mean_system == pytest.approx(0.6) and c.mean_baseline == pytest.approx(0.46)
    assert c.t_p == pytest.approx(stats.ttest_rel(other, base).pvalue)  # scipy's paired t-test
    assert c.diff_low < c.diff < c.diff_high
    # only the queries both systems have are paired
    c2 = compare_pair("new", "old", "m", "s", (ids, base), (["q1", "zz"], np.array([1.0, 0.0])))
    assert c2.queries == 1 and c2.diff == pytest.approx(0.8) and np.isnan(c2.t_p)


def test_compare_systems_family_and_errors():
    per_query = {
        "a": {("human", "ndcg@10"): (["x", "y", "z"], np.array([0.1, 0.2, 0.3])),
              ("human", "mrr"): (["x", "y", "z"], np.array([0.5, 0.5, 0.5]))},
        "b": {("human", "ndcg@10"): (["x", "y", "z"], np.array([0.4, 0.5, 0.6])),
              ("human", "mrr"): (["x", "y", "z"], np.array([0.5, 0.5, 0.5]))},
    }
    rows = compare_systems(per_query, "a", n_boot=200, n_perm=2000)
    assert [(r.system, r.metric) for r in rows] == [("b", "mrr"), ("b", "ndcg@10")]
    mrr = rows[0]
    assert (mrr.ties, mrr.t_p, mrr.randomisation_p) == (3, 1.0, 1.0)
    # Holm over the 2 comparisons: the smaller p doubles
    ps = sorted(r.randomisation_p for r in rows)
    assert min(r.randomisation_p_holm for r in rows) == pytest.approx(min(1.0, 2 * ps[0]))
    with pytest.raises(CompareError, match="baseline"):
        compare_systems(per_query, "nope")
    assert with_holm([]) == []


def test_ordering_of_systems():
    off = {"a": 0.5, "b": 0.6, "c": 0.4, "d": float("nan")}
    on = {"a": 0.10, "b": 0.12, "c": 0.11, "d": 0.5}
    o = ordering(off, on, offline_metric="human/ndcg@10", online_metric="online/ctr@10")
    # each order holds every system with a finite value of its metric: d has no offline value, so it is in
    # the online order only (and first there, 0.5 being the highest CTR)
    assert o.offline_order == ["b", "a", "c"] and o.online_order == ["d", "b", "c", "a"]
    assert o.systems == 3 and o.common == ["a", "b", "c"]  # the correlation rests on a, b, c
    # offline ranks b1 a2 c3 vs online (common set) b1 c2 a3: one discordant pair of three -> tau = (2 - 1) / 3
    assert o.kendall == pytest.approx(1 / 3)
    assert o.spearman == pytest.approx(0.5)  # 1 - 6*(0 + 1 + 1)/(3*8)
    lower = ordering(off, on, offline_metric="m", online_metric="online/abandonment", online_higher_is_better=False)
    assert lower.online_order == ["a", "c", "b", "d"]
    single = ordering({"a": 1.0}, {"a": 1.0}, offline_metric="m", online_metric="n")
    assert np.isnan(single.kendall)


def test_ordering_keeps_systems_missing_on_one_side():
    # the ESCI shape: Chorus has no judged query (offline NaN) but the higher CTR@10 (0.126 vs 0.060);
    # it must still head the online order, and the correlation rests on one system, so it is NaN
    o = ordering({"Chorus": float("nan"), "esci_ubi_sample": 0.268}, {"Chorus": 0.126, "esci_ubi_sample": 0.060},
                 offline_metric="human/ndcg@10", online_metric="online/ctr@10")
    assert o.offline_order == ["esci_ubi_sample"]
    assert o.online_order == ["Chorus", "esci_ubi_sample"]
    assert (o.systems, o.common) == (1, ["esci_ubi_sample"])
    assert np.isnan(o.kendall) and np.isnan(o.spearman)
    # a run file (offline only) is ranked offline and absent online
    r = ordering({"a": 0.5, "b": 0.6, "run": 0.9}, {"a": 0.2, "b": 0.1}, offline_metric="m", online_metric="n")
    assert r.offline_order == ["run", "b", "a"] and r.online_order == ["a", "b"]
    assert r.systems == 2 and r.kendall == pytest.approx(-1.0)  # b > a offline, a > b online


def test_a_system_without_common_queries_is_n0_not_a_crash():
    # Chorus on ESCI: no evaluated query for a source, so its per-query arrays are empty; numpy cannot
    # reshape an empty array to (0, -1), which crashed `ubi report --baseline` before
    base = (["q1", "q2"], np.array([[0.5, 1.0], [0.25, 0.0]]))
    empty = ([], np.empty(0))
    (c0, c1) = compare_block("Chorus", "esci", "human", ["ndcg@10", "mrr"], base, empty, n_boot=100, n_perm=100)
    for c in (c0, c1):
        assert c.queries == 0 and (c.wins, c.losses, c.ties) == (0, 0, 0)
        assert all(np.isnan(x) for x in (c.diff, c.diff_low, c.diff_high, c.t_p, c.randomisation_p))
    rev = compare_block("esci", "Chorus", "human", ["ndcg@10"], empty, (["q1"], np.array([0.5])))
    assert rev[0].queries == 0
    # through compare_systems (which column-stacks per metric), and Holm leaves the NaNs out of the family
    per_query = {
        "esci": {("human", "ndcg@10"): (["q1", "q2"], np.array([0.5, 0.25])),
                 ("human", "mrr"): (["q1", "q2"], np.array([1.0, 0.0]))},
        "Chorus": {("human", "ndcg@10"): ([], np.array([])), ("human", "mrr"): ([], np.array([]))},
    }
    out = compare_systems(per_query, "esci", n_boot=100, n_perm=100)
    assert [(c.system, c.metric, c.queries) for c in out] == [("Chorus", "mrr", 0), ("Chorus", "ndcg@10", 0)]
    assert all(np.isnan(c.randomisation_p_holm) for c in out)
    with pytest.raises(CompareError, match="shape"):
        compare_block("s", "b", "human", ["m0", "m1"], base, (["q1"], np.array([1.0, 2.0, 3.0])))


def test_a_block_of_metrics_gives_each_metric_what_it_gets_alone():
    rng = np.random.default_rng(5)
    ids = [f"q{i}" for i in range(60)]
    base, other = rng.random((60, 3)), rng.random((60, 3)) + [0.0, 0.05, 0.2]
    block = compare_block("s", "b", "human", ["m0", "m1", "m2"], (ids, base), (ids, other), n_boot=500, n_perm=800)
    for j, c in enumerate(block):
        alone = compare_pair("s", "b", f"m{j}", "human", (ids, base[:, j]), (ids, other[:, j]), n_boot=500,
                             n_perm=800)
        assert asdict(c) == pytest.approx(asdict(replace(alone, metric=c.metric)), nan_ok=True)
    assert block[2].randomisation_p < 0.01 < block[0].randomisation_p  # +0.2 on 60 queries is clear
