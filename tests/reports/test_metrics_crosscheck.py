"""Our metrics against ranx and ir_measures (pytrec_eval, i.e. trec_eval's own code) to 1e-9.

Which reference metric matches which of ours (checked here, not assumed):
- ndcg@k (linear gain) == trec_eval ``ndcg_cut_k`` (ir_measures ``nDCG@k``) == ranx ``ndcg@k`` (Järvelin).
- ndcg_exp@k == ranx ``ndcg_burges@k`` == ir_measures ``nDCG(gains={g: 2^g-1})@k``.
- ranx's relevance level also drops grades below it from nDCG (its ``clean_qrels``); trec_eval does not, and
  neither do we, so nDCG is checked against ranx at level 1 only and against trec_eval at level 2 as well.
- judged@k == ir_measures ``Judged@k`` (denominator min(k, ranking length)); trec_eval has no such measure.
- condensed lists == trec_eval ``-J`` (ir_measures ``judged_only=True``).
Rankings here have strictly decreasing scores, so no tie-break convention can change the order (ranx breaks
ties arbitrarily); the tie convention is checked against trec_eval on a TREC file in the last test.
"""

from __future__ import annotations

import os
from pathlib import Path

import ir_measures
import numpy as np
import pytest
from ir_measures import AP, RR, Judged, P, R, nDCG

from ubi_pipeline.formats.runs import load_trec_run
from ubi_pipeline.reports.metrics import compute

# ranx's metrics are numba functions; compiling them took 60-80 s of every clean-clone `make test` for 250
# queries. With the JIT off numba runs the same Python source (ranx's definitions are unchanged), in well
# under a second per metric here. Set before numba is first imported; no other test module imports it.
os.environ.setdefault("NUMBA_DISABLE_JIT", "1")
ranx = pytest.importorskip("ranx")
pytestmark = pytest.mark.filterwarnings("ignore::Warning")  # numba type-safety chatter inside ranx

TOL = 1e-9


def random_collection(seed: int, n_queries: int = 250, max_grade: int = 3) -> tuple[dict, dict, dict]:
    """Random graded qrels and runs: judged pools overlap rankings partly; some rankings are short or empty."""
    rng = np.random.default_rng(seed)
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, list[str]] = {}
    scores: dict[str, dict[str, float]] = {}
    for i in range(n_queries):
        q = f"q{i}"
        pool = [f"d{j}" for j in rng.choice(80, size=50, replace=False)]
        n_judged = int(rng.integers(1, 30))
        qrels[q] = {d: int(g) for d, g in zip(pool[:n_judged], rng.integers(0, max_grade + 1, n_judged), strict=True)}
        ranked = [str(d) for d in rng.permutation(pool)[: int(rng.integers(0, 40))]]
        run[q] = ranked
        scores[q] = {d: float(len(ranked) - r) + float(rng.random()) * 0.5 for r, d in enumerate(ranked)}
    return qrels, run, scores


def ranx_values(qrels: dict, scores: dict, ids: list[str], metric: str) -> np.ndarray:
    rq = ranx.Qrels({q: qrels[q] for q in ids})
    rr = ranx.Run({q: scores[q] for q in ids})
    ranx.evaluate(rq, rr, [metric], make_comparable=True)
    return np.array([rr.scores[metric][q] for q in ids])


def ir_values(qrels: dict, scores: dict, ids: list[str], measure: object) -> np.ndarray:
    found = {m.query_id: m.value for m in ir_measures.iter_calc([measure], {q: qrels[q] for q in ids},
                                                                 {q: scores[q] for q in ids if scores[q]})}
    # trec_eval leaves out queries with an empty ranking; every measure here is 0 for them
    return np.array([found.get(q, 0.0) for q in ids])


RANX = [  # (ours, ranx, relevance level)
    ("ndcg@10", "ndcg@10", 1), ("ndcg@3", "ndcg@3", 1), ("ndcg", "ndcg", 1),
    ("ndcg_exp@10", "ndcg_burges@10", 1),
    ("recall@10", "recall@10", 1), ("recall@5", "recall@5-l2", 2),
    ("p@5", "precision@5", 1), ("p@10", "precision@10-l2", 2),
    ("mrr", "mrr", 1), ("rr@3", "mrr@3", 1), ("mrr", "mrr-l3", 3),
    ("map", "map", 1), ("ap@5", "map@5", 1), ("map", "map-l2", 2),
]


@pytest.mark.parametrize(("ours", "theirs", "level"), RANX)
def test_against_ranx(ours: str, theirs: str, level: int) -> None:
    qrels, run, scores = random_collection(seed=7)
    table = compute(qrels, run, [ours], rel_threshold=level)
    ids = list(table.query_ids)
    assert len(ids) > 150  # most random queries have a positive at these levels
    np.testing.assert_allclose(table[ours], ranx_values(qrels, scores, ids, theirs), rtol=0, atol=TOL)


