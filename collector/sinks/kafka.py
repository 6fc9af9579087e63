"""The Kafka sink: validated records to ``<prefix>.queries`` / ``.events`` / ``.failed``, 202 after the broker's ack.

Two ways a batch becomes durable, and a request waits for one of them before its 202:

* direct: every message is produced (``acks=all``, keyed by ``query_id``) and the broker acknowledged all
  of them;
* spooled: the broker did not acknowledge within ``kafka_ack_timeout`` (down, slow, topic missing), so
  the batch was appended to the local spool (:mod:`ubi_pipeline.collector.spool`) and fsync'd.

Once one batch is spooled the sink stays in spooling mode: later batches go to the spool behind it, and a
replay thread sends the spool to the broker in append order, moving the spool's cursor only after the
broker acknowledged. When the spool is empty again, new batches go direct again. Because a client's next
request only starts after its previous one was answered, a ``query_id``'s records reach the topic in the
order they were acknowledged. A batch may reach the topic twice (produced late by a timed-out attempt and
replayed from the spool): the loader's dedup keys absorb the copy. The collector keeps no other state: any
number of them can run side by side, each with its own spool slot.
"""

from __future__ import annotations

import logging
import queue
import struct
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from ubi_pipeline.collector.errors import SinkUnavailable
from ubi_pipeline.collector.ingest import IngestResult, ItemError, Validated
from ubi_pipeline.collector.sinks.base import Sink
from ubi_pipeline.collector.spool import Spool, SpoolError, SpoolLocked, claim, orphaned_slots
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.rows import Counts, event_row, failed_row, query_row, utcnow
from ubi_pipeline.transport.kafka_client import ensure_topics, make_producer
from ubi_pipeline.transport.wire import (
    MAX_VALUE_BYTES,
    TOPIC_KINDS,
    Message,
    Topics,
    failed_value,
    group_rows,
    row_line,
    topics,
)

log = logging.getLogger("ubi.collector.kafka")


# ---------------------------------------------------------------- validated bodies as messages

#: What building a stored row can raise for a record that validated (as in ``ubi_pipeline.collector.ingest.prepare``).
_ROW_ERRORS = (orjson.JSONEncodeError, ValueError, OverflowError, TypeError)


@dataclass
class Encoded:
    """One validated body as messages, with what the 202 reports about it."""

    msgs: list[Message]
    queries: int
    events: int
    errors: list[ItemError]


#: What building a stored row can raise for a record that validated (as in ``ubi_pipeline.collector.ingest.prepare``).
_ROW_ERRORS = (orjson.JSONEncodeError, ValueError, OverflowError, TypeError)


def _producible(line: bytes) -> bytes:
    """A stored row's line, if one Kafka message of ours can hold it (``MAX_VALUE_BYTES``); ValueError if not.

    Every string has a length limit but a list of hit ids has no item limit: one query record carried 4.9 MB
    of them, the producer refused the message (over ``max_request_size``), the collector spooled it, and its
    spool never drained again, holding every record acknowledged after it (found by bench/faults.py --kafka).
    """
    if len(line) > MAX_VALUE_BYTES:
        raise ValueError(f"its stored row is {len(line):,} bytes of JSON; a Kafka message holds at most "
                         f"{MAX_VALUE_BYTES:,} (ubi_pipeline.transport.wire.MAX_VALUE_BYTES)")
    return line


def encode(validated: Validated, *, source: str, received_at: datetime | None = None) -> Encoded:
    """The messages of one validated body: its stored rows, and its rejected items with their reasons.

    Rows go straight from the validated records to JSON (no Arrow round trip). A record that validated
    but cannot be stored is rejected on its own, as :func:`ubi_pipeline.collector.ingest.prepare` does.
    """
    now = received_at or utcnow()
    errors = list(validated.errors)
    late: list[ItemError] = []
    qrows: list[tuple[str, bytes]] = []
    erows: list[tuple[str, bytes]] = []
    for index, q in validated.queries:
        try:
            row = query_row(q, now)
            qrows.append((row["query_id"], _producible(row_line(row))))
        except _ROW_ERRORS as exc:
            late.append(ItemError(index, None, f"cannot be stored: {exc}", "query", validated.raws.get(index, b"")))
    for index, e, bulk_id in validated.events:
        try:
            row = event_row(e, now, bulk_id)
            erows.append((row["query_id"] or row["event_key"], _producible(row_line(row))))
        except _ROW_ERRORS as exc:
            late.append(ItemError(index, None, f"cannot be stored: {exc}", "event", validated.raws.get(index, b"")))
    if late:
        errors = sorted([*errors, *late], key=lambda err: err.index)
    msgs = group_rows("queries", qrows) + group_rows("events", erows)
    for err in errors:
        row = failed_row(source=source, kind=err.kind, reason=err.message, raw=err.raw, item_index=err.index,
                         field=err.field, received_at=now)
        msgs.append(Message("failed", None, failed_value(row)))
    return Encoded(msgs, len(qrows), len(erows), errors)


