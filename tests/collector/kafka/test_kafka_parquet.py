"""The Parquet store: per-partition files written by loaders, read back through deduplicating views that
match the DuckDB store row for row."""

from __future__ import annotations

import duckdb
import pytest

from tests.conftest import SAMPLE_LOG, shared_path
from ubi_pipeline.collector.ingest import parse_bulk, parse_items, validate_items
from ubi_pipeline.collector.sinks.kafka import KafkaSink, encode
from ubi_pipeline.loader.consumer import Consumer
from ubi_pipeline.loader.decode import InRecord, decode
from ubi_pipeline.loader.targets import DuckDBLoader, ParquetLoader
from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.parquet_store import is_parquet_store, open_parquet_reader
from ubi_pipeline.transport.wire import topics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

CONFLICTING = b'{"query_id": "33198ee9-5912-453c-9173-3f92fd3cb1be", "user_query": "something else"}'
#: Another event under the first sample event's _id: a conflict in both stores. Its query_id is the sample
#: event's, hence its Kafka key and partition: it is loaded after it, so both stores keep the same first write.
REUSED_ID = (b'{"index": {"_index": "ubi_events", "_id": "adbef2c4-1223-4580-92d1-61b3718874d0"}}\n'
             b'{"action_name": "click", "timestamp": "2024-12-10T00:01:30Z", "query_id": "33198ee9-5912-453c-9173-3f92fd3cb1be"}\n')


def _load(settings: Settings, loader, group: str) -> dict:
    consumer = Consumer(settings, loader, group=group)
    try:
        consumer.run(exit_idle=0.5)
    finally:
        consumer.close()
    return consumer.progress.public()


def _rows(con: duckdb.DuckDBPyConnection, table: str, columns: tuple[str, ...], key: str) -> list[tuple]:
    cols = ", ".join(c for c in columns if c != "received_at")
    return con.execute(f"SELECT {cols} FROM {table} ORDER BY {key}").fetchall()


def test_parquet_views_equal_the_duckdb_store_and_absorb_redelivery(broker, prefix, tmp_path):
    settings = Settings(kafka_bootstrap=broker.bootstrap, kafka_topic_prefix=prefix, spool_dir=tmp_path / "spool",
                        consumer_max_poll_interval_ms=3000, consumer_batch_records=2000)
    sink = KafkaSink(settings)
    try:
        sink.write(validate_items(parse_bulk(shared_path(SAMPLE_LOG).read_bytes())), source="/v1/bulk")
        sink.write(validate_items(parse_items(CONFLICTING, "query")), source="/v1/queries")
        sink.write(validate_items(parse_items(b'[{"action_name": "click"}]', "event")), source="/v1/events")
        sink.write(validate_items(parse_bulk(REUSED_ID)), source="/v1/bulk")
    finally:
        sink.close()

    out = tmp_path / "parquet"
    first = _load(settings, ParquetLoader(out), f"{prefix}-p1")
    second = _load(settings, ParquetLoader(out), f"{prefix}-p2")  # the whole topic delivered again into the same folder
    db = tmp_path / "ubi.duckdb"
    _load(settings, DuckDBLoader(Store(db)), f"{prefix}-d1")

    # 473 + 1 query records, 3,448 + 1 events (docs/ubi.md; the 1 re-uses a sample _id), 1 reject: each
    # written twice as raw Parquet rows.
    assert first["rows"] == second["rows"] == 473 + 1 + 3448 + 1 + 1
    raw = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/ubi_events/*/*.parquet')").fetchall()[0]
    assert raw == (2 * 3449,)
    assert is_parquet_store(out) and not list(out.glob("*/*/.*.tmp"))
    # one folder per topic partition; file names carry the offset range they hold
    folders = {p.name for p in (out / "ubi_events").iterdir()}
    assert folders <= {f"{prefix}.events.{i}" for i in range(6)} and len(folders) > 1

    pq_con = open_parquet_reader(out)
    db_con = duckdb.connect(str(db), read_only=True)
    try:
        for table, cols, key in (("ubi_queries", tables.QUERY_COLUMNS, "query_key"),
                                 ("ubi_events", tables.EVENT_COLUMNS, "event_key")):
            from_parquet = _rows(pq_con, table, cols, key)
            assert from_parquet == _rows(db_con, table, cols, key)
        assert len(_rows(pq_con, "ubi_events", tables.EVENT_COLUMNS, "event_key")) == 3448
        assert len(_rows(pq_con, "ubi_queries", tables.QUERY_COLUMNS, "query_key")) == 473
        failed_cols = ("failed_id", "kind", "field", "kafka_topic")
        assert _rows(pq_con, "failed_records", failed_cols, "failed_id") == \
            _rows(db_con, "failed_records", failed_cols, "failed_id")
        kinds = sorted(pq_con.execute("SELECT kind, field FROM failed_records").fetchall(), key=str)
        assert kinds == [("conflict", "event_id"), ("conflict", "query_id"), ("event", "timestamp")]
    finally:
        pq_con.close()
        db_con.close()

    # The processors read the Parquet folder as they read the DuckDB store (ubi_pipeline.store.client.open_reader).
    from ubi_pipeline.processors.clicks.sessions import read_sessions

    from_parquet, from_duckdb = read_sessions(out), read_sessions(db)
    assert from_parquet.quality == from_duckdb.quality and from_parquet.filters == from_duckdb.filters
    assert list(from_parquet.cells.impressions) == list(from_duckdb.cells.impressions)
    assert from_parquet.patterns.n_sessions == from_duckdb.patterns.n_sessions > 0


