"""Interleaving outcomes: credit, the sign test and the per-query level, on counts worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from ubi_pipeline.reports.interleaving_outcomes import (
    InterleavedSearch,
    analyse,
    bootstrap_win_rate,
    credit,
    sign_test,
    tally,
)


def test_credit_counts_distinct_clicked_docs_per_team() -> None:
    teams = {"a": "A", "b": "B", "c": "A"}
    assert credit(teams, ["a", "c", "a", "zz"], ("A", "B")) == (2, 0)  # repeat click once, unknown doc nobody
    assert credit(teams, ["b"], ("A", "B")) == (0, 1)


def test_sign_test_by_hand() -> None:
    # 9 wins, 1 loss: two-sided P = 2·(C(10,0) + C(10,1))/2^10 = 22/1024
    assert sign_test(9, 1) == pytest.approx(22 / 1024)
    assert sign_test(5, 5) == pytest.approx(1.0)
    assert sign_test(0, 0) == 1.0


def test_tally_and_bootstrap() -> None:
    out = np.array([1] * 6 + [-1] * 2 + [0] * 2)
    t = tally(out, n_boot=500, seed=3)
    assert (t.wins, t.losses, t.ties, t.n) == (6, 2, 2, 10)
    assert t.win_rate == pytest.approx(0.75)
    assert t.preference == pytest.approx((6 + 1) / 10 - 0.5)
    assert t.ci_low <= 0.75 <= t.ci_high and 0 <= t.ci_low and t.ci_high <= 1
    assert bootstrap_win_rate(np.ones(7, dtype=np.int64), n_boot=50) == (1.0, 1.0)


def test_analyse_levels() -> None:
    def s(qid: str, q: str, clicked: set[str]) -> InterleavedSearch:
        return InterleavedSearch(qid, q, ("base", "cand"), {"x": "base", "y": "cand"}, frozenset(clicked))

    searches = [s("1", "shoes", {"y"}), s("2", "shoes", {"y"}), s("3", "shoes", {"x"}),  # shoes: +1 +1 −1
                s("4", "hats", {"x"}), s("5", "hats", {"x", "y"}), s("6", "hats", set())]  # hats: −1, 0, none
    (res,) = analyse(searches, n_boot=100)
    assert res.experiment == "cand-vs-base" and res.searches == 6 and res.searches_without_clicks == 1
    assert (res.by_search.wins, res.by_search.losses, res.by_search.ties) == (2, 2, 1)
    assert res.credited_clicks == (3, 3)
    # per query: shoes mean +1/3 -> win; hats mean −1/2 -> loss
    assert (res.by_query.wins, res.by_query.losses, res.by_query.ties) == (1, 1, 0)
    assert res.per_query == [{"query": "hats", "searches": 2, "wins": 0, "losses": 1, "ties": 1},
                             {"query": "shoes", "searches": 3, "wins": 2, "losses": 1, "ties": 0}]
