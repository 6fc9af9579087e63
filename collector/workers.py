"""Parse workers: large request bodies are parsed, validated and turned into stored rows in other processes.

The collector's event loop and its DuckDB writer share one GIL. For a 500-event batch the loop spent
15-22 us of CPU per event on orjson, pydantic and the stored rows (``bench/batch_paths.py``), so a collector
served 23,000-35,000 events/s with one core busy and the other idle whatever the client count (issue 26).
Here those three steps run in a pool of worker processes, one per core by default (``UBI_PARSE_WORKERS``);
the loop only hands over the body's bytes and gets back the rows as Arrow tables, already framed for the
answer log (read back without a copy). The writer appends that frame to the answer log as it came, and
DuckDB inserts the tables; every answer is still given in the collector's process.

What a worker sends back is what the process would make of the body: ``prepare(validate_items(items))``, or
the columnar path's ``prepare_items(items)`` from ``fastpath.HTTP_MIN_ITEMS`` items (``ubi import``'s chunks
to a running collector); the same rows, errors and order (the same functions run).
Only the raw bytes of valid items stay behind: a conflict's ``failed_records`` row needs them, seldom, and
:class:`BodyRaws` parses the body again for them then.

Anything unusual goes back to the in-process path, which then gives its exact answer or error: a body the
worker could not parse or that holds too many items, an exception of any kind, a pool that is still starting
or was broken by a worker that died (it is replaced). Small bodies (under :data:`MIN_BODY_BYTES`, single
events) and requests that pass through record filters (they need the models) never leave the process: the
hand-over costs more than it saves for them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from ubi_pipeline.collector.bodies import Kind, RawItem, parse_bulk, parse_items
from ubi_pipeline.collector.fastpath import HTTP_MIN_ITEMS, prepare_items
from ubi_pipeline.collector.ingest import (
    ItemError,
    Prepared,
    Validated,
    frame_tables,
    prepare,
    validate_items,
)
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store import answer_log
from ubi_pipeline.store.rows import TableRows

log = logging.getLogger("ubi.collector")

#: Bytes a body needs before it goes to a worker (about 100 events). A hand-over costs about 0.3 ms of the
#: loop's time (pipe, pickle, futures); 100 events cost 2-5 ms in process.
MIN_BODY_BYTES = 32 * 1024


@dataclass(frozen=True)
class Parsed:
    """What a worker sends back: the rows as one answer-log payload (Arrow IPC: what the writer logs, and read
    back without a copy), and what the answers need beside them."""

    payload: bytes
    query_index: list[int]
    event_ids: list[tuple[int, str | None, str | None]]
    errors: list[ItemError]
    received_at: datetime
    #: The key index's hashes of the rows' query and event keys (``Prepared.hashes``): computed here, where
    #: cores are many, instead of in the writer's thread.
    key_hashes: tuple[np.ndarray, np.ndarray]


def body_items(body: bytes, kind: Kind | None, ndjson: bool, indices: Mapping[str, Kind]) -> list[RawItem]:
    """The items of a body as ``Collector.accept`` splits it (``kind`` None: an OpenSearch ``_bulk`` body)."""
    return parse_bulk(body, indices=indices) if kind is None else parse_items(body, kind, ndjson=ndjson)


def parse_body(
    body: bytes, kind: Kind | None, ndjson: bool, indices: Mapping[str, Kind], max_items: int, source: str
) -> Parsed | None:
    """Parse, validate and prepare one body, and frame its rows for the answer log (run in a worker). None
    when the in-process path must take it: the body cannot be parsed, holds more than ``max_items`` items, or
    anything raised. Its error is then raised there, with its status, and no exception object has to cross
    the pipe."""
    try:
        items = body_items(body, kind, ndjson, indices)
        if len(items) > max_items:
            return None
        if len(items) >= HTTP_MIN_ITEMS:  # as in process: the columnar path pays for itself from there
            p = prepare_items(items, source=source)
        else:
            p = prepare(validate_items(items), source=source)
        payload = answer_log.encode(frame_tables([p]))
        hashes = p.hashes()
    except Exception:
        return None
    return Parsed(payload, p.query_index, p.event_ids, list(p.validated.errors), p.received_at, hashes)


def prepared_of(parsed: Parsed, raws: Mapping[int, bytes], source: str) -> Prepared:
    """A worker's :class:`Parsed` as the :class:`Prepared` the sink takes: its rows are the payload's tables
    (``failed_records`` rows too: rejected items are few, and reading them back keeps one copy on the pipe)."""
    tables = answer_log.decode(parsed.payload)
    return Prepared(
        validated=Validated(errors=parsed.errors, raws=raws),
        source=source,
        received_at=parsed.received_at,
        query_rows=TableRows(tables[0]),
        event_rows=TableRows(tables[1]),
        failed_rows=tables[2].to_pylist() if tables[2] is not None else [],
        query_index=parsed.query_index,
        event_ids=parsed.event_ids,
        frame=(tables, parsed.payload),
        key_hashes=parsed.key_hashes,
    )


class BodyRaws(Mapping[int, bytes]):
    """The raw bytes of a body's items, from a parse of the body made on the first look (conflicts only)."""

    def __init__(self, body: bytes, kind: Kind | None, ndjson: bool, indices: Mapping[str, Kind]) -> None:
        self._args = (body, kind, ndjson, indices)
        self._items: dict[int, RawItem] | None = None
        self._lock = threading.Lock()

    def _parsed(self) -> dict[int, RawItem]:
        with self._lock:
            if self._items is None:
                self._items = {item.index: item for item in body_items(*self._args)}
            return self._items

    def __getitem__(self, index: int) -> bytes:
        return self._parsed()[index].raw_bytes()

    def __iter__(self) -> Iterator[int]:
        return iter(self._parsed())

    def __len__(self) -> int:
        return len(self._parsed())


