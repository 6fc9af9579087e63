"""Offline metrics on cases small enough to compute by hand (the arithmetic is written next to each number)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ubi_pipeline.reports.metrics import MetricError, compute, parse_metric, parse_metrics
from ubi_pipeline.reports.metrics.ap import average_precision
from ubi_pipeline.reports.metrics.judged import judged_at_k
from ubi_pipeline.reports.metrics.ndcg import discounts, ndcg
from ubi_pipeline.reports.metrics.precision import precision
from ubi_pipeline.reports.metrics.recall import recall
from ubi_pipeline.reports.metrics.rr import reciprocal_rank

# q1: four judgments, positives (grade >= 1) are a, c, z; the run ranks a, b, c and an unjudged x.
# q2: judged, nothing relevant (a labelled negative); the run still returns two docs.
# q3: in the run, never judged.  q4: judged, missing from the run.
QRELS = {"q1": {"a": 2, "b": 0, "c": 1, "z": 3}, "q2": {"a": 0}, "q4": {"m": 1}}
RUN = {"q1": ["a", "b", "c", "x"], "q2": ["a", "y"], "q3": ["a"]}
LOG2_3 = math.log2(3)  # 1.584962500721156


def test_three_doc_ranking_by_hand() -> None:
    t = compute(QRELS, RUN, "p@3,p@5,recall@1,recall@3,mrr,map,ap@2,ndcg@3,ndcg_exp@3,judged@2,judged@10,ndcg")
    assert t.query_ids == ("q1",)
    v = {name: float(t[name][0]) for name in t.metrics}
    assert v["p@3"] == pytest.approx(2 / 3, abs=1e-15)  # a, c of the top 3 are positive
    assert v["p@5"] == pytest.approx(2 / 5, abs=1e-15)  # the denominator stays k though only 4 docs are ranked
    assert v["recall@1"] == pytest.approx(1 / 3, abs=1e-15)  # a of {a, c, z}
    assert v["recall@3"] == pytest.approx(2 / 3, abs=1e-15)  # a, c of {a, c, z}
    assert v["mrr"] == 1.0  # first positive a at rank 1
    # AP: precision at each positive's rank, P@1 = 1 (a), P@3 = 2/3 (c), z never ranked counts 0; over 3 positives
    assert v["map"] == pytest.approx((1 + 2 / 3 + 0) / 3, abs=1e-15)
    assert v["ap@2"] == pytest.approx(1 / 3, abs=1e-15)  # only a (P@1 = 1) within the cutoff, still over 3 positives
    # nDCG@3 linear: DCG = 2/log2(2) + 0/log2(3) + 1/log2(4) = 2.5; the ideal sorts ALL judged grades 3, 2, 1, 0:
    # IDCG = 3/1 + 2/log2(3) + 1/2 = 4.761859507142915
    assert v["ndcg@3"] == pytest.approx(2.5 / (3 + 2 / LOG2_3 + 0.5), abs=1e-15)
    assert v["ndcg@3"] == pytest.approx(0.5250049893849101, abs=1e-15)
    # exponential gain 2^g - 1: DCG = 3 + 0 + 1/2 = 3.5; IDCG = 7 + 3/log2(3) + 1/2 = 9.392789260714372
    assert v["ndcg_exp@3"] == pytest.approx(3.5 / (7 + 3 / LOG2_3 + 0.5), abs=1e-15)
    # whole-ranking nDCG: the same DCG (x gains 0) over IDCG of all 4 judgments = 4.761859507142915 + 0/log2(5)
    assert v["ndcg"] == pytest.approx(v["ndcg@3"], abs=1e-15)
    assert v["judged@2"] == 1.0  # a, b both judged (b with grade 0 counts)
    assert v["judged@10"] == pytest.approx(3 / 4, abs=1e-15)  # a, b, c of the 4 ranked docs (min(10, 4))


def test_labelled_negatives_unjudged_and_missing_queries_are_apart() -> None:
    t = compute(QRELS, RUN, "ndcg@10,judged@10,mrr")
    assert t.query_ids == ("q1",) and t.n_queries == 1
    assert t.negative_query_ids == ("q2",)
    assert t.negative_retrieved.tolist() == [2]
    assert t.negative_values["judged@10"].tolist() == [0.5]  # a judged, y not
    assert t.unjudged_query_ids == ("q3",)
    assert t.missing_query_ids == ("q4",)
    agg = t.aggregate()
    assert agg["mrr"].mean == 1.0 and agg["mrr"].n == 1  # q2 is not averaged in as 0 or NaN
    assert t.negatives_aggregate()["retrieved"] == (2.0, 1)
    assert t.negatives_per_query() == [{"query_id": "q2", "retrieved": 2, "judged@10": 0.5}]
    doc = t.as_dict(per_query=True)
    assert doc["labelled_negatives"]["query_ids"] == ["q2"]
    assert doc["per_query"] == [{"query_id": "q1", "ndcg@10": t["ndcg@10"][0], "judged@10": 0.75, "mrr": 1.0}]

    # trec_eval -c: q4 is scored as an empty ranking, 0 everywhere, and now counts
    c = compute(QRELS, RUN, "ndcg@10,judged@10,mrr", complete=True)
    assert c.query_ids == ("q1", "q4")
    assert c["mrr"].tolist() == [1.0, 0.0] and c["judged@10"].tolist() == [0.75, 0.0]
    assert c.aggregate()["mrr"] == (0.5, 2)


def test_threshold_changes_binary_metrics_not_ndcg() -> None:
    t = compute(QRELS, RUN, "p@3,recall@3,map,ndcg@3", rel_threshold=2)
    # positives are now a (2) and z (3): P@3 = 1/3, R@3 = 1/2, AP = (P@1 = 1 + z unranked 0) / 2
    assert t["p@3"][0] == pytest.approx(1 / 3, abs=1e-15)
    assert t["recall@3"][0] == pytest.approx(1 / 2, abs=1e-15)
    assert t["map"][0] == pytest.approx(1 / 2, abs=1e-15)
    assert t["ndcg@3"][0] == pytest.approx(0.5250049893849101, abs=1e-15)  # raw grades, as trec_eval ndcg_cut
    # q4 ({m: 1}) has no grade >= 2: with --complete it is a labelled negative, not a zero
    assert compute(QRELS, RUN, "mrr", rel_threshold=2, complete=True).negative_query_ids == ("q2", "q4")


def test_gain_parameter_applies_to_plain_ndcg() -> None:
    exp = compute(QRELS, RUN, "ndcg@3", gain="exponential")
    assert exp["ndcg@3"][0] == pytest.approx(3.5 / (7 + 3 / LOG2_3 + 0.5), abs=1e-15)
    assert exp.specs[0].describe() == "nDCG@3 (exponential gain 2^g-1)"


def test_empty_inputs_have_no_mean_not_nan() -> None:
    t = compute({}, {}, "ndcg@10,mrr")
    assert t.n_queries == 0
    assert t.aggregate() == {"ndcg@10": (None, 0), "mrr": (None, 0)}
    empty_ranking = compute({"q": {"a": 1}}, {"q": []}, "ndcg@5,judged@5,map,mrr,p@1")
    assert [float(empty_ranking[m][0]) for m in empty_ranking.metrics] == [0.0] * 5


def test_metric_names() -> None:
    assert parse_metric("NDCG@10") == ("ndcg@10", "ndcg", 10, "linear")
    assert parse_metric("ndcg_burges@5") == ("ndcg_burges@5", "ndcg", 5, "exponential")
    assert parse_metric("mrr") == ("mrr", "rr", None, None)
    assert parse_metric("map@100") == ("map@100", "ap", 100, None)
    assert [s.name for s in parse_metrics("p@5, recall@10,p@5")] == ["p@5", "recall@10"]
    for bad, fragment in [
        ("ndcg@0", "k must be >= 1"), ("p@-1", "k must be >= 1"), ("p", "needs a cutoff"),
        ("ndcg@ten", "whole number"), ("bleu@4", "unknown metric"), ("", "unknown metric"),
    ]:
        with pytest.raises(MetricError, match=fragment):
            parse_metric(bad)
    with pytest.raises(MetricError, match="empty metric name"):
        parse_metrics("p@5,,mrr")
    with pytest.raises(MetricError, match="unknown gain"):
        parse_metric("ndcg@10", gain="quadratic")


@pytest.mark.parametrize(
    ("qrels", "run", "options", "fragment"),
    [
        ({"q": {"a": 1}}, {"q": ["a", "b", "a"]}, {}, "doc 'a' is ranked twice for query 'q' (ranks 1 and 3)"),
        ({"q": {"a": 1.5}}, {"q": ["a"]}, {}, "grades must be non-negative integers"),
        ({"q": {"a": -1}}, {"q": ["a"]}, {}, "grades must be non-negative integers"),
        ({"q": {"a": "x"}}, {"q": ["a"]}, {}, "grades must be non-negative integers"),
        ({"q": {"a": 5000}}, {"q": ["a"]}, {"gain": "exponential"}, "exponential gain needs grades <= 1000"),
        ({"q": {"a": 1}}, {"q": ["a"]}, {"rel_threshold": 0}, "rel_threshold must be a whole number >= 1"),
        ({"q": {"a": 1}}, {"q": ["a"]}, {"gain": "log"}, "unknown gain"),
    ],
)
def test_invalid_in_memory_inputs_raise(qrels: dict, run: dict, options: dict, fragment: str) -> None:
    with pytest.raises(MetricError) as info:
        compute(qrels, run, "ndcg@10", **options)
    assert fragment in str(info.value)


def test_kernels_by_hand() -> None:
    # two queries, ranks 1..3; relevant: [T, F, T] and [F, F, F] (second query has 2 positives, none ranked)
    rel = np.array([[True, False, True], [False, False, False]])
    npos = np.array([2, 2])
    assert precision(rel, 2).tolist() == [0.5, 0.0]
    assert recall(rel, npos, 3).tolist() == [1.0, 0.0]
    assert reciprocal_rank(rel).tolist() == [1.0, 0.0]
    assert average_precision(rel, npos).tolist() == pytest.approx([(1 + 2 / 3) / 2, 0.0], abs=1e-15)
    assert discounts(3).tolist() == pytest.approx([1.0, 1 / LOG2_3, 0.5], abs=1e-15)
    # gains [3, 0, 1] against ideal [3, 1, 0]: (3 + 0 + 0.5) / (3 + 1/log2(3) + 0)
    assert ndcg(np.array([[3.0, 0, 1]]), np.array([[3.0, 1, 0]]))[0] == pytest.approx(3.5 / (3 + 1 / LOG2_3), abs=1e-15)
    assert judged_at_k(np.array([[True, False, False]]), np.array([2]), 10).tolist() == [0.5]
    with pytest.raises(MetricError, match="2-D"):
        precision(np.zeros(3, dtype=bool), 1)
    with pytest.raises(MetricError, match="needs a cutoff"):
        precision(rel, None)  # type: ignore[arg-type]
    with pytest.raises(MetricError, match="count >= 1"):
        recall(rel, np.array([1, 0]))
    with pytest.raises(MetricError, match="rows"):
        ndcg(np.zeros((2, 3)), np.zeros((1, 3)))


def test_condensed_lists_drop_unjudged_docs_but_not_from_judged_at_k() -> None:
    qrels = {"q": {"a": 1, "c": 2, "b": 0}}
    run = {"q": ["a", "x", "c", "y", "b"]}  # x, y unjudged
    full = compute(qrels, run, "p@2,mrr,ndcg@2,judged@3")
    cond = compute(qrels, run, "p@2,mrr,ndcg@2,judged@3", condensed=True)
    assert full["p@2"][0] == 0.5 and cond["p@2"][0] == 1.0  # [a, x] vs condensed [a, c]
    # nDCG@2: full (1 + 0) / (2 + 1/log2(3)); condensed (1 + 2/log2(3)) / (2 + 1/log2(3))
    assert full["ndcg@2"][0] == pytest.approx(1 / (2 + 1 / LOG2_3), abs=1e-15)
    assert cond["ndcg@2"][0] == pytest.approx((1 + 2 / LOG2_3) / (2 + 1 / LOG2_3), abs=1e-15)
    assert full["judged@3"][0] == cond["judged@3"][0] == pytest.approx(2 / 3, abs=1e-15)  # a, c of a, x, c
    assert cond.condensed and cond.as_dict()["condensed"] is True
