"""The store's write: per-row outcomes in one transaction and the one-writer lock (seals: test_sealed.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ubi_pipeline.schemas.errors import StoreError, StoreLocked
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.ubi import UbiEvent, UbiQuery
from ubi_pipeline.store.client import collector_url, open_reader
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import (
    EVENT_SCHEMA,
    QUERY_SCHEMA,
    RowStatus,
    event_row,
    failed_row,
    failed_table,
    query_row,
    utcnow,
)

INSERTED, DUPLICATE, CONFLICT = RowStatus.INSERTED, RowStatus.DUPLICATE, RowStatus.CONFLICT


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
        counts = out.counts()
        assert (counts.queries, counts.query_duplicates, counts.conflicts, counts.failed) == (1, 2, 2, 2)


def events(*records, bulk_ids=None) -> pa.Table:
    now = utcnow()
    ids = bulk_ids or [None] * len(records)
    return pa.Table.from_pylist(
        [event_row(UbiEvent.model_validate(r), now, b) for r, b in zip(records, ids, strict=True)],
        schema=EVENT_SCHEMA,
    )


def test_event_outcomes(tmp_path, make_event):
    e1, e2 = make_event(), make_event()
    rows = events(e1, e2, e1)
    with Store(tmp_path / "s.duckdb") as store:
        assert store.write_rows(events=rows).event_status == (INSERTED, INSERTED, DUPLICATE)
        assert store.write_rows(events=rows).event_status == (DUPLICATE, DUPLICATE, DUPLICATE)


def test_an_event_id_reused_for_other_content_is_a_conflict_kept_once(tmp_path, make_event):
    """A retry (same content, however its keys are ordered or its timestamp spelt) is a duplicate; another
    event under a taken event_id is a conflict, in the batch that stored it first or in a later one."""
    a = make_event(event_id="e1", page="p", extra_obj={"x": 1, "y": 2})
    a_again = dict(reversed(list(a.items())))
    a_again["extra_obj"] = {"y": 2, "x": 1}
    a_again["timestamp"] = "2024-05-16T14:34:56.789+02:00"  # the instant of a's 12:34:56.789Z
    other = dict(a, action_name="purchase")
    b = make_event(event_id="e2")
    kept: list[list[int]] = []

    def keep(positions):
        kept.append(list(positions))
        return failed_table(
            [failed_row(source="t", kind="conflict", reason="r", raw=b"", item_index=p) for p in positions]
        )

    with Store(tmp_path / "s.duckdb") as store:
        # all keys new; in-batch repeats are compared with the batch's first occurrence
        out = store.write_rows(events=events(a, a_again, other, b), event_conflicts=keep)
        assert out.event_status == (INSERTED, DUPLICATE, CONFLICT, INSERTED)
        assert kept == [[2]]
        # stored keys (found through the key table, store/keys.py): the callback runs once per write
        out = store.write_rows(events=events(make_event(), other, a_again), event_conflicts=keep)
        assert out.event_status == (INSERTED, CONFLICT, DUPLICATE)
        assert kept == [[2], [1]]
        counts = out.counts()
        assert (counts.events, counts.event_duplicates, counts.conflicts) == (1, 1, 1)
        assert store.read("SELECT count(*) FROM failed_records") == [(2,)]
        assert store.read("SELECT action_name FROM ubi_events WHERE event_id = 'e1'") == [("click",)]


def test_a_bulk_id_counts_like_an_event_id(tmp_path, make_event):
    """A _bulk _id stores as event_id: the same document under it is a duplicate whichever way it came."""
    e = make_event()
    with Store(tmp_path / "s.duckdb") as store:
        store.write_rows(events=events(e, bulk_ids=["b1"]))
        same = store.write_rows(events=events(dict(e, event_id="b1")))
        assert same.event_status == (DUPLICATE,)
        other = store.write_rows(events=events(dict(e, action_name="view"), bulk_ids=["b1"]))
        assert other.event_status == (CONFLICT,)


def test_reader_opens_a_free_file_and_explains_a_missing_collector(tmp_path):
    """A second process holding the file is tested in test_server.py (DuckDB's lock is per process)."""
    path = tmp_path / "s.duckdb"
    Store(path).close()
    con = open_reader(path)
    assert con.execute("SELECT count(*) FROM ubi_events").fetchone() == (0,)
    con.close()
    with pytest.raises(StoreLocked, match="no running collector advertises it"):
        collector_url(path)


def test_conflict_callbacks_run_once_when_the_fast_path_is_retried(tmp_path, make_query, make_event):
    """An in-batch query conflict beside a stored event key (the write used to be tried twice then, and the
    conflict had to be kept once, not once per attempt; now there is one attempt): kept once."""
    q, e = make_query(query_id="q"), make_event(event_id="e")
    calls: list[list[int]] = []

    def keep(positions):
        calls.append(list(positions))
        return failed_table([failed_row(source="t", kind="conflict", reason="r", raw=b"") for _ in positions])

    with Store(tmp_path / "s.duckdb") as store:
        store.write_rows(events=events(e))
        out = store.write_rows(queries(q, dict(q, user_query="other")), events(e), conflicts=keep)
        assert (out.query_status, out.event_status) == ((INSERTED, CONFLICT), (DUPLICATE,))
        assert calls == [[1]]
        assert store.read("SELECT count(*) FROM failed_records") == [(1,)]


# ---------------------------------------------------------------- a read-only reader holding the file


def _hold_read_only(db):
    """A real reader process (as `ubi report` is while no collector runs) with ``db`` open read-only."""
    import subprocess
    import sys

    code = "import sys, duckdb; con = duckdb.connect(sys.argv[1], read_only=True); print('open', flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "open"
    return proc


def _serve(db, wait_seconds):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "UBI_STORE_WAIT_SECONDS": str(wait_seconds)}
    return subprocess.Popen([sys.executable, "-m", "ubi_pipeline", "serve", "--db", str(db), "--port", "0"], cwd=root,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_serve_waits_for_a_read_only_reader_and_then_starts(tmp_path):
    import re
    import signal

    import httpx

    db = tmp_path / "ubi.duckdb"
    Store(db).close()
    reader = _hold_read_only(db)
    server = _serve(db, wait_seconds=120)
    try:
        # It says what holds the file (a reader, with its pid) and how long it waits, then keeps trying.
        line = server.stderr.readline()
        assert f"open read-only by process {reader.pid}" in line and "UBI_STORE_WAIT_SECONDS" in line, line
        assert "another collector" not in line and "`ubi serve`?" not in line  # what 74e9b3e blamed
        assert server.poll() is None
        reader.communicate("", timeout=30)  # the report finishes
        out = server.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+", out)
        assert url, out + server.stderr.read()
        assert httpx.get(url.group(0) + "/healthz", timeout=30).status_code == 200
    finally:
        reader.kill()
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=30)


