"""The embedded DuckDB store: one writing process, readers through sealed Parquet segments.

DuckDB lets one process open a file for writing, and no other process may open it at all while it does.
The design (README, "One writer, many readers"):

* The process that owns the file (``ubi serve``, or a command run while no collector runs) holds a
  :class:`Store` opened read-write. Every write is one transaction over whole Arrow batches; a 202 is sent
  only after it committed (DuckDB fsyncs its WAL on commit).
* A running collector (or ``ubi consume --db``) advertises itself in a sidecar file next to the database (``<db>.collector.json``).
* Readers (``ubi process``, ``ubi report``) call :func:`ubi_pipeline.store.client.open_reader`: when the file is free they open it
  read-only; when a collector holds it, they ask it to seal (``POST /v1/admin/seal``: the rows stored since
  the last seal are appended, in one read transaction while the writer keeps committing, to immutable
  Parquet segments, :mod:`ubi_pipeline.store.sealed`) and read those segments in place. Derived tables they produce go
  back through the collector (``POST /v1/admin/load/{table}``), so the one writer stays the one writer.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.errors import StoreError, StoreHeldByReader, StoreLocked
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store import answer_log
from ubi_pipeline.store.judgment_params import table_columns
from ubi_pipeline.store.keys import KeyIndex
from ubi_pipeline.store.rows import EVENT_CONTENT_COLUMNS, Counts, RowStatus, event_content_digest
from ubi_pipeline.store.sealed import Sealed, Sealer
from ubi_pipeline.store.sql import checked_columns, quote_ident

#: Derived tables other processes may load through a running collector.
LOADABLE_TABLES = ("judgments", "judgment_runs", "human_judgments")

log = logging.getLogger("ubi.store")


class StoreUnavailable(StoreError):
    """DuckDB invalidated the database during a write; the store reopened it and the write was not stored
    (retry it). The collector answers it 503, the loader retries the batch."""


def is_lock_error(exc: Exception) -> bool:
    """Whether a DuckDB error says another process holds the file."""
    return "lock" in str(exc).lower()


#: The statuses as module names: a class attribute of an Enum costs a lookup per row in the loops below.
_INSERTED, _DUPLICATE, _CONFLICT = RowStatus.INSERTED, RowStatus.DUPLICATE, RowStatus.CONFLICT
_FLOCK = "hhqqi4x"  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid (+ padding)


def lock_holder(path: Path) -> tuple[str, int] | None:
    """Who holds a POSIX lock on ``path`` (DuckDB locks the whole file): ``("read"|"write", pid)``, or None.

    A read-only DuckDB connection takes a shared lock, a writer an exclusive one; F_GETLK asks the kernel
    which lock would stop this process from writing, without taking one.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        kind, _, _, _, pid = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    except OSError:
        return None
    finally:
        os.close(fd)
    if kind == fcntl.F_UNLCK:
        return None
    return ("read" if kind == fcntl.F_RDLCK else "write"), int(pid)


@dataclass(frozen=True)
class RowOutcome:
    """What one committed write did to every row: a :class:`RowStatus` per query and event row."""

    query_status: tuple[RowStatus, ...] = ()  # one per query row
    event_status: tuple[RowStatus, ...] = ()  # one per event row
    failed_inserted: int = 0

    def counts(self) -> Counts:
        """The outcome as counts (``failed`` is every failed_records row inserted, conflicts included)."""
        return Counts.of(self.query_status, self.event_status, failed=self.failed_inserted)


def insert_arrow(
    cur: duckdb.DuckDBPyConnection, head: str, columns: str, rows: pa.Table, tail: str = ""
) -> list[tuple[Any, ...]]:
    """Run ``{head} SELECT {columns} FROM <rows> {tail}`` and return what it returns (RETURNING rows).

    DuckDB reads ``rows`` through a replacement scan: a table name it does not know is looked up among the
    calling frame's Python variables, here the local ``_ubi_arrow_rows``. ``register``/``unregister`` would do
    the same with two more statements, a measurable share of a small group commit's CPU (``bench/ingest.py``;
    figures in the README, Benchmarks, Ingest), and every statement is one more hand-over of the GIL between
    the writer and the event loop.
    """
    _ubi_arrow_rows = rows  # noqa: F841 (read by name by DuckDB's replacement scan)
    result = cur.execute(f"{head} SELECT {columns} FROM _ubi_arrow_rows {tail}")
    return result.fetchall() if tail else []


