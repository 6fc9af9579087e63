"""The review queue's order, sample and serving rules, on hand-built rows (positions derived in the comments)."""

from __future__ import annotations

import pytest

from ubi_pipeline.processors.labels.queue import Candidate, HumanGrade, Queue, QueueError, build_queue


def _c(query, doc, source, grade, width=None, support=10):
    lo = None if width is None else 0.2
    return Candidate(query, doc, source, 0.5, lo, None if width is None else lo + width, support, 1, support, grade)


#: query counts: "shoes" 100, "hat" 10, "bag" 1
FREQ = {"shoes": 100, "hat": 10, "bag": 1}

CANDIDATES = [
    _c("bag", "b1", "implicit:pbm", 3, 0.10), _c("bag", "b1", "model:llm", 0, None),  # range 3
    _c("hat", "h1", "implicit:pbm", 2, 0.10), _c("hat", "h1", "model:llm", 1, None),  # range 1
    _c("shoes", "s1", "implicit:pbm", 1, 0.45),  # one source: range 0, band 4
    _c("hat", "h2", "implicit:pbm", 1, 0.45),  # range 0, band 4, less frequent than shoes
    _c("shoes", "s2", "implicit:pbm", 1, 0.12),  # range 0 with the implicit source, but a person said 3: range 2
    _c("shoes", "s3", "implicit:pbm", None, None),  # no interval: after every pair with one
    _c("bag", "b2", "implicit:pbm", 0, 0.41),  # range 0, band 4 (0.41 -> 4), least frequent of band 4
]
HUMANS = [HumanGrade("shoes", "s2", "ann", 3)]


def test_order_without_sample():
    items = build_queue(CANDIDATES, HUMANS, FREQ, held_out=0)
    # 1. b1: range 3 (pbm 3 vs llm 0); 2. s2: range 2 (pbm 1 vs ann 3); 3. h1: range 1;
    # then range 0 by width band desc (s1, h2, b2 all in band 4: 0.45, 0.45, 0.41), by frequency within it
    # (shoes 100 > hat 10 > bag 1); then s3, which no source has an interval for.
    assert [it.doc_id for it in items] == ["b1", "s2", "h1", "s1", "h2", "b2", "s3"]
    assert [it.position for it in items] == list(range(7))
    assert not any(it.held_out for it in items)
    assert items[0].reason == "grades differ by 3 (implicit:pbm 3, model:llm 0); interval 0.10 wide; query seen 1 time"
    assert items[1].reason.startswith("grades differ by 2 (implicit:pbm 1, ann 3)")
    assert items[6].reason == "no source has an interval; query seen 100 times"
    assert [c.source for c in items[0].evidence] == ["implicit:pbm", "model:llm"]


def test_width_band_before_frequency_and_exact_width_after():
    # band 3 (0.35) of a frequent query comes after band 4 (0.41) of a rare one; in one band the frequency decides
    items = build_queue([_c("shoes", "a", "implicit:pbm", 1, 0.35), _c("bag", "b", "implicit:pbm", 1, 0.41),
                         _c("hat", "c", "implicit:pbm", 1, 0.44), _c("hat", "d", "implicit:pbm", 1, 0.49)],
                        [], FREQ, held_out=0)
    # b, c, d in band 4; hat (10) before bag (1); among the two hat pairs the wider (d, 0.49) first
    assert [it.doc_id for it in items] == ["d", "c", "b", "a"]


def _many():
    # 3 queries x 3 docs, one per suggested grade 0..2: 9 strata of one pair each (tail/torso/head x grade)
    return [_c(q, f"{q}-{g}", "implicit:pbm", g, 0.1) for q in FREQ for g in range(3)]