def test_serve_gives_up_naming_the_reader_and_the_setting(tmp_path):
    db = tmp_path / "ubi.duckdb"
    Store(db).close()
    reader = _hold_read_only(db)
    try:
        server = _serve(db, wait_seconds=0.5)
        _, err = server.communicate(timeout=60)
    finally:
        reader.kill()
        reader.wait()
    assert server.returncode == 2, err
    assert f"open read-only by process {reader.pid}" in err and "gave up after waiting 0.5 s" in err
    assert "UBI_STORE_WAIT_SECONDS" in err and "another collector" not in err and "`ubi serve`?" not in err


def test_a_writer_holding_the_file_is_still_named_as_one(tmp_path):
    db = tmp_path / "ubi.duckdb"
    with Store(db):
        # in-process lock probes do not see this process's own locks: ask from another process
        import subprocess
        import sys

        code = ("import sys; from ubi_pipeline.store.duckdb_store import Store\n"
                "try:\n    Store(sys.argv[1], wait_for_readers=5)\nexcept Exception as e:\n    print(type(e).__name__, e)")
        out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=60,
                             cwd=__import__("pathlib").Path(__file__).resolve().parents[2]).stdout
    assert out.startswith("StoreLocked ") and "held for writing by another process" in out, out


def test_a_store_held_only_by_a_reader_raises_the_reader_subclass(tmp_path):
    """Giving up on a read-only reader raises StoreHeldByReader (a StoreLocked), which `ubi serve` tells from a
    writer holding the file by its type (test_a_writer_holding_the_file_is_still_named_as_one: plain StoreLocked)."""
    from ubi_pipeline.schemas.errors import StoreHeldByReader

    db = tmp_path / "ubi.duckdb"
    Store(db).close()
    reader = _hold_read_only(db)
    try:
        with pytest.raises(StoreHeldByReader, match=f"open read-only by process {reader.pid}") as info:
            Store(db, wait_for_readers=0.3)
        assert isinstance(info.value, StoreLocked)
    finally:
        reader.kill()
        reader.wait()


