"""Candidate judgments: hand-worked CTR/COEC rows, grade mapping, calibration split, files and storage."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ubi_records import build_store, make_event, make_query

from processors.click_models.base import RelevanceEstimate
from processors.grades import (
    apply_thresholds,
    default_mapping,
    fit_thresholds,
    in_calibration_split,
    quadratic_weighted_kappa,
    simulation_curve,
)
from processors.judgments import (
    JudgmentError,
    build_judgments,
    calibrate,
    eligible,
    load_human_grades,
    make_judgments,
    query_from_trec_id,
    read_jsonl,
    read_trec,
    store_judgments,
    trec_query_id,
    write_jsonl,
    write_trec,
)
from processors.sessions import patterns_from_sessions
from processors.stats import PairIndex
from schemas.errors import InputFileError
from schemas.judgments import Qrel
from schemas.sessions import Session
from schemas.settings import Settings

LOOSE = Settings(min_support=1, max_ci_width=100.0)


def two_doc_log():
    """Query "q", docs a and b; 3 sessions show [a, b], 1 shows [b, a].

    Clicks: a at rank 1 in two of the three [a, b] sessions, b at rank 2 in one of them; b at rank 1 in [b, a].
    """
    s = [
        Session("1", "q", ("a", "b"), (1, 2), (True, True)),
        Session("2", "q", ("a", "b"), (1, 2), (True, False)),
        Session("3", "q", ("a", "b"), (1, 2), (False, False)),
        Session("4", "q", ("b", "a"), (1, 2), (True, False)),
    ]
    return patterns_from_sessions(s, max_rank=10)


def rows(run) -> dict[str, dict]:
    return {r["doc_id"]: r for r in run.table.to_pylist()}


def test_ctr_by_hand() -> None:
    # CTR(a) = clicks 2 / impressions 4 = 0.5; CTR(b) = 2 / 4 = 0.5
    # default ctr thresholds for G = 3: 0.0449, 0.0981, 0.2047 -> 0.5 is grade 3
    run = make_judgments(two_doc_log(), "ctr", LOOSE)
    r = rows(run)
    assert run.source == "implicit:ctr"
    assert (r["a"]["score"], r["a"]["impressions"], r["a"]["clicks"], r["a"]["sessions"]) == (0.5, 4, 2, 4)
    assert (r["b"]["score"], r["b"]["grade"]) == (0.5, 3)
    assert r["a"]["ci_low"] < 0.5 < r["a"]["ci_high"]


def test_coec_by_hand() -> None:
    # global CTR per rank: rank 1 shown 4 times (a x3, b x1), clicked 3 times (a twice, b once) -> 0.75;
    # rank 2 shown 4 times (b x3, a x1), clicked once (b)                                     -> 0.25
    # expected clicks: a = 3 x 0.75 + 1 x 0.25 = 2.5;  b = 1 x 0.75 + 3 x 0.25 = 1.5
    # COEC: a = 2 / 2.5 = 0.8;  b = 2 / 1.5 = 1.3333
    # default ratio thresholds for G = 3: 0.3379, 0.7388, 1.5405 -> both grade 2
    run = make_judgments(two_doc_log(), "coec", LOOSE)
    r = rows(run)
    assert run.source == "implicit:coec"
    assert r["a"]["score"] == pytest.approx(0.8)
    assert r["b"]["score"] == pytest.approx(4 / 3)
    assert (r["a"]["grade"], r["b"]["grade"]) == (2, 2)
    params = orjson.loads(r["a"]["parameters"])
    assert params["model"]["rank_ctr"][:2] == [0.75, 0.25]
    assert params["grade_mapping"]["kind"] == "ratio" and params["min_support"] == 1


def test_min_support_and_interval_withhold_grades() -> None:
    # 4 impressions each: below a minimum support of 5 -> score kept, grade null
    run = make_judgments(two_doc_log(), "ctr", Settings(min_support=5, max_ci_width=100.0))
    assert all(r["grade"] is None and r["score"] == 0.5 for r in run.table.to_pylist())
    # enough support, but the Wilson interval of 2/4 is far wider than 0.01 x 0.2929 on the CTR scale
    run = make_judgments(two_doc_log(), "ctr", Settings(min_support=1, max_ci_width=0.01))
    assert run.graded == 0


def test_unknown_and_rankless_models_are_refused() -> None:
    with pytest.raises(JudgmentError, match="choose one of"):
        make_judgments(two_doc_log(), "nope", LOOSE)
    with pytest.raises(JudgmentError, match="no per-pair relevance"):
        make_judgments(two_doc_log(), "gctr", LOOSE)


def test_default_mapping_inverts_the_simulation_curve() -> None:
    # a(g) = 0.1 + 0.9 (2^g - 1) / 7 for G = 3; threshold between g-1 and g at a(g - 1/2):
    # a(0.5) = 0.1 + 0.9 x 0.41421 / 7 = 0.15326;  a(1.5) = 0.1 + 0.9 x 1.82843 / 7 = 0.33508;
    # a(2.5) = 0.1 + 0.9 x 4.65685 / 7 = 0.69874
    m = default_mapping("probability", 3)
    assert m.thresholds == pytest.approx((0.15326, 0.33508, 0.69874), abs=1e-5)
    # every grade's own click probability maps back to that grade
    assert m.grade(simulation_curve(np.arange(4), 3)).tolist() == [0, 1, 2, 3]
    assert m.grade(np.array([np.nan])).tolist() == [-1]


def test_quadratic_weighted_kappa_by_hand() -> None:
    # ratings a = [0, 1, 2], b = [0, 2, 2], 3 classes, w_ij = (i - j)^2 / 4
    # observed: one pair each at (0,0), (1,2), (2,2) -> sum w O = 1/4
    # marginals a = (1, 1, 1), b = (1, 0, 2); E_ij = a_i b_j / 3 -> sum w E = (2/3)(1) + (1/3)(1/4) + (2/3)(1/4)
    #   + (1/3)(1) = 1.25;  kappa = 1 - 0.25 / 1.25 = 0.8
    assert quadratic_weighted_kappa(np.array([0, 1, 2]), np.array([0, 2, 2]), 3) == pytest.approx(0.8)
    assert quadratic_weighted_kappa(np.array([0, 1, 2, 3]), np.array([0, 1, 2, 3]), 4) == pytest.approx(1.0)


@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 3)), min_size=2, max_size=60))
def test_fitted_thresholds_are_ordered_and_never_worse_than_quantile_start(data) -> None:
    scores = np.array([s for s, _ in data])
    human = np.array([g for _, g in data])
    t = fit_thresholds(scores, human, 3)
    assert np.all(np.diff(t) >= 0)
    fitted = quadratic_weighted_kappa(apply_thresholds(scores, t), human, 4)
    start = fit_thresholds(scores, human, 3, max_sweeps=0)
    before = quadratic_weighted_kappa(apply_thresholds(scores, start), human, 4)
    if not np.isnan(before):
        assert fitted >= before - 1e-12


def _estimate(n: int, seed: int = 0):
    """n pairs of one query with known grades; score = the simulation curve of the grade, times noise."""
    rng = np.random.default_rng(seed)
    grades = rng.integers(0, 4, n)
    score = simulation_curve(grades, 3) * rng.uniform(0.7, 1.3, n)
    docs = np.array([f"d{i:03d}" for i in range(n)], dtype=object)
    pairs = PairIndex(np.array(["q"] * n, dtype=object), docs, np.zeros(n, dtype=np.int64))
    imps = np.full(n, 50, dtype=np.int64)
    est = RelevanceEstimate(pairs, score, score - 0.05, score + 0.05, imps, (score * 50).astype(np.int64), imps)
    return est, {("q", d): int(g) for d, g in zip(docs, grades, strict=True)}


def test_calibration_fits_on_one_split_and_reports_on_the_other() -> None:
    est, human = _estimate(400)
    ok = eligible(est, min_support=10, max_ci_width=0.5)
    mapping, report, split = calibrate(est, ok, human, kind="probability", grade_max=3, fraction=0.5)
    fit = [i for i, s in enumerate(split) if s == "fit"]
    hold = [i for i, s in enumerate(split) if s == "holdout"]
    # the split is the documented hash split, and covers every human-graded pair exactly once
    assert len(fit) + len(hold) == 400 and not set(fit) & set(hold)
    assert all(in_calibration_split("q", est.pairs.doc_ids[i], 0.5) for i in fit)
    assert report.fit.pairs == len(fit) and report.holdout.pairs == len(hold)
    # the held-out kappa is the mapping's kappa on the held-out pairs alone
    hold_grades = np.array([human[("q", est.pairs.doc_ids[i])] for i in hold])
    assert report.holdout.kappa == pytest.approx(
        quadratic_weighted_kappa(mapping.grade(est.score[hold]), hold_grades, 4))
    assert report.holdout.kappa > 0.8  # noise of +-30 % rarely crosses a grade boundary
    # changing the held-out human grades changes nothing in the fitted thresholds, only the reported agreement
    flipped = {k: (3 - g if not in_calibration_split(*k, 0.5) else g) for k, g in human.items()}
    mapping2, report2, _ = calibrate(est, ok, flipped, kind="probability", grade_max=3, fraction=0.5)
    assert mapping2.thresholds == mapping.thresholds
    assert report2.holdout.kappa < 0 < report.holdout.kappa


def test_calibration_split_is_recorded_per_row() -> None:
    est, human = _estimate(40)
    ok = eligible(est, min_support=10, max_ci_width=0.5)
    del human[("q", "d000")]  # one pair without a human grade
    mapping, report, split = calibrate(est, ok, human, kind="probability", grade_max=3, fraction=0.5)
    table = build_judgments(est, source="implicit:test", model_version="1", mapping=mapping, ok=ok, split=split)
    marks = [orjson.loads(p).get("calibration_split") for p in table.column("parameters").to_pylist()]
    assert marks[0] is None
    assert marks.count("fit") == report.fit.pairs and marks.count("holdout") == report.holdout.pairs == 39 - report.fit.pairs


def test_calibration_needs_overlap_and_a_matching_scale() -> None:
    est, human = _estimate(20)
    ok = eligible(est, min_support=10, max_ci_width=0.5)
    with pytest.raises(JudgmentError, match="calibration needs at least 2"):
        calibrate(est, ok, {("other", "x"): 1}, kind="probability", grade_max=3, fraction=0.5)
    with pytest.raises(JudgmentError, match="outside 0..3"):
        calibrate(est, ok, {("q", "d000"): 100}, kind="probability", grade_max=3, fraction=0.5)


@given(st.text(min_size=1).filter(lambda s: s.strip() == s and s))
def test_trec_ids_round_trip(text: str) -> None:
    qid = trec_query_id(text)
    assert len(qid.split()) == 1 and qid == qid.strip()
    assert query_from_trec_id(qid) == text


def test_jsonl_and_trec_files_round_trip(tmp_path: Path) -> None:
    s = [Session(str(i), q, ("a b", "50%"), (1, 2), (i % 2 == 0, i % 3 == 0))
         for i, q in enumerate(["red shoes"] * 6 + ["ünïcode  query"] * 6)]
    run = make_judgments(patterns_from_sessions(s), "ctr", LOOSE)
    assert run.graded == 4
    n = write_jsonl(run.table, tmp_path / "j.jsonl")
    back = read_jsonl(tmp_path / "j.jsonl")
    assert n == 4 and back == list(run.judgments())
    m = write_trec(run.table, tmp_path / "j.trec")
    lines = (tmp_path / "j.trec").read_text().splitlines()
    assert m == 4 and "red%20shoes 0 a%20b 3" in lines and "red%20shoes 0 50%25 3" in lines
    qrels = read_trec(tmp_path / "j.trec")
    want = sorted(Qrel(r["query"], r["doc_id"], r["grade"]) for r in run.table.to_pylist() if r["grade"] is not None)
    assert sorted(qrels) == want


def test_file_errors_name_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.trec"
    bad.write_text("q 0 d 1\nq 0 d two\n")
    with pytest.raises(InputFileError, match=r"bad.trec:2: grade 'two'"):
        read_trec(bad)
    bad.write_text("q 0 d 1\nq 0 d 2\n")
    with pytest.raises(InputFileError, match=r"bad.trec:2: .*already judged on line 1"):
        read_trec(bad)
    j = tmp_path / "bad.jsonl"
    j.write_text('{"query": "q"}\n')
    with pytest.raises(InputFileError, match=r"bad.jsonl:1: .*doc_id"):
        read_jsonl(j)


def test_human_grades_from_jsonl_and_trec(tmp_path: Path) -> None:
    j = tmp_path / "qrels.jsonl"
    j.write_text('{"query_id": "q01", "query": "Red  Shoes", "relevant": {"a": 2, "b": 0}}\n'
                 '{"query_id": "q02", "query": "boots", "relevant": {"c": 1}}\n')
    assert load_human_grades(j) == {("red shoes", "a"): 2, ("red shoes", "b"): 0, ("boots", "c"): 1}
    t = tmp_path / "qrels.trec"
    t.write_text("red%20shoes 0 a 2\nboots 0 c 1\n")
    assert load_human_grades(t) == {("red shoes", "a"): 2, ("boots", "c"): 1}
    for body, message in (
        ('{"query_id": "q01", "query": "x", "relevant": {"a": 1}}\n\n', r":2: blank line"),
        ('{"query_id": "q01", "query": "x", "relevant": {"a": -1}}\n', r":1: grade of 'a' must be a non-negative"),
        ('{"query_id": "q01", "query": "x", "relevant": {"a": 1}}\n{"query_id": "q01", "query": "y", "relevant": {}}\n',
         r":2: duplicate query_id 'q01'"),
        ('{"query_id": "q01", "query": " ", "relevant": {}}\n', r":1: 'query' must be a non-empty"),
        ('{"query_id": "q01", "query": "x", "relevant": {"a": 1}\n', r":1: malformed JSON"),
    ):
        j.write_text(body)
        with pytest.raises(InputFileError, match=message):
            load_human_grades(j)


def test_store_replaces_the_rows_of_its_source_only(tmp_path: Path) -> None:
    db = build_store(tmp_path / "s.duckdb", [make_query("s1", "q", ["a"])], [make_event("click", "s1", "a", 0)])
    full = make_judgments(two_doc_log(), "ctr", LOOSE)
    other = make_judgments(two_doc_log(), "coec", LOOSE)
    assert store_judgments(db, full.table, full.source) == (2, True)
    assert store_judgments(db, other.table, other.source) == (2, True)
    only_a = full.table.filter(np.array([d == "a" for d in full.table.column("doc_id").to_pylist()]))
    assert store_judgments(db, only_a, full.source) == (1, True)
    con = duckdb.connect(str(db), read_only=True)
    got = con.execute("SELECT source, doc_id FROM judgments ORDER BY 1, 2").fetchall()
    con.close()
    assert got == [("implicit:coec", "a"), ("implicit:coec", "b"), ("implicit:ctr", "a")]