def test_held_out_sample_is_stratified_seeded_and_first():
    items = build_queue(_many(), [], FREQ, held_out=3, seed=7)
    sample = [it for it in items if it.held_out]
    assert len(sample) == 3 and all(it.held_out for it in items[:3]) and len(items) == 9
    # 9 strata of one pair, 3 to draw: shares of 1, so three distinct strata, chosen by the seeded order
    assert len({it.stratum for it in sample}) == 3
    others = {tuple(it.stratum for it in build_queue(_many(), [], FREQ, held_out=3, seed=s)[:3]) for s in range(8)}
    assert len(others) > 1  # another seed draws other strata: the sample is not the same first strata every time
    assert all(it.reason.startswith("held-out sample (") for it in sample)
    again = build_queue(_many(), [], FREQ, held_out=3, seed=7)
    assert [it.pair for it in again] == [it.pair for it in items]
    # every stratum named by band and suggested grade; bands from the thirds of the counts 1, 10, 100
    full = build_queue(_many(), [], FREQ, held_out=9, seed=1)
    assert {it.stratum for it in full} == {f"{b}/grade {g}" for b in ("tail", "torso", "head") for g in range(3)}
    assert {it.stratum for it in full if it.query == "shoes"} == {"head/grade 0", "head/grade 1", "head/grade 2"}


def test_equal_shares_pass_the_rest_on():
    # strata: tail/grade 0 holds 4 pairs, head/grade 2 holds 1; a sample of 4 takes 1 from head, 3 from tail
    rows = [_c("bag", f"b{i}", "implicit:pbm", 0, 0.1) for i in range(4)] + [_c("shoes", "s", "implicit:pbm", 2, 0.1)]
    items = build_queue(rows, [], {"bag": 1, "shoes": 100}, held_out=4, seed=0)
    strata = [it.stratum for it in items if it.held_out]
    assert sorted(strata) == ["head/grade 2"] + ["tail/grade 0"] * 3


def test_serving_rules():
    items = build_queue(CANDIDATES, HUMANS, FREQ, held_out=0)
    q = Queue.of(items, HUMANS, assessors_per_pair=2)
    assert q.next_for("ann").doc_id == "b1"
    q.record(("bag", "b1"), "ann")
    assert q.next_for("ann").doc_id == "h1"  # s2 was graded by ann already (stored grade)
    assert q.next_for("bob").doc_id == "b1"  # b1 wants a second assessor
    q.record(("bag", "b1"), "bob")
    assert q.next_for("cid").doc_id == "s2"  # b1 has its two assessors
    q.skip(("shoes", "s2"), "cid")
    assert q.next_for("cid").doc_id == "h1"
    q.unskip(("shoes", "s2"), "cid")
    assert q.next_for("cid").doc_id == "s2"
    q.forget(("bag", "b1"), "bob")
    assert q.next_for("cid").doc_id == "b1"
    assert q.progress("ann") == {"graded": 2, "skipped": 0, "left": 5, "pairs": 7}


def test_bad_limits():
    with pytest.raises(QueueError, match="held-out sample size -1"):
        build_queue([], [], {}, held_out=-1)
    with pytest.raises(QueueError, match="assessors per pair 0"):
        Queue([], 0)
    assert build_queue([], [], {}) == []


def test_a_model_judge_grading_queued_pairs_does_not_move_the_held_out_sample():
    """`ubi judge --limit 5` on the ESCI sample store changed the first 8 held-out pairs of the queue for every later
    judge and page: the strata took the model's grades into the suggested grade. They are the implicit sources' now."""
    before = build_queue(_many(), [], FREQ, held_out=4, seed=3)
    # a model grades every pair 3 (the strata would all become grade 2 or 3 under the median of pbm and llm)
    judged = _many() + [_c(q, d, "model:llm", 3) for q, d in {(c.query, c.doc_id) for c in _many()}]
    after = build_queue(judged, [], FREQ, held_out=4, seed=3)
    assert [(it.pair, it.stratum) for it in after[:4]] == [(it.pair, it.stratum) for it in before[:4]]
    assert all(it.held_out for it in after[:4])