def _judgment_rows(n: int) -> pa.Table:
    from datetime import datetime

    return pa.table({"query": [f"query number {i // 10}" for i in range(n)], "doc_id": [f"doc-{i}" for i in range(n)],
                     "source": ["implicit:pbm"] * n, "parameters": ['{"support": 12}'] * n, "score": [0.5] * n,
                     "created_at": [datetime(2026, 1, 1)] * n})


def test_derived_tables_load_under_their_own_memory_limit(tmp_path):
    """``judgments`` keeps a primary key, whose index DuckDB holds in memory whole: at 20M events, replacing the
    416,660 judgments of ``ubi process`` did not fit in the writer's 256 MB and the run failed at its last step.
    Scaled down (measured: 50,000 judgment rows fail under a 16 MB pool and load under 256 MB), the load uses
    the readers' limit (``load_memory_limit``, ``Settings.memory_limit``) and the writer's pool comes back after."""
    rows = _judgment_rows(50_000)
    with Store(tmp_path / "small.duckdb", memory_limit="16MB") as store:
        with pytest.raises(StoreError, match="UBI_MEMORY_LIMIT"):  # typed, and says what to raise
            store.load_tables([("judgments", rows, "implicit:pbm")])
        assert store.con.execute("SELECT count(*) FROM judgments").fetchone() == (0,)  # nothing half-written
    with Store(tmp_path / "loads.duckdb", memory_limit="16MB", load_memory_limit="256MB") as store:
        assert store.load_tables([("judgments", rows, "implicit:pbm")]) == [50_000]
        assert store.con.execute("SELECT count(*) FROM judgments").fetchone() == (50_000,)
        # the writer's pool is back (DuckDB prints 16 MB, 16e6 bytes, as "15.2 MiB")
        assert store.con.execute("SELECT current_setting('memory_limit')").fetchone() == ("15.2 MiB",)


def test_a_store_made_before_assessors_were_kept_is_rekeyed_by_assessor(tmp_path) -> None:
    """The human_judgments of an older store (key query, doc_id, source; no note) are copied into today's table:
    every row kept, a NULL assessor becomes '' (unnamed), and a second assessor of the same pair adds a row."""
    import duckdb

    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE human_judgments (query_id VARCHAR, query VARCHAR NOT NULL, doc_id VARCHAR NOT NULL, "
                "grade INTEGER NOT NULL, source VARCHAR NOT NULL, assessor VARCHAR, judged_at TIMESTAMP, "
                "rubric VARCHAR, origin VARCHAR, PRIMARY KEY (query, doc_id, source))")
    con.execute("INSERT INTO human_judgments VALUES ('q', 'q', 'd1', 2, 'human', NULL, NULL, NULL, 'f'), "
                "('q', 'q', 'd2', 1, 'human', 'ann', NULL, 'v1', 'f')")
    con.close()
    with Store(db) as store:
        store.load_table("human_judgments", pa.Table.from_pylist([
            {"query": "q", "doc_id": "d2", "grade": 3, "source": "human", "assessor": "bob", "note": "exact match"}]))
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT doc_id, grade, assessor, note FROM human_judgments ORDER BY doc_id, assessor").fetchall()
    (key,) = con.execute("SELECT constraint_column_names FROM duckdb_constraints() WHERE table_name = "
                         "'human_judgments' AND constraint_type = 'PRIMARY KEY'").fetchall()[0]
    con.close()
    assert rows == [("d1", 2, "", None), ("d2", 1, "ann", None), ("d2", 3, "bob", "exact match")]
    assert list(key) == ["query", "doc_id", "source", "assessor"]
    with Store(db):  # opening again finds it done
        pass


