"""Reading a held store without copying it: incremental seals into Parquet segments (store/sealed.py).

Expected numbers are counts of rows this file writes itself (hand-computed from the loops below).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from ubi_pipeline.store.client import reading
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.sealed import (
    MANIFEST,
    SealFailed,
    decode_seal,
    default_root,
    encode_seal,
    open_sealed,
)

ROOT = Path(__file__).resolve().parents[2]
TABLES = ("ubi_queries", "ubi_events", "failed_records", "judgments", "judgment_runs", "human_judgments")


def add_events(store: Store, first: int, n: int, day: str = "2024-05-01") -> None:
    """``n`` events ``e<first>..``, one query per ten events, one failed record per 100, in one commit."""
    with store.transaction() as cur:
        cur.execute(
            "INSERT INTO ubi_events (event_key, event_id, action_name, query_id, timestamp, event_attributes, "
            "position_ordinal, received_at) "
            f"SELECT 'id:e' || i, 'e' || i, 'click', 'q' || (i // 10), TIMESTAMP '{day}' + INTERVAL (i) SECOND, "
            "'{\"a\": ' || i || '}', (i % 10)::INTEGER, "
            f"TIMESTAMP '{day}' + INTERVAL (i % 7200) SECOND FROM range({first}, {first + n}) r(i)"
        )
        cur.execute(
            "INSERT INTO ubi_queries (query_key, query_id, user_query, query_response_hit_ids, "
            "content_hash, received_at) "
            f"SELECT 'q' || (i // 10), 'q' || (i // 10), 'shoes', ['d1', 'd2'], 'h', TIMESTAMP '{day}' "
            f"FROM range({first}, {first + n}) r(i) WHERE i % 10 = 0 "
            "AND 'q' || (i // 10) NOT IN (SELECT query_key FROM ubi_queries)"
        )
        cur.execute(
            "INSERT INTO failed_records (failed_id, received_at, source, kind, reason, raw) "
            f"SELECT 'f' || i, TIMESTAMP '{day}', 'test', 'event', 'bad', 'raw'::BLOB "
            f"FROM range({first}, {first + n}) r(i) WHERE i % 100 = 0"
        )


def judgments(n: int) -> pa.Table:
    return pa.table({
        "query": [f"q{i}" for i in range(n)],
        "doc_id": ["d1"] * n,
        "source": ["implicit:ctr"] * n,
        "score": [i / n for i in range(n)],
        "created_at": pa.array([0] * n, pa.timestamp("us")),
    })


def shape(con, table: str) -> list[tuple[str, str]]:
    """Column names and types, in order (a view has no NOT NULL or key of its own to show)."""
    return [(r[0], r[1]) for r in con.execute(f"DESCRIBE {table}").fetchall()]


def sealed_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet")}


def test_a_seal_copies_only_what_was_stored_since_the_last_one(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as store:
        add_events(store, 0, 1000)
        first = store.seal()
        # 1000 events, 100 queries (one per ten events), 10 failed records (one per 100)
        assert first.new_rows == {"ubi_queries": 100, "ubi_events": 1000, "failed_records": 10}
        add_events(store, 1000, 50, day="2024-05-02")
        second = store.seal()
        assert second.new_rows == {"ubi_queries": 5, "ubi_events": 50, "failed_records": 1}
        files = sealed_files(first.root)
        third = store.seal()  # nothing new: no file written
        assert third.new_rows == {"ubi_queries": 0, "ubi_events": 0, "failed_records": 0}
        assert sealed_files(first.root) == files
        # Hive-partitioned by the day rows were received, one file per seal and day
        assert {Path(f).parent.name for f in files if f.startswith("ubi_events/")} == {"day=2024-05-01", "day=2024-05-02"}
        assert len([f for f in files if f.startswith("ubi_events/")]) == 2
        con = open_sealed(third)
        try:
            for table in ("ubi_queries", "ubi_events", "failed_records"):
                stored = store.con.sql(f"SELECT * FROM {table} ORDER BY ALL").to_arrow_table()
                read = con.sql(f"SELECT * FROM {table} ORDER BY ALL").to_arrow_table()
                assert read.equals(stored), table  # every row once, every value as stored
        finally:
            con.close()


def test_the_reader_sees_the_stores_tables_with_their_columns_and_types(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as store:
        add_events(store, 0, 30)
        store.load_table("judgments", judgments(4))
        sealed = store.seal()
        con = open_sealed(sealed)
        try:
            for table in TABLES:
                assert shape(con, table) == shape(store.con, table)
            assert con.execute("SELECT count(*), sum(score) FROM judgments").fetchone() == (4, 0 + 0.25 + 0.5 + 0.75)
            # JSON and lists read back as JSON and lists, so reader SQL on them runs unchanged
            assert con.execute("SELECT event_attributes->>'a' FROM ubi_events WHERE event_id = 'e7'").fetchone() == ("7",)
            assert con.execute("SELECT query_response_hit_ids[2] FROM ubi_queries LIMIT 1").fetchone() == ("d2",)
        finally:
            con.close()


def test_an_empty_store_reads_as_empty_tables(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as store:
        con = open_sealed(store.seal())
        try:
            assert [con.execute(f"SELECT count(*) FROM {t}").fetchone() for t in TABLES] == [(0,)] * len(TABLES)
        finally:
            con.close()


def test_the_answer_round_trips_and_a_cut_one_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as store:
        add_events(store, 0, 20)
        store.load_table("judgments", judgments(3))
        sealed = store.seal()
    body = b"".join(encode_seal(sealed))
    back = decode_seal(body)
    assert back.files == sealed.files and back.new_rows == sealed.new_rows
    assert len(back.files["judgments"]) == 1 and back.files["human_judgments"] == []  # a snapshot; no rows
    with pytest.raises(SealFailed, match="cut short"):
        decode_seal(body[:-5])
    # rows sent inline (the answer's other form) round-trip too
    sealed.inline = {"judgments": judgments(3)}
    assert decode_seal(b"".join(encode_seal(sealed))).inline["judgments"].equals(judgments(3))


def _snapshot_rows(sealed) -> list[tuple]:
    con = open_sealed(sealed)
    try:
        return con.execute("SELECT query, doc_id, source, score FROM judgments ORDER BY query").fetchall()
    finally:
        con.close()


def test_derived_tables_are_one_snapshot_file_rewritten_only_when_their_rows_change(tmp_path: Path) -> None:
    """Judgments are not sent with every answer: a Parquet snapshot, kept while its rows stay the same."""
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        add_events(store, 0, 10)
        store.load_table("judgments", judgments(3))
        first = store.seal()
        (snap,) = first.files["judgments"]
        stamp = snap.stat().st_mtime_ns
        assert first.inline == {}
        assert _snapshot_rows(first) == [(f"q{i}", "d1", "implicit:ctr", i / 3) for i in range(3)]
        add_events(store, 10, 5)  # new events, same judgments: the same file, not written again
        again = store.seal()
        assert again.files["judgments"] == [snap] and snap.stat().st_mtime_ns == stamp
        store.load_table("judgments", judgments(4), replace_source="implicit:ctr")  # replaced rows: a new file
        third = store.seal()
        (new,) = third.files["judgments"]
        assert new != snap and snap.exists()  # the old one stays for readers still scanning it
        assert _snapshot_rows(third) == [(f"q{i}", "d1", "implicit:ctr", i / 4) for i in range(4)]
        assert _snapshot_rows(first)[0] == ("q0", "d1", "implicit:ctr", 0.0)  # an earlier reader's file still reads
    with Store(db) as store:  # the writer's next start removes snapshots the manifest no longer names
        assert not snap.exists() and new.exists()
        assert store.seal().files["judgments"] == [new]


def test_a_store_that_no_longer_matches_its_manifest_is_sealed_again_from_scratch(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        add_events(store, 0, 100)
        store.seal()
    # The file is replaced by another store with as many rows but other keys (a restore, a copy elsewhere).
    db.unlink()
    with Store(db) as store:
        add_events(store, 5000, 100)
        sealed = store.seal()
        assert sealed.new_rows["ubi_events"] == 100  # all of them: the old watermark was not trusted
        con = open_sealed(sealed)
        try:
            assert con.execute("SELECT min(event_id), max(event_id), count(*) FROM ubi_events").fetchone() == (
                "e5000", "e5099", 100)
        finally:
            con.close()
        old_generation = [f for f in sealed_files(sealed.root) if not any(str(sealed.root / f) == str(p)
                                                                          for p in sealed.files["ubi_events"])]
        assert old_generation  # still on disk while this writer runs: a reader may be scanning them
    with Store(db) as store:  # the next start-up removes what no manifest names
        assert {str(p) for ps in store.seal().files.values() for p in ps} == {
            str(store.sealer.root / f) for f in sealed_files(store.sealer.root)}


def test_start_up_removes_a_seal_cut_short_and_keeps_the_sealed_files(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        add_events(store, 0, 10)
        kept = sealed_files(store.seal().root)
    root = default_root(db)
    (root / ".staging-abc" / "ubi_events").mkdir(parents=True)
    (root / ".staging-abc" / "ubi_events" / "x.parquet").write_bytes(b"half")
    (root / "ubi_events" / "day=2024-05-01" / "seg-orphan-000009-0.parquet").write_bytes(b"unnamed")
    with Store(db):
        pass
    assert not (root / ".staging-abc").exists()
    assert sealed_files(root) == kept


def test_an_unwritable_seal_directory_is_a_seal_failed_that_names_the_setting(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with Store(tmp_path / "s.duckdb", seal_dir=not_a_dir / "sealed") as store:
        add_events(store, 0, 10)
        with pytest.raises(SealFailed, match="UBI_SEAL_DIR"):
            store.seal()
    assert not_a_dir.read_text() == "x"


def test_a_seal_holds_whole_commits_and_does_not_pause_writers(tmp_path: Path) -> None:
    """A writer thread commits batches (one query and 20 events each) while seals copy a large store out.

    What the reader sees is a prefix of the batches, each whole (all 21 rows or none); several batches are
    committed while the first (large) seal runs, which a seal holding the store lock would forbid. A second
    seal adds what came since, and the two together hold every row once. Ordering of logged events only.
    """
    import threading

    with Store(tmp_path / "big.duckdb") as store:
        with store.transaction() as cur:  # 300,000 stored events make the first seal take some tenths of a second
            cur.execute(
                "INSERT INTO ubi_events (event_key, action_name, timestamp, received_at, user_query) "
                "SELECT 'pre' || i, 'impression', TIMESTAMP '2024-01-01' + INTERVAL (i) SECOND, "
                "TIMESTAMP '2024-01-01', md5(i::VARCHAR) FROM range(300000) r(i)"
            )
        log: list[tuple[str, int]] = []
        stop = threading.Event()

        def write_batches() -> None:
            k = 0
            while not stop.is_set():
                with store.transaction() as cur:
                    cur.execute("INSERT INTO ubi_queries (query_key, query_id, user_query, content_hash, received_at) "
                                f"VALUES ('q{k}', 'q{k}', 'shoes', 'h', now())")
                    cur.execute("INSERT INTO ubi_events (event_key, event_id, action_name, timestamp, received_at) "
                                f"SELECT 'id:e{k}-' || i, 'e{k}-' || i, 'click', now(), now() FROM range(20) r(i)")
                log.append(("commit", k))
                k += 1
                time.sleep(0.001)

        writer = threading.Thread(target=write_batches)
        writer.start()
        try:
            while not log:
                stop.wait(0.001)
            log.append(("seal-start", -1))
            store.seal()
            log.append(("seal-end", -1))
            time.sleep(0.05)
            second = store.seal()
        finally:
            stop.set()
            writer.join()
        start, end = log.index(("seal-start", -1)), log.index(("seal-end", -1))
        during = [k for what, k in log[start + 1:end] if what == "commit"]
        assert len(during) >= 3, f"only {len(during)} writes committed while the seal copied"
        con = open_sealed(second)
        try:
            per_batch = dict(con.execute("SELECT split_part(event_id, '-', 1), count(*) FROM ubi_events "
                                         "WHERE event_id IS NOT NULL GROUP BY 1").fetchall())
            stored_queries = {q for (q,) in con.execute("SELECT query_id FROM ubi_queries").fetchall()}
            assert con.execute("SELECT count(*), count(DISTINCT event_key) FROM ubi_events WHERE event_id IS NULL"
                               ).fetchone() == (300000, 300000)
        finally:
            con.close()
    n = len(stored_queries)
    assert stored_queries == {f"q{k}" for k in range(n)}  # a prefix of the batches,
    assert per_batch == {f"e{k}": 20 for k in range(n)}  # each whole, every row once
    assert n > end - start - 1  # and the second seal added those committed after the first one


# ---------------------------------------------------------------- a reader killed mid-read

READER = """
import sys, threading, time
from ubi_pipeline.store.client import reading
with reading(sys.argv[1]) as con:
    n = con.execute("SELECT count(*) FROM ubi_events").fetchone()[0]
    print("open", n, flush=True)
    # a long scan of the sealed segments: killed while it runs
    con.execute("SELECT count(DISTINCT md5(e.event_key || r.i)) FROM ubi_events e, range(200) r(i)").fetchall()
    print("finished", flush=True)
