"""Every assessor kept: imports add one row per (query, doc, assessor), readers see one aggregate grade per pair.

Expected numbers are hand-computed from the small files written in each test (the lower median of each pair's
grades, counts of rows per assessor).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from ubi_pipeline.cli import main
from ubi_pipeline.processors.labels.merge import (
    AGGREGATE_RULE,
    Label,
    LabelSet,
    MergeError,
    aggregate_grades,
    labels_from_store,
    merge_view,
)
from ubi_pipeline.store.client import open_reader


def rows(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _import(db: Path, path: Path, *extra: str) -> int:
    return main(["judgments", "import", str(path), "--db", str(db), *extra])


def test_aggregate_is_the_lower_median() -> None:
    # by hand: sorted grades, element (n - 1) // 2
    assert [aggregate_grades(g) for g in ([2], [1, 2], [2, 1], [0, 1, 3], [2, 2, 3, 3], [0, 3, 3], [3, 0, 0, 3])] == [
        2, 1, 1, 1, 2, 3, 0]
    assert AGGREGATE_RULE == "median_low"
    with pytest.raises(MergeError, match="no grades"):
        aggregate_grades([])


def test_two_assessors_are_both_kept_and_reimport_replaces_only_ones_own(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.duckdb"
    ann = _jsonl(tmp_path / "ann.jsonl", [{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 3, "d2": 1, "d3": 0}}])
    bob = _jsonl(tmp_path / "bob.jsonl", [{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 1, "d2": 2}}])
    # the file names its assessor (JSONL "assessor" per query): it wins over --assessor
    cat = _jsonl(tmp_path / "cat.jsonl", [{"query_id": "q1", "query": "red shoes", "assessor": "cat", "relevant": {"d1": 2}}])
    assert _import(db, ann, "--assessor", "ann") == 0
    assert _import(db, bob, "--assessor", "bob", "--json") == 0
    got = json.loads(capsys.readouterr().out.splitlines()[-1])
    # bob's d1 and d2 sit beside ann's: nothing replaced, 2 labels of another assessor kept
    assert (got["replaced"], got["other_assessors"], got["assessors"]) == (0, 2, ["bob"])
    assert _import(db, cat, "--assessor", "ignored") == 0
    assert rows(db, "SELECT assessor, doc_id, grade FROM human_judgments ORDER BY ALL") == [
        ("ann", "d1", 3), ("ann", "d2", 1), ("ann", "d3", 0), ("bob", "d1", 1), ("bob", "d2", 2), ("cat", "d1", 2)]

    # ann again with --replace and one pair fewer: her d3 goes, bob's and cat's rows stay
    ann2 = _jsonl(tmp_path / "ann2.jsonl", [{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 2, "d2": 1}}])
    assert _import(db, ann2, "--assessor", "ann", "--replace", "--json") == 0
    got = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (got["replaced"], got["removed"], got["other_assessors"]) == (2, 1, 3)
    assert rows(db, "SELECT assessor, doc_id, grade FROM human_judgments ORDER BY ALL") == [
        ("ann", "d1", 2), ("ann", "d2", 1), ("bob", "d1", 1), ("bob", "d2", 2), ("cat", "d1", 2)]

    # readers see one grade per pair: d1 {2, 1, 2} -> 2, d2 {1, 2} -> 1 (tie to the lower)
    con = open_reader(db)
    try:
        labels = LabelSet().add(labels_from_store(con))
    finally:
        con.close()
    assert labels.qrels("human") == {"red shoes": {"d1": 2, "d2": 1}}
    d1 = labels.choose(("human",))[("red shoes", "d1")]
    assert d1.assessor is None and dict(d1.parameters or {}) == {
        "aggregate": "median_low", "assessors": 3, "grade_min": 1, "grade_max": 2,
        "grades": {"ann": 2, "bob": 1, "cat": 2}}
    pairs, summary = merge_view(labels)
    assert summary.conflicts == 2 and summary.conflicts_by_sources == {"human: assessors differ": 2}
    assert [p.chosen.grade for p in pairs] == [2, 1]  # type: ignore[union-attr]

    assert pairs[0].as_dict()["aggregate"]["grades"] == {"ann": 2, "bob": 1, "cat": 2}

    # the human export is the aggregate too, and says so; --assessor writes one assessor's grades
    out = tmp_path / "h.trec"
    assert main(["judgments", "export", "--db", str(db), "--format", "trec", "--out", str(out)]) == 0
    assert out.read_text() == "red%20shoes 0 d1 2\nred%20shoes 0 d2 1\n"
    assert "2 pairs graded by several assessors written as the lower median of their grades" in " ".join(
        capsys.readouterr().err.split())
    assert main(["judgments", "export", "--db", str(db), "--format", "trec", "--assessor", "bob"]) == 0
    assert capsys.readouterr().out == "red%20shoes 0 d1 1\nred%20shoes 0 d2 2\n"
    assert main(["judgments", "export", "--db", str(db), "--format", "workbench", "--assessor", "cat"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["judgmentRatings"][0]["ratings"][0]["docId"] == "d1"
    # one assessor's list says whose it is (it read "from source human", like the merge of all of them)
    assert got["description"] == "Exported by ubi-pipeline from source human, assessor cat"
    wb = tmp_path / "cat.json"
    assert main(["judgments", "export", "--db", str(db), "--format", "workbench", "--assessor", "cat",
                 "--out", str(wb)]) == 0
    assert "(human, assessor cat)" in capsys.readouterr().err
    assert main(["judgments", "export", "--db", str(db), "--format", "trec", "--assessor", "nobody"]) == 2


def test_a_single_assessor_label_is_chosen_as_it_is() -> None:
    one = Label("q", "d", 2, "human", origin="store", assessor="ann", note="exact model")
    labels = LabelSet().add([one, Label("q", "d", 0, "implicit:ctr", origin="store")])
    assert labels.choose(("human",))[("q", "d")] is one
    # a file given on the command line still beats the store, and is not averaged with it
    file_label = Label("q", "d", 0, "human", origin="f.jsonl", assessor="bob")
    labels.add([file_label, Label("q", "d", 3, "human", origin="store", assessor="cat")])
    assert labels.choose(("human",))[("q", "d")] is file_label


def test_review_sheet_with_several_assessors_and_notes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.duckdb"
    sheet = tmp_path / "sheet.csv"
    sheet.write_text("query,doc_id,source,grade,assessor,notes\n"
                     "red shoes,d1,,3,ann,exact match\n"
                     "red shoes,d1,,1,bob,wrong colour\n"
                     "red shoes,d2,,,ann,\n"
                     "red shoes,d2,,2,,\n")
    assert main(["review", "import", str(sheet), "--db", str(db), "--assessor", "lead", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["imported"] == 3
    assert rows(db, "SELECT doc_id, assessor, grade, note FROM human_judgments ORDER BY ALL") == [
        ("d1", "ann", 3, "exact match"), ("d1", "bob", 1, "wrong colour"), ("d2", "lead", 2, None)]
    # the same assessor twice on a pair is an error naming the line
    bad = tmp_path / "bad.csv"
    bad.write_text("query,doc_id,grade,assessor\nred shoes,d1,3,ann\nred shoes,d1,2,ann\n")
    assert main(["review", "import", str(bad), "--db", str(db), "--assessor", "lead"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "bad.csv:3" in err and "already graded by 'ann' on line 2" in err


def test_scoped_replace_and_model_import_while_a_collector_holds_the_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.reports.joint_fixtures import build_store
    from ubi_pipeline.demo import running_collector

    db = build_store(tmp_path / "ubi.duckdb")
    ann = _jsonl(tmp_path / "ann.jsonl", [{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 3, "d2": 1}}])
    bob = _jsonl(tmp_path / "bob.jsonl", [{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 1, "d2": 2}}])
    ann2 = _jsonl(tmp_path / "ann2.jsonl", [{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 2}}])
    with running_collector(db, log=tmp_path / "collector.log"):
        # through the admin protocol: the same scoped replace as on a free file
        assert _import(db, ann, "--assessor", "ann") == 0
        assert _import(db, bob, "--assessor", "bob") == 0
        assert _import(db, ann2, "--assessor", "ann", "--replace") == 0
        assert _import(db, ann, "--source", "model:m", "--assessor", "gpt") == 0
    capsys.readouterr()
    assert rows(db, "SELECT assessor, doc_id, grade FROM human_judgments ORDER BY ALL") == [
        ("ann", "d1", 2), ("bob", "d1", 1), ("bob", "d2", 2)]
    assert rows(db, "SELECT doc_id, grade FROM judgments WHERE source = 'model:m' ORDER BY ALL") == [
        ("d1", 3), ("d2", 1)]
