"""The joint view's lines (reports/pairs.py): hand-worked numbers, a published interval, signs and pairs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ubi_pipeline.reports.interleaving_outcomes import InterleavingResult, Tally
from ubi_pipeline.reports.intervals import Interval, wilson
from ubi_pipeline.reports.online import OnlineMetrics
from ubi_pipeline.reports.pairs import (
    Line,
    PairView,
    interleaving_line,
    joint_view,
    mover_difference,
    observed_line,
    offline_line,
    pairs_of,
    ranker_system,
)


def test_mover_difference_by_hand() -> None:
    # reference 0.20 [0.15, 0.26], challenger 0.30 [0.22, 0.37]: d = 0.10,
    # L = 0.10 − √(0.08² + 0.06²) = 0.10 − 0.10 = 0, U = 0.10 + √(0.07² + 0.05²) = 0.10 + √0.0074 = 0.186023
    d, lo, hi = mover_difference(Interval(0.20, 0.15, 0.26, 100, "wilson"), Interval(0.30, 0.22, 0.37, 100, "wilson"))
    assert d == pytest.approx(0.10) and lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.186023, abs=1e-6)


def test_mover_of_wilson_intervals_is_newcombes_method_10() -> None:
    # Newcombe, Stat. Med. 17:873 (1998), Table II, example (a): 56/70 − 48/80 = 0.2000, method 10 (score
    # interval, no continuity correction): 0.0524 to 0.3339.
    d, lo, hi = mover_difference(wilson(48, 80), wilson(56, 70))
    assert round(d, 4) == 0.2 and round(lo, 4) == 0.0524 and round(hi, 4) == 0.3339


def _online(system: str, clicked: int, shown: int, searches: int) -> OnlineMetrics:
    return OnlineMetrics(system, searches, searches, {"ctr@10": wilson(clicked, shown)})


def test_observed_line_needs_both_logged() -> None:
    online = {"a": _online("a", 48, 80, 8), "b": _online("b", 56, 70, 7)}
    ln = observed_line(online, "ctr@10", "a", "b")
    assert (round(ln.diff, 4), round(ln.low, 4), round(ln.high, 4), ln.n) == (0.2, 0.0524, 0.3339, 15)
    assert ln.sign == 1 and ln.clear is True
    missing = observed_line(online, "ctr@10", "a", "run")
    assert not math.isfinite(missing.diff) and "run never served" in (missing.missing or "")


def _tally(wins: int, losses: int, ties: int, low: float, high: float) -> Tally:
    n = wins + losses + ties
    return Tally(wins, losses, ties, wins / (wins + losses), low, high, (wins + ties / 2) / n - 0.5, 0.01)


def _experiment() -> InterleavingResult:
    t = _tally(30, 10, 5, 0.60, 0.88)
    return InterleavingResult("candidate-vs-baseline", "baseline", "candidate", 50, 5, (12, 35), t, t, 10,
                              systems=("shop",))


def test_interleaving_line_maps_rankers_to_systems_and_flips_when_reversed() -> None:
    systems = ["shop/ranker=baseline", "shop/ranker=candidate"]
    ln = interleaving_line([_experiment()], systems, *systems)
    # win rate 30 / 40 = 0.75, so 0.75 − 1/2 = +0.25 with the interval 0.60 .. 0.88 shifted: +0.10 .. +0.38
    assert (ln.diff, ln.low, ln.high, ln.n) == pytest.approx((0.25, 0.10, 0.38, 40))
    back = interleaving_line([_experiment()], systems, systems[1], systems[0])
    assert (back.diff, back.low, back.high) == pytest.approx((-0.25, -0.38, -0.10))
    none = interleaving_line([_experiment()], [*systems, "other"], systems[0], "other")
    assert none.missing == "not interleaved against each other"


def test_ranker_system_is_exact_else_the_one_split_system() -> None:
    assert ranker_system("bm25", ["bm25", "shop/ranker=bm25"]) == "bm25"
    assert ranker_system("b", ["shop/ranker=a", "shop/ranker=b"]) == "shop/ranker=b"
    assert ranker_system("b", ["x/ranker=b", "y/ranker=b"]) is None  # two applications: ambiguous
    assert ranker_system("b", ["shop"]) is None


def test_offline_line_pairs_common_queries() -> None:
    # common queries a and b: differences 0.7 − 0.5 = 0.2 and 0.2 − 0.2 = 0, mean 0.1 over 2 queries
    per_text = {"ref": (["a", "b", "c"], np.array([0.5, 0.2, 0.9])), "cha": (["a", "b", "d"], np.array([0.7, 0.2, 0.1]))}
    ln = offline_line("human offline", "human", "ndcg@10", per_text, "ref", "cha", n_boot=200, seed=0, why_none="-")
    assert ln.diff == pytest.approx(0.1) and ln.n == 2 and ln.unit == "queries"
    # two queries: no interval and no "excludes 0" (issue 24: none below MIN_BOOTSTRAP_N = 5, as the README says;
    # before, the resamples of {0.2, 0} gave an interval)
    assert math.isnan(ln.low) and math.isnan(ln.high) and ln.clear is None and ln.interval == "no interval: 2 queries < 5"
    # five common queries: differences 0.2, 0, 0.1, 0.3, 0.1, mean 0.14; bootstrap means lie in [0, 0.3]
    five = {"ref": (list("abcef"), np.array([0.5, 0.2, 0.3, 0.1, 0.4])), "cha": (list("abcef"), np.array([0.7, 0.2, 0.4, 0.4, 0.5]))}
    ln5 = offline_line("human offline", "human", "ndcg@10", five, "ref", "cha", n_boot=200, seed=0, why_none="-")
    assert ln5.diff == pytest.approx(0.14) and ln5.n == 5 and 0.0 <= ln5.low <= ln5.diff <= ln5.high <= 0.3
    absent = offline_line("human offline", None, "ndcg@10", per_text, "ref", "cha", n_boot=10, seed=0,
                          why_none="no human labels")
    assert absent.missing == "no human labels"


def test_signs_agree_and_disagree() -> None:
    up = Line("human offline", "m", 0.1, 0.05, 0.2, 10, "queries")
    down = Line("predicted online", "m", -0.02, -0.03, 0.01, 100, "searches")
    gone = Line("interleaving", "m", missing="not interleaved")
    agree = PairView("a", "b", (up, Line("observed online (A/B)", "m", 0.01, -0.01, 0.02, 9, "searches"), gone))
    assert agree.agree is True and agree.verdict() == "agree in sign: all 2 lines with a direction favour b"
    split = PairView("a", "b", (up, down, gone))
    assert split.agree is False
    assert split.verdict() == "disagree in sign: human offline favour b; predicted online favour a"
    assert down.clear is False and up.clear is True and gone.clear is None
    assert PairView("a", "b", (up, gone)).agree is None  # one line: nothing to agree with
    # an exact tie points nowhere: it neither agrees nor disagrees, and is named
    tie = Line("interleaving", "m", 0.0, -0.3, 0.3, 9, "searches with a winner")
    assert tie.sign == 0
    assert PairView("a", "b", (up, tie)).verdict() == "one line only has a direction (human offline) (interleaving: a tie)"
    both = PairView("a", "b", (up, agree.lines[1], tie))
    assert both.agree is True and both.verdict() == "agree in sign: all 2 lines with a direction favour b (interleaving: a tie)"


def test_pairs_of_puts_the_baseline_first_and_caps() -> None:
    assert pairs_of(["a", "b", "c"], None) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert pairs_of(["a", "b", "c"], "b") == [("b", "a"), ("b", "c"), ("a", "c")]
    assert len(pairs_of([str(i) for i in range(6)], None)) == 10  # 15 pairs, capped at 10


def test_joint_view_has_five_lines_per_pair_in_order() -> None:
    per_text = {"a": (["q"], np.array([0.5])), "b": (["q"], np.array([0.75]))}
    online = {"a": _online("a", 48, 80, 8), "b": _online("b", 56, 70, 7)}
    (pair,) = joint_view(["a", "b"], baseline=None, metric="ndcg@10", k=10, human=per_text, implicit_source=None,
                         implicit={}, predicted=None, predicted_missing="no logged sessions", online=online,
                         interleaving=[], has_human=True, n_boot=50)
    assert [ln.evidence for ln in pair.lines] == ["human offline", "implicit offline", "predicted online",
                                                   "observed online (A/B)", "interleaving"]
    assert pair.lines[0].diff == pytest.approx(0.25) and pair.lines[0].n == 1
    assert pair.lines[2].missing == "no logged sessions"
    assert pair.agree is True