GAINS_EXP = {g: 2**g - 1 for g in range(4)}
IR = [  # (ours, ir_measures measure, relevance level)
    ("ndcg@10", nDCG @ 10, 1), ("ndcg@10", nDCG @ 10, 2), ("ndcg", nDCG, 1),
    ("ndcg_exp@10", nDCG(gains=GAINS_EXP) @ 10, 1),
    ("recall@10", R @ 10, 1), ("recall@20", R(rel=2) @ 20, 2),
    ("p@5", P @ 5, 1), ("p@5", P(rel=2) @ 5, 2),
    ("mrr", RR, 1), ("rr@5", RR @ 5, 1), ("mrr", RR(rel=2), 2),
    ("map", AP, 1), ("ap@10", AP @ 10, 1), ("map", AP(rel=3), 3),
    ("judged@10", Judged @ 10, 1),
]


@pytest.mark.parametrize(("ours", "measure", "level"), IR, ids=[f"{o}-{m}-l{lv}" for o, m, lv in IR])
def test_against_trec_eval_via_ir_measures(ours: str, measure: object, level: int) -> None:
    qrels, run, scores = random_collection(seed=11)
    table = compute(qrels, run, [ours], rel_threshold=level)
    ids = list(table.query_ids)
    if ours.startswith("judged"):  # ir_measures' Judged divides by the ranking length: no empty rankings
        ids = [q for q in ids if run[q]]
        mine = np.array([dict(zip(table.query_ids, table[ours], strict=True))[q] for q in ids])
    else:
        mine = table[ours]
    np.testing.assert_allclose(mine, ir_values(qrels, scores, ids, measure), rtol=0, atol=TOL)


CONDENSED = [
    ("ndcg@10", nDCG(judged_only=True) @ 10), ("p@5", P(judged_only=True) @ 5), ("recall@10", R(judged_only=True) @ 10),
    ("map", AP(judged_only=True)), ("mrr", RR(judged_only=True)),
]


@pytest.mark.parametrize(("ours", "measure"), CONDENSED, ids=[o for o, _ in CONDENSED])
def test_condensed_lists_against_trec_eval_judged_only(ours: str, measure: object) -> None:
    qrels, run, scores = random_collection(seed=13)
    table = compute(qrels, run, [ours], condensed=True)
    ids = list(table.query_ids)
    np.testing.assert_allclose(table[ours], ir_values(qrels, scores, ids, measure), rtol=0, atol=TOL)


def test_ranx_ndcg_drops_grades_below_its_level_and_we_do_not() -> None:
    # {a: 1, b: 2}, ranking [a, b]: trec_eval/ours nDCG@2 = (1 + 2/log2(3)) / (2 + 1/log2(3)) = 0.8597...;
    # ranx ndcg@2-l2 drops a (grade 1): (0 + 2/log2(3)) / 2 = 0.6309...
    qrels, scores = {"q": {"a": 1, "b": 2}}, {"q": {"a": 2.0, "b": 1.0}}
    ours = compute(qrels, {"q": ["a", "b"]}, ["ndcg@2"], rel_threshold=2)["ndcg@2"][0]
    log2_3 = np.log2(3)
    assert ours == pytest.approx((1 + 2 / log2_3) / (2 + 1 / log2_3), abs=1e-12)
    assert ir_values(qrels, scores, ["q"], nDCG @ 2)[0] == pytest.approx(ours, abs=TOL)
    assert ranx_values(qrels, scores, ["q"], "ndcg@2-l2")[0] == pytest.approx((2 / log2_3) / 2, abs=1e-12)


def test_trec_file_with_ties_matches_trec_eval(tmp_path: Path) -> None:
    # scores rounded to one decimal tie often; trec_eval breaks ties by doc id descending, and so must the
    # order our loader gives the same file.
    qrels, _run, scores = random_collection(seed=3, n_queries=120)
    rng = np.random.default_rng(5)
    tied = {q: {d: round(float(rng.integers(0, 6)) / 10, 1) for d in docs} for q, docs in scores.items()}
    lines = [f"{q} Q0 {d} {r} {s} tied\n" for q, docs in tied.items() for r, (d, s) in enumerate(docs.items(), 1)]
    path = tmp_path / "tied.run"
    path.write_text("".join(lines))
    table = compute(qrels, load_trec_run(path), ["ndcg@10", "p@5", "mrr", "map"])
    ids = list(table.query_ids)
    for name, measure in (("ndcg@10", nDCG @ 10), ("p@5", P @ 5), ("mrr", RR), ("map", AP)):
        np.testing.assert_allclose(table[name], ir_values(qrels, tied, ids, measure), rtol=0, atol=TOL)
