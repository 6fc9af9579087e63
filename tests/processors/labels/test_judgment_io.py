"""How stored labels become a judgment file: which text and id each query gets, which provenance survives."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest

from ubi_pipeline.processors.labels.judgment_io import (
    JudgmentIOError,
    export_judgments,
    source_name,
    stored_qrels,
)
from ubi_pipeline.store.client import open_reader
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import HUMAN_JUDGMENT_SCHEMA


def _human(query_id, query, doc, grade, assessor=""):
    return {"query_id": query_id, "query": query, "doc_id": doc, "grade": grade, "source": "human",
            "assessor": assessor, "judged_at": datetime(2025, 1, 1), "rubric": None, "origin": "f"}


@pytest.fixture()
def con(tmp_path: Path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.load_table("human_judgments", pa.Table.from_pylist([
            _human("Red Shoes", "red shoes", "d1", 3, "ann"),  # Workbench-style: the id is the judged wording
            _human("Red Shoes", "red shoes", "d2", 1, "ann"),
            _human("q2", "blue hat", "h1", 2, "ann"),  # two ids and two assessors for one query
            _human("q9", "blue hat", "h2", 0, "bob"),
            _human("blue hat", "green bag", "b1", 1),  # a stored id that is another query's text
        ], schema=HUMAN_JUDGMENT_SCHEMA))
    c = open_reader(db)
    yield c
    c.close()


def test_ids_texts_and_provenance_of_exported_queries(con):
    qrels, by_source, mixed = stored_qrels(con)
    # red shoes: one id "Red Shoes" that normalises to the query -> it is both the id and the text written
    # blue hat: two ids (q2, q9) -> the text is the id; green bag: its id "blue hat" is blue hat's text -> text
    assert qrels.grades == {"blue hat": {"h1": 2, "h2": 0}, "green bag": {"b1": 1}, "Red Shoes": {"d1": 3, "d2": 1}}
    assert qrels.texts == {"blue hat": "blue hat", "green bag": "green bag", "Red Shoes": "Red Shoes"}
    assert by_source == {"human": 5}
    # blue hat's labels differ in assessor (ann, bob): left out and counted; the date they share is kept
    assert mixed == 1
    assert qrels.meta["blue hat"] == {"judged_at": datetime(2025, 1, 1)}
    assert qrels.meta["Red Shoes"] == {"assessor": "ann", "judged_at": datetime(2025, 1, 1)}
    trec, _, _ = stored_qrels(con, trec_ids=True)
    assert list(trec.grades) == ["blue%20hat", "green%20bag", "Red%20Shoes"]
    body, summary = export_judgments(con, "workbench")
    assert '"query": "Red Shoes"' in body and (summary.queries, summary.judgments, summary.mixed_provenance) == (3, 5, 0)


def test_source_names():
    assert [source_name(s) for s in ("human", "pbm", "implicit:ctr", "reviewed", "merged", " sdbn ")] == [
        "human", "implicit:pbm", "implicit:ctr", "reviewed", "merged", "implicit:sdbn"]
    with pytest.raises(JudgmentIOError):
        source_name(" ")


def test_unknown_source_says_what_is_there(con):
    with pytest.raises(JudgmentIOError, match="no graded judgment of source 'reviewed'; sources present: human"):
        stored_qrels(con, "reviewed")
