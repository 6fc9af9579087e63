"""The embedded DuckDB store: one writing process, readers through snapshots.

DuckDB lets one process open a file for writing, and no other process may open it at all while it does.
The design (README, "One writer, many readers"):

* The process that owns the file (``ubi serve``, or a command run while no collector runs) holds a
  :class:`Store` opened read-write. Every write is one transaction over whole Arrow batches; a 202 is sent
  only after it committed (DuckDB fsyncs its WAL on commit).
* A running collector advertises itself in a sidecar file next to the database (``<db>.collector.json``).
* Readers (``ubi process``, ``ubi report``) call :func:`open_reader`: when the file is free they open it
  read-only; when a collector holds it, they ask the collector for a consistent snapshot
  (``POST /v1/admin/snapshot``: a copy of the database as of one commit, made in a read transaction while
  the writer keeps committing) and read that. Derived tables they produce go back through the collector
  (``POST /v1/admin/load/{table}``), so the one writer stays the one writer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from schemas import tables
from schemas.errors import StoreError, StoreLocked

#: Derived tables other processes may load through a running collector.
LOADABLE_TABLES = ("judgments", "human_judgments")


def sidecar_path(db: Path) -> Path:
    """Where a running collector advertises its URL for the database ``db``."""
    return Path(str(db) + ".collector.json")


def _is_lock_error(exc: Exception) -> bool:
    return "lock" in str(exc).lower()


def utcnow() -> datetime:
    """Now, as a naive UTC datetime (the stored convention for TIMESTAMP columns)."""
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class WriteResult:
    """What one committed write did."""

    queries_inserted: int = 0
    queries_duplicate: int = 0
    query_conflicts: tuple[int, ...] = ()  # batch positions of conflicting query records
    events_inserted: int = 0
    events_duplicate: int = 0
    failed_inserted: int = 0
    event_conflicts: tuple[int, ...] = ()  # batch positions of conflicting events


#: Per-row outcome codes of a query record or an event in :class:`RowOutcome`.
INSERTED, DUPLICATE, CONFLICT = 0, 1, 2


@dataclass(frozen=True)
class RowOutcome:
    """What one committed write did to every row: INSERTED, DUPLICATE or CONFLICT per query and event row."""

    query_status: tuple[int, ...] = ()  # one per query row
    event_status: tuple[int, ...] = ()  # one per event row
    failed_inserted: int = 0

    @property
    def event_inserted(self) -> tuple[bool, ...]:
        """Whether each event row was new."""
        return tuple(s == INSERTED for s in self.event_status)

    def summary(self) -> WriteResult:
        q_ins = sum(1 for s in self.query_status if s == INSERTED)
        conflicts = tuple(i for i, s in enumerate(self.query_status) if s == CONFLICT)
        e_ins = sum(1 for s in self.event_status if s == INSERTED)
        e_conflicts = tuple(i for i, s in enumerate(self.event_status) if s == CONFLICT)
        return WriteResult(
            queries_inserted=q_ins,
            queries_duplicate=len(self.query_status) - q_ins - len(conflicts),
            query_conflicts=conflicts,
            events_inserted=e_ins,
            events_duplicate=len(self.event_status) - e_ins - len(e_conflicts),
            failed_inserted=self.failed_inserted,
            event_conflicts=e_conflicts,
        )


#: Columns of an event that are its content: all but the dedup key and the server's arrival time.
EVENT_CONTENT_COLUMNS = tuple(c for c in tables.EVENT_COLUMNS if c not in ("event_key", "received_at"))
_EVENT_CONTENT = EVENT_CONTENT_COLUMNS
_EVENT_JSON = frozenset({"event_attributes", "extra"})


def event_content_hash(row: Mapping[str, Any]) -> str:
    """SHA-256 (first 32 hex) of a stored event row's content, the same whatever its JSON key order.

    Compared only for rows whose ``event_key`` is already taken, to tell a retry (same content) from a
    different event re-using an ``event_id`` (a conflict). The JSON columns are parsed so that
    ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}`` count as the same content.
    """
    return event_content_digest([row[c] for c in _EVENT_CONTENT])


def event_content_digest(values: Sequence[Any]) -> str:
    """:func:`event_content_hash` of the values of :data:`EVENT_CONTENT_COLUMNS`, in that order."""
    parsed = [
        orjson.loads(v) if c in _EVENT_JSON and v is not None else v
        for c, v in zip(_EVENT_CONTENT, values, strict=True)
    ]
    return hashlib.sha256(
        orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS | orjson.OPT_NAIVE_UTC)
    ).hexdigest()[:32]


def insert_arrow(
    cur: duckdb.DuckDBPyConnection, head: str, columns: str, rows: pa.Table, tail: str = ""
) -> list[tuple[Any, ...]]:
    """Run ``{head} SELECT {columns} FROM <rows> {tail}`` and return what it returns (RETURNING rows).

    DuckDB reads ``rows`` through a replacement scan: a table name it does not know is looked up among the
    calling frame's Python variables, here the local ``_ubi_arrow_rows``. ``register``/``unregister`` would do
    the same with two more statements; on a 16-event group commit they were 0.5 of 2.4 ms of CPU (DuckDB
    2.0), and every statement is one more hand-over of the GIL between the writer and the event loop.
    """
    _ubi_arrow_rows = rows  # noqa: F841 (read by name by DuckDB's replacement scan)
    result = cur.execute(f"{head} SELECT {columns} FROM _ubi_arrow_rows {tail}")
    return result.fetchall() if tail else []


class Store:
    """A DuckDB database file opened for writing by this process. Thread-safe: one lock for writes, none
    held during a snapshot's copy."""

    def __init__(self, path: Path | str, *, create: bool = True, threads: int | None = 1) -> None:
        self.path = Path(path)
        if not create and not self.path.exists():
            raise StoreError(f"{self.path}: no such database; run `ubi serve` or `ubi import` first")
        try:
            self.con = duckdb.connect(str(self.path))
        except duckdb.IOException as exc:
            if _is_lock_error(exc):
                raise StoreLocked(
                    f"{self.path} is held by another process (a running `ubi serve`?). Stop it, or point this "
                    "command at the running collector instead."
                ) from exc
            raise StoreError(f"{self.path}: cannot open: {exc}") from exc
        self.lock = threading.Lock()
        # Snapshots copy outside the lock; close() waits for them (notified under the same lock).
        self._idle = threading.Condition(self.lock)
        self._copies = 0
        self._closed = False
        if threads is not None:
            # The writer's transactions are inserts of one request group or file chunk: DuckDB's worker threads
            # cost CPU there without speeding anything up (bench/ingest.py: a 31-request group commit 5.5 ->
            # 2.9 ms of CPU, 500-event batches 14 -> 9 us per event), and the collector's event loop needs the
            # other core. None keeps DuckDB's default (one thread per core).
            self.con.execute(f"SET threads = {int(threads)}")
        ensure_tables(self.con)

    def close(self) -> None:
        with self._idle:
            self._closed = True
            self._idle.wait_for(lambda: self._copies == 0)
            self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One write transaction under the store lock; rolled back on any error."""
        with self.lock:
            cur = self.con.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            else:
                try:
                    cur.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(duckdb.Error):
                        cur.execute("ROLLBACK")  # a failed COMMIT may leave the transaction open
                    raise
            finally:
                cur.close()

    def write(
        self,
        queries: pa.Table | None = None,
        events: pa.Table | None = None,
        failed: pa.Table | None = None,
    ) -> WriteResult:
        """Insert whole Arrow batches in one committed transaction, deduplicating on the table keys.

        A query whose ``query_key`` is stored with the same ``content_hash`` is a duplicate; with a different
        hash it is a conflict: it is not stored and its batch position is returned so the caller can keep it
        as a failed record. Events alike: same ``event_key`` and same content (:func:`event_content_hash`)
        is a duplicate, different content a conflict.
        """
        out = self.write_rows(queries, events, failed)
        return out.summary()

    def write_rows(
        self,
        queries: pa.Table | None = None,
        events: pa.Table | None = None,
        failed: pa.Table | None = None,
        *,
        conflicts: Callable[[Sequence[int]], pa.Table | None] | None = None,
        event_conflicts: Callable[[Sequence[int]], pa.Table | None] | None = None,
    ) -> RowOutcome:
        """Like :meth:`write`, but report the outcome of every row, and keep conflicts in the same transaction.

        ``conflicts`` (``event_conflicts``) receives the batch positions of conflicting query records
        (events) and returns the ``failed_records`` rows to insert for them, in the same transaction as
        everything else. Within a batch the first occurrence of a key wins; later ones are duplicates (or
        conflicts).
        """
        # Fast path first: plain INSERTs, which cost half of INSERT OR IGNORE ... RETURNING (measured in
        # bench/ingest.py). Any key already stored makes DuckDB raise a constraint error; then the whole
        # transaction is rolled back and written again the careful way, row by row outcome.
        try:
            return self._write_once(queries, events, failed, conflicts, event_conflicts, careful=False)
        except duckdb.ConstraintException:
            return self._write_once(queries, events, failed, conflicts, event_conflicts, careful=True)

    def _write_once(
        self,
        queries: pa.Table | None,
        events: pa.Table | None,
        failed: pa.Table | None,
        conflicts: Callable[[Sequence[int]], pa.Table | None] | None,
        event_conflicts: Callable[[Sequence[int]], pa.Table | None] | None,
        *,
        careful: bool,
    ) -> RowOutcome:
        q_status: list[int] = []
        e_status: list[int] = []
        f_ins = 0
        with self.transaction() as cur:
            if queries is not None and queries.num_rows:
                q_status = self._insert_queries(cur, queries, careful=careful)
            if events is not None and events.num_rows:
                e_status = self._insert_events(cur, events, careful=careful)
            if failed is not None and failed.num_rows:
                self._insert_failed(cur, failed)
                f_ins += failed.num_rows
            # Last: a constraint error above makes write_rows try again, and the callbacks must run once.
            f_ins += self._keep_conflicts(cur, q_status, conflicts)
            f_ins += self._keep_conflicts(cur, e_status, event_conflicts)
        return RowOutcome(tuple(q_status), tuple(e_status), f_ins)

    def _keep_conflicts(
        self,
        cur: duckdb.DuckDBPyConnection,
        status: list[int],
        keep: Callable[[Sequence[int]], pa.Table | None] | None,
    ) -> int:
        positions = [i for i, s in enumerate(status) if s == CONFLICT]
        if not positions or keep is None:
            return 0
        rows = keep(positions)
        if rows is None or not rows.num_rows:
            return 0
        # OR IGNORE: a loader re-delivering a batch keeps a conflict under the same deterministic failed_id.
        self._insert_failed(cur, rows, or_ignore=True)
        return int(rows.num_rows)

    @staticmethod
    def _first_occurrences(keys: list[str]) -> list[int]:
        seen: set[str] = set()
        keep: list[int] = []
        for pos, key in enumerate(keys):
            if key not in seen:
                seen.add(key)
                keep.append(pos)
        return keep

    @staticmethod
    def _insert_new(
        cur: duckdb.DuckDBPyConnection,
        table: str,
        key: str,
        columns: Sequence[str],
        rows: pa.Table,
        keys: list[str],
        keep: list[int],
        careful: bool,
    ) -> set[str]:
        """Insert the rows at ``keep`` (first occurrences); return the keys that were new.

        Careful: INSERT OR IGNORE probes the primary-key index (a join against the table would scan all of
        it) and RETURNING tells which rows were new. Fast: a plain INSERT, all new or a constraint error.
        """
        batch = rows if len(keep) == len(keys) else rows.take(pa.array(keep, pa.int64()))
        cols = ", ".join(columns)
        if not careful:
            insert_arrow(cur, f"INSERT INTO {table}", cols, batch)
            return set(keys)
        inserted = insert_arrow(cur, f"INSERT OR IGNORE INTO {table}", cols, batch, f"RETURNING {key}")
        return {k for (k,) in inserted}

    def _insert_events(self, cur: duckdb.DuckDBPyConnection, events: pa.Table, *, careful: bool) -> list[int]:
        keys = events.column("event_key").to_pylist()
        keep = self._first_occurrences(keys)
        new = self._insert_new(cur, "ubi_events", "event_key", tables.EVENT_COLUMNS, events, keys, keep, careful)
        status = [DUPLICATE] * len(keys)
        for pos in keep:
            if keys[pos] in new:
                status[pos] = INSERTED
        # A taken key is a retry only if the content is the same. Hash keys ("h:") are the content already;
        # client event_ids ("id:") are compared with the row stored under them (this batch's first occurrence
        # included: the transaction sees it). Only taken keys pay for this, so the fast path stays fast.
        suspects = [pos for pos, st in enumerate(status) if st == DUPLICATE and keys[pos].startswith("id:")]
        if suspects:
            stored = {
                row[0]: row[1:]
                for row in cur.execute(
                    f"SELECT event_key, {', '.join(_EVENT_CONTENT)} FROM ubi_events "
                    "WHERE event_key IN (SELECT unnest(?))",
                    [sorted({keys[p] for p in suspects})],
                ).fetchall()
            }
            taken = events.select(list(_EVENT_CONTENT)).take(pa.array(suspects, pa.int64())).to_pydict()
            for pos, row in zip(suspects, zip(*taken.values(), strict=True), strict=True):
                old = stored.get(keys[pos])
                # Equal values (a replay of the same bytes) need no hashing; else compare JSON key-order free.
                if old is None or (old != row and event_content_digest(old) != event_content_digest(row)):
                    status[pos] = CONFLICT
        return status

    def _insert_queries(
        self, cur: duckdb.DuckDBPyConnection, queries: pa.Table, *, careful: bool
    ) -> list[int]:
        keys = queries.column("query_key").to_pylist()
        hashes = queries.column("content_hash").to_pylist()
        keep = self._first_occurrences(keys)
        new = self._insert_new(cur, "ubi_queries", "query_key", tables.QUERY_COLUMNS, queries, keys, keep, careful)
        # Keys not inserted were stored before (or earlier in this batch): compare content hashes.
        old_keys = sorted({k for k in keys if k not in new})
        stored: dict[str, str] = {}
        if old_keys:
            stored = dict(
                cur.execute(
                    "SELECT query_key, content_hash FROM ubi_queries WHERE query_key IN (SELECT unnest(?))",
                    [old_keys],
                ).fetchall()
            )
        first_hash: dict[str, str] = {}
        status: list[int] = []
        for key, h in zip(keys, hashes, strict=True):
            if key in new and key not in first_hash:
                first_hash[key] = h
                status.append(INSERTED)
                continue
            reference = first_hash.get(key, stored.get(key))
            status.append(DUPLICATE if reference == h else CONFLICT)
        return status

    @staticmethod
    def _insert_failed(cur: duckdb.DuckDBPyConnection, failed: pa.Table, *, or_ignore: bool = False) -> None:
        verb = "INSERT OR IGNORE" if or_ignore else "INSERT"
        insert_arrow(cur, f"{verb} INTO failed_records", ", ".join(tables.FAILED_COLUMNS), failed)

    def load_table(self, name: str, data: pa.Table, *, replace_source: str | None = None) -> int:
        """Insert or replace rows of a derived table (``judgments``, ``human_judgments``) in one transaction.

        With ``replace_source``, every stored row of that ``source`` is deleted first, in the same
        transaction, so a new run of a model leaves no stale rows of pairs it no longer sees.
        """
        if name not in LOADABLE_TABLES:
            raise StoreError(f"table {name!r} cannot be loaded; expected one of {', '.join(LOADABLE_TABLES)}")
        cols = ", ".join(data.column_names)
        with self.transaction() as cur:
            if replace_source is not None:
                cur.execute(f"DELETE FROM {name} WHERE source = ?", [replace_source])
            cur.register("_load", data)
            cur.execute(f"INSERT OR REPLACE INTO {name} ({cols}) SELECT {cols} FROM _load")
            cur.unregister("_load")
        return data.num_rows

    def snapshot(self, dest: Path | None = None) -> Path:
        """Copy the whole database, as of one committed state, to a new file opened by nobody.

        Writers are not paused: the copy runs in a read transaction on its own cursor, outside the store
        lock, and DuckDB's MVCC gives that transaction the state of the last commit before it began while
        the writer keeps committing on its cursor. The transaction writes only the attached destination,
        which DuckDB allows (one written database per transaction). Every table therefore holds every row
        of a committed write or none of it (tests/collector/test_store.py; bench/snapshot.py measures the
        longest request during a snapshot).
        """
        dest = dest or self.path.with_name(f"{self.path.name}.snapshot-{uuid.uuid4().hex[:12]}")
        alias = f"_snap_{uuid.uuid4().hex[:12]}"  # snapshots may run side by side
        if dest.exists():
            raise StoreError(f"{dest} exists; a snapshot goes to a new file")
        with self._idle:
            if self._closed:
                raise StoreError(f"{self.path}: the store is closed")
            cur = self.con.cursor()
            self._copies += 1
        try:
            cur.execute(f"ATTACH '{_sql_str(dest)}' AS {alias}")
            try:
                cur.execute("BEGIN TRANSACTION")
                try:
                    (src,) = cur.execute("SELECT current_database()").fetchone() or ("",)
                    cur.execute(f'COPY FROM DATABASE "{src}" TO {alias}')
                    cur.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(duckdb.Error):
                        cur.execute("ROLLBACK")
                    raise
            finally:
                cur.execute(f"DETACH {alias}")
        except BaseException as exc:
            for partial in (dest, dest.with_name(dest.name + ".wal")):  # no half copy left for a reader
                partial.unlink(missing_ok=True)
            if isinstance(exc, duckdb.Error):
                raise StoreError(f"{self.path}: could not copy a snapshot to {dest}: {exc}") from exc
            raise
        finally:
            cur.close()
            with self._idle:
                self._copies -= 1
                self._idle.notify_all()
        return dest

    def read(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a read query on the writer connection (for the collector's own routes)."""
        with self.lock:
            cur = self.con.cursor()
            try:
                return cur.execute(sql, params or []).fetchall()
            finally:
                cur.close()


