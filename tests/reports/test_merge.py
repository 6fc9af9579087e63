"""Merging labels with provenance: nothing overwritten, precedence configurable, coverage judged@k."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from joint_fixtures import build_store, write_human

from ubi_pipeline.formats.qrels import load_qrels
from ubi_pipeline.processors.labels.merge import (
    Label,
    LabelSet,
    MergeError,
    coverage,
    labels_from_human,
    labels_from_store,
    merge_view,
)
from ubi_pipeline.store.client import open_reader


def _labels(tmp_path) -> LabelSet:
    con = open_reader(build_store(tmp_path / "ubi.duckdb"))
    try:
        store = labels_from_store(con)
    finally:
        con.close()
    human = labels_from_human(load_qrels(write_human(tmp_path / "h.jsonl")).human_judgments())
    return LabelSet().add(human).add(store)


def test_every_label_is_kept_with_its_provenance(tmp_path):
    labels = _labels(tmp_path)
    # 6 human judgments + 6 implicit rows (one without a grade), nothing dropped or replaced
    assert len(labels) == 12
    d1 = labels.by_pair[("red shoes", "d1")]
    assert sorted(lab.source for lab in d1) == ["human", "implicit:ctr"]
    human = next(lab for lab in d1 if lab.source == "human")
    implicit = next(lab for lab in d1 if lab.source == "implicit:ctr")
    assert (human.grade, human.assessor, human.query_id) == (3, "ann", "q1")
    assert human.origin is not None and human.origin.endswith("h.jsonl")
    assert (implicit.grade, implicit.model_version, implicit.impressions, implicit.ci_low) == (3, "1", 20, 0.1)
    assert implicit.parameters == {"model": {"name": "ctr"}, "grade_mapping": {"calibrated": True}}
    assert labels.sources() == ["human", "implicit:ctr"]


def test_merged_view_applies_precedence_without_overwriting(tmp_path):
    labels = _labels(tmp_path)
    merged = labels.merged()
    # d2: human 1 beats implicit 2 under human > reviewed > implicit; both labels stay attached
    assert merged[("red shoes", "d2")].grade == 1 and merged[("red shoes", "d2")].source == "human"
    assert len(merged[("red shoes", "d2")].labels) == 2
    # d4 has only an implicit label: it fills the gap
    assert merged[("red shoes", "d4")].grade == 1 and merged[("red shoes", "d4")].source == "implicit:ctr"
    # b2's implicit row has no grade: no merged label at all
    assert ("green bag", "b2") not in merged
    # implicit first: d2 takes the implicit grade; the human label is still there
    flipped = labels.merged(("implicit:ctr", "human"))
    assert flipped[("red shoes", "d2")].grade == 2
    assert labels.qrels("human")["red shoes"]["d2"] == 1
    assert labels.qrels("implicit:ctr")["red shoes"] == {"d1": 3, "d2": 2, "d4": 1}
    assert labels.merged_qrels()["red shoes"] == {"d1": 3, "d2": 1, "d3": 0, "d4": 1}
    # precedence naming only human: implicit labels are kept but never chosen
    assert ("red shoes", "d4") not in labels.merged(("human",))


def test_merge_view_keeps_every_label_and_counts_what_the_precedence_did(tmp_path):
    pairs, summary = merge_view(_labels(tmp_path))
    # human: red shoes d1 3, d2 1, d3 0; blue hat h1 2, h2 0; green bag b1 0
    # implicit:ctr: red shoes d1 3, d2 2, d4 1; blue hat h1 1, h2 0; green bag b2 (no grade)
    # -> 8 pairs, sorted by (query, doc): blue hat h1 h2, green bag b1 b2, red shoes d1 d2 d3 d4
    assert [(p.query, p.doc_id) for p in pairs] == [
        ("blue hat", "h1"), ("blue hat", "h2"), ("green bag", "b1"), ("green bag", "b2"),
        ("red shoes", "d1"), ("red shoes", "d2"), ("red shoes", "d3"), ("red shoes", "d4")]
    assert summary.pairs == 8 and summary.precedence == ("human", "reviewed", "implicit")
    # human chosen for d1 d2 d3 h1 h2 b1 (6), implicit only fills d4 (1); b2 has no grade at all (1)
    assert summary.chosen_by_source == {"human": 6, "implicit:ctr": 1} and summary.unresolved == 1
    # both sources label d1 d2 h1 h2 (4); they disagree on d2 (1 vs 2) and h1 (2 vs 1), agree on d1 (3) and h2 (0)
    assert summary.several_sources == 4
    assert summary.conflicts == 2 and summary.conflicts_by_sources == {"human vs implicit:ctr": 2}
    by = {(p.query, p.doc_id): p for p in pairs}
    assert [k for k, p in by.items() if p.conflict] == [("blue hat", "h1"), ("red shoes", "d2")]
    b2 = by[("green bag", "b2")]
    assert b2.chosen is None and b2.as_dict()["grade"] is None and b2.as_dict()["labels"][0]["grade"] is None
    # the JSON form of one pair: the chosen label, then every label with its provenance, none overwritten
    d2 = by[("red shoes", "d2")].as_dict()
    assert (d2["grade"], d2["source"], d2["conflict"]) == (1, "human", True)
    human, implicit = sorted(d2["labels"], key=lambda lab: lab["source"])
    assert human == {"grade": 1, "source": "human", "kind": "human", "query_id": "q1", "assessor": "ann",
                     "origin": str(tmp_path / "h.jsonl")}
    assert implicit == {
        "grade": 2, "source": "implicit:ctr", "kind": "implicit", "origin": "store", "model_version": "1",
        "score": 0.5, "ci_low": 0.1, "ci_high": 0.9, "impressions": 20, "clicks": 10, "sessions": 20,
        "judged_at": "2025-01-02T00:00:00",
        "parameters": {"model": {"name": "ctr"}, "grade_mapping": {"calibrated": True}},
    }
    # implicit first: the same pairs and conflicts, the other side chosen
    _, flipped = merge_view(_labels(tmp_path), ("implicit", "human"))
    # implicit chosen wherever it has a grade (d1 d2 d4 h1 h2: 5), human for d3 and b1 (2)
    assert flipped.chosen_by_source == {"human": 2, "implicit:ctr": 5} and flipped.conflicts == 2


def test_merge_view_names_one_source_read_twice():
    labels = LabelSet().add([
        Label("q", "d", 1, "human", origin="store"),
        Label("q", "d", 2, "human", origin="new.jsonl"),
        Label("q", "e", 2, "human", origin="store"),
        Label("q", "e", 2, "human", origin="new.jsonl"),
    ])
    pairs, summary = merge_view(labels)
    # q/d: the file (2) and the store (1) disagree; q/e agree. The file wins the tie rule.
    assert summary.conflicts == 1 and summary.several_sources == 0
    assert summary.conflicts_by_sources == {"human (new.jsonl) vs human (store)": 1}
    assert pairs[0].chosen is not None and pairs[0].chosen.grade == 2


def test_ties_prefer_the_file_then_the_aggregate_then_the_newest():
    labels = LabelSet().add([
        Label("q", "d", 1, "human", origin="store", judged_at=datetime(2025, 1, 3)),
        Label("q", "d", 2, "human", origin="qrels.jsonl", judged_at=datetime(2024, 1, 1)),
        Label("q", "e", 1, "human", origin="store", judged_at=datetime(2024, 1, 1)),
        Label("q", "e", 3, "human", origin="store", judged_at=datetime(2025, 1, 1)),
    ])
    assert labels.merged()[("q", "d")].grade == 2  # the file given on the command line wins
    # two stored labels of one source are two assessors: their lower median (1 of {1, 3}), not the newest
    assert labels.merged()[("q", "e")].grade == 1
    # within one precedence entry, two sources: the most recent judgment
    newer = LabelSet().add([
        Label("q", "f", 1, "reviewed:implicit:ctr", origin="store", judged_at=datetime(2024, 1, 1)),
        Label("q", "f", 3, "reviewed:implicit:pbm", origin="store", judged_at=datetime(2025, 1, 1)),
    ])
    assert newer.merged()[("q", "f")].grade == 3


def test_bad_precedence_and_labels():
    labels = LabelSet()
    with pytest.raises(MergeError, match="expected 'human'"):
        labels.add([Label("q", "d", 1, "clicks")])
    with pytest.raises(MergeError, match="grade"):
        labels.add([Label("q", "d", -1, "human")])
    with pytest.raises(MergeError, match="empty"):
        labels.merged(())
    with pytest.raises(MergeError, match="twice"):
        labels.merged(("human", "human"))


def test_coverage_judged_at_k():
    run = {"x": ["a", "b", "c", "d"], "y": ["e"], "z": []}
    qrels = {"x": {"a": 1, "c": 0, "zz": 2}, "y": {"e": 0}}
    cov = coverage({"sys": (run, {q: q for q in run})}, {"human": qrels}, k=2)
    # x: top 2 = a (judged), b (not) -> 1/2; y: e judged -> 1/1; z: empty -> 0; mean (0.5 + 1 + 0) / 3
    assert cov[0].judged_at_k == pytest.approx(0.5)
    assert (cov[0].queries, cov[0].queries_labelled) == (3, 2)
    with pytest.raises(MergeError):
        coverage({}, {}, k=0)


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("xyz"), st.integers(0, 3),
                          st.sampled_from(["human", "implicit:ctr", "implicit:pbm", "reviewed:ctr"])),
                max_size=30))
def test_merging_never_loses_a_label_and_always_picks_an_existing_one(rows):
    labels = LabelSet().add(Label(q, d, g, s) for q, d, g, s in rows)
    assert len(labels) == len(rows)
    for pair, m in labels.merged().items():
        assert (m.grade, m.source) in {(lab.grade, lab.source) for lab in labels.by_pair[pair]}
        kinds = {lab.kind for lab in labels.by_pair[pair]}
        # the chosen kind is the highest one present under human > reviewed > implicit
        assert m.source.split(":")[0] == next(k for k in ("human", "reviewed", "implicit") if k in kinds)


def test_stored_parameters_read_back_as_stored_with_the_run_wide_part_shared(tmp_path):
    """labels_from_store parses the part of ``parameters`` shared by a run once (memory at 400k judgments)."""
    import json

    import duckdb

    from ubi_pipeline.schemas import tables

    db = tmp_path / "p.duckdb"
    shared = {"model": {"model": "pbm", "theta_ratio": [1.0, 0.5]}, "grade_mapping": {"thresholds": [0.2, 0.4]}}
    texts = [
        json.dumps({**shared, "observations": 41}),
        json.dumps({**shared, "calibration_split": "holdout", "observations": 12.5}),
        json.dumps({**shared, "observations": None}),  # a non-finite support is written as null
        json.dumps(shared),
        json.dumps([1, 2]),  # not an object: read whole
        None,
    ]
    with duckdb.connect(str(db)) as con:
        con.execute(tables.JUDGMENTS)
        for i, text in enumerate(texts):
            con.execute("INSERT INTO judgments (query, doc_id, source, parameters, created_at) "
                        "VALUES ('q', ?, 'implicit:pbm', ?, now())", [f"d{i}", text])
    con = open_reader(db)
    try:
        got = {lab.doc_id: lab.parameters for lab in labels_from_store(con)}
    finally:
        con.close()
    expected = [json.loads(t) if t is not None else None for t in texts]
    expected[4] = {"value": [1, 2]}  # the reader's rule for a JSON value that is not an object
    assert [got[f"d{i}"] for i in range(len(texts))] == expected
    # the run-wide part is one object shared by the rows, not a copy per row
    assert got["d0"]["model"] is got["d1"]["model"] is got["d3"]["model"]


def test_a_source_disagrees_with_the_assessors_aggregate_not_with_each_assessor():
    """Three assessors who differ among themselves used to make a model disagree with "human" on every pair where
    any one of them differed from it (ESCI, 3 perturbed copies: 4,559 pairs counted, 2,983 differ from the merged
    grade). Each side of a couple of sources is now its assessors' aggregate, the lower median."""
    def people(doc: str, grades: tuple[int, ...]) -> list[Label]:
        return [Label("q", doc, g, "human", origin="store", assessor=w) for w, g in zip("abc", grades, strict=False)]
    labels = LabelSet().add([
        *people("d", (0, 3, 3)), Label("q", "d", 3, "model:llm", origin="store"),  # merged 3 = model: assessors only
        *people("e", (1, 2)), Label("q", "e", 2, "model:llm", origin="store"),     # merged 1 (lower median) != 2
        *people("f", (2, 2)), Label("q", "f", 2, "model:llm", origin="store"),     # all agree
        *people("g", (1,)), Label("q", "g", 0, "model:llm", origin="store"),       # one assessor, model differs
    ])
    _, summary = merge_view(labels)
    assert summary.conflicts_by_sources == {"human vs model:llm": 2, "human: assessors differ": 2}
    assert summary.conflicts == 3  # d (assessors), e (both), g (model)