def body_message(body: bytes, *, source: str, reason: str, kind: str) -> Message:
    """A whole refused body (unparseable, wrong type) as a ``.failed`` message."""
    return Message("failed", None, failed_value(failed_row(source=source, kind=kind, reason=reason, raw=body)))


# ---------------------------------------------------------------- spool payloads

_MSG = struct.Struct("<BiI")  # topic kind index, key length (-1: no key), value length


def encode_messages(msgs: list[Message]) -> bytes:
    """Messages of one batch as one spool payload."""
    parts: list[bytes] = []
    for m in msgs:
        key = m.key if m.key is not None else b""
        parts.append(_MSG.pack(TOPIC_KINDS.index(m.kind), len(key) if m.key is not None else -1, len(m.value)))
        parts.append(key)
        parts.append(m.value)
    return b"".join(parts)


def decode_messages(payload: bytes) -> list[Message]:
    """The messages of one spool payload (inverse of :func:`encode_messages`)."""
    out: list[Message] = []
    pos = 0
    while pos < len(payload):
        kind, klen, vlen = _MSG.unpack_from(payload, pos)
        pos += _MSG.size
        key = None
        if klen >= 0:
            key = payload[pos:pos + klen]
            pos += klen
        out.append(Message(TOPIC_KINDS[kind], key, payload[pos:pos + vlen]))
        pos += vlen
    return out


# ---------------------------------------------------------------- jobs

_PENDING, _ACKED, _CLAIMED = 0, 1, 2


@dataclass(eq=False)
class _Job:
    msgs: list[Message]
    result: Any  # IngestResult, or None for a kept body
    future: Future[Any]
    deadline: float = 0.0
    remaining: int = 0
    state: int = _PENDING
    records: int = field(init=False)

    def __post_init__(self) -> None:
        self.records = len(self.msgs)


_STOP = object()