class Store:
    """A DuckDB database file opened for writing by this process. Thread-safe: one lock for writes, none
    held while a seal copies new rows out."""

    def __init__(
        self,
        path: Path | str,
        *,
        create: bool = True,
        threads: int | None = 1,
        seal_dir: Path | None = None,
        wait_for_readers: float = 0.0,
        memory_limit: str | None = "256MB",
        load_memory_limit: str | None = None,
        checkpoint_threshold: str | None = None,
    ) -> None:
        """Open ``path`` for writing.

        ``seal_dir``: where :meth:`seal` writes its segments (default: ``<db>.sealed`` beside the database).
        ``wait_for_readers``: seconds to wait, retrying, while read-only readers hold the file.
        ``memory_limit``: DuckDB's buffer pool of the writer (``Settings.writer_memory_limit``; None: DuckDB's
        default, 80 % of RAM). Without it the pool keeps every table block written, about 70 MB per million
        events; the keys are no index in memory (:mod:`ubi_pipeline.store.keys`), so everything in it can be evicted.
        ``load_memory_limit``: the pool while :meth:`load_tables` writes derived tables (``Settings.memory_limit``,
        the readers' limit; None: ``memory_limit``). ``judgments`` keeps a primary key, whose index DuckDB holds in
        memory whole: replacing the 416,660 judgments of a 20M-event log does not fit in 256 MB.
        ``checkpoint_threshold``: the WAL size at which a commit checkpoints (None: DuckDB's default, 16 MB; the
        collector's and the loader's stores take ``Settings.checkpoint_threshold``, 64 MB, through
        :meth:`from_settings`), at most a quarter of ``memory_limit``: the rows not yet checkpointed stay in the
        buffer pool, and a 32 MB pool could not commit under a 64 MB threshold. A checkpoint rewrites the table's last, partly filled row group (122,880 rows)
        whatever it adds: at 16 MB a collector storing 45,000 events/s checkpointed about once a second, and
        spent a quarter of its own process's CPU on it (``bench/ingest.py``). ``ubi import`` keeps DuckDB's
        default (its transactions are of 50,000 records).
        """
        self.path = Path(path)
        if not create and not self.path.exists():
            raise StoreError(f"{self.path}: no such database; run `ubi serve` or `ubi import` first")
        self._wait_for_readers, self._threads = wait_for_readers, threads
        #: Times DuckDB invalidated the database and this store reopened it (:meth:`_recover`).
        self.recoveries = 0
        self._invalid: BaseException | None = None  # the fatal error of a recovery that failed: retried first
        #: (table, key column, key) of rows the open transaction inserted, new keys only: after a fatal error
        #: during COMMIT, whether the first is stored says whether the transaction was.
        self._witness: list[tuple[str, str, str]] = []
        self.con = self._connect(wait_for_readers)
        self.lock = threading.Lock()
        # Seals read outside the lock; close() waits for them (notified under the same lock).
        self._idle = threading.Condition(self.lock)
        self._copies = 0
        self._closed = False
        # The open batch (Store.batch): (thread, cursor, after-commit callbacks)
        self._batch: tuple[int, duckdb.DuckDBPyConnection, list[Callable[[duckdb.DuckDBPyConnection], None]]] | None = None
        #: Called before every read (:meth:`read`, :meth:`reading_cursor`, so seals too), outside any lock: a
        #: writer that acknowledges rows before it commits them (the collector's answer log) commits them
        #: here, so that a read sees every acknowledged row.
        self.before_read: Callable[[], None] | None = None
        if threads is not None:
            # The writer's transactions are inserts of one request group or file chunk: DuckDB's worker threads
            # cost CPU there without speeding anything up (bench/ingest.py: a 31-request group commit 5.5 ->
            # 2.9 ms of CPU, 500-event batches 14 -> 9 us per event), and the collector's event loop needs the
            # other core. None keeps DuckDB's default (one thread per core).
            self.con.execute(f"SET threads = {int(threads)}")
        self.memory_limit, self.load_memory_limit = memory_limit, load_memory_limit
        if memory_limit:
            self.con.execute("SET memory_limit = ?", [memory_limit])
        threshold = _checkpoint_threshold(checkpoint_threshold, memory_limit)
        if threshold is not None:
            self.con.execute("SET checkpoint_threshold = ?", [f"{threshold}B"])
        ensure_tables(self.con)
        migrate_keys(self.con)
        self.keys = {t.name: KeyIndex(t) for t in (tables.QUERY_TABLE, tables.EVENT_TABLE)}
        for index in self.keys.values():
            index.open(self.con)
        #: Rows of the answer log written on open: answered by a collector that stopped before it committed them.
        self.replayed = 0
        self.sealer = Sealer(self, seal_dir)
        if str(self.path) != ":memory:":
            self.sealer.clean()  # staging left by a seal cut short; files no manifest names
            try:
                self.replayed = answer_log.replay(self)
            except BaseException:
                self.con.close()
                raise

    def _connect(self, wait_for_readers: float) -> duckdb.DuckDBPyConnection:
        """The read-write connection; while readers hold the file, retry for up to ``wait_for_readers`` s."""
        deadline = time.monotonic() + wait_for_readers
        told = False
        while True:
            try:
                return duckdb.connect(str(self.path))
            except duckdb.IOException as exc:
                if not is_lock_error(exc):
                    raise StoreError(f"{self.path}: cannot open: {exc}") from exc
                holder = lock_holder(self.path)
                if holder is None or holder[0] != "read":
                    who = f" (process {holder[1]})" if holder else ""
                    raise StoreLocked(
                        f"{self.path} is held for writing by another process{who}: a running `ubi serve`, "
                        "`ubi consume --db` or `ubi import`. Stop it, or point this command at it instead."
                    ) from exc
                reader = (
                    f"{self.path} is open read-only by process {holder[1]} (a reader such as `ubi report` or "
                    "`ubi process`, started while no collector held the file)"
                )
                if time.monotonic() >= deadline:
                    raise StoreHeldByReader(
                        f"{reader}; gave up after waiting {wait_for_readers:g} s (UBI_STORE_WAIT_SECONDS). Let it "
                        "finish and start again, or wait longer with a larger UBI_STORE_WAIT_SECONDS."
                    ) from exc
                if not told:
                    log.warning("%s; waiting up to %g s for it to finish (UBI_STORE_WAIT_SECONDS)",
                                reader, wait_for_readers)
                    told = True
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    @classmethod
    def from_settings(cls, settings: Settings, path: Path | None = None) -> Store:
        """The writer of ``path`` (default ``settings.db``) with the seal and wait settings applied."""
        return cls(
            path if path is not None else settings.db,
            seal_dir=settings.seal_dir,
            wait_for_readers=settings.store_wait_seconds,
            memory_limit=settings.writer_memory_limit,
            load_memory_limit=settings.memory_limit,
            checkpoint_threshold=settings.checkpoint_threshold,
        )

    def close(self) -> None:
        with self._idle:
            self._closed = True
            self._idle.wait_for(lambda: self._copies == 0)
            if self._invalid is None:
                for index in self.keys.values():
                    try:
                        index.write_held(self.con)
                    except duckdb.Error as exc:  # the next open writes them from the stored rows
                        log.warning("%s: key rows not written on close (%s); the next open writes them",
                                    self.path, _first_line(exc))
            self.con.close()

    @contextmanager
    def reading_cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor of its own, outside the store lock, for a read transaction; :meth:`close` waits for it."""
        if self.before_read is not None:
            self.before_read()
        with self._idle:
            if self._closed:
                raise StoreError(f"{self.path}: the store is closed")
            cur = self.con.cursor()
            self._copies += 1
        try:
            yield cur
        finally:
            cur.close()
            with self._idle:
                self._copies -= 1
                self._idle.notify_all()

    def seal(self) -> Sealed:
        """Seal the rows committed since the last seal into Parquet segments; see :mod:`ubi_pipeline.store.sealed`.

        Writers are not paused: the copy runs in a read transaction on its own cursor, outside the store
        lock, and DuckDB's MVCC gives that transaction the state of the last commit before it began while
        the writer keeps committing on its cursor. Every table therefore holds every row of a committed
        write or none of it (tests/store/test_sealed.py).
        """
        return self.sealer.seal()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(
        self, after_commit: list[Callable[[duckdb.DuckDBPyConnection], None]] | None = None
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """One write transaction under the store lock; rolled back on any error. ``after_commit`` callbacks
        (filled in by the body) run once it committed, still under the lock. Rows it inserts into a keyed
        table get their key rows at the next write (:meth:`KeyIndex.sync`)."""
        with self._transaction(after_commit, raw=True) as cur:
            yield cur

    @contextmanager
    def _transaction(
        self, after_commit: list[Callable[[duckdb.DuckDBPyConnection], None]] | None = None, *, raw: bool = False
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """:meth:`transaction`; ``raw`` false: a write through the key indexes (:meth:`write_rows`)."""
        with self.lock:
            if raw:
                for index in self.keys.values():
                    index.stale = True
            if self._invalid is not None:
                self._recover(self._invalid)
            cur = self.con.cursor()
            self._witness = []
            try:
                cur.execute("BEGIN TRANSACTION")
            except duckdb.FatalException as exc:
                cur.close()
                self._recover(exc)
                raise StoreUnavailable(f"{self.path}: {_first_line(exc)}; the store was reopened, nothing of this "
                                       "write was stored: retry") from exc
            try:
                yield cur
            except BaseException as exc:
                try:
                    cur.execute("ROLLBACK")
                except duckdb.Error as again:
                    if not _is_fatal(exc) and not _is_fatal(again):
                        raise exc from again
                if _is_fatal(exc) or self._con_invalidated():
                    self._recover(exc)
                    raise StoreUnavailable(f"{self.path}: {_first_line(exc)}; the store was reopened, nothing of "
                                           "this write was stored: retry") from exc
                raise
            else:
                try:
                    cur.execute("COMMIT")
                except duckdb.FatalException as exc:
                    # DuckDB commits (WAL written and fsynced), then checkpoints in the same call; when only the
                    # checkpoint failed, it says so and the write is durable. A large transaction is checkpointed
                    # instead of logged, and then the same failure may or may not have kept it: the store looks
                    # for the first row it inserted. Committed: answered as such, never 503.
                    witness = self._witness[0] if self._witness else None
                    self._recover(exc)
                    durable = _COMMITTED_BUT in str(exc) or (witness is not None and self._stored(witness))
                    if not durable:
                        raise StoreUnavailable(f"{self.path}: {_first_line(exc)}; the store was reopened, this "
                                               "write was not stored: retry") from exc
                    return  # the key indexes were reopened from the stored rows: no after-commit step left
                except BaseException:
                    with contextlib.suppress(duckdb.Error):
                        cur.execute("ROLLBACK")  # a failed COMMIT may leave the transaction open
                    raise
                for done in after_commit or ():
                    done(cur)
            finally:
                with contextlib.suppress(duckdb.Error):
                    cur.close()

    def _stored(self, witness: tuple[str, str, str]) -> bool:
        """Whether the row ``witness`` names, (table, key column, key), is stored (after :meth:`_recover`)."""
        table, column, key = witness
        rows = self.con.execute(
            f"SELECT count(*) FROM {quote_ident(table)} WHERE {quote_ident(column)} = ?", [key]).fetchall()
        return bool(rows[0][0])

    def _con_invalidated(self) -> bool:
        try:
            self.con.execute("SELECT 1").fetchall()
        except duckdb.FatalException:
            return True
        except duckdb.Error:
            return False
        return False

    def _recover(self, cause: BaseException) -> None:
        """Reopen the database after DuckDB invalidated it (a fatal error, e.g. a checkpoint that could not
        pin its blocks), under the store lock: the connection is closed, opened again (DuckDB replays the WAL:
        every committed write is kept), checkpointed under DuckDB's default memory limit, and the key indexes
        are reopened from the stored rows.

        The writer keeps DuckDB's default limit (80 % of RAM) from then on: what made the checkpoint fail is
        still in the table (a checkpoint rewrites the last row group of a table it appends to), and under the
        old limit the next checkpoint would fail the same way. Raises :class:`StoreUnavailable` if reopening
        fails; the next transaction tries again.
        """
        log.error("%s: DuckDB invalidated the database (%s); reopening it (WAL replay)", self.path, _first_line(cause))
        with contextlib.suppress(duckdb.Error):
            self.con.close()
        try:
            con = self._connect(self._wait_for_readers)
            if self._threads is not None:
                con.execute(f"SET threads = {int(self._threads)}")
            con.execute("CHECKPOINT")
            for index in self.keys.values():
                index.open(con)
        except (duckdb.Error, StoreError) as exc:
            self._invalid = cause
            raise StoreUnavailable(f"{self.path}: could not reopen the store after a fatal DuckDB error "
                                   f"({_first_line(cause)}): {_first_line(exc)}") from exc
        self.con, self._invalid = con, None
        self.recoveries += 1
        if self.memory_limit:
            log.warning("%s: the writer now runs with DuckDB's default memory limit instead of %s (writer_memory_limit) "
                        "until it restarts: the checkpoint failed under that limit", self.path, self.memory_limit)
            self.memory_limit = None

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every :meth:`write_rows` of this thread inside the block goes into ONE transaction, committed when
        the block ends (rolled back, with all of them, on an error). What each write returns is final only
        once the block ended without error.

        ``ubi import`` writes a file's chunks this way: DuckDB writes the row groups of a transaction of
        122,880 rows or more to the file directly, where a 50,000-row transaction goes through the WAL and a
        checkpoint that rewrites the last, partly filled row group each time (README, "Import speed").
        Other threads' writes wait for the block to end (the store lock is held throughout).
        """
        after: list[Callable[[duckdb.DuckDBPyConnection], None]] = []
        with self._transaction(after) as cur:
            for index in self.keys.values():
                index.begin()
            self._batch = (threading.get_ident(), cur, after)
            try:
                yield
            finally:
                self._batch = None

    @contextmanager
    def _write_transaction(
        self,
    ) -> Iterator[tuple[duckdb.DuckDBPyConnection, list[Callable[[duckdb.DuckDBPyConnection], None]]]]:
        """The open :meth:`batch` of this thread, else a transaction of its own: (cursor, after-commit list)."""
        batch = self._batch
        if batch is not None and batch[0] == threading.get_ident():
            yield batch[1], batch[2]
            return
        after: list[Callable[[duckdb.DuckDBPyConnection], None]] = []
        with self._transaction(after) as cur:
            for index in self.keys.values():
                index.begin()
            yield cur, after

    def write(
        self,
        queries: pa.Table | None = None,
        events: pa.Table | None = None,
        failed: pa.Table | None = None,
    ) -> Counts:
        """Insert whole Arrow batches in one committed transaction, deduplicating on the table keys.

        A query whose ``query_key`` is stored with the same ``content_hash`` is a duplicate; with a different
        hash it is a conflict: it is not stored and its batch position is returned so the caller can keep it
        as a failed record. Events alike: same ``event_key`` and same content (:func:`event_content_hash`)
        is a duplicate, different content a conflict.
        """
        return self.write_rows(queries, events, failed).counts()

    def write_rows(
        self,
        queries: pa.Table | None = None,
        events: pa.Table | None = None,
        failed: pa.Table | None = None,
        *,
        conflicts: Callable[[Sequence[int]], pa.Table | None] | None = None,
        event_conflicts: Callable[[Sequence[int]], pa.Table | None] | None = None,
        failed_or_ignore: bool = False,
        key_hashes: tuple[np.ndarray | None, np.ndarray | None] = (None, None),
    ) -> RowOutcome:
        """Like :meth:`write`, but report the outcome of every row, and keep conflicts in the same transaction.

        ``conflicts`` (``event_conflicts``) receives the batch positions of conflicting query records
        (events) and returns the ``failed_records`` rows to insert for them, in the same transaction as
        everything else. Within a batch the first occurrence of a key wins; later ones are duplicates (or
        conflicts). ``failed_or_ignore``: a ``failed`` row whose ``failed_id`` is stored already is skipped (a
        replay of rows written before), not an error. ``key_hashes``: the key index's hashes of the
        ``query_key`` and ``event_key`` columns (:func:`ubi_pipeline.store.keys.key_hashes`), when the caller has
        them already (:meth:`surely_new` took them); None: computed here.
        """
        q_status: list[RowStatus] = []
        e_status: list[RowStatus] = []
        f_ins = 0
        with self._write_transaction() as (cur, after):
            if queries is not None and queries.num_rows:
                q_status = self._insert_queries(cur, queries, after, key_hashes[0])
            if events is not None and events.num_rows:
                e_status = self._insert_events(cur, events, after, key_hashes[1])
            if failed is not None and failed.num_rows:
                self._insert_failed(cur, failed, or_ignore=failed_or_ignore)
                f_ins += failed.num_rows
            f_ins += self._keep_conflicts(cur, q_status, conflicts)
            f_ins += self._keep_conflicts(cur, e_status, event_conflicts)
        return RowOutcome(tuple(q_status), tuple(e_status), f_ins)

    def surely_new(self, table: str, keys: Sequence[str], hashes: np.ndarray | None = None) -> bool:
        """Whether none of ``keys`` is stored (committed) in ``table`` (``ubi_events`` or ``ubi_queries``).

        The key index's filter answers for most keys without reading anything (no false negatives,
        :mod:`ubi_pipeline.store.keys`); the keys it may hold (0.4 % of new keys, so most 500-key batches have
        one) are looked up in the key table, as a write would. False also when it cannot tell: the filter is
        not filled yet (no write since the store opened), rows may have been written around the index since
        its last write, the store needs recovery, or the lookup failed.
        """
        if not keys:
            return True
        index = self.keys[table]
        with self.lock:
            if index.filter is None or index.stale or self._invalid is not None or self._batch is not None:
                return False
            hashes = _given(hashes, keys) if hashes is not None else index.hashes(keys)
            maybe = np.flatnonzero(index.filter.might_contain(hashes))
            if not len(maybe):
                return True
            cur = self.con.cursor()
            try:
                found = index.lookup(cur, [keys[int(i)] for i in maybe], hashes[maybe], tables.TABLES[table].key)
            except duckdb.Error:
                return False
            finally:
                with contextlib.suppress(duckdb.Error):
                    cur.close()
            return not found

    def _keep_conflicts(
        self,
        cur: duckdb.DuckDBPyConnection,
        status: list[RowStatus],
        keep: Callable[[Sequence[int]], pa.Table | None] | None,
    ) -> int:
        if keep is None or _CONFLICT not in status:  # `in` runs in C: no loop in Python for the common write
            return 0
        positions = [i for i, s in enumerate(status) if s is _CONFLICT]
        rows = keep(positions)
        if rows is None or not rows.num_rows:
            return 0
        # OR IGNORE: a loader re-delivering a batch keeps a conflict under the same deterministic failed_id.
        self._insert_failed(cur, rows, or_ignore=True)
        return int(rows.num_rows)

    @staticmethod
    def _first_occurrences(keys: list[str]) -> list[int]:
        if len(set(keys)) == len(keys):  # the common case, every key once: a set in C, no loop in Python
            return list(range(len(keys)))
        seen: set[str] = set()
        keep: list[int] = []
        for pos, key in enumerate(keys):
            if key not in seen:
                seen.add(key)
                keep.append(pos)
        return keep

    def _insert_new(
        self,
        cur: duckdb.DuckDBPyConnection,
        table: tables.Table,
        rows: pa.Table,
        keys: list[str],
        keep: list[int],
        fetch: Sequence[str],
        after: list[Callable[[duckdb.DuckDBPyConnection], None]],
        given: np.ndarray | None = None,
    ) -> tuple[dict[int, tuple[Any, ...]], set[int]]:
        """Insert the rows at ``keep`` (first occurrences) whose key is not stored (:mod:`ubi_pipeline.store.keys`).

        Returns, by batch position, the ``fetch`` columns of the stored row of each key that was stored
        already, and the positions inserted.
        """
        index = self.keys[table.name]
        index.sync(cur)
        # Also with no new row: the key rows sync added for raw inserts commit with this transaction.
        after.append(index.committed)
        first = [keys[p] for p in keep]
        if given is None:
            hashes = index.hashes(first)
        else:
            hashes = _given(given, keys)
            if len(keep) < len(keys):
                hashes = hashes[np.asarray(keep, dtype=np.int64)]
        stored = index.lookup(cur, first, hashes, fetch)
        new = [j for j in range(len(keep)) if j not in stored] if stored else list(range(len(keep)))
        if new:
            batch = rows if len(new) == len(keys) else rows.take(pa.array([keep[j] for j in new], pa.int64()))
            insert_arrow(cur, f"INSERT INTO {quote_ident(table.name)}", ", ".join(table.names), batch)
            self._witness.append((table.name, table.key[0], str(batch.column(table.key[0])[0].as_py())))
            added = hashes[new] if len(new) < len(hashes) else hashes
            index.append(cur, added, batch)
        return {keep[j]: row for j, row in stored.items()}, {keep[j] for j in new}

    def _insert_events(
        self,
        cur: duckdb.DuckDBPyConnection,
        events: pa.Table,
        after: list[Callable[[duckdb.DuckDBPyConnection], None]],
        given: np.ndarray | None = None,
    ) -> list[RowStatus]:
        keys = events.column("event_key").to_pylist()
        keep = self._first_occurrences(keys)
        stored, new = self._insert_new(cur, tables.EVENT_TABLE, events, keys, keep, EVENT_CONTENT_COLUMNS, after,
                                       given)
        if len(new) == len(keys):  # every row inserted (the common write): nothing to compare
            return [_INSERTED] * len(keys)
        status = [_INSERTED if pos in new else _DUPLICATE for pos in range(len(keys))]
        # A taken key is a retry only if the content is the same. Hash keys ("h:") are the content already;
        # client event_ids ("id:") are compared with the row stored under them, or with this batch's first
        # occurrence. Only taken keys pay for this, so the common write stays fast.
        suspects = [pos for pos, st in enumerate(status) if st is _DUPLICATE and keys[pos].startswith("id:")]
        if suspects:
            first_pos = {k: p for p, k in ((p, keys[p]) for p in reversed(keep))}
            batch_refs = sorted({first_pos[keys[p]] for p in suspects if first_pos[keys[p]] in new})
            content = events.select(list(EVENT_CONTENT_COLUMNS))
            reference = dict(stored)
            if batch_refs:
                ref_rows = content.take(pa.array(batch_refs, pa.int64())).to_pydict()
                reference.update(zip(batch_refs, zip(*ref_rows.values(), strict=True), strict=True))
            taken = content.take(pa.array(suspects, pa.int64())).to_pydict()
            for pos, row in zip(suspects, zip(*taken.values(), strict=True), strict=True):
                old = reference.get(first_pos[keys[pos]])
                # Equal values (a replay of the same bytes) need no hashing; else compare JSON key-order free.
                if old is None or (old != row and event_content_digest(old) != event_content_digest(row)):
                    status[pos] = _CONFLICT
        return status

    def _insert_queries(
        self,
        cur: duckdb.DuckDBPyConnection,
        queries: pa.Table,
        after: list[Callable[[duckdb.DuckDBPyConnection], None]],
        given: np.ndarray | None = None,
    ) -> list[RowStatus]:
        keys = queries.column("query_key").to_pylist()
        hashes = queries.column("content_hash").to_pylist()
        keep = self._first_occurrences(keys)
        stored, new = self._insert_new(cur, tables.QUERY_TABLE, queries, keys, keep, ("content_hash",), after,
                                       given)
        if len(new) == len(keys):  # every record inserted (the common write): nothing to compare
            return [_INSERTED] * len(keys)
        # The content hash of each key's first record: stored before, or inserted by this batch.
        reference = {keys[p]: (row[0] if p in stored else hashes[p]) for p in keep for row in [stored.get(p, ())]}
        return [
            _INSERTED if pos in new else _DUPLICATE if reference[key] == h else _CONFLICT
            for pos, (key, h) in enumerate(zip(keys, hashes, strict=True))
        ]

    def _insert_failed(self, cur: duckdb.DuckDBPyConnection, failed: pa.Table, *, or_ignore: bool = False) -> None:
        verb = "INSERT OR IGNORE" if or_ignore else "INSERT"
        insert_arrow(cur, f"{verb} INTO failed_records", ", ".join(tables.FAILED_COLUMNS), failed)
        if not or_ignore:
            self._witness.append(("failed_records", "failed_id", str(failed.column("failed_id")[0].as_py())))

    def load_table(self, name: str, data: pa.Table, *, replace_source: str | None = None) -> int:
        """Insert or replace rows of a derived table (``judgments``, ``judgment_runs``, ``human_judgments``) in one
        transaction; see :meth:`load_tables`."""
        return self.load_tables([(name, data, replace_source)])[0]

    def load_tables(self, loads: Sequence[tuple[str, pa.Table, str | None]]) -> list[int]:
        """Insert or replace rows of derived tables, ``(table, rows, replace_source)`` in order, in one transaction.

        With ``replace_source``, every stored row of that ``source`` that the rows do not replace is deleted,
        in the same transaction (in ``human_judgments``: of that source and of the assessors the rows carry), so a new run of a model leaves no stale rows of pairs it no longer sees; for
        ``judgments`` that also deletes the source's ``judgment_runs`` no row refers to any more. Judgment rows
        that refer to a run (``run_id``) ``judgment_runs`` does not hold are refused (:class:`StoreError`): load
        the run first (``ubi_pipeline.processors.labels.implicit.store_judgments`` loads both, runs first).

        The rows are inserted or replaced first and only the stale ones deleted after: the same end state as
        deleting the whole source first, but DuckDB (2.0) deletes rows from a checkpointed primary-key index in
        time that grows faster than the rows (27,079 judgments: 1.4 s of CPU to delete, 0.03 s to replace;
        2,000: 0.01 s), and a re-run of a model replaces nearly every row and leaves few stale.
        """
        for name, data, _ in loads:
            if name not in LOADABLE_TABLES:
                raise StoreError(f"table {name!r} cannot be loaded; expected one of {', '.join(LOADABLE_TABLES)}")
            checked_columns(name, data.column_names)
            missing = [k for k in tables.TABLES[name].key if k not in data.column_names]
            if missing:
                raise StoreError(f"rows for {name} lack its key column(s) {', '.join(missing)}")
        try:
            with self._pool(self.load_memory_limit), self.transaction() as cur:
                for name, data, replace_source in loads:
                    self._load(cur, name, data, replace_source)
        except duckdb.OutOfMemoryException as exc:
            raise StoreError(
                f"{self.path}: loading {', '.join(f'{d.num_rows:,} rows of {n}' for n, d, _ in loads)} ran out of "
                f"DuckDB memory ({self.load_memory_limit or self.memory_limit}); nothing was written. Raise "
                "UBI_MEMORY_LIMIT (the limit of derived-table loads) and run again"
            ) from exc
        return [int(data.num_rows) for _, data, _ in loads]

    def delete_rows(self, name: str, keys: pa.Table) -> int:
        """Delete the rows of a derived table whose key (every key column of the table) a row of ``keys`` gives, in
        one transaction; returns how many were deleted. The review page's undo of a grade it stored."""
        if name not in LOADABLE_TABLES:
            raise StoreError(f"table {name!r} cannot be deleted from; expected one of {', '.join(LOADABLE_TABLES)}")
        key = tables.TABLES[name].key
        missing = [k for k in key if k not in keys.column_names]
        if missing:
            raise StoreError(f"keys for {name} lack its key column(s) {', '.join(missing)}")
        _ubi_arrow_rows = keys.select(list(key))  # noqa: F841 (read by name by DuckDB's replacement scan)
        same = " AND ".join(f"n.{quote_ident(k)} = t.{quote_ident(k)}" for k in key)
        with self.transaction() as cur:
            row = cur.execute(f"DELETE FROM {quote_ident(name)} t WHERE EXISTS "
                              f"(SELECT 1 FROM _ubi_arrow_rows n WHERE {same})").fetchone()
        return int(row[0]) if row else 0

    @contextmanager
    def _pool(self, limit: str | None) -> Iterator[None]:
        """DuckDB's memory limit set to ``limit`` for the block, then back to the writer's (nothing when None)."""
        if not limit or limit == self.memory_limit:
            yield
            return
        with self.lock:
            self.con.execute("SET memory_limit = ?", [limit])
        try:
            yield
        finally:
            with self.lock:
                try:
                    if self.memory_limit:
                        self.con.execute("SET memory_limit = ?", [self.memory_limit])
                    else:
                        self.con.execute("RESET memory_limit")
                except duckdb.OutOfMemoryException:
                    # what cannot be evicted (the judgments' primary-key index) outgrew the writer's pool: keep
                    # the larger one rather than fail a load that committed
                    log.warning("%s: DuckDB memory limit left at %s after a derived-table load: what it holds no "
                                "longer fits in the writer's %s", self.path, limit, self.memory_limit)

    @staticmethod
    def _load(cur: duckdb.DuckDBPyConnection, name: str, data: pa.Table, replace_source: str | None) -> None:
        cols = checked_columns(name, data.column_names)
        table = quote_ident(name)
        key = [quote_ident(k) for k in tables.TABLES[name].key]
        insert_arrow(cur, f"INSERT OR REPLACE INTO {table} ({cols})", cols, data)
        _ubi_arrow_rows = data  # noqa: F841 (read by name by DuckDB's replacement scan)
        if name == "judgments" and "run_id" in data.column_names:
            orphan = cur.execute(
                "SELECT n.source, n.run_id FROM _ubi_arrow_rows n WHERE n.run_id IS NOT NULL AND NOT EXISTS "
                "(SELECT 1 FROM judgment_runs r WHERE r.source = n.source AND r.run_id = n.run_id) LIMIT 1"
            ).fetchall()
            if orphan:
                raise StoreError(f"judgments of source {orphan[0][0]!r} refer to run {orphan[0][1]!r}, which judgment_runs "
                                 "does not hold; load the run's row into judgment_runs first")
        if replace_source is not None:
            same = " AND ".join(f"n.{k} = t.{k}" for k in key)
            # human_judgments: only the assessors the rows carry, so one assessor's re-import never deletes another's
            scope = (" AND t.assessor IN (SELECT DISTINCT n.assessor FROM _ubi_arrow_rows n)"
                     if name == "human_judgments" else "")
            cur.execute(f"DELETE FROM {table} t WHERE t.source = ?{scope} AND NOT EXISTS "
                        f"(SELECT 1 FROM _ubi_arrow_rows n WHERE {same})", [replace_source])
            if name == "judgments":
                cur.execute("DELETE FROM judgment_runs r WHERE r.source = ? AND NOT EXISTS "
                            "(SELECT 1 FROM judgments j WHERE j.source = r.source AND j.run_id = r.run_id)",
                            [replace_source])

    def read(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a read query on the writer connection (for the collector's own routes)."""
        if self.before_read is not None:
            self.before_read()
        with self.lock:
            if self._invalid is not None:
                self._recover(self._invalid)
            cur = self.con.cursor()
            try:
                return cur.execute(sql, params or []).fetchall()
            except duckdb.FatalException as exc:
                self._recover(exc)
                raise StoreUnavailable(f"{self.path}: {_first_line(exc)}; the store was reopened: retry") from exc
            finally:
                with contextlib.suppress(duckdb.Error):
                    cur.close()


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*", re.IGNORECASE)
#: DuckDB's own checkpoint_threshold: a smaller one is never set.
DUCKDB_CHECKPOINT_THRESHOLD = 16 * 1024**2


def _given(hashes: np.ndarray, keys: Sequence[str]) -> np.ndarray:
    """Key hashes a caller computed for ``keys``, checked to be one per key: a hash that is not its key's would
    let a retry past the key index, so a mismatch is an error, never ignored."""
    if len(hashes) != len(keys) or hashes.dtype != np.uint64:
        raise StoreError(
            f"{len(hashes)} key hashes ({hashes.dtype}) were given for {len(keys)} keys: expected one uint64 per key "
            "(ubi_pipeline.store.keys.key_hashes)"
        )
    return hashes


def size_bytes(text: str) -> int | None:
    """Bytes of a DuckDB size setting (``256MB``, ``1.5GiB``, ``64kb``; KB = 1000, KiB = 1024); None if
    it is not one."""
    m = _SIZE.fullmatch(text)
    if m is None:
        return None
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base ** ("kmgt".find(m.group(2).lower()) + 1 if m.group(2) else 0))


def _checkpoint_threshold(wanted: str | None, memory_limit: str | None) -> int | None:
    """The checkpoint threshold to set, in bytes: ``wanted``, at most a quarter of ``memory_limit``; None (keep
    DuckDB's 16 MiB) when that is not more than DuckDB's own or either setting is unreadable."""
    want = size_bytes(wanted) if wanted else None
    if want is None:
        return None
    if memory_limit:
        limit = size_bytes(memory_limit)
        if limit is None:
            return None
        want = min(want, limit // 4)
    return want if want > DUCKDB_CHECKPOINT_THRESHOLD else None


#: What DuckDB's FatalException says when the transaction committed and only the checkpoint after it failed.
_COMMITTED_BUT = "COMMIT succeeded and is durable"


def _is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.FatalException)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def ensure_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create every table of ``ubi_pipeline.schemas.tables`` that does not exist yet, and bring older tables up to date.

    Two migrations so far. ``judgments.run_id`` (the run-wide parameters moved to ``judgment_runs``): a store
    made before it gets the column, NULL in every row it holds; those rows keep their whole parameters and are
    read as they are (``ubi_pipeline.store.judgment_params``). Adding a nullable column rewrites nothing (0.03 s with 400,000
    rows), and running it again finds the column and does nothing. ``human_judgments`` keyed by assessor too
    (:func:`_migrate_human_key`). Running either again finds it done and does nothing.
    """
    for ddl in tables.ALL_TABLES:
        con.execute(ddl)
    _migrate_human_key(con)
    have = set(table_columns(con, "judgments"))
    for column in tables.JUDGMENT_TABLE.columns:
        if column.name not in have:
            if column.not_null or column.name in tables.JUDGMENT_TABLE.key:
                raise StoreError(f"judgments lacks column {column.name}, which cannot be added to stored rows "
                                 "(it may not be NULL); this store was made by an incompatible version")
            con.execute(f"ALTER TABLE judgments ADD COLUMN {quote_ident(column.name)} {column.sql}")


def _migrate_human_key(con: duckdb.DuckDBPyConnection) -> bool:
    """Re-key a ``human_judgments`` made before every assessor was kept (key ``query, doc_id, source``) by
    ``assessor`` too, adding the ``note`` column; a NULL assessor becomes '' (unnamed). DuckDB cannot change a
    primary key, so the rows are copied into a table made by today's DDL in one transaction (a migration cut
    short leaves the old table as it was). Returns whether it migrated."""
    table = tables.HUMAN_JUDGMENT_TABLE
    rows = con.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() WHERE schema_name = 'main' AND table_name = ? "
        "AND constraint_type = 'PRIMARY KEY'", [table.name]).fetchall()
    if not rows or "assessor" in list(rows[0][0]):
        return False
    have = set(table_columns(con, table.name))
    name, staging = quote_ident(table.name), quote_ident(table.name + "__migrating")
    cols = [c for c in table.names if c in have]
    values = ", ".join("coalesce(assessor, '')" if c == "assessor" else quote_ident(c) for c in cols)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"DROP TABLE IF EXISTS {staging}")
        con.execute(table.ddl(table.name + "__migrating"))
        con.execute(f"INSERT INTO {staging} ({', '.join(quote_ident(c) for c in cols)}) SELECT {values} FROM {name}")
        con.execute(f"DROP TABLE {name}")
        con.execute(f"ALTER TABLE {staging} RENAME TO {name}")
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    log.info("human_judgments: keyed by assessor too, so every assessor's grade is kept")
    return True


def migrate_keys(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Drop the PRIMARY KEY of ``ubi_events`` / ``ubi_queries`` in a store made before the key tables
    (:mod:`ubi_pipeline.store.keys`); returns the tables migrated.

    DuckDB cannot drop a constraint, so the table is copied into one made by today's DDL, in its order (no
    row is ever deleted, so every ``rowid`` and the sealed segments' watermarks stay), in
    one transaction: a migration cut short leaves the old table as it was. The key table is filled after,
    by :meth:`ubi_pipeline.store.keys.KeyIndex.open`.
    """
    done = []
    for table in (tables.QUERY_TABLE, tables.EVENT_TABLE):
        (n,) = con.execute(
            "SELECT count(*) FROM duckdb_constraints() WHERE schema_name = 'main' AND table_name = ? "
            "AND constraint_type = 'PRIMARY KEY'", [table.name]
        ).fetchall()[0]
        if not n:
            continue
        name, staging = quote_ident(table.name), quote_ident(table.name + "__migrating")
        cols = ", ".join(quote_ident(c) for c in table.names)
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(f"DROP TABLE IF EXISTS {staging}")
            con.execute(table.ddl(table.name + "__migrating"))
            # No ORDER BY: DuckDB keeps a table's order in a plain scan (preserve_insertion_order, on by default,
            # checked below), and sorting a large store would cost a spilled sort for nothing.
            con.execute("SET preserve_insertion_order = true")
            con.execute(f"INSERT INTO {staging} ({cols}) SELECT {cols} FROM {name}")
            # The copy's rows take their rowids in its scan order at commit: that order must be the table's.
            key = quote_ident(table.key[0])
            (moved,) = con.execute(
                f"SELECT count(*) FROM (SELECT {key} AS a FROM {name}) POSITIONAL JOIN "
                f"(SELECT {key} AS b FROM {staging}) WHERE a IS DISTINCT FROM b").fetchall()[0]
            if moved:
                raise StoreError(f"{table.name}: migrating to a key table would renumber {moved} of its rows; "
                                 "the store is left as it was")
            con.execute(f"DROP TABLE {name}")
            con.execute(f"ALTER TABLE {staging} RENAME TO {name}")
            con.execute(f"DELETE FROM {quote_ident(table.key_table or '')}")
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        log.info("%s: dropped the in-memory primary-key index; keys are kept in %s", table.name, table.key_table)
        done.append(table.name)
    return done