def test_a_folder_that_is_not_a_parquet_store_is_refused(tmp_path):
    with pytest.raises(StoreError, match="not a Parquet store"):
        open_parquet_reader(tmp_path)


def test_an_empty_store_reads_as_empty_tables(tmp_path):
    ParquetLoader(tmp_path / "p")
    con = open_parquet_reader(tmp_path / "p")
    assert con.execute("SELECT (SELECT count(*) FROM ubi_queries), (SELECT count(*) FROM ubi_events), "
                       "(SELECT count(*) FROM failed_records)").fetchone() == (0, 0, 0)


def test_files_left_half_written_by_a_killed_loader_are_ignored_and_cleaned(tmp_path):
    loader = ParquetLoader(tmp_path / "p")
    tmp = tmp_path / "p" / "ubi_events" / "ubi.events.0" / ".part-00000000000000000000-00000000000000000009-x.parquet.tmp"
    tmp.parent.mkdir(parents=True)
    tmp.write_bytes(b"PAR1 truncated")
    con = open_parquet_reader(tmp_path / "p")
    assert con.execute("SELECT count(*) FROM ubi_events").fetchone() == (0,)
    loader = ParquetLoader(tmp_path / "p")  # a restarted loader removes it
    assert not tmp.exists() and loader.root == tmp_path / "p"


def test_event_conflicts_in_the_views_match_the_duckdb_loader(tmp_path):
    """Without a broker: rows encoded as the collector produces them, loaded into both stores. An event
    re-sent with its extra keys in another order is a duplicate; another event under the same _id is one
    conflict row, with the same failed_id as the DuckDB loader's, however often it is delivered."""
    names = topics("ubi")
    body = (
        b'{"index": {"_index": "ubi_events", "_id": "x1"}}\n'
        b'{"action_name": "click", "timestamp": 1, "extra": {"a": 1, "b": 2}}\n'
        b'{"index": {"_index": "ubi_events", "_id": "x1"}}\n{"action_name": "view", "timestamp": 1}\n'
        b'{"index": {"_index": "ubi_events", "_id": "x1"}}\n'
        b'{"timestamp": 1, "action_name": "click", "extra": {"b": 2, "a": 1}}\n'
        b'{"index": {"_index": "ubi_events", "_id": "x2"}}\n{"action_name": "view", "timestamp": 1}\n'
    )
    records = []
    for item in parse_bulk(body):  # one request per record: one message each, offsets in order
        for msg in encode(validate_items([item]), source="t").msgs:
            records.append(InRecord(names.of(msg.kind), 0, len(records), msg.value))
    ParquetLoader(tmp_path / "pq").write(decode(records, names))
    ParquetLoader(tmp_path / "pq").write(decode(records, names))  # delivered again
    loader = DuckDBLoader(Store(tmp_path / "s.duckdb"))
    result = loader.write(decode(records, names))
    assert (result.events, result.event_duplicates, result.conflicts) == (2, 1, 1)
    from_duckdb = loader.store.read("SELECT failed_id, kind, field, item_index FROM failed_records")
    loader.close()
    con = open_parquet_reader(tmp_path / "pq")
    try:
        assert con.execute("SELECT event_key, action_name FROM ubi_events ORDER BY 1").fetchall() == [
            ("id:x1", "click"), ("id:x2", "view")]
        assert con.execute("SELECT failed_id, kind, field, item_index FROM failed_records").fetchall() == from_duckdb
        assert len(from_duckdb) == 1
    finally:
        con.close()
