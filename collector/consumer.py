"""The loader: a Kafka consumer group that moves ``<prefix>.*`` topics into the store, exactly once.

Each round: poll until ``consumer_batch_records`` records are buffered or ``consumer_batch_seconds`` passed,
decode the batch (:func:`collector.kafka_records.decode`: stored-shape rows; unreadable records become
``poison`` failed rows carrying topic, partition and offset), write it durably through a :class:`Loader`,
and only then commit the offsets. A crash between the write and the commit re-delivers the batch; the dedup
keys (``event_key``, ``query_key``, deterministic ``failed_id`` s) make the second write a no-op. Before
partitions move to another consumer (a rebalance) the buffered batch is written and committed first.

Two loaders:

* :class:`DuckDBLoader`: the DuckDB store. DuckDB has one writing process, so one loader per store file
  (a second one fails with :class:`~schemas.errors.StoreLocked`); readers get snapshots from it as from a
  collector (:func:`serve_admin`).
* :class:`collector.parquet_store.ParquetLoader`: a folder of Parquet files, one writer per partition, so
  several loaders in one group scale out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.errors import KafkaError as _KE
from kafka.structs import OffsetAndMetadata

from collector.kafka_client import consumer_config, ensure_topics, make_admin
from collector.kafka_records import Decoded, InRecord, KafkaError, Topics, decode, failed_arrow, topics
from collector.store import (
    CONFLICT,
    DUPLICATE,
    INSERTED,
    Store,
    advertise,
    event_content_hash,
    failed_row,
    sidecar_path,
    utcnow,
)
from schemas.errors import StoreError
from schemas.settings import Settings

log = logging.getLogger("ubi.consumer")


@dataclass
class LoadResult:
    """What one durable write did."""

    queries: int = 0
    query_duplicates: int = 0
    conflicts: int = 0  # query records and events re-using a stored key with different content
    events: int = 0
    event_duplicates: int = 0
    failed: int = 0  # rejected items from the .failed topic
    poison: int = 0

    def add(self, other: LoadResult) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)


class Loader(Protocol):
    """Where loaded batches go. ``write`` returns only once the batch is durable."""

    def write(self, batch: Decoded) -> LoadResult: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------- DuckDB


def conflict_id(key: str, content_hash: str) -> str:
    """Deterministic ``failed_id`` of a conflicting query record (``query_key``) or event (``event_key``):
    one row however often it is delivered."""
    return "conflict:" + hashlib.sha256(f"{key}\x1f{content_hash}".encode()).hexdigest()[:32]


class DuckDBLoader:
    """Writes batches into the DuckDB store, one transaction per batch."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @classmethod
    def open(cls, db: Path) -> DuckDBLoader:
        return cls(Store(db))

    def write(self, batch: Decoded) -> LoadResult:
        queries, events = batch.queries, batch.events
        q_keys = queries.column("query_key").to_pylist() if queries is not None else []
        q_hashes = queries.column("content_hash").to_pylist() if queries is not None else []
        c_ids = [conflict_id(k, h) for k, h in zip(q_keys, q_hashes, strict=True)]
        # Rows kept before (a re-delivered batch) must not be inserted twice: failed_id is their key.
        candidates = [f["failed_id"] for f in batch.failed] + c_ids
        stored: set[str] = set()
        if candidates:
            stored = {fid for (fid,) in self.store.read(
                "SELECT failed_id FROM failed_records WHERE failed_id IN (SELECT unnest(?))", [candidates])}
        failed: list[dict[str, Any]] = []
        seen: set[str] = set(stored)
        for f in batch.failed:
            if f["failed_id"] not in seen:
                seen.add(f["failed_id"])
                failed.append(f)
        now = utcnow()

        def conflict_row(fid: str, origin: Any, field: str, reason: str) -> dict[str, Any] | None:
            """The failed_records row of one conflict, once per failed_id (a second copy in this batch is
            skipped; a copy kept by an earlier delivery the store ignores)."""
            if fid in seen:
                return None
            seen.add(fid)
            rec = origin.record
            row = failed_row(
                source=rec.topic, kind="conflict", field=field, received_at=now, raw=origin.raw(),
                item_index=origin.line, kafka=(rec.topic, rec.partition, rec.offset), reason=reason)
            row["failed_id"] = fid
            return row

        def keep_conflicts(positions: Any) -> pa.Table | None:
            rows = [conflict_row(
                c_ids[pos], batch.query_origin[pos], "query_id",
                f"query_key {q_keys[pos]!r} is already stored with different content; first write wins, "
                "this record is kept as a conflict") for pos in positions]
            kept = [r for r in rows if r is not None]
            return failed_arrow(kept) if kept else None

        def keep_event_conflicts(positions: Any) -> pa.Table | None:
            if events is None:
                return None
            taken = events.take(pa.array(positions, pa.int64())).to_pylist()
            rows = [conflict_row(
                conflict_id(row["event_key"], event_content_hash(row)), batch.event_origin[pos], "event_id",
                f"event_id {row['event_id']!r} is already stored for an event with different content; first "
                "write wins, this event is kept as a conflict") for pos, row in zip(positions, taken, strict=True)]
            kept = [r for r in rows if r is not None]
            return failed_arrow(kept) if kept else None

        outcome = self.store.write_rows(queries, events, failed_arrow(failed) if failed else None,
                                        conflicts=keep_conflicts, event_conflicts=keep_event_conflicts)
        qs, es = outcome.query_status, outcome.event_status
        return LoadResult(
            queries=sum(1 for s in qs if s == INSERTED),
            query_duplicates=sum(1 for s in qs if s == DUPLICATE),
            conflicts=sum(1 for s in qs if s == CONFLICT) + sum(1 for s in es if s == CONFLICT),
            events=sum(1 for s in es if s == INSERTED),
            event_duplicates=sum(1 for s in es if s == DUPLICATE),
            failed=sum(1 for f in failed if f["kind"] != "poison"),
            poison=sum(1 for f in failed if f["kind"] == "poison"),
        )

    def close(self) -> None:
        self.store.close()


