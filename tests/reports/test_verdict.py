"""The verdict's rules (reports/verdict.py) on hand-made lines: a direction only where the evidence supports one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ubi_pipeline.reports.intervals import wilson
from ubi_pipeline.reports.online import OnlineMetrics
from ubi_pipeline.reports.pairs import Line, PairView
from ubi_pipeline.reports.verdict import (
    FIRM,
    ONE_LINE,
    PREDICTED,
    UNDETERMINED,
    PairContext,
    _needed,
    candidate_findings,
    decide,
    pair_finding,
)

MISSING = (Line("predicted online", "ctr", missing="none"), Line("interleaving", "win rate − 1/2", missing="not interleaved against each other"))


def _human(diff: float, low: float, high: float, n: int = 20) -> Line:
    return Line("human offline", "human/ndcg@10", diff, low, high, n, "queries", "paired bootstrap over queries")


def _ab(diff: float, low: float, high: float, n: int = 4000) -> Line:
    return Line("observed online (A/B)", "ctr@10", diff, low, high, n, "searches", "MOVER")


def test_two_kinds_of_evidence_agreeing_are_firm() -> None:
    f = pair_finding(PairView("a", "b", (_human(0.05, 0.02, 0.08), _ab(0.01, 0.004, 0.016), *MISSING)), PairContext())
    assert (f.winner, f.firmness, f.evidence) == ("b", FIRM, ("human offline", "observed online (A/B)"))
    assert f.text == "b ahead of a on human offline, observed online (A/B) (firm)" and f.would_decide == ()


def test_one_clear_line_is_said_as_such_with_the_line_against() -> None:
    # human favours a clearly; the A/B points to b without excluding 0
    f = pair_finding(PairView("a", "b", (_human(-0.05, -0.08, -0.02), _ab(0.002, -0.004, 0.008), *MISSING)),
                     PairContext(shared_queries=20, unjudged_pairs=0))
    assert (f.winner, f.firmness) == ("a", ONE_LINE)
    assert f.text == ("a ahead of b on human offline (on one line of evidence); observed online (A/B) points the other "
                      "way without excluding a tie")
    # what would make it firmer: the A/B at the traffic where its interval would exclude 0:
    # half-width 0.006, difference 0.002: 4,000 · (0.006 / 0.002)² = 36,000 searches
    assert "more traffic: about 36,000 searches (now 4,000) if the observed difference holds" in f.would_decide
    assert "interleaving a and b (team draft)" in f.would_decide


def test_conflicting_and_unclear_evidence_is_undetermined() -> None:
    conflict = pair_finding(PairView("a", "b", (_human(0.05, 0.02, 0.08), _ab(-0.01, -0.016, -0.004), *MISSING)),
                            PairContext())
    assert (conflict.winner, conflict.firmness) == (None, UNDETERMINED)
    assert "conflicting evidence (human offline favour b; observed online (A/B) favour a)" in conflict.text
    # an interval on 3 queries is no interval (n < 5), however far from 0 it lies
    few = pair_finding(PairView("a", "b", (_human(0.3, 0.2, 0.4, n=3), *MISSING)),
                       PairContext(shared_queries=3, unjudged_pairs=12, k=10))
    assert few.winner is None and "human offline: no interval" in few.text
    assert few.would_decide == ("interleaving a and b (team draft)",
                                "human judgments for 12 (query, doc) pairs of their top 10 on the 3 queries both rank")


def test_a_predicted_line_resting_on_the_prior_decides_nothing() -> None:
    pred = Line("predicted online", "ctr@10 (dr, predicted)", 0.02, 0.01, 0.03, 5000, "logged searches")
    lines = (pred, Line("observed online (A/B)", "ctr@10", missing="b never served (no log)"),
             Line("interleaving", "w", missing="not interleaved against each other"))
    shown = pair_finding(PairView("a", "b", lines), PairContext(prior_share=0.0))
    assert (shown.winner, shown.firmness) == ("b", ONE_LINE)
    unseen = pair_finding(PairView("a", "b", lines), PairContext(prior_share=0.25))
    assert unseen.winner is None and "rests on the click model's prior" in unseen.text
    # b never served: serving it decides, not an A/B test of two logged systems, and no separate interleaving item
    assert unseen.would_decide == ("serving it: interleave b with a, or run an A/B test",)


def test_traffic_needed_rounds_up_to_two_digits() -> None:
    assert _needed(1000, 0.01, -0.01, 0.03) == 4000  # half-width 0.02: 1000 · 2² = 4000
    assert _needed(900, 0.01, -0.005, 0.025) == 2100  # half-width 0.015: 900 · 1.5² = 2025, up to 2,100
    assert _needed(900, 0.0, -0.01, 0.01) is None  # no difference: no traffic makes one


def _pred(cal: tuple[float, float], shares: dict[str, float] | None = None) -> SimpleNamespace:
    fig = SimpleNamespace(value=sum(cal) / 2, low=cal[0] + 0.005, high=cal[1] - 0.005, cal_low=cal[0], cal_high=cal[1])
    p = SimpleNamespace(figures={"dm": {"ctr@k": fig}, "dr": {"ctr@k": fig}}, prior_share=0.25,
                        unsupported_share=0.1, k=10)
    if shares is not None:
        p.evidence_shares = shares
    return p


def test_a_candidate_is_ordered_only_by_disjoint_intervals() -> None:
    # the logged ranker: 121 clicks of 1,000 results, Wilson [0.102, 0.143]
    logged = {"ranker-3": OnlineMetrics("ranker-3", 500, 500, {"ctr@10": wilson(121, 1000)})}
    iv = logged["ranker-3"].metrics["ctr@10"]
    assert (round(iv.low, 3), round(iv.high, 3)) == (0.102, 0.143)
    # issue 24's candidate 2: primary interval [0.108, 0.132] against 0.121: overlapping, so undetermined
    shares = {"shown": 0.85, "human_grade": 0.1, "returned_not_shown": 0.0, "prior": 0.05}
    (f,) = candidate_findings("candidate-2", _pred((0.108, 0.132), shares), logged, 10)
    assert (f.winner, f.firmness) == (None, UNDETERMINED)
    assert "the intervals overlap (predicted [0.108, 0.132], observed 0.121 [0.102, 0.143])" in f.text
    assert f.shares == {"never shown for its query": 0.25, "never shown in the log (no IPS support)": 0.1, **shares}
    # what the top k rests on, in words, the kinds with a share only (Prediction.evidence_shares)
    assert f.text.endswith("its top k rests on shown in the log 85%, human grades 10%, the click model's prior only 5%")
    assert "interleaving candidate-2 with ranker-3 (team draft)" in f.would_decide
    # disjoint: ordered, said to rest on the model
    (up,) = candidate_findings("candidate-1", _pred((0.150, 0.190)), logged, 10)
    assert (up.winner, up.firmness) == ("candidate-1", PREDICTED)
    # a predictor without evidence shares: the shares never shown for their query and never shown at all
    assert up.text.endswith("on assumptions: never shown for its query 25%, never shown in the log (no IPS support) 10%")
    (down,) = candidate_findings("candidate-0", _pred((0.050, 0.090)), logged, 10)
    assert down.winner == "ranker-3"
    # no calibrated interval: the bootstrap one is read (said so)
    boot = _pred((0.150, 0.190))
    boot.figures["dr"]["ctr@k"].cal_low = float("nan")
    (b,) = candidate_findings("candidate-1", boot, logged, 10)
    assert "bootstrap interval" in b.text and b.winner == "candidate-1"


def test_headline_and_what_could_not_be_decided() -> None:
    firm = PairView("a", "b", (_human(0.05, 0.02, 0.08), _ab(0.01, 0.004, 0.016), *MISSING))
    unclear = PairView("a", "c", (_human(0.01, -0.02, 0.04), *MISSING))
    rec = {"source": None, "leader": "implicit:auto", "why": "no recommendation: too few held-out searches"}
    v = decide([firm, unclear], {}, recommendation=rec)
    assert v.headline == "b ahead of a on human offline, observed online (A/B) (firm); 1 other comparison undetermined"
    assert v.undecided[0].startswith("c vs a: ") and "interleaving a and c (team draft)" in v.undecided[0]
    assert v.undecided[-1] == "which implicit source to trust: no recommendation: too few held-out searches"
    assert decide([unclear], {}).headline == "undetermined: the evidence cannot order c and a"
    assert decide([], {}).headline == "no two systems to compare: nothing to decide"
    assert v.as_dict()["findings"][0]["winner"] == "b"


@pytest.mark.parametrize("n", [1, 4])
def test_no_line_below_five_units_excludes_zero(n: int) -> None:
    assert _human(0.3, 0.2, 0.4, n=n).clear is None and _human(0.3, 0.2, 0.4, n=5).clear is True