"""


@contextlib.contextmanager
def serving(db: Path, env: dict[str, str]) -> Iterator[None]:
    """``ubi serve`` holding ``db`` (port 0) until the block ends."""
    serve = subprocess.Popen([sys.executable, "-m", "ubi_pipeline", "serve", "--db", str(db), "--port", "0"], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        assert re.search(r"http://127\.0\.0\.1:\d+", line), f"ubi serve did not start: {line!r}"
        yield
    finally:
        serve.terminate()
        serve.wait(timeout=60)


def tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def test_a_reader_killed_mid_read_leaves_nothing_behind(tmp_path: Path) -> None:
    work, cwd = tmp_path / "store", tmp_path / "reader-cwd"
    work.mkdir()
    cwd.mkdir()
    db = work / "ubi.duckdb"
    with Store(db) as store:
        add_events(store, 0, 50_000)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with serving(db, env):
        assert json.loads((work / "ubi.duckdb.collector.json").read_text())["url"]
        reader = subprocess.Popen([sys.executable, "-c", READER, str(db)], cwd=cwd, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert reader.stdout is not None
        opened = reader.stdout.readline().split()
        assert opened == ["open", "50000"], (opened, reader.stderr.read() if reader.poll() is not None else "")
        during = tree(work)
        time.sleep(0.5)  # well inside the scan (it runs for many seconds)
        assert reader.poll() is None, "the reader finished before it could be killed"
        reader.send_signal(signal.SIGKILL)
        reader.wait(timeout=30)
        after = tree(work)
        # Nothing on disk is the reader's: the store's folder holds what it held while the reader ran (the
        # database, the sidecar, the sealed segments every reader shares), and the reader's own folder is empty.
        assert after.keys() == during.keys()
        assert not [p for p in after if ".snapshot-" in p]
        assert list(cwd.iterdir()) == []
        manifest = json.loads((default_root(db) / MANIFEST).read_text())
        named = {f for t in manifest["tables"].values() for f in t["files"]}
        assert {p for p in after if p.endswith(".parquet")} == {f"ubi.duckdb.sealed/{f}" for f in named}
        # A second reader reuses the segments: it seals nothing new and adds no file
        with_second = subprocess.run(
            [sys.executable, "-c", "import sys; from ubi_pipeline.store.client import reading\n"
             "with reading(sys.argv[1]) as con: print(con.execute('SELECT count(*) FROM ubi_events').fetchone()[0])",
             str(db)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert with_second.stdout.strip() == "50000", with_second.stderr
        assert tree(work).keys() == during.keys()


YIELDING = """
import os, sys
from ubi_pipeline.store.client import reading
for _ in range(2):  # a second read does not lower the priority further
    with reading(sys.argv[1]) as con:
        threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
        print(os.nice(0), threads, con.execute("SELECT count(*) FROM ubi_events").fetchone()[0], flush=True)
