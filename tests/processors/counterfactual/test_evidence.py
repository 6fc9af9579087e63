"""What documents the log never showed rest on: the store's hit lists, the grade map, the slot ranges, the shares."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

from tests.processors.ubi_records import build_store, make_query
from ubi_pipeline.processors.clicks.sessions import patterns_from_sessions
from ubi_pipeline.processors.counterfactual.evidence import (
    GRADE,
    PRIOR,
    RETURNED,
    SCORE,
    SHOWN,
    EvidenceArrays,
    UnseenEvidence,
    evidence_shares,
    grade_map,
    returned_not_shown,
    slot_values,
)
from ubi_pipeline.processors.counterfactual.predict import predict
from ubi_pipeline.schemas.sessions import Session


def test_returned_not_shown_reads_the_hit_lists_below_the_display(tmp_path: Path) -> None:
    # displayed depth 2. s1 "Red Shoes" returned a b c d e: c at 3, d at 4, e at 5; s2 "red shoes " returned
    # b a d c: d at 3, c at 4; s2's later record (another sub-search) is not its hit list; s3 returned 2 docs
    # only, s4 has no hit list. Means: c (3 + 4) / 2, d (4 + 3) / 2, e 5.
    db = build_store(tmp_path / "s.duckdb", [
        make_query("s1", "Red Shoes", ["a", "b", "c", "d", "e"], at=0),
        make_query("s2", "red shoes ", ["b", "a", "d", "c"], at=1),
        make_query("s2", "red shoes ", ["z", "y", "x"], at=5, response_id="later"),
        make_query("s3", "hats", ["h", "i"], at=2),
        make_query("s4", "socks", None, at=3),
    ], [])
    with duckdb.connect(str(db), read_only=True) as con:
        got = returned_not_shown(con, 2)
    assert got == {"red shoes": {"c": 3.5, "d": 3.5, "e": 5.0}}


def test_grade_map_by_hand() -> None:
    # grade 1: five pairs at 0.1, 0.1, 0.2, 0.2, 0.2 with weights 1, 1, 1, 1, 1: mean 0.16, variance
    # (2·0.06² + 3·0.04²)/5 = 0.0024, effective n 5: half-width 2·sqrt(0.0024/5) = 0.043818.
    # grade 3 has one pair (0.5): the least-squares line over all six passes through the grade-1 mean and
    # that pair (two distinct grades): slope (0.5 - 0.16)/2 = 0.17, read at g = 3: 0.5. Its half-width: two
    # residual sds over the effective n (sqrt(5·0.0024/6) = 0.044721; n 6) plus the slope: 0.036515 + 0.17.
    a1 = np.array([0.1, 0.1, 0.2, 0.2, 0.2, 0.5])
    grade = np.array([1, 1, 1, 1, 1, 3], dtype=float)
    point, half = grade_map(a1, np.ones(6), grade, np.array([1.0, 3.0]))
    assert point[0] == pytest.approx(0.16)
    assert half[0] == pytest.approx(2 * np.sqrt(0.0024 / 5))
    assert point[1] == pytest.approx(0.5)
    assert half[1] == pytest.approx(2 * np.sqrt(0.002) / np.sqrt(6) + 0.17)


def _arrays(kind: list[list[int]], **slots: list[list[float]]) -> EvidenceArrays:
    shape = (len(kind), len(kind[0]))
    nan = np.full(shape, np.nan)
    return EvidenceArrays(np.array(kind), np.array(slots.get("grade", nan)), np.array(slots.get("rank", nan)),
                          np.array(slots.get("score", nan)), np.full(6, np.nan), np.full(6, np.nan), 20.0)


def test_a_returned_document_ranges_from_the_loggers_order_to_the_candidates() -> None:
    # six shown pairs: a1 = 0.5 - 0.1·ln(mean shown rank) exactly, at ranks 1..6 (equal weights): the logging
    # ranker's line, read at returned rank 12: 0.5 - 0.1·ln 12 = 0.25151. The candidate ranks the same pairs
    # 1..6 too, so its line is the same: at candidate rank 1, 0.5 (five pairs per rank are needed for a
    # per-rank mean; none here). The returned slot at candidate rank 1: [0.2515, 0.5], point in the middle.
    ranks = np.arange(1, 7, dtype=float)
    a1 = 0.5 - 0.1 * np.log(ranks)
    ev = _arrays([[RETURNED, SHOWN]], rank=[[12.0, np.nan]])
    v = slot_values(ev, ev.kind, a1, np.ones(6), ranks, np.arange(1, 7), np.array([0.05, 0.1, 0.3]), 0.1)
    low = 0.5 - 0.1 * np.log(12)
    assert (v.low[0, 0], v.high[0, 0]) == (pytest.approx(low), pytest.approx(0.5))
    assert v.point[0, 0] == pytest.approx((low + 0.5) / 2)
    assert np.isnan(v.point[0, 1])  # shown: the fit values it
    # on the prior: every deep pair's click probability (0.05 to 0.3), the point given
    ev = _arrays([[PRIOR, SHOWN]])
    v = slot_values(ev, ev.kind, a1, np.ones(6), ranks, np.arange(1, 7), np.array([0.05, 0.1, 0.3]), 0.1)
    assert (v.low[0, 0], v.point[0, 0], v.high[0, 0]) == (0.05, 0.1, 0.3)


def test_evidence_shares_by_hand() -> None:
    # query 0 (3 searches): shown, grade, returned; query 1 (1 search): score, prior, empty. Top 3:
    # 3·3 + 1·2 = 11 filled slots; shown 3, grade 3, returned 3, score 1, prior 1 (of 11)
    kind = np.array([[SHOWN, GRADE, RETURNED], [SCORE, PRIOR, -1]])
    shares = evidence_shares(kind, np.array([3.0, 1.0]), 3)
    assert shares == {"shown": 3 / 11, "human_grade": 3 / 11, "returned_not_shown": 3 / 11,
                      "candidate_score": 1 / 11, "prior": 1 / 11}
    assert evidence_shares(kind, np.array([3.0, 1.0]), 1) == {"shown": 3 / 4, "human_grade": 0.0,
                                                              "returned_not_shown": 0.0, "candidate_score": 0.25,
                                                              "prior": 0.0}


def _graded_log() -> list[Session]:
    """Five queries, each showing a (grade 2, clicked 12 of 20) and b (grade 0, clicked 4 of 20) at rank 1."""
    out = []
    for q in range(5):
        for i in range(40):
            first = "a" if i % 2 == 0 else "b"
            clicked = (i % 10 < 6) if first == "a" else (i % 10 == 1)
            out.append(Session(f"s{q}-{i}", f"query {q}", (f"{first}{q}",), (1,), (clicked,)))
    return out


def test_a_human_grade_values_an_unseen_document() -> None:
    # The candidate puts an unseen document first for every query. Without evidence it rests on the prior
    # (every deep pair's click probability: here every pair, 0.2 to 0.6); with a human grade 2, the shown
    # grade-2 pairs' mean (0.6, by the MLE: 12 of 20 clicks per a-pair) with no spread: [0.6, 0.6].
    pat = patterns_from_sessions(_graded_log(), max_rank=1)
    cand = {f"query {q}": [f"new{q}"] for q in range(5)}
    grades = {f"query {q}": {f"a{q}": 2, f"b{q}": 0, f"new{q}": 2} for q in range(5)}
    bare = predict(pat, cand, replicates=0, k=1, model_options={"prior": "none"})
    graded = predict(pat, cand, replicates=0, k=1, model_options={"prior": "none"},
                     evidence=UnseenEvidence(grades=grades))
    assert bare.evidence_shares["prior"] == 1.0 and graded.evidence_shares["human_grade"] == 1.0
    b, g = bare.figures["dm"]["ctr@k"], graded.figures["dm"]["ctr@k"]
    assert (b.cal_low, b.cal_high) == (pytest.approx(0.2), pytest.approx(0.6))
    assert (g.value, g.cal_low, g.cal_high) == (pytest.approx(0.6),) * 3
    assert graded.to_json()["evidence_shares"]["human_grade"] == 1.0
