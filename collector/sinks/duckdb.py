"""The embedded sink: validated batches into the DuckDB store, many requests per committed transaction.

Group commit: requests hand their prepared rows to one writer thread, which takes everything pending as one
group and resolves each request's future with that request's own result once the group is durable. With an
answer log (``log_dir``; ``UBI_ACK=log``, the default of ``ubi serve``), a group whose keys are all surely
new is durable once its rows are fsync'd to the log (:mod:`ubi_pipeline.store.answer_log`), and DuckDB
commits the answered rows of many groups later in one transaction; any other group, and every group without
the log, is written in a transaction of its own and answered after its COMMIT.

Commit delay (PostgreSQL's ``commit_delay``/``commit_siblings`` idea): when the previous commit carried
more than one request, the collector is loaded, and the writer waits ``commit_delay`` seconds before
taking the group, so more requests share the commit. A commit's cost is nearly all fixed (DuckDB plans and
commits an insert of 16 or 64 rows in about the same time), and a commit that runs while the event loop is
busy is slowed further by handing the GIL back and forth. ``bench/ingest.py`` and ``bench/ack_modes.py``
measure both; the figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ubi_pipeline.collector.errors import SinkUnavailable
from ubi_pipeline.collector.ingest import (
    IngestResult,
    Prepared,
    Validated,
    frame_tables,
    ingest_many,
    prepare,
    result_of,
)
from ubi_pipeline.collector.sinks.base import Sink
from ubi_pipeline.collector.spool import HEADER, Position, Spool, SpoolError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store import answer_log
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import (
    EVENT_SCHEMA,
    failed_row,
    rows_table,
)

log = logging.getLogger("ubi.collector.sink")


@dataclass(frozen=True)
class _Job:
    prepared: Prepared
    #: A concurrent future (``submit``), or an asyncio future of ``loop`` (``submit_async``).
    future: Future[IngestResult] | asyncio.Future[IngestResult]
    loop: asyncio.AbstractEventLoop | None = None


def _settle_on_loop(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    """Resolve the asyncio futures of one commit, on their loop (one callback for the whole group)."""
    for fut, result, exc in outcomes:
        if fut.cancelled():  # the request went away; its rows are committed all the same
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)


_STOP = object()


@dataclass(frozen=True)
class _Commit:
    """Asks the writer to commit the rows it answered from the log (a read is waiting for them)."""

    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class _Frame:
    """One group's rows answered from the log: its tables, and where it ends in the log."""

    tables: answer_log.Tables
    end: Position  # where the log's next frame starts
    rows: int
    size: int  # bytes in the log, header included
    requests: int
    entries: int = 1  # log entries it spans: the group's own, and one per body a parse worker framed
    #: The key index's hashes of its query and event keys, in its tables' row order (taken for surely_new,
    #: used again by the commit); None: computed at the commit.
    hashes: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(frozen=True)
class _Keys:
    """A group's keys, all surely new, and each body's key hashes (queries, events), in the group's order."""

    queries: list[str]
    events: list[str]
    hashes: list[tuple[np.ndarray, np.ndarray]]


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


@dataclass
class _Answered:
    """Rows answered from the log and not yet committed to DuckDB, frame by frame, with their keys."""

    frames: list[_Frame] = field(default_factory=list)
    query_keys: set[str] = field(default_factory=set)
    event_keys: set[str] = field(default_factory=set)
    rows: int = 0
    size: int = 0
    since: float = 0.0  # monotonic time of the first frame

    @classmethod
    def of(cls, frames: list[_Frame], since: float) -> _Answered:
        """The frames left after some were committed."""
        out = cls(frames=frames, since=since)
        for f in frames:
            queries, events, _ = f.tables
            out.query_keys.update(queries.column("query_key").to_pylist() if queries is not None else ())
            out.event_keys.update(events.column("event_key").to_pylist() if events is not None else ())
            out.rows += f.rows
            out.size += f.size
        return out

#: Groups of at least this many rows are committed with a short GIL switch interval (:func:`_gil_handover`).
BIG_GROUP_ROWS = 500
#: The switch interval during such a commit, in seconds (CPython's default is 0.005).
SHORT_SWITCH_INTERVAL = 0.0005

_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.005