# ---------------------------------------------------------------- the consumer loop


@dataclass
class Progress:
    """The loader's running totals and current lag (what ``ubi consume`` prints)."""

    loaded: LoadResult = field(default_factory=LoadResult)
    records: int = 0  # Kafka records (messages) consumed and written, all topics
    rows: int = 0  # rows they held (query and event rows, failed records, poison)
    batches: int = 0
    commits: int = 0
    commit_failures: int = 0
    lag: int | None = None  # records on the assigned partitions not consumed yet
    partitions: int = 0
    started: float = field(default_factory=time.monotonic)
    first_record_at: float | None = None
    last_batch_at: float | None = None

    def public(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {"records": self.records, "rows": self.rows, "batches": self.batches, "commits": self.commits,
                "commit_failures": self.commit_failures, "lag": self.lag, "partitions": self.partitions,
                "rows_per_s": round(self.rows / elapsed, 1), **asdict(self.loaded)}


class Consumer:
    """One member of the loader group: poll, buffer, write durably, commit."""

    def __init__(self, settings: Settings, loader: Loader, *, group: str | None = None) -> None:
        self.settings = settings
        self.loader = loader
        self.group = group or settings.consumer_group
        self.topics: Topics = topics(settings.kafka_topic_prefix)
        self.progress = Progress()
        self._buffer: list[InRecord] = []
        self._next: dict[Any, int] = {}  # TopicPartition -> next offset to commit
        self._buffer_since: float | None = None
        self._consumer: Any = None
        self._lock = threading.Lock()
        self._admin: Any = None
        self._topic_ids: dict[str, str] | None = None  # the topics' incarnations we read from
        self._rejoined_at: float | None = None  # when we last joined again after the topics were re-created
        self._on_written: Callable[[Progress], None] | None = None
        self.recreated_topics = 0

    # ------------------------------------------------------------ set-up

    def connect(self, *, wait: float = 60.0) -> None:
        """Create the topics if needed and join the group (retrying while no broker answers, up to ``wait`` s)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                ensure_topics(self.settings, self.topics)
                self._consumer = KafkaConsumer(**consumer_config(self.settings, self.group))
                break
            except (KafkaError, _KE) as exc:
                if time.monotonic() >= deadline:
                    raise KafkaError(f"no Kafka broker answers at {self.settings.kafka_bootstrap}: {exc}") from exc
                log.warning("waiting for the broker: %s", exc)
                time.sleep(1.0)
        self._consumer.subscribe(list(self.topics), listener=_Rebalance(self))
        self._topic_ids = self._current_topic_ids()

    # ------------------------------------------------------------ topics deleted and created again

    def _current_topic_ids(self) -> dict[str, str] | None:
        """Topic name -> topic id (a new id means a new topic under the old name); None if unknown now."""
        try:
            if self._admin is None:
                self._admin = make_admin(self.settings)
            found = self._admin.describe_topics(list(self.topics))
        except Exception as exc:  # broker away: nothing to compare this time
            log.debug("describe_topics failed: %s", exc)
            self._admin = None
            return None
        return {d["name"]: str(d.get("topic_id")) for d in found if d.get("error_code") == 0}

    def _topics_recreated(self) -> bool:
        """Whether the topics are not the ones we read (and committed offsets for) any more.

        Offsets belong to one incarnation of a topic: after it is deleted and created again (or a broker
        without durable storage, such as Tansu's memory store, restarts), positions and commits of the old
        one would skip records of the new one, which starts again at offset 0.
        """
        ids = self._current_topic_ids()
        if ids is None or self._topic_ids is None:
            if self._topic_ids is None:
                self._topic_ids = ids
            return False
        return ids != self._topic_ids

    def _rejoin_stuck(self, now: float) -> bool:
        """After a restart on new topics, whether the new member has waited too long for partitions.

        Seen once with Tansu after a broker restart: the new member's join never completed. A member that
        legitimately has no partitions (more loaders than partitions) is not affected: this only watches
        the first join after :meth:`_restart_on_new_topics`.
        """
        if self._rejoined_at is None:
            return False
        if self._consumer.assignment():
            self._rejoined_at = None
            return False
        patience = max(15.0, 3 * self.settings.consumer_max_poll_interval_ms / 1000)
        if now - self._rejoined_at < patience:
            return False
        log.warning("no partitions %.0f s after joining the group again; joining once more", now - self._rejoined_at)
        return True

    def _restart_on_new_topics(self) -> None:
        """Drop the consumer (its positions belong to the old topics) and join again from the new ones' start."""
        log.warning("topics %s were created again; reading them from the beginning", ", ".join(self.topics))
        self.recreated_topics += 1
        self._rejoined_at = time.monotonic()
        with self._lock:
            if self._buffer:  # already consumed from the old topics: keep it, but commit nothing
                decoded = decode(self._buffer, self.topics)
                self.progress.loaded.add(self.loader.write(decoded))
                self.progress.records += len(self._buffer)
                self._buffer, self._next, self._buffer_since = [], {}, None
        try:
            self._consumer.close(autocommit=False)
        except Exception:
            log.debug("closing the old consumer failed", exc_info=True)
        self._consumer = None
        self.connect()

    # ------------------------------------------------------------ the loop

    def run(self, *, stop: threading.Event | None = None, exit_idle: float | None = None,
            on_progress: Callable[[Progress], None] | None = None, progress_every: float = 1.0,
            on_written: Callable[[Progress], None] | None = None) -> Progress:
        """Load until ``stop`` is set, or until caught up (lag 0) for ``exit_idle`` seconds."""
        if self._consumer is None:
            self.connect()
        stop = stop or threading.Event()
        batch_seconds = self.settings.consumer_batch_seconds
        batch_records = self.settings.consumer_batch_records
        next_report = time.monotonic() + progress_every
        next_check = time.monotonic() + 1.0
        idle_since: float | None = None
        self._on_written = on_written
        try:
            while not stop.is_set():
                polled = self._consumer.poll(timeout_ms=100, max_records=batch_records)
                got = 0
                for tp, recs in polled.items():
                    for r in recs:
                        self._buffer.append(InRecord(tp.topic, tp.partition, r.offset, r.value))
                    if recs:
                        self._next[tp] = recs[-1].offset + 1
                        got += len(recs)
                now = time.monotonic()
                if got and self._buffer_since is None:
                    self._buffer_since = now
                if got and self.progress.first_record_at is None:
                    self.progress.first_record_at = now
                if self._buffer and (len(self._buffer) >= batch_records
                                     or now - (self._buffer_since or now) >= batch_seconds):
                    self.flush()
                if now >= next_check:
                    next_check = now + 1.0
                    if self._topics_recreated() or self._rejoin_stuck(now):
                        self._restart_on_new_topics()
                        continue
                if now >= next_report or (exit_idle is not None and not got):
                    self.progress.lag = self._lag()
                    if now >= next_report:
                        next_report = now + progress_every
                        if on_progress is not None:
                            on_progress(self.progress)
                if exit_idle is not None:
                    caught_up = not got and not self._buffer and self.progress.lag == 0 and self.progress.partitions
                    if caught_up:
                        idle_since = idle_since or now
                        if now - idle_since >= exit_idle:
                            break
                    else:
                        idle_since = None
        finally:
            self.flush()
        return self.progress

    def flush(self) -> None:
        """Write the buffered batch durably, then commit its offsets."""
        with self._lock:
            if not self._buffer:
                return
            batch, offsets = self._buffer, dict(self._next)
            decoded = decode(batch, self.topics)
            result = self.loader.write(decoded)  # raises: nothing committed, the batch comes again
            self._buffer, self._next, self._buffer_since = [], {}, None
            p = self.progress
            p.loaded.add(result)
            p.records += len(batch)
            p.rows += sum(t.num_rows for t in (decoded.queries, decoded.events) if t is not None) + len(decoded.failed)
            p.batches += 1
            p.last_batch_at = time.monotonic()
            if self._on_written is not None:
                self._on_written(p)
            if self._topics_recreated():
                # The offsets are the old topics': committing them would skip records of the new ones.
                self.progress.commit_failures += 1
                return
            self._commit(offsets)

    def _commit(self, offsets: dict[Any, int]) -> None:
        try:
            self._consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()})
            self.progress.commits += 1
        except _KE as exc:
            # The group moved on (rebalance, broker restart): the new owner re-reads from the last commit,
            # and the rows written here make that a no-op.
            self.progress.commit_failures += 1
            log.warning("offset commit failed (%s); the batch will be re-delivered and deduplicated", exc)

    def _lag(self) -> int | None:
        """Kafka records not written yet on the assigned partitions (high watermark minus position, plus buffer);
        None when it cannot be known now (no partitions, broker not answering)."""
        try:
            return self._lag_now()
        except Exception as exc:  # positions unknown and the broker away: no figure this round
            log.debug("lag unknown: %s", exc)
            return None

    def _lag_now(self) -> int | None:
        assigned = list(self._consumer.assignment())
        self.progress.partitions = len(assigned)
        if not assigned:
            return None
        lag = 0
        missing = []
        for tp in assigned:
            hw = self._consumer.highwater(tp)
            if hw is None:
                missing.append(tp)
                continue
            pos = self._consumer.position(tp, timeout_ms=1000)
            lag += max(0, hw - (pos or 0))
        if missing:
            try:
                ends = self._consumer.end_offsets(missing, timeout_ms=2000)
                for tp in missing:
                    pos = self._consumer.position(tp, timeout_ms=1000)
                    lag += max(0, ends.get(tp, 0) - (pos or 0))
            except Exception as exc:  # no answer right now: lag unknown this round
                log.debug("end_offsets failed: %s", exc)
                return None
        return lag + len(self._buffer)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
            if self._admin is not None:
                self._admin.close()
            self.loader.close()


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Write and commit the buffered batch before partitions move to another member."""

    def __init__(self, owner: Consumer) -> None:
        self.owner = owner

    def on_partitions_revoked(self, revoked: Any) -> None:
        try:
            self.owner.flush()
        except Exception:
            log.exception("could not write the batch before a rebalance; it will be re-delivered")
            self.owner._buffer, self.owner._next, self.owner._buffer_since = [], {}, None

    def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("assigned %d partitions", len(assigned))


# ---------------------------------------------------------------- readers while a DuckDB loader runs


def serve_admin(store: Store, status: Callable[[], dict[str, Any]], host: str = "127.0.0.1",
                port: int = 0) -> ThreadingHTTPServer:
    """Serve snapshot / load / failed / healthz for ``store`` (as a collector does) and advertise it.

    ``ubi process`` and ``ubi report`` find the loader through the sidecar file and read snapshots, so
    they work while ``ubi consume --db`` holds the file.
    """
    from collector.routes import failed_page

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def _send(self, code: int, obj: Any) -> None:
            body = json.dumps(obj, default=str).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            from urllib.parse import parse_qs, urlparse

            url = urlparse(self.path)
            if url.path == "/healthz":
                self._send(200, {"status": "ok", **status()})
            elif url.path == "/v1/failed":
                q = {k: v[-1] for k, v in parse_qs(url.query).items()}
                try:
                    page = failed_page(store, limit=min(int(q.get("limit", 100)), 1000),
                                       offset=int(q.get("offset", 0)), kind=q.get("kind"))
                except ValueError as exc:
                    self._send(400, {"error": "BadRequest", "message": str(exc)})
                    return
                self._send(200, page)
            else:
                self._send(404, {"error": "NotFound", "message": self.path})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            try:
                if self.path == "/v1/admin/snapshot":
                    self._send(200, {"path": str(store.snapshot())})
                elif self.path.startswith("/v1/admin/load/"):
                    table = self.path.rsplit("/", 1)[-1]
                    data = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
                    self._send(200, {"table": table, "rows": store.load_table(table, data)})
                else:
                    self._send(404, {"error": "NotFound", "message": self.path})
            except (StoreError, pa.ArrowException, ValueError, OSError) as exc:
                self._send(400, {"error": type(exc).__name__, "message": str(exc)})

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="ubi-loader-admin", daemon=True).start()
    port_bound = int(server.server_address[1])
    advertise(store.path, f"http://{host}:{port_bound}")
    return server


def stop_admin(server: ThreadingHTTPServer, store: Store) -> None:
    server.shutdown()
    server.server_close()
    sidecar_path(store.path).unlink(missing_ok=True)