def tune_gc() -> None:
    """Collect garbage less often: the collector allocates many short-lived, acyclic objects per request.

    With CPython's default gen-0 threshold (700 allocations) a 500-event batch triggers dozens of
    collections that each walk the batch's still-live models; measured in ``bench/ingest.py`` this halves
    validation throughput. Objects alive at start-up are frozen out of collection altogether.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


#: Seconds between a worker's looks at whether the collector that started it is still alive.
PARENT_CHECK_SECONDS = 0.5


def _watch_parent(parent: int) -> None:
    """End this worker once its collector is gone. A collector killed with SIGKILL cannot stop its pool, and a
    worker waiting for a body never sees the pipe close (it holds both ends of the pool's queue)."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(0)


def _start_worker(parent: int) -> None:
    """Each worker's start (the ingest code is imported with this module): watch the collector, tune the GC."""
    threading.Thread(target=_watch_parent, args=(parent,), name="ubi-parse-parent-watch", daemon=True).start()
    tune_gc()


#: What each worker parses before the pool counts as ready: an event and a query record, so that the
#: validators pydantic builds on first use (~0.1 s each) are built before the first request's body.
_WARM_BODY = (b'[{"action_name":"click","timestamp":"2024-05-16T12:34:56.789Z","event_attributes":'
              b'{"object":{"object_id":"d1"},"position":{"ordinal":1}}},{"action_name":"click"}]')
_WARM_QUERIES = b'[{"query_id":"q1","user_query":"warm","query_response_hit_ids":["d1"]},{"query_id":1}]'


def _warm() -> int:
    """A first task for each worker (the pool is ready once every worker has run one): parse a few records,
    valid and invalid, as a request's body would be."""
    parse_body(_WARM_BODY, "event", False, {}, 10, "warm-up")
    parse_body(_WARM_QUERIES, "query", False, {}, 10, "warm-up")
    return 0


#: Most parse workers when ``UBI_PARSE_WORKERS`` is unset.
DEFAULT_MAX_WORKERS = 8


def workers_for(settings: Settings) -> int:
    """Parse workers of a collector: ``settings.parse_workers``, or one per core (at most 8)."""
    if settings.parse_workers is not None:
        return settings.parse_workers
    return min(os.cpu_count() or 1, DEFAULT_MAX_WORKERS)


#: Seconds after a pool broke (a worker died) or could not start before a new one is started: a machine that
#: cannot start processes gets one attempt and one log line per interval, not one per request.
RESTART_AFTER_SECONDS = 10.0


class ParsePool:
    """A pool of parse workers started on the first large body; bodies go in process until it is ready."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._ready = False
        self._lock = threading.Lock()
        self._closed = False
        self._broken_at: float | None = None  # monotonic time the last pool broke or failed to start
        self.handed = 0  # bodies parsed by a worker
        self.fell_back = 0  # bodies a worker gave back to the process (errors, a broken pool)

    @property
    def enabled(self) -> bool:
        return self.workers > 0 and not self._closed

    def _start(self) -> None:
        """Start the pool (spawned processes: the collector has threads and an open DuckDB file, so no fork)
        and mark it ready once every worker has imported the ingest code."""
        pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"), initializer=_start_worker,
                                   initargs=(os.getpid(),))
        self._pool = pool
        warmups = [pool.submit(_warm) for _ in range(self.workers)]

        def ready(_: Future[int]) -> None:
            if not all(f.done() for f in warmups) or self._pool is not pool:
                return
            # a cancelled future's exception() raises: name it instead (raising here would leave the pool set
            # but never ready, and never tried again)
            failed = next(("cancelled" if f.cancelled() else f.exception() for f in warmups
                           if f.cancelled() or f.exception() is not None), None)
            if failed is None:
                self._ready = True
            else:
                log.warning("the parse workers did not start (%s); bodies are parsed in process, trying again in "
                            "%g s", failed, RESTART_AFTER_SECONDS)
                self._replace(pool)

        for f in warmups:
            f.add_done_callback(ready)

    def live_workers(self) -> int:
        """Worker processes of the pool that are ready (0 before the first large body)."""
        return self.workers if self._ready else 0

    def ready(self) -> bool:
        """True when a worker can take a body now; starts the pool on the first call."""
        if not self.enabled:
            return False
        if self._pool is None:
            if self._broken_at is not None and time.monotonic() - self._broken_at < RESTART_AFTER_SECONDS:
                return False
            with self._lock:
                if self._pool is None and not self._closed:
                    self._start()
        return self._ready

    async def parse(self, body: bytes, kind: Kind | None, ndjson: bool, indices: Mapping[str, Kind],
                    max_items: int, source: str) -> Prepared | None:
        """The body as a :class:`Prepared` from a worker; None: take the in-process path (which gives the
        exact answer or error for whatever made the worker give up)."""
        pool = self._pool
        if pool is None or not self._ready:
            return None
        try:
            parsed = await asyncio.wrap_future(pool.submit(parse_body, body, kind, ndjson, dict(indices), max_items,
                                                           source))
        except BrokenProcessPool:
            if self._replace(pool):
                log.warning("a parse worker died; new workers start with the next large body after %g s (bodies "
                            "are parsed in process meanwhile)", RESTART_AFTER_SECONDS)
            self.fell_back += 1
            return None
        except Exception:  # a result that could not cross the pipe: never seen; the process takes the body
            log.exception("a parse worker could not return a body's rows; parsing it in process")
            self.fell_back += 1
            return None
        if parsed is None:
            self.fell_back += 1
            return None
        self.handed += 1
        return prepared_of(parsed, BodyRaws(body, kind, ndjson, indices), source)

    def _replace(self, broken: ProcessPoolExecutor) -> bool:
        """Drop ``broken`` (a new pool starts after RESTART_AFTER_SECONDS); False if it was dropped already."""
        with self._lock:
            if self._pool is not broken:
                return False
            self._ready, self._pool, self._broken_at = False, None, time.monotonic()
        broken.shutdown(wait=False, cancel_futures=True)
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool, self._ready = self._pool, None, False
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
