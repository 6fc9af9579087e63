"""The store's write: per-row outcomes in one transaction, snapshots, and the one-writer lock."""

from __future__ import annotations

import pyarrow as pa
import pytest

from collector.ingest import QUERY_SCHEMA, event_row, query_row
from collector.store import (
    CONFLICT,
    DUPLICATE,
    INSERTED,
    Store,
    collector_url,
    failed_row,
    failed_table,
    open_reader,
    utcnow,
)
from schemas.errors import StoreLocked
from schemas.ubi import UbiEvent, UbiQuery


def queries(*records) -> pa.Table:
    now = utcnow()
    return pa.Table.from_pylist(
        [query_row(UbiQuery.model_validate(r), now) for r in records], schema=QUERY_SCHEMA
    )


def test_query_outcomes_and_conflicts_kept_in_the_same_transaction(tmp_path, make_query):
    a, b = make_query(query_id="a"), make_query(query_id="b")
    with Store(tmp_path / "s.duckdb") as store:
        store.write(queries(a))
        kept = []

        def keep(positions):
            kept.extend(positions)
            return failed_table(
                [
                    failed_row(source="t", kind="conflict", reason="r", raw=b"x", item_index=p)
                    for p in positions
                ]
            )

        out = store.write_rows(
            queries(a, dict(a, user_query="changed"), b, b, dict(b, user_query="z")), conflicts=keep
        )
        # a: stored before -> duplicate; changed a -> conflict; b new -> inserted; b again -> duplicate
        # (first occurrence in the batch wins); changed b -> conflict with the b inserted just before
        assert out.query_status == (DUPLICATE, CONFLICT, INSERTED, DUPLICATE, CONFLICT)
        assert kept == [1, 4]
        assert store.read("SELECT count(*) FROM failed_records") == [(2,)]
        summary = out.summary()
        assert (summary.queries_inserted, summary.queries_duplicate, summary.query_conflicts) == (
            1,
            2,
            (1, 4),
        )


def test_event_outcomes(tmp_path, make_event):
    now = utcnow()
    e1, e2 = (UbiEvent.model_validate(make_event()) for _ in range(2))
    rows = pa.Table.from_pylist([event_row(e, now) for e in (e1, e2, e1)])
    with Store(tmp_path / "s.duckdb") as store:
        assert store.write_rows(events=rows).event_inserted == (True, True, False)
        assert store.write_rows(events=rows).event_inserted == (False, False, False)


def test_reader_opens_a_free_file_and_explains_a_missing_collector(tmp_path):
    """A second process holding the file is tested in test_server.py (DuckDB's lock is per process)."""
    path = tmp_path / "s.duckdb"
    Store(path).close()
    con = open_reader(path)
    assert con.execute("SELECT count(*) FROM ubi_events").fetchone() == (0,)
    con.close()
    with pytest.raises(StoreLocked, match="no running collector advertises it"):
        collector_url(path)
