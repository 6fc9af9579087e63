"""The review stage while ``ubi serve`` holds the store: grades and their undo go through the admin protocol."""

from __future__ import annotations

from pathlib import Path

import httpx
import pyarrow as pa
import pytest

from tests.collector.tests_collector_support import start_server
from tests.review.review_store import review_store
from ubi_pipeline.review.session import ReviewSession, read_rubric
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.client import reading
from ubi_pipeline.store.duckdb_store import Store


def rows(db: Path) -> list[tuple]:
    with reading(db) as con:  # the collector holds the file: this reads its sealed segments
        return con.execute("SELECT query, doc_id, grade, source, assessor, note FROM human_judgments "
                           "ORDER BY assessor, query, doc_id").fetchall()


def test_grade_and_undo_while_the_collector_holds_the_store(tmp_path: Path):
    db = review_store(tmp_path / "held.duckdb")
    server = start_server(db)
    try:
        s = ReviewSession.open(db, Settings(db=db), rubric=read_rubric(None, 3), held_out=0)
        s.grade("bob", "green bag", "g1", 3, "exact")
        s.grade("bob", "red shoes", "r1", 1, None)
        assert rows(db) == [("red shoes", "r1", 0, "human", "ann", None),
                            ("green bag", "g1", 3, "reviewed:implicit:pbm", "bob", "exact"),
                            ("red shoes", "r1", 1, "reviewed:implicit:pbm", "bob", None)]
        s.undo("bob")  # deletes bob's r1 row through POST /v1/admin/delete/human_judgments
        assert rows(db) == [("red shoes", "r1", 0, "human", "ann", None),
                            ("green bag", "g1", 3, "reviewed:implicit:pbm", "bob", "exact")]
        # the delete route refuses what the load route refuses: a table that is not derived, keys that lack a column
        sink = pa.BufferOutputStream()
        keys = pa.table({"query": ["green bag"], "doc_id": ["g1"]})
        with pa.ipc.new_stream(sink, keys.schema) as w:
            w.write_table(keys)
        body = sink.getvalue().to_pybytes()
        assert httpx.post(f"{server.url}/v1/admin/delete/ubi_queries", content=body).status_code == 422
        r = httpx.post(f"{server.url}/v1/admin/delete/human_judgments", content=body)
        assert r.status_code == 400 and "lack its key column(s) source, assessor" in r.json()["message"]
        # and answers only to loopback names, as every admin route (DNS rebinding)
        r = httpx.post(f"{server.url}/v1/admin/delete/human_judgments", content=body, headers={"host": "evil.example"})
        assert r.status_code == 403
    finally:
        assert server.stop() == 0


def test_store_delete_rows_refuses_raw_tables(tmp_path: Path):
    with Store(tmp_path / "s.duckdb") as store, pytest.raises(StoreError, match="'ubi_events' cannot be deleted from"):
        store.delete_rows("ubi_events", pa.table({"event_key": ["x"]}))