def _sql_str(path: Path) -> str:
    return str(path).replace("'", "''")


def ensure_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create every table of ``schemas.tables`` that does not exist yet."""
    for ddl in tables.ALL_TABLES:
        con.execute(ddl)


def failed_row(
    *,
    source: str,
    kind: str,
    reason: str,
    raw: bytes | None,
    item_index: int | None = None,
    field: str | None = None,
    received_at: datetime | None = None,
    kafka: tuple[str, int, int] | None = None,
) -> dict[str, Any]:
    """One ``failed_records`` row as a dict (see ``schemas.tables.FAILED_RECORDS``)."""
    topic, partition, offset = kafka or (None, None, None)
    return {
        "failed_id": uuid.uuid4().hex,
        "received_at": received_at or utcnow(),
        "source": source,
        "kind": kind,
        "item_index": item_index,
        "field": field,
        "reason": reason,
        "raw": raw,
        "kafka_topic": topic,
        "kafka_partition": partition,
        "kafka_offset": offset,
    }


FAILED_SCHEMA = pa.schema(
    [
        ("failed_id", pa.string()),
        ("received_at", pa.timestamp("us")),
        ("source", pa.string()),
        ("kind", pa.string()),
        ("item_index", pa.int32()),
        ("field", pa.string()),
        ("reason", pa.string()),
        ("raw", pa.binary()),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
    ]
)


def failed_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=FAILED_SCHEMA)


def open_reader(db: Path | str) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the store, or to a fresh snapshot of it when a collector holds the file.

    ``db`` may also be a Parquet folder written by ``ubi consume --parquet``: its tables are then views with the
    same dedup rules. Raises :class:`StoreError` when the file does not exist, or is locked and no collector
    answers.
    """
    path = Path(db)
    from collector.parquet_store import is_parquet_store, open_parquet_reader  # it imports this module

    if is_parquet_store(path):
        return open_parquet_reader(path)
    if not path.exists():
        raise StoreError(f"{path}: no such database; ingest something first (`ubi serve`, `ubi import`)")
    try:
        return duckdb.connect(str(path), read_only=True)
    except duckdb.IOException as exc:
        if not _is_lock_error(exc):
            raise StoreError(f"{path}: cannot open: {exc}") from exc
    snap = request_snapshot(path)
    try:
        return duckdb.connect(str(snap), read_only=True)
    except duckdb.Error as exc:
        raise StoreError(f"{snap}: cannot open the snapshot: {exc}") from exc