class KafkaSink(Sink):
    """Produces validated batches to Kafka; spools them locally while the broker cannot take them."""

    name = "kafka"

    def __init__(self, settings: Settings, *, spool: Spool | None = None) -> None:
        self.settings = settings
        self.topics: Topics = topics(settings.kafka_topic_prefix)
        self.ack_timeout = settings.kafka_ack_timeout
        self.spool = spool or claim(settings.spool_dir, max_bytes=settings.spool_max_bytes,
                                    segment_bytes=settings.spool_segment_bytes)
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._state_lock = threading.Lock()  # job states (callbacks run on kafka-python's I/O thread)
        self._mode_lock = threading.Lock()  # spooling flag vs. spool contents
        self._failed: deque[_Job] = deque()
        self._pending: deque[_Job] = deque()
        self._wake_replay = threading.Event()
        self._closed = False
        self._stopping = threading.Event()
        self._producer: Any = None
        self._producer_ok = False
        # Start spooling; the replay thread connects, and switches to direct production once the spool is
        # empty. Connecting to a broker that accepts TCP but does not answer can take kafka-python far longer
        # than its timeouts, so it never happens on the caller's thread.
        self.spooling = True
        self.last_error: str | None = None
        self.produced_records = 0
        self.spooled_records = 0
        self.adopted_records = 0
        self._first_attempt = threading.Event()
        self._closed_spool = False
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="ubi-kafka-dispatch", daemon=True)
        self._replayer = threading.Thread(target=self._replay_loop, name="ubi-kafka-replay", daemon=True)
        self._dispatcher.start()
        self._replayer.start()
        # A healthy broker answers well within the ack timeout: start producing directly at once.
        self._first_attempt.wait(timeout=self.ack_timeout)

    @classmethod
    def from_settings(cls, settings: Settings) -> KafkaSink:
        return cls(settings)

    # ------------------------------------------------------------ the two verbs

    def submit(self, batch: Validated, *, source: str) -> Future[IngestResult]:
        fut: Future[IngestResult] = Future()
        if self._closed:
            fut.set_exception(SinkUnavailable("the collector is shutting down; retry against a running one"))
            return fut
        try:
            enc = encode(batch, source=source)
        except Exception as exc:  # a bug met by some record: acknowledge nothing
            fut.set_exception(exc)
            return fut
        # Duplicates are known only where the records are loaded (the loader's dedup keys).
        counts = Counts(queries=enc.queries, events=enc.events, failed=len(enc.errors))
        result = IngestResult(counts=counts, rejected=len(enc.errors), errors=tuple(enc.errors))
        msgs = enc.msgs
        self._enqueue(_Job(msgs, result, fut))
        return fut

    def keep_unparseable(self, body: bytes, *, source: str, reason: str, kind: str = "body") -> Future[None]:
        fut: Future[None] = Future()
        if self._closed:
            fut.set_exception(SinkUnavailable("the collector is shutting down"))
            return fut
        self._enqueue(_Job([body_message(body, source=source, reason=reason, kind=kind)], None, fut))
        return fut

    def _enqueue(self, job: _Job) -> None:
        if not job.msgs:
            job.future.set_result(job.result)
            return
        self._jobs.put(job)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._jobs.put(_STOP)
        self._dispatcher.join()
        self._stopping.set()
        self._wake_replay.set()
        # A replay thread stuck connecting to a broker that does not answer is left behind (daemon); it
        # checks _stopping before it touches the spool again.
        self._replayer.join(timeout=self.ack_timeout + 2)
        if self._producer is not None:
            try:
                self._producer.close(timeout=2)
            except Exception:  # closing a producer whose broker is gone: nothing left to save
                log.debug("producer close failed", exc_info=True)
        self._closed_spool = True
        self.spool.close()

    # ------------------------------------------------------------ state

    def health(self) -> dict[str, Any]:
        spool = self.spool.state()
        full = spool["bytes"] >= 0.99 * self.spool.max_bytes  # type: ignore[operator]
        return {
            "sink": self.name,
            "ok": not self._closed and not full,
            "bootstrap": self.settings.kafka_bootstrap,
            "topics": list(self.topics),
            "mode": "spooling" if self.spooling else "direct",
            "broker": "up" if self._producer_ok else "unreachable",
            "spool": spool,
            "last_error": self.last_error,
        }

    def gauges(self) -> dict[str, float]:
        s = self.spool
        return {
            "spool_bytes": float(s.depth_bytes),
            "spool_entries": float(s.depth_entries),
            "spool_records": float(s.depth_records),
            "spool_max_bytes": float(s.max_bytes),
            "spool_replayed_records_total": float(s.replayed_records + self.adopted_records),
            "spooled_records_total": float(self.spooled_records),
            "produced_records_total": float(self.produced_records),
            "spooling": 1.0 if self.spooling else 0.0,
            "broker_up": 1.0 if self._producer_ok else 0.0,
        }

    def _note_error(self, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {exc}"
        if msg != self.last_error:
            log.warning("kafka: %s", msg)
        self.last_error = msg

    # ------------------------------------------------------------ producer

    def _connect(self) -> None:
        """A fresh producer, and the topics (re)created: after a failure the old producer may be wedged
        (an idempotent producer whose broker lost its producer state never recovers)."""
        old, self._producer, self._producer_ok = self._producer, None, False
        if old is not None:
            try:
                old.close(timeout=0)  # its unsent batches fail; they are spooled already
            except Exception:
                log.debug("closing the old producer failed", exc_info=True)
        ensure_topics(self.settings, self.topics)
        self._producer = make_producer(self.settings)
        self._producer_ok = True

    def _send(self, producer: Any, msgs: list[Message], on_ack: Any, on_error: Any) -> None:
        for m in msgs:
            f = producer.send(self.topics.of(m.kind), value=m.value, key=m.key)
            f.add_callback(on_ack)
            f.add_errback(on_error)

    # ------------------------------------------------------------ direct path (dispatcher thread)

    def _dispatch_loop(self) -> None:
        stop = False
        while True:
            timeout = 0.05 if self._pending else None
            batch: list[_Job] = []
            try:
                item = self._jobs.get(timeout=timeout)
                while True:
                    if item is _STOP:
                        stop = True
                        break
                    batch.append(item)
                    item = self._jobs.get_nowait()
            except queue.Empty:
                pass
            to_spool: list[_Job] = []
            for job in batch:
                if self.spooling or not self._producer_ok:
                    to_spool.append(job)
                else:
                    self._send_direct(job, to_spool)
            to_spool.extend(self._due())
            if stop:
                # Shutting down: wait for what is in flight, spool what the broker has not acknowledged.
                end = time.monotonic() + self.ack_timeout
                while self._pending and time.monotonic() < end:
                    time.sleep(0.01)
                    to_spool.extend(self._due(now=0.0))
                to_spool.extend(self._due(now=float("inf")))
            if to_spool:
                self._spool_jobs(to_spool)
            if stop:
                return

    def _send_direct(self, job: _Job, to_spool: list[_Job]) -> None:
        job.deadline = time.monotonic() + self.ack_timeout
        job.remaining = len(job.msgs)

        def on_ack(_md: Any) -> None:
            with self._state_lock:
                job.remaining -= 1
                if job.remaining or job.state != _PENDING:
                    return
                job.state = _ACKED
                self.produced_records += job.records
            job.future.set_result(job.result)

        def on_error(exc: BaseException) -> None:
            self._note_error(exc)
            self._failed.append(job)

        try:
            self._send(self._producer, job.msgs, on_ack, on_error)
        except Exception as exc:  # metadata or buffer wait timed out, producer closed: spool it
            self._note_error(exc)
            self._producer_ok = False
            with self._state_lock:
                if job.state == _PENDING:
                    job.state = _CLAIMED
                    to_spool.append(job)
            return
        self._pending.append(job)

    def _due(self, now: float | None = None) -> list[_Job]:
        """Jobs to spool now: failed ones, and pending ones past their deadline (claimed under the lock)."""
        now = time.monotonic() if now is None else now
        out: list[_Job] = []
        with self._state_lock:
            while self._failed:
                job = self._failed.popleft()
                if job.state == _PENDING:
                    job.state = _CLAIMED
                    out.append(job)
            while self._pending and (self._pending[0].state != _PENDING or self._pending[0].deadline <= now):
                job = self._pending.popleft()
                if job.state == _PENDING:
                    job.state = _CLAIMED
                    out.append(job)
        if out:
            self._producer_ok = False
        return out

    def _spool_jobs(self, jobs: list[_Job]) -> None:
        """Append jobs to the spool in one fsync; then their 202s (or 503s when the spool cannot take them)."""
        try:
            with self._mode_lock:
                self.spool.append((job.records, encode_messages(job.msgs)) for job in jobs)
                self.spooling = True
        except (SinkUnavailable, SpoolError) as exc:
            self._note_error(exc)
            err = exc if isinstance(exc, SinkUnavailable) else SinkUnavailable(str(exc))
            for job in jobs:
                job.future.set_exception(err)
            return
        self.spooled_records += sum(j.records for j in jobs)
        self._wake_replay.set()
        for job in jobs:
            job.future.set_result(job.result)

    # ------------------------------------------------------------ replay (replayer thread)

    def _replay_loop(self) -> None:
        backoff = 0.2
        next_orphan_scan = 0.0
        while not self._stopping.is_set():
            if not self.spooling:
                self._wake_replay.wait(timeout=1.0)
                self._wake_replay.clear()
                if time.monotonic() >= next_orphan_scan and not self._stopping.is_set():
                    next_orphan_scan = time.monotonic() + 10
                    self._adopt_orphans()
                continue
            try:
                if not self._producer_ok:
                    self._connect()
                if not self._replay_some(self.spool):
                    with self._mode_lock:
                        if self.spool.empty:
                            self.spooling = False
                            log.info("spool empty; producing directly")
                backoff = 0.2
            except Exception as exc:  # broker still away: wait, then try again with a new producer
                self._note_error(exc)
                self._producer_ok = False
                self._first_attempt.set()
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            else:
                self._first_attempt.set()

    def _replay_some(self, spool: Spool) -> bool:
        """Send the oldest spooled entries and wait for the broker; True if there were any."""
        entries = spool.read(max_records=20_000)
        if not entries:
            return False
        msgs = [m for e in entries for m in decode_messages(e.payload)]
        futures: list[Any] = []
        for m in msgs:
            futures.append(self._producer.send(self.topics.of(m.kind), value=m.value, key=m.key))
        self._producer.flush(timeout=self.ack_timeout)
        for f in futures:
            f.get(timeout=max(0.01, self.ack_timeout))  # raises the broker's error, or times out
        if self._stopping.is_set() and self._closed_spool:
            return False
        spool.ack(entries)
        self.produced_records += len(msgs)
        self.last_error = None
        self._producer_ok = True
        return True

    def _adopt_orphans(self) -> None:
        """Drain spools left behind by collectors on this host that died before replaying them."""
        for path in orphaned_slots(self.settings.spool_dir, self.spool.dir):
            try:
                other = Spool(path, max_bytes=self.spool.max_bytes, segment_bytes=self.spool.segment_bytes)
            except SpoolLocked:
                continue  # its owner is alive
            except SpoolError as exc:
                self._note_error(exc)
                continue
            try:
                if other.empty:
                    continue
                log.info("replaying %d records left in %s", other.depth_records, path)
                if not self._producer_ok:
                    self._connect()
                while not self._stopping.is_set() and self._replay_some(other):
                    pass
                self.adopted_records += other.replayed_records
            except Exception as exc:
                self._note_error(exc)
                self._producer_ok = False
            finally:
                other.close()


# ---------------------------------------------------------------- plug-in hooks (ubi_pipeline.collector.sinks)


def create(settings: Settings) -> KafkaSink:
    """Sink factory used by ``--sink kafka``."""
    return KafkaSink.from_settings(settings)
