"""Unique keys without an index in memory (store/keys.py): key rows point at their rows, collisions keep
both records, old stores are migrated on open, rows written around the store get their keys."""

from __future__ import annotations

import dataclasses

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.ubi import UbiEvent
from ubi_pipeline.store import keys as store_keys
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.keys import KeyFilter, KeyIndex, key_hashes
from ubi_pipeline.store.rows import EVENT_SCHEMA, RowStatus, event_row, failed_row, failed_table, utcnow

INSERTED, DUPLICATE, CONFLICT = RowStatus.INSERTED, RowStatus.DUPLICATE, RowStatus.CONFLICT


def events(*records) -> pa.Table:
    now = utcnow()
    return pa.Table.from_pylist([event_row(UbiEvent.model_validate(r), now) for r in records], schema=EVENT_SCHEMA)


def _mismatched_key_rows(path) -> tuple[int, int, int]:
    """(events, key rows, key rows whose hash is not that of the event at their row_id)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        row = con.execute("""
            SELECT (SELECT count(*) FROM ubi_events), (SELECT count(*) FROM ubi_event_keys),
                   (SELECT count(*) FROM ubi_event_keys k LEFT JOIN ubi_events e ON e.rowid = k.row_id
                    WHERE e.event_key IS NULL OR md5_number_lower(e.event_key) <> k.key_hash)""").fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def test_key_rows_point_at_their_rows_after_a_rolled_back_write(tmp_path, make_event):
    """A write that fails after its inserts is rolled back; the next write's rows take the rowids the
    rolled-back ones had, and its key rows say so (checked for every row, by hash, in a fresh connection)."""
    path = tmp_path / "s.duckdb"
    first = [make_event(event_id=f"a{i}") for i in range(3)]

    def fail(positions):
        raise RuntimeError("the conflict could not be kept")

    with Store(path) as store:
        store.write_rows(events=events(*first))
        with pytest.raises(RuntimeError):
            # new events, then a conflict whose callback raises: the whole transaction is rolled back
            store.write_rows(events=events(make_event(event_id="r1"), dict(first[0], action_name="x")),
                             event_conflicts=fail)
        b1 = make_event(event_id="b1")
        out = store.write_rows(events=events(b1, make_event(event_id="b2")))
        assert out.event_status == (INSERTED, INSERTED)
        # the rolled-back r1 was never stored: it is new now
        assert store.write_rows(events=events(make_event(event_id="r1"))).event_status == (INSERTED,)
    assert _mismatched_key_rows(path) == (6, 6, 0)
    with Store(path) as store:  # reopened: the filter is rebuilt from the key table, duplicates still found
        again = store.write_rows(events=events(*first, b1))
        assert again.event_status == (DUPLICATE,) * 4


def test_keys_that_share_a_hash_are_all_stored(tmp_path, make_event, monkeypatch):
    """Every key hashed to the same 64 bits (a collision on every write): the exact key decides, so each
    distinct event is stored once, a retry is a duplicate and another event under a taken id a conflict."""
    monkeypatch.setattr(KeyIndex, "hashes", lambda self, keys: np.full(len(keys), 42, dtype=np.uint64))
    a, b, c = make_event(event_id="a"), make_event(event_id="b"), make_event()  # c: key from its content
    with Store(tmp_path / "s.duckdb") as store:
        assert store.write_rows(events=events(a)).event_status == (INSERTED,)
        out = store.write_rows(events=events(b, a, c, dict(a, action_name="view"), c))
        assert out.event_status == (INSERTED, DUPLICATE, INSERTED, CONFLICT, DUPLICATE)
        assert store.read("SELECT count(*), count(DISTINCT event_key) FROM ubi_events") == [(3, 3)]
    # small writes' key rows are held in memory until KEY_FLUSH_ROWS of them or the store closes
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT count(*), count(DISTINCT key_hash) FROM ubi_event_keys").fetchall() == [(3, 1)]
    finally:
        con.close()


def test_an_old_store_with_primary_keys_is_migrated_on_open(tmp_path, make_event):
    """A store made with PRIMARY KEYs on ubi_events / ubi_queries (before store/keys.py) opens: the keys
    become key tables, every row keeps its rowid, and what was stored is still found."""
    path = tmp_path / "old.duckdb"
    stored = [make_event(event_id=f"e{i}") for i in range(5)] + [make_event()]
    con = duckdb.connect(str(path))
    for table in (tables.QUERY_TABLE, tables.EVENT_TABLE):  # the DDL before: the key as PRIMARY KEY
        con.execute(dataclasses.replace(table, key_table=None).ddl())
    _old_rows = events(*stored)  # noqa: F841 (read by DuckDB by name)
    con.execute("INSERT INTO ubi_events SELECT * FROM _old_rows")
    before = con.execute("SELECT rowid, event_key FROM ubi_events ORDER BY rowid").fetchall()
    assert con.execute("SELECT count(*) FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY'").fetchone() == (2,)
    con.close()

    with Store(path) as store:
        assert store.read("SELECT count(*) FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY' "
                          "AND table_name IN ('ubi_events', 'ubi_queries')") == [(0,)]
        assert store.read("SELECT rowid, event_key FROM ubi_events ORDER BY rowid") == before
        out = store.write_rows(events=events(*stored, dict(stored[0], action_name="view"), make_event()))
        assert out.event_status == (DUPLICATE,) * 6 + (CONFLICT, INSERTED)
        assert store.write_rows(queries=None, events=None).event_status == ()
    assert _mismatched_key_rows(path) == (7, 7, 0)


def test_rows_written_around_the_store_get_their_keys_on_open(tmp_path, make_event):
    """``bulk_log`` and benches insert into ubi_events directly: the next open adds their key rows."""
    path = tmp_path / "s.duckdb"
    a, b = make_event(event_id="a"), make_event(event_id="b")
    with Store(path) as store:
        store.write_rows(events=events(a))
    con = duckdb.connect(str(path))
    _direct = events(b)  # noqa: F841 (read by DuckDB by name)
    con.execute("INSERT INTO ubi_events SELECT * FROM _direct")
    con.close()
    assert _mismatched_key_rows(path) == (2, 1, 0)
    with Store(path) as store:
        assert store.write_rows(events=events(a, b, dict(b, action_name="view"))).event_status == (
            DUPLICATE, DUPLICATE, CONFLICT)
    assert _mismatched_key_rows(path) == (2, 2, 0)


def test_a_key_table_that_does_not_match_its_rows_is_rebuilt(tmp_path, make_event):
    path = tmp_path / "s.duckdb"
    stored = [make_event(event_id=f"e{i}") for i in range(4)]
    with Store(path) as store:
        store.write_rows(events=events(*stored))
    con = duckdb.connect(str(path))
    con.execute("UPDATE ubi_event_keys SET key_hash = key_hash + 1 WHERE row_id = 3")  # a wrong key row
    con.close()
    with Store(path) as store:
        assert store.write_rows(events=events(stored[3])).event_status == (DUPLICATE,)
    assert _mismatched_key_rows(path) == (4, 4, 0)


def test_the_query_table_is_kept_unique_the_same_way(tmp_path, make_query):
    from ubi_pipeline.schemas.ubi import UbiQuery
    from ubi_pipeline.store.rows import QUERY_SCHEMA, query_row

    def queries(*records):
        return pa.Table.from_pylist([query_row(UbiQuery.model_validate(r), utcnow()) for r in records],
                                    schema=QUERY_SCHEMA)

    a = make_query(query_id="a")
    with Store(tmp_path / "s.duckdb") as store:
        kept = []

        def keep(positions):
            kept.extend(positions)
            return failed_table([failed_row(source="t", kind="conflict", reason="r", raw=b"") for _ in positions])

        assert store.write_rows(queries=queries(a)).query_status == (INSERTED,)
        out = store.write_rows(queries=queries(a, dict(a, user_query="other"), make_query(query_id="b")),
                               conflicts=keep)
        assert out.query_status == (DUPLICATE, CONFLICT, INSERTED) and kept == [1]
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)  # key rows written on close at the latest
    try:
        assert con.execute("SELECT count(*) FROM ubi_query_keys").fetchall() == [(2,)]
    finally:
        con.close()


def test_the_filter_has_no_false_negatives_and_few_false_positives() -> None:
    """A blocked Bloom filter (Putze et al. 2007), 6 bits set per key in one 64-bit word: 100,000 keys in 2^15
    words (21 bits a key) let through 0.16 % of 200,000 keys never added (seed 7, measured); at 16 bits a key
    0.4 %, at 8 bits 3.8 % (measured alike). The test allows 1 %."""
    rng = np.random.default_rng(7)
    added = rng.integers(0, 2**64 - 1, 100_000, dtype=np.uint64, endpoint=True)
    f = KeyFilter(100_000)
    f.add(added)
    assert f.might_contain(added).all()
    others = rng.integers(0, 2**64 - 1, 200_000, dtype=np.uint64, endpoint=True)
    rate = float(f.might_contain(others).mean())
    assert rate < 0.01, rate
    assert f.capacity >= 100_000 and len(f.words) * 8 <= 2 * 100_000 * 16 // 8  # 16 bits a key, a power of 2


def test_the_filter_stops_growing_at_its_cap(monkeypatch) -> None:
    monkeypatch.setattr(store_keys, "MAX_FILTER_BYTES", 1 << 17)
    f = KeyFilter(10_000_000)
    assert len(f.words) * 8 == 1 << 17 and not f.full
    f.add(np.arange(200_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    assert not f.full  # past its capacity, but it may not grow: it only says "maybe" more often


def _insert_around(store: Store, *records) -> None:
    """A raw INSERT of ``records`` through ``Store.transaction`` (as tests and benches write rows)."""
    with store.transaction() as cur:
        _direct = events(*records)  # noqa: F841 (read by DuckDB by name)
        cur.execute("INSERT INTO ubi_events SELECT * FROM _direct")


def test_rows_inserted_through_the_open_stores_transaction_are_found(tmp_path, make_event):
    """A raw INSERT through ``Store.transaction`` (as tests and benches do) gets its key rows at the next write."""
    a, b = make_event(event_id="a"), make_event(event_id="b")
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        store.write_rows(events=events(a))
        _insert_around(store, b)
        out = store.write_rows(events=events(b, a, make_event(event_id="c")))
        assert out.event_status == (DUPLICATE, DUPLICATE, INSERTED)
    assert _mismatched_key_rows(path) == (3, 3, 0)


def test_raw_inserts_around_a_write_that_stored_nothing_are_found(tmp_path, make_event):
    """A write whose every row was stored already commits no key rows: the raw insert before it is still
    counted by the next write (the index only skips its count(*) after a committed write of its own)."""
    a, b, c = (make_event(event_id=x) for x in "abc")
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        store.write_rows(events=events(a))
        _insert_around(store, b)
        assert store.write_rows(events=events(a)).event_status == (DUPLICATE,)
        _insert_around(store, c)
        out = store.write_rows(events=events(b, c, a, make_event(event_id="d")))
        assert out.event_status == (DUPLICATE, DUPLICATE, DUPLICATE, INSERTED)
    assert _mismatched_key_rows(path) == (4, 4, 0)


def test_a_write_after_a_write_does_not_count_the_table(tmp_path, make_event, monkeypatch):
    """Only this store writes the file: after its own committed write, the next one needs no count(*) to
    find rows committed around the index; after a raw transaction it counts again."""
    counted: list[str] = []
    real = store_keys._one

    def spy(con, sql):
        if "count(*)" in sql:
            counted.append(sql)
        return real(con, sql)

    monkeypatch.setattr(store_keys, "_one", spy)
    with Store(tmp_path / "s.duckdb") as store:
        store.write_rows(events=events(make_event(event_id="a")))
        counted.clear()
        store.write_rows(events=events(make_event(event_id="b")))
        store.write_rows(events=events(make_event(event_id="c")))
        assert counted == []
        with store.transaction() as cur:
            cur.execute("SELECT 1")
        store.write_rows(events=events(make_event(event_id="d")))
        assert counted == ['SELECT count(*) FROM "ubi_events"']


def test_key_rows_held_in_memory_are_found_flushed_and_survive_a_rollback(tmp_path, make_event, monkeypatch):
    """Small writes hold their key rows in memory until KEY_FLUSH_ROWS of them (here 3): retries find rows
    whether their key rows are in memory or in the key table, and a rolled-back transaction that flushed
    leaves the held rows held."""
    monkeypatch.setattr(store_keys, "KEY_FLUSH_ROWS", 3)
    ev = [make_event(event_id=f"e{i}") for i in range(7)]
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        for e in ev[:2]:
            store.write_rows(events=events(e))
        assert store.read("SELECT count(*) FROM ubi_event_keys") == [(0,)]
        store.write_rows(events=events(ev[2]))  # the third held row: all three written
        assert store.read("SELECT count(*) FROM ubi_event_keys") == [(3,)]
        store.write_rows(events=events(ev[3]))
        assert store.write_rows(events=events(*ev[:4])).event_status == (DUPLICATE,) * 4
        with pytest.raises(RuntimeError), store.batch():
            store.write_rows(events=events(ev[4], ev[5]))  # held: 3 -> flushed with e3, in this transaction
            raise RuntimeError("rolled back")
        assert store.read("SELECT count(*) FROM ubi_event_keys") == [(3,)]
        out = store.write_rows(events=events(ev[3], ev[4], ev[5], ev[6]))
        assert out.event_status == (DUPLICATE, INSERTED, INSERTED, INSERTED)
        assert store.write_rows(events=events(*ev)).event_status == (DUPLICATE,) * 7
    assert _mismatched_key_rows(path) == (7, 7, 0)


def test_key_rows_lost_with_the_process_are_written_on_open(tmp_path, make_event):
    """A writer that dies holding key rows in memory (the connection closed without Store.close): the rows
    are committed, so the next open writes their key rows and a retry is a duplicate."""
    ev = [make_event(event_id=f"e{i}") for i in range(5)]
    path = tmp_path / "s.duckdb"
    store = Store(path)
    for e in ev:
        store.write_rows(events=events(e))
    store.con.close()  # no Store.close: the held key rows are never written
    assert _mismatched_key_rows(path) == (5, 0, 0)
    with Store(path) as store:
        assert store.write_rows(events=events(*ev)).event_status == (DUPLICATE,) * 5
    assert _mismatched_key_rows(path) == (5, 5, 0)


def test_the_writers_key_hashes_are_duckdbs_md5_number_lower() -> None:
    """The writer hashes keys in Python, the key table is filled by DuckDB's SQL on open: they must agree
    (ASCII, accents, astral characters, the empty string, the key shapes of ubi_pipeline.schemas.ubi)."""
    keys = ["abc", "", "id:é€😀", "h:" + "f" * 32, "q1\x1fr1", "id:" + "x" * 100]
    con = duckdb.connect()
    expected = [h for (h,) in con.execute("SELECT md5_number_lower(k) FROM unnest(?) t(k)", [keys]).fetchall()]
    assert key_hashes(keys).tolist() == expected
    assert expected[0] == 8250560606382298838  # md5_number_lower('abc') as DuckDB 2.0.1 prints it


def test_block_filters_have_no_false_negatives_and_few_false_positives() -> None:
    """One filter per block of BLOCK_ROWS rowids (ubi_pipeline.store.keys.BlockFilters): each stored hash finds its own
    block, and a hash never added passes 0.32 % of the blocks' filters (seed 11, measured: 252 of the 80,000
    checks of 20,000 such hashes against 4 full blocks; about KeyFilter's 0.4 % at 16 bits a key, above). The
    test allows 1 %."""
    rng = np.random.default_rng(11)
    n = 4 * store_keys.BLOCK_ROWS
    added = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    f = store_keys.BlockFilters()
    f.add(added, np.arange(n))
    assert f.blocks == 4 and f.nbytes == 4 * 256 * 1024  # 256 KB a block
    sample = rng.choice(n, 2000, replace=False)
    for i in sample.tolist():
        found = f.candidates(added[i:i + 1])
        assert found is not None and i // store_keys.BLOCK_ROWS in found.tolist()
    others = rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64, endpoint=True)
    false = sum(len(f.candidates(others[i:i + 1])) for i in range(len(others)))  # type: ignore[arg-type]
    assert false / (4 * len(others)) < 0.01, false
    assert f.candidates(others[:1000], most=1) is None  # a thousand keys may be anywhere: "scan it all"


def test_a_retry_reads_only_the_block_that_holds_its_key(tmp_path, make_event, monkeypatch):
    """Blocks of 4 rowids, 40 events stored (10 blocks): a retry of the 18th event, a conflict on the 34th and a
    new event read the key table only in the blocks their filters name (rowids 16-19 and 32-35), before and
    after the store is reopened (filters rebuilt from the key table) and for rows inserted around the store;
    a retry of all 40 at once points at every block and scans the table once. Outcomes as without blocks."""
    monkeypatch.setattr(store_keys, "BLOCK_ROWS", 4)
    read: list[list[tuple[int, int]]] = []
    ranges = store_keys.block_ranges
    monkeypatch.setattr(store_keys, "block_ranges", lambda blocks: read.append(ranges(blocks)) or read[-1])
    stored = [make_event(event_id=f"e{i}") for i in range(40)]
    around = [make_event(event_id=f"d{i}") for i in range(4)]
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        store.write_rows(events=events(*stored))
    for reopened in (False, True):
        with Store(path) as store:
            if reopened:  # 4 rows written around the store: rowids 40-43, found through KeyIndex.sync
                with store.transaction() as cur:
                    _direct = events(*around)  # noqa: F841 (read by DuckDB by name)
                    cur.execute("INSERT INTO ubi_events SELECT * FROM _direct")
            read.clear()
            out = store.write_rows(events=events(stored[17], dict(stored[33], action_name="view"),
                                                 make_event(event_id=f"new{reopened}")))
            assert out.event_status == (DUPLICATE, CONFLICT, INSERTED)
            assert read == [[(16, 20), (32, 36)]], read  # the new key: ruled out by the global filter first
            if reopened:
                read.clear()
                assert store.write_rows(events=events(around[2])).event_status == (DUPLICATE,)
                assert read == [[(40, 44)]]
            read.clear()
            out = store.write_rows(events=events(*stored))
            assert out.event_status == (DUPLICATE,) * 40 and read == []  # every block: one scan, no ranges
    assert _mismatched_key_rows(path) == (46, 46, 0)  # 40 + 4 written around + 2 new


def test_block_filters_stop_at_their_cap_and_read_the_blocks_past_it(monkeypatch) -> None:
    """Capped at 2 blocks' filters (512 KB): blocks 2-4 get none, so every hash may be in them; a hash of block
    1 finds blocks 1-4, a hash never added at least 2-4; memory stays at the cap."""
    monkeypatch.setattr(store_keys, "MAX_BLOCK_FILTER_BYTES", 2 * 256 * 1024)
    rng = np.random.default_rng(3)
    n = 5 * store_keys.BLOCK_ROWS
    added = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    f = store_keys.BlockFilters(n)
    f.add(added, np.arange(n))
    assert f.blocks == 5 and f.nbytes == 2 * 256 * 1024
    found = f.candidates(added[store_keys.BLOCK_ROWS + 7:store_keys.BLOCK_ROWS + 8])
    assert found is not None and found.tolist()[-3:] == [2, 3, 4] and 1 in found.tolist()
    never = f.candidates(np.array([12345], dtype=np.uint64))
    assert never is not None and set(never.tolist()) >= {2, 3, 4}
    assert f.candidates(added[:1], most=2) is None  # the three unfiltered blocks alone are more than 2


def test_writes_in_one_batch_see_each_other_and_commit_or_roll_back_together(tmp_path, make_event):
    """Store.batch: several write_rows in one transaction (ubi import's). A later write finds the keys an
    earlier one of the same batch inserted (a retry is a duplicate, other content a conflict); a batch that
    fails leaves nothing, and the key rows of what was committed point at their rows."""
    path = tmp_path / "s.duckdb"
    a, b = make_event(event_id="a"), make_event(event_id="b")
    kept: list[int] = []

    def keep(positions):
        kept.extend(positions)
        return failed_table([failed_row(source="t", kind="conflict", reason="r", raw=b"{}", item_index=p,
                                        received_at=utcnow()) for p in positions])

    with Store(path) as store:
        with store.batch():
            assert store.write_rows(events=events(a)).event_status == (INSERTED,)
            out = store.write_rows(events=events(a, dict(a, action_name="other"), b), event_conflicts=keep)
            assert out.event_status == (DUPLICATE, CONFLICT, INSERTED)
        assert kept == [1]
        c = make_event(event_id="c")
        with pytest.raises(RuntimeError), store.batch():
            store.write_rows(events=events(c))
            raise RuntimeError("the import stopped")
        # c was rolled back: new again; a and b were committed: duplicates
        assert store.write_rows(events=events(c, a, b)).event_status == (INSERTED, DUPLICATE, DUPLICATE)
    # hand count: a, b, then c: 3 events, 3 key rows, each at its row
    assert _mismatched_key_rows(path) == (3, 3, 0)