@contextmanager
def reading(db: Path | str) -> Iterator[duckdb.DuckDBPyConnection]:
    """:func:`open_reader` for the length of a block; a snapshot it had to take is deleted afterwards.

    While a collector holds the file every reader gets a fresh copy of the whole database; without this
    each ``ubi process`` or ``ubi report`` would leave one behind.
    """
    con = open_reader(db)
    try:
        rows = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
        opened = Path(rows[0][0]) if rows and rows[0][0] else None
        yield con
    finally:
        con.close()
    if opened is not None and opened.resolve() != Path(db).resolve() and ".snapshot-" in opened.name:
        for leftover in (opened, opened.with_name(opened.name + ".wal")):
            leftover.unlink(missing_ok=True)


def collector_url(db: Path) -> str:
    """URL of the collector that holds ``db``, from its sidecar file."""
    side = sidecar_path(db)
    try:
        info = json.loads(side.read_text())
        return str(info["url"])
    except (OSError, ValueError, KeyError) as exc:
        raise StoreLocked(
            f"{db} is locked by another process and no running collector advertises it ({side} missing or "
            "unreadable). Stop the process holding the file, or run this command again once it has finished."
        ) from exc


def request_snapshot(db: Path) -> Path:
    """Ask the collector holding ``db`` for a consistent snapshot; return the snapshot's path."""
    import httpx

    url = collector_url(db)
    try:
        resp = httpx.post(url + "/v1/admin/snapshot", timeout=600)
        resp.raise_for_status()
        return Path(resp.json()["path"])
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise StoreLocked(
            f"{db} is held by the collector at {url}, which did not give a snapshot: {exc}"
        ) from exc


def load_derived(db: Path | str, name: str, data: pa.Table, *, replace_source: str | None = None) -> int:
    """Write a derived table into the store: directly when the file is free, else through the collector.

    ``replace_source`` replaces every stored row of that source (see :meth:`Store.load_table`).
    """
    path = Path(db)
    try:
        with Store(path) as store:
            return store.load_table(name, data, replace_source=replace_source)
    except StoreLocked:
        pass
    import httpx

    url = collector_url(path)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write_table(data)
    try:
        resp = httpx.post(
            f"{url}/v1/admin/load/{name}",
            params={"replace_source": replace_source} if replace_source is not None else None,
            content=sink.getvalue().to_pybytes(),
            headers={"content-type": "application/vnd.apache.arrow.stream"},
            timeout=600,
        )
        resp.raise_for_status()
        return int(resp.json()["rows"])
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise StoreError(f"could not load {name} through the collector at {url}: {exc}") from exc


def advertise(db: Path, url: str) -> Path:
    """Write the sidecar that tells readers where the collector holding ``db`` listens."""
    side = sidecar_path(db)
    side.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    return side
