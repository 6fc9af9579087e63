"""``ubi_pipeline.store.rows``: the one counts type and row status, and the stored shape's Arrow schemas."""

from __future__ import annotations

from ubi_pipeline.schemas import tables
from ubi_pipeline.store.rows import EVENT_SCHEMA, FAILED_SCHEMA, QUERY_SCHEMA, Counts, RowStatus

INS, DUP, CON = RowStatus.INSERTED, RowStatus.DUPLICATE, RowStatus.CONFLICT


def test_counts_of_row_statuses() -> None:
    # counted by hand: queries 1 new, 1 duplicate, 1 conflict; events 2 new, 1 duplicate, 1 conflict
    c = Counts.of([INS, DUP, CON], [INS, INS, CON, DUP], failed=2, poison=1)
    assert c == Counts(queries=1, query_duplicates=1, events=2, event_duplicates=1, conflicts=2, failed=2, poison=1)
    assert (c.accepted, c.duplicates) == (3, 2)
    c.add(Counts(queries=4, poison=1))
    assert c.public() == {"queries": 5, "query_duplicates": 1, "events": 2, "event_duplicates": 1,
                          "conflicts": 2, "failed": 2, "poison": 2}


def test_arrow_schemas_follow_the_table_column_lists() -> None:
    assert QUERY_SCHEMA.names == list(tables.QUERY_COLUMNS)
    assert EVENT_SCHEMA.names == list(tables.EVENT_COLUMNS)
    assert FAILED_SCHEMA.names == list(tables.FAILED_COLUMNS)
    assert str(FAILED_SCHEMA.field("raw").type) == "binary" and str(FAILED_SCHEMA.field("kafka_offset").type) == "int64"