def test_surely_new_says_which_keys_a_write_would_insert(tmp_path, make_event):
    # The collector answers a request before its commit only when this is True (store/answer_log.py).
    now = utcnow()
    stored = [event_row(UbiEvent.model_validate(make_event(event_id=f"s{i}")), now) for i in range(50)]
    with Store(tmp_path / "s.duckdb") as store:
        assert not store.surely_new("ubi_events", ["id:x"])  # no write yet: the key filter is not filled
        store.write(events=pa.Table.from_pylist(stored, schema=EVENT_SCHEMA))
        assert store.surely_new("ubi_events", [f"id:n{i}" for i in range(50)])
        assert not store.surely_new("ubi_events", ["id:n0", "id:s7"])
        assert store.surely_new("ubi_events", [])
        # Keys the filter may hold (its false positives) are looked up in the key table: force every key there.
        index = store.keys["ubi_events"]
        real = index.filter.might_contain
        index.filter.might_contain = lambda hashes: real(hashes) | True  # type: ignore[method-assign]
        assert store.surely_new("ubi_events", [f"id:n{i}" for i in range(50)])
        assert not store.surely_new("ubi_events", ["id:n1", "id:s49"])
        index.filter.might_contain = real  # type: ignore[method-assign]
        with store.transaction() as cur:  # a raw transaction may write around the index: it cannot tell
            cur.execute("SELECT 1")
        assert not store.surely_new("ubi_events", ["id:n2"])


def test_key_hashes_a_caller_gives_are_the_ones_the_index_uses(tmp_path, make_event):
    # The collector's writer hashes a group's keys once for surely_new and hands the same hashes to the
    # commit (write_rows); a parse worker computes them with the rows. Given or computed, a retry must be
    # found the same way: the expected statuses are those of the same writes without hashes.
    from ubi_pipeline.store.keys import key_hashes
    from ubi_pipeline.store.rows import RowStatus

    now = utcnow()
    first = pa.Table.from_pylist(
        [event_row(UbiEvent.model_validate(make_event(event_id=f"k{i}")), now) for i in range(40)], schema=EVENT_SCHEMA)
    # a retry of 10 of them, a repeat inside the batch, and 5 new
    again = pa.concat_tables([first.slice(30, 10), first.slice(30, 1), pa.Table.from_pylist(
        [event_row(UbiEvent.model_validate(make_event(event_id=f"n{i}")), now) for i in range(5)], schema=EVENT_SCHEMA)])
    outcomes = []
    for given in (False, True):
        with Store(tmp_path / f"h{given}.duckdb") as store:
            for table in (first, again):
                keys = table.column("event_key").to_pylist()
                hashes = key_hashes(keys) if given else None
                outcome = store.write_rows(events=table, key_hashes=(None, hashes))
                outcomes.append(outcome.event_status)
            # after the writes (the filter is filled by the first), the retries are not new, other keys are
            for keys, new in ((again.column("event_key").to_pylist()[:10], False), ([f"id:m{i}" for i in range(9)], True)):
                assert store.surely_new("ubi_events", keys, key_hashes(keys) if given else None) is new
            assert store.read("SELECT count(*) FROM ubi_events") == [(45,)]
    assert outcomes[:2] == outcomes[2:]
    assert outcomes[1] == (RowStatus.DUPLICATE,) * 11 + (RowStatus.INSERTED,) * 5
    with Store(tmp_path / "bad.duckdb") as store:  # hashes that are not one per key are refused, never used
        keys = first.column("event_key").to_pylist()
        with pytest.raises(StoreError, match="40 keys: expected one uint64 per key"):
            store.write_rows(events=first, key_hashes=(None, key_hashes(keys)[:-1]))


def test_checkpoint_threshold_is_the_setting_within_a_quarter_of_the_writer_pool(tmp_path):
    """Settings.checkpoint_threshold (64MB) under the default 256MB pool; a quarter of a smaller pool, and
    DuckDB's own 16 MiB when that quarter is not more (a 32MB pool could not commit under 64MB: rows not yet
    checkpointed stay in the pool, tests/collector/test_store_attack.py)."""
    from ubi_pipeline.store.duckdb_store import _checkpoint_threshold, size_bytes

    assert [size_bytes(t) for t in ("256MB", "1.5GiB", "64kb", "7", "lots")] == [256_000_000, 1_610_612_736, 64_000, 7,
                                                                             None]
    assert _checkpoint_threshold("64MB", "256MB") == 64_000_000
    assert _checkpoint_threshold("64MB", "128MB") == 32_000_000
    assert _checkpoint_threshold("64MB", "32MB") is None and _checkpoint_threshold(None, "1GB") is None

    def threshold(settings: Settings) -> str:
        with Store.from_settings(settings, tmp_path / f"{settings.writer_memory_limit}.duckdb") as store:
            return store.con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]

    assert threshold(Settings(writer_memory_limit="256MB")) == "61.0 MiB"  # 64,000,000 bytes as DuckDB prints it
    assert threshold(Settings(writer_memory_limit="32MB")) == "16.0 MiB"  # DuckDB's own
