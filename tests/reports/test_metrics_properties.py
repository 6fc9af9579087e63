"""Laws every metric obeys, on random qrels and runs (hypothesis)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from ubi_pipeline.reports.metrics import compute

METRICS = "ndcg@1,ndcg@5,ndcg,ndcg_exp@5,recall@1,recall@5,recall,p@1,p@5,mrr,rr@2,map,ap@3,judged@1,judged@5"
DOCS = [f"d{i}" for i in range(10)]


@st.composite
def collections(draw: st.DrawFn) -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    n = draw(st.integers(1, 6))
    qrels, run = {}, {}
    for i in range(n):
        judged = draw(st.dictionaries(st.sampled_from(DOCS), st.integers(0, 4), max_size=8))
        ranking = draw(st.lists(st.sampled_from(DOCS), unique=True, max_size=10))
        if judged or draw(st.booleans()):
            qrels[f"q{i}"] = judged
        run[f"q{i}"] = ranking
    return qrels, run


@settings(max_examples=150, deadline=None)
@given(collections(), st.sampled_from(["linear", "exponential"]), st.integers(1, 3))
def test_every_value_is_in_unit_interval(data: tuple[dict, dict], gain: str, threshold: int) -> None:
    qrels, run = data
    table = compute(qrels, run, METRICS, gain=gain, rel_threshold=threshold)
    for name in table.metrics:
        values = table[name]
        assert values.shape == (table.n_queries,)
        assert ((values >= 0) & (values <= 1)).all(), (name, values)
    for values in table.negative_values.values():
        assert ((values >= 0) & (values <= 1)).all()
    for agg in table.aggregate().values():
        assert agg.mean is None or 0 <= agg.mean <= 1
    # every judged query of the run is either evaluated or a labelled negative, never lost
    assert sorted(table.query_ids + table.negative_query_ids) == sorted(q for q in run if q in qrels)


@settings(max_examples=100, deadline=None)
@given(collections(), st.randoms(use_true_random=False))
def test_permuting_queries_changes_no_aggregate(data: tuple[dict, dict], rnd: object) -> None:
    qrels, run = data
    order = list(run)
    rnd.shuffle(order)  # type: ignore[attr-defined]
    shuffled_run = {q: run[q] for q in order}
    qorder = list(qrels)
    rnd.shuffle(qorder)  # type: ignore[attr-defined]
    shuffled_qrels = {q: qrels[q] for q in qorder}
    a = compute(qrels, run, METRICS).aggregate()
    b = compute(shuffled_qrels, shuffled_run, METRICS).aggregate()
    assert a == b  # exact: means use a correctly rounded sum


@settings(max_examples=100, deadline=None)
@given(collections())
def test_ideal_ranking_scores_one_and_recall_grows_with_k(data: tuple[dict, dict]) -> None:
    qrels, _ = data
    ideal_run = {q: sorted(docs, key=lambda d: -docs[d]) for q, docs in qrels.items()}
    table = compute(qrels, ideal_run, "ndcg@1,ndcg@3,ndcg,ndcg_exp@3,recall,map,mrr,recall@1,recall@2,recall@4")
    for name in ("ndcg@1", "ndcg@3", "ndcg", "ndcg_exp@3", "recall", "map", "mrr"):
        assert all(math.isclose(v, 1.0, abs_tol=1e-12) for v in table[name]), name
    assert (table["recall@1"] <= table["recall@2"]).all() and (table["recall@2"] <= table["recall@4"]).all()