"""


def test_a_reader_of_a_live_store_steps_back_for_the_writer(tmp_path: Path) -> None:
    """While ``ubi serve`` holds the store a reader runs at the nice value ``UBI_READER_NICE`` (3 above the one
    it started at, here) with ``UBI_READER_THREADS`` DuckDB threads, by default one less than the cores (at
    least 1), and a second read lowers nothing further; reading the free file it keeps its priority and
    DuckDB's threads (one per core)."""
    start = os.nice(0)  # a subprocess starts at this process's nice value
    if start > 16:
        pytest.skip(f"this process runs at nice {start}: no room to lower a reader's priority by 3")
    db = tmp_path / "ubi.duckdb"
    with Store(db) as store:
        add_events(store, 0, 1_000)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "UBI_READER_NICE": str(start + 3)}
    cores = os.cpu_count() or 1
    free = subprocess.run([sys.executable, "-c", YIELDING, str(db)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert free.stdout.split("\n")[:2] == [f"{start} {cores} 1000"] * 2, free.stderr
    with serving(db, env):
        for threads, expected in ((None, max(1, cores - 1)), ("3", 3)):
            run_env = env if threads is None else {**env, "UBI_READER_THREADS": threads}
            live = subprocess.run([sys.executable, "-c", YIELDING, str(db)], cwd=tmp_path, env=run_env,
                                  capture_output=True, text=True, timeout=120)
            assert live.stdout.split("\n")[:2] == [f"{start + 3} {expected} 1000"] * 2, live.stderr


def test_reading_a_free_store_opens_the_file_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        add_events(store, 0, 10)
    before = tree(tmp_path)
    with reading(db) as con:
        assert con.execute("SELECT count(*) FROM ubi_events").fetchone() == (10,)
        # the file itself, read-only
        assert con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
                           ).fetchone() == (str(db),)
    assert tree(tmp_path).keys() == before.keys()


def test_a_large_backlog_is_sealed_in_chunks_each_row_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ubi_pipeline.store.sealed

    monkeypatch.setattr(ubi_pipeline.store.sealed, "CHUNK_ROWS", 300)
    with Store(tmp_path / "s.duckdb") as store_:
        add_events(store_, 0, 1000)
        sealed = store_.seal()
        # rowids 0..999 in chunks of 300: (-1, 299], (299, 599], (599, 899], (899, 999]: four files, one day
        assert len(sealed.files["ubi_events"]) == 4
        con = open_sealed(sealed)
        try:
            assert con.execute("SELECT count(*), count(DISTINCT event_key) FROM ubi_events").fetchone() == (1000, 1000)
        finally:
            con.close()


def test_a_seal_cut_short_leaves_the_manifest_in_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(tmp_path / "s.duckdb") as store:
        add_events(store, 0, 100)
        first = store.seal()
        add_events(store, 100, 10)

        def full_disk(*args: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr("ubi_pipeline.store.sealed.os.replace", full_disk)
        with pytest.raises(SealFailed, match="No space left"):
            store.seal()
        monkeypatch.undo()
        again = store.seal()
        assert again.new_rows["ubi_events"] == 10  # the 10 rows the failed seal did not publish, once
        con = open_sealed(again)
        try:
            assert con.execute("SELECT count(*), count(DISTINCT event_key) FROM ubi_events").fetchone() == (110, 110)
        finally:
            con.close()
        assert len(again.files["ubi_events"]) == len(first.files["ubi_events"]) + 1


def test_a_large_chunk_is_sealed_within_the_writers_memory_limit(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A partitioned COPY buffers rows in DuckDB's pool until it flushes: at DuckDB's default flush threshold
    (524,288 rows) 300,000 of these events (one day, one chunk) do not fit a 16 MB writer pool, and the seal is
    a SealFailed naming the setting, with nothing sealed; at FLUSH_ROWS the same chunk is sealed whole. (The
    sizes were found by trying: the real case was a 1M-row chunk of a 20M-event store under the collector's
    256 MB, README "Reading without copying".)"""
    import ubi_pipeline.store.sealed

    with Store(tmp_path / "s.duckdb", memory_limit="16MB") as store_:
        add_events(store_, 0, 300_000)
        monkeypatch.setattr(ubi_pipeline.store.sealed, "FLUSH_ROWS", 524_288)
        with pytest.raises(SealFailed, match="UBI_WRITER_MEMORY_LIMIT"):
            store_.seal()
        assert sealed_files(default_root(tmp_path / "s.duckdb")) == set()
        monkeypatch.undo()
        sealed = store_.seal()
        assert sealed.new_rows["ubi_events"] == 300_000
        con = open_sealed(sealed)
        try:
            assert con.execute("SELECT count(*), count(DISTINCT event_key) FROM ubi_events").fetchone() == (
                300_000, 300_000)
        finally:
            con.close()