@contextlib.contextmanager
def _gil_handover() -> Iterator[None]:
    """Shorten CPython's GIL switch interval while a large group is committed.

    DuckDB releases the GIL while it executes and takes it back many times per statement (about 20 for one
    INSERT ... COMMIT). While the event loop is busy validating the next large body, each take waits a whole
    switch interval (5 ms): the commit stalls until the loop runs out of work, so validation and commits
    take turns instead of using both cores. At 0.5 ms the writer gets the GIL back ten times sooner. Only
    for large groups: applied to single-event traffic it cost more in forced switches than it saved.
    ``bench/ingest.py`` measures both cases; the figures are in the README (Benchmarks, Ingest).
    Process-wide, so nested users are counted.
    """
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, SHORT_SWITCH_INTERVAL))
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)


class DuckDBSink(Sink):
    """Writes to a :class:`~ubi_pipeline.store.duckdb_store.Store` through one group-committing writer thread."""

    name = "duckdb"

    def __init__(
        self,
        store: Store,
        *,
        max_group_rows: int = 50_000,
        max_pending: int = 10_000,
        commit_delay: float = 0.0,
        log_dir: Path | None = None,
        log_commit_seconds: float = 0.2,
        log_max_bytes: int = 256 * 1024**2,
        log_commit_rows: int = 50_000,
        log_commit_bytes: int = 4 * 1024**2,
    ) -> None:
        self.store = store
        self.commit_delay = commit_delay
        self._last_group = 0
        self.max_pending = max_pending
        self._db: Store = store  # the same store, typed as present
        self.max_group_rows = max_group_rows
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._close_lock = threading.Lock()
        self.commits = 0
        self.grouped_requests = 0
        #: Seconds the writer spent writing groups (rows to DuckDB, COMMIT), failed writes included: over a
        #: stretch of wall time, the share the writer was busy (``bench/ingest.py`` prints it).
        self.write_seconds = 0.0
        self.failed_writes = 0
        self.last_error: str | None = None
        # pyarrow imports pandas on its first conversion from Python objects (~150 ms): pay it now, not on
        # the first request.
        rows_table([tuple([None] * len(EVENT_SCHEMA))], EVENT_SCHEMA)
        #: The answer log (:mod:`ubi_pipeline.store.answer_log`); None: every answer waits for its commit.
        self._log: Spool | None = None
        self.log_commit_seconds, self.log_commit_rows = log_commit_seconds, log_commit_rows
        #: Answered rows are committed once their frames reach this size: a transaction's memory stays
        #: near that of the commit path's (a 120-record request of records at every limit is 2.9 MB).
        self.log_commit_bytes = log_commit_bytes
        self._answered = _Answered()
        self.answered_from_log = 0  # requests answered before their commit
        if log_dir is not None:
            try:
                # The store wrote what an earlier collector answered but did not commit when it opened.
                self._log = Spool(log_dir, max_bytes=log_max_bytes, name="answer log",
                                  full_reason="(UBI_ANSWER_LOG_MAX_BYTES): the store has not committed the rows "
                                  "answered so far (its last error is on /healthz)")
            except BaseException:
                store.close()
                raise
            store.before_read = self.commit_answered
        self._thread = threading.Thread(target=self._run, name="ubi-duckdb-writer", daemon=True)
        self._thread.start()

    @classmethod
    def from_settings(cls, settings: Settings) -> DuckDBSink:
        """Open (or create) the store at ``settings.db`` for writing (with its answer log unless
        ``settings.ack`` is ``commit`` or the store is in memory)."""
        store = Store.from_settings(settings)
        logged = settings.ack == "log" and str(store.path) != ":memory:"
        return cls(
            store,
            commit_delay=settings.commit_delay_ms / 1000,
            log_dir=answer_log.answer_log_dir(store.path) if logged else None,
            log_commit_seconds=settings.log_commit_ms / 1000,
            log_max_bytes=settings.answer_log_max_bytes,
        )

    # ------------------------------------------------------------ the two verbs

    def submit(self, batch: Validated, *, source: str) -> Future[IngestResult]:
        fut: Future[IngestResult] = Future()
        try:
            self._enqueue(batch, source, fut, None)
        except Exception as exc:
            fut.set_exception(exc)
        return fut

    async def submit_async(self, batch: Validated, *, source: str) -> IngestResult:
        # The writer resolves a whole commit's requests with one call into the loop, instead of one
        # thread-safe callback (and a concurrent future chained to an asyncio one) per request.
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[IngestResult] = loop.create_future()
        self._enqueue(batch, source, fut, loop)
        return await fut

    takes_rows = True

    async def submit_prepared(self, prepared: Prepared) -> IngestResult:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[IngestResult] = loop.create_future()
        self._enqueue(prepared, prepared.source, fut, loop)
        return await fut

    def _enqueue(
        self,
        batch: Validated | Prepared,
        source: str,
        fut: Future[IngestResult] | asyncio.Future[IngestResult],
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        if self._closed:
            raise SinkUnavailable("the collector is shutting down; retry against a running one")
        if self._queue.qsize() >= self.max_pending:
            # Better a quick 503 the client retries than an unbounded queue of bodies in memory.
            raise SinkUnavailable(
                f"{self.max_pending} requests are waiting for the store; retry shortly", retry_after=1
            )
        # A row the store's shape cannot hold raises here: rejected loudly, nothing acknowledged.
        prepared = batch if isinstance(batch, Prepared) else prepare(batch, source=source)
        self._queue.put(_Job(prepared, fut, loop))

    def keep_unparseable(self, body: bytes, *, source: str, reason: str, kind: str = "body") -> Future[None]:
        row = failed_row(source=source, kind=kind, reason=reason, raw=body)
        prepared = Prepared(
            validated=Validated(),
            source=source,
            received_at=row["received_at"],
            query_rows=[],
            event_rows=[],
            failed_rows=[row],
        )
        out: Future[None] = Future()
        if self._closed:
            out.set_exception(SinkUnavailable("the collector is shutting down"))
            return out
        inner: Future[IngestResult] = Future()
        inner.add_done_callback(
            lambda f: out.set_exception(e) if (e := f.exception()) else out.set_result(None)
        )
        self._queue.put(_Job(prepared, inner))
        return out

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)
        self._thread.join()  # the writer commits what it answered before it stops
        if self._log is not None:
            self._db.before_read = None
            applied = self._log.empty
            self._log.close()
            if applied:  # nothing left for the next open to write: no folder left beside the store either
                shutil.rmtree(self._log.dir, ignore_errors=True)
        self._db.close()

    # ------------------------------------------------------------ state

    def health(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "sink": self.name,
            "ok": self.last_error is None and not self._closed,
            "db": str(self._db.path),
            "last_error": self.last_error,
            "recoveries": self._db.recoveries,
        }
        if self._log is not None:
            state["answer_log"] = self._log.state()
        return state

    def gauges(self) -> dict[str, float]:
        return {
            "pending_requests": float(self._queue.qsize()),
            "commits_total": float(self.commits),
            "grouped_requests_total": float(self.grouped_requests),
            "write_seconds_total": self.write_seconds,
            "commit_delay_seconds": self.commit_delay,
            "failed_writes_total": float(self.failed_writes),
            "store_recoveries_total": float(self._db.recoveries),
            "answered_from_log_total": float(self.answered_from_log),
            "answered_uncommitted_rows": float(self._answered.rows),
        }

    # ------------------------------------------------------------ the writer thread

    def _run(self) -> None:
        stopping = False
        while not stopping:
            try:
                job = self._queue.get(timeout=self._commit_wait())
            except queue.Empty:  # answered rows waited long enough: commit them
                self._commit_answered_now()
                continue
            if job is _STOP:
                break
            if isinstance(job, _Commit):
                self._commit_answered_now()
                job.done.set()
                continue
            jobs: list[_Job] = [job]
            commits: list[_Commit] = []
            rows = job.prepared.n_queries + job.prepared.n_events
            if self.commit_delay and self._last_group > 1:
                time.sleep(self.commit_delay)  # loaded: let more requests join this commit
            # Take whatever else is already waiting: those requests share this commit.
            while rows < self.max_group_rows:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                if isinstance(nxt, _Commit):
                    commits.append(nxt)
                    continue
                jobs.append(nxt)
                rows += nxt.prepared.n_queries + nxt.prepared.n_events
            self._last_group = len(jobs)
            keys = self._answerable(jobs) if self._log is not None else None
            if keys is not None and self._answer_from_log(jobs, keys):
                if self._commit_wait() == 0.0:  # due: under steady load the queue is never idle long enough
                    self._commit_answered_now()
            elif self._commit_answered_now():  # rows answered before these come first in the store
                self._write(jobs)
            else:  # they could not be committed: writing these first would store a retry before its original
                err = SinkUnavailable(f"the store could not commit earlier requests: {self.last_error}; retry")
                self._settle([(j, None, err) for j in jobs])
            for c in commits:
                self._commit_answered_now()
                c.done.set()
        self._commit_answered_now()

    # ------------------------------------------------------------ the answer log

    def _commit_wait(self) -> float | None:
        """How long the writer may wait for a request before it commits the rows it answered."""
        if not self._answered.frames:
            return None
        return max(0.0, self._answered.since + self.log_commit_seconds - time.monotonic())

    def _answerable(self, jobs: list[_Job]) -> _Keys | None:
        """The group's query and event keys (and their hashes) when its answer can be given before its commit:
        every key surely new (module doc of :mod:`ubi_pipeline.store.answer_log`), and the store's last write
        did not fail."""
        if self.last_error is not None:
            return None
        q_keys = [k for j in jobs for k in j.prepared.query_keys()]
        e_keys = [k for j in jobs for k in j.prepared.event_keys()]
        a = self._answered
        if not (
            len(set(q_keys)) == len(q_keys)
            and len(set(e_keys)) == len(e_keys)
            and a.query_keys.isdisjoint(q_keys)
            and a.event_keys.isdisjoint(e_keys)
        ):
            return None
        # a parse worker's bodies come with their hashes; the others' are computed once, here
        hashes = [j.prepared.hashes() for j in jobs]
        q_hashes = _joined([h[0] for h in hashes])
        e_hashes = _joined([h[1] for h in hashes])
        if self._db.surely_new("ubi_queries", q_keys, q_hashes) and self._db.surely_new("ubi_events", e_keys, e_hashes):
            return _Keys(q_keys, e_keys, hashes)
        return None

    def _answer_from_log(self, jobs: list[_Job], keys: _Keys) -> bool:
        """Append the group's rows to the log (fsync'd), answer every request, keep the rows for the commit.
        False (nothing answered, nothing logged) when the rows could not be framed: the group is then written
        the usual way, which isolates the request at fault."""
        if self._log is None:
            return False
        preps = [j.prepared for j in jobs]
        # bodies a parse worker framed are logged as they came, the others framed here together
        framed = [(p.n_rows, p.frame) for p in preps if p.frame is not None]
        own = [p for p in preps if p.frame is None]
        # the hashes in the frame's row order: the framed bodies' rows first, then the others'
        order = [*(h for p, h in zip(preps, keys.hashes, strict=True) if p.frame is not None),
                 *(h for p, h in zip(preps, keys.hashes, strict=True) if p.frame is None)]
        hashes = (_joined([h[0] for h in order]), _joined([h[1] for h in order]))
        entries = [(rows, payload) for rows, (_, payload) in framed]
        parts = [tables for _, (tables, _) in framed]
        started = time.perf_counter()
        if own:
            try:
                tables = frame_tables(own)
                entries.append((sum(p.n_rows for p in own), answer_log.encode(tables)))
            except Exception:  # a value the Arrow schema cannot hold: never seen, but it must not stop the writer
                log.exception("could not frame %d requests for the answer log; writing them the usual way", len(jobs))
                return False
            parts.append(tables)
        frame = parts[0] if len(parts) == 1 else answer_log.concat(parts)
        n = sum(rows for rows, _ in entries)
        size = sum(HEADER.size + len(payload) for _, payload in entries)
        try:
            end = self._log.append(entries)
        except (SinkUnavailable, SpoolError) as exc:  # full, or the disk refused: nothing was answered
            self.write_seconds += time.perf_counter() - started
            err = exc if isinstance(exc, SinkUnavailable) else SinkUnavailable(str(exc))
            self._settle([(j, None, err) for j in jobs])
            return True
        self.write_seconds += time.perf_counter() - started
        a = self._answered
        if not a.frames:
            a.since = time.monotonic()
        a.frames.append(_Frame(frame, end, n, size, len(jobs), len(entries), hashes))
        a.query_keys.update(keys.queries)
        a.event_keys.update(keys.events)
        a.rows += n
        a.size += size
        self.answered_from_log += len(jobs)
        self._settle([(j, result_of(j.prepared), None) for j in jobs])  # every row will be inserted
        if a.rows >= self.log_commit_rows or a.size >= self.log_commit_bytes:
            self._commit_answered_now()
        return True

    def _commit_answered_now(self) -> bool:
        """Commit the rows answered from the log, then move the log's cursor past them; whether none is left
        uncommitted. All in one transaction; if that fails, group by group (each frame the size of one commit
        of the commit path), in order, up to the first that fails. What fails stays (in memory and in the log)
        and the next request or timeout tries again."""
        a = self._answered
        if not a.frames or self._log is None:
            return True
        if self._commit_frames(a.frames, alone=len(a.frames) == 1):
            self._answered = _Answered()
            return True
        done = 0
        if len(a.frames) > 1:
            log.warning("committing %d answered rows in one transaction failed; committing them group by group",
                        a.rows)
            for frame in a.frames:
                if not self._commit_frames([frame], alone=True):
                    break
                done += 1
        if done == len(a.frames):
            self._answered = _Answered()
            return True
        # try again after another log_commit_seconds
        self._answered = _Answered.of(a.frames[done:], since=time.monotonic()) if done else a
        if not done:
            a.since = time.monotonic()
        return False

    def _commit_frames(self, frames: list[_Frame], *, alone: bool) -> bool:
        """Commit ``frames`` in one transaction and move the log's cursor past them; False if the commit
        failed (logged with its traceback when ``alone``: nothing smaller is left to try)."""
        if self._log is None:
            return False
        started = time.perf_counter()
        try:
            hashed = all(f.hashes is not None for f in frames)
            odd = answer_log.write_frames(
                self._db,
                answer_log.concat([f.tables for f in frames]),
                key_hashes=(
                    _joined([f.hashes[0] for f in frames if f.hashes is not None]),
                    _joined([f.hashes[1] for f in frames if f.hashes is not None]),
                ) if hashed else (None, None),
            )
            if odd:
                log.warning("%d rows answered from the answer log were not new when committed", odd)
        except Exception as exc:
            self.write_seconds += time.perf_counter() - started
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.failed_writes += 1
            if alone:
                log.exception("committing %d answered rows to %s failed; they stay in the answer log %s and are "
                              "committed again later", sum(f.rows for f in frames), self._db.path, self._log.dir)
            return False
        self.write_seconds += time.perf_counter() - started
        self.last_error = None
        self.commits += 1
        self.grouped_requests += sum(f.requests for f in frames)
        try:
            self._log.ack_through(frames[-1].end, entries=sum(f.entries for f in frames), records=sum(f.rows for f in frames),
                                  size=sum(f.size for f in frames))
        except (OSError, SpoolError):  # committed: replaying these frames after a restart stores nothing twice
            log.exception("the answer log %s could not record a commit; its frames will be written again "
                          "(as duplicates) on the next start", self._log.dir)
        return True

    def commit_answered(self) -> None:
        """Commit every row answered so far (any thread; :attr:`Store.before_read` calls it): after it, a read
        sees every acknowledged row."""
        if not self._answered.frames:
            return
        if threading.current_thread() is self._thread:
            self._commit_answered_now()
            return
        request = _Commit()
        self._queue.put(request)
        while not request.done.wait(0.5):
            if not self._thread.is_alive():  # stopped: it committed what it had on its way out
                return

    def _write(self, jobs: list[_Job]) -> None:
        started = time.perf_counter()
        rows = sum(j.prepared.n_queries + j.prepared.n_events for j in jobs)
        try:
            with _gil_handover() if rows >= BIG_GROUP_ROWS else contextlib.nullcontext():
                results = ingest_many(self._db, [j.prepared for j in jobs])
        except Exception as exc:
            self.write_seconds += time.perf_counter() - started
            if len(jobs) > 1:
                # One request's rows spoiled the shared transaction: write each alone so only it fails.
                for j in jobs:
                    self._write([j])
                return
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.failed_writes += 1
            log.exception("write to %s failed; nothing acknowledged", self._db.path)
            err = SinkUnavailable(f"the store could not commit this batch: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            self._settle([(jobs[0], None, err)])
            return
        self.write_seconds += time.perf_counter() - started
        self.last_error = None
        self.commits += 1
        self.grouped_requests += len(jobs)
        log.debug("committed %d requests in %.1f ms", len(jobs), 1000 * (time.perf_counter() - started))
        self._settle([(j, r, None) for j, r in zip(jobs, results, strict=True)])

    @staticmethod
    def _settle(outcomes: list[tuple[_Job, Any, BaseException | None]]) -> None:
        """Resolve the jobs' futures: concurrent ones here, asyncio ones in one callback per event loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
        for job, result, exc in outcomes:
            if job.loop is not None:
                by_loop.setdefault(job.loop, []).append((job.future, result, exc))  # type: ignore[arg-type]
            elif exc is not None:
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle_on_loop, items)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                log.debug("event loop closed before %d requests could be answered", len(items))


def create(settings: Settings) -> DuckDBSink:
    """Sink factory used by ``--sink duckdb`` (the default)."""
    return DuckDBSink.from_settings(settings)

