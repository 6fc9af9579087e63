"""The loader's consumer-group loop: move the ``<prefix>.*`` topics into the store, exactly once.

Each round: poll until ``consumer_batch_records`` records are buffered or ``consumer_batch_seconds`` passed,
decode the batch (:func:`ubi_pipeline.loader.decode.decode`: stored-shape rows; unreadable records become
``poison`` failed rows carrying topic, partition and offset), write it durably through a
:class:`~ubi_pipeline.loader.targets.Loader`, and only then commit the offsets. A crash between the write and the commit
re-delivers the batch; the dedup keys (``event_key``, ``query_key``, deterministic ``failed_id`` s) make the
second write a no-op. Before partitions move to another consumer (a rebalance) the buffered batch is
written and committed first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.errors import KafkaError as _KE
from kafka.structs import OffsetAndMetadata

from ubi_pipeline.loader.decode import InRecord, decode
from ubi_pipeline.loader.targets import Loader
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.duckdb_store import StoreUnavailable
from ubi_pipeline.store.rows import Counts
from ubi_pipeline.transport.kafka_client import KafkaError, consumer_config, ensure_topics, make_admin
from ubi_pipeline.transport.wire import Topics, topics

log = logging.getLogger("ubi.consumer")


@dataclass
class Progress:
    """The loader's running totals and current lag (what ``ubi consume`` prints)."""

    loaded: Counts = field(default_factory=Counts)
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
            self._write_buffer(commit=True)

    def _write_buffer(self, *, commit: bool) -> None:
        """Write the buffered batch durably and, if ``commit``, commit its offsets (the caller holds the lock)."""
        if not self._buffer:
            return
        batch, offsets = self._buffer, dict(self._next)
        decoded = decode(batch, self.topics)
        try:
            result = self.loader.write(decoded)  # raises: nothing committed, the batch comes again
        except StoreUnavailable as exc:
            # DuckDB invalidated the store and it was reopened, without this batch: write it once more
            log.warning("%s; writing the batch again", exc)
            result = self.loader.write(decoded)
        self._buffer, self._next, self._buffer_since = [], {}, None
        p = self.progress
        p.loaded.add(result)
        p.records += len(batch)
        p.rows += sum(t.num_rows for t in (decoded.queries, decoded.events) if t is not None) + len(decoded.failed)
        p.batches += 1
        p.last_batch_at = time.monotonic()
        if self._on_written is not None:
            self._on_written(p)
        if not commit:
            return
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
    """Write the buffered batch before partitions move to another member, without committing it.

    kafka-python 3 calls the listener on its IO loop, where a blocking call such as a commit raises "Cannot
    block on net.run() from the IO thread itself": the listener only writes. Written, the batch is safe
    whatever happens to the partitions' positions; the member that gets a partition next re-reads it from the
    last commit, and the dedup keys make that a no-op. If the poll loop is writing a batch right now (it holds
    the lock, and its commit may be waiting for this very loop), the listener leaves it to that write.
    """

    def __init__(self, owner: Consumer) -> None:
        self.owner = owner

    def on_partitions_revoked(self, revoked: Any) -> None:
        owner = self.owner
        if not owner._lock.acquire(blocking=False):
            return
        try:
            owner._write_buffer(commit=False)
        except Exception:
            log.exception("could not write the batch before a rebalance; it will be re-delivered")
            owner._buffer, owner._next, owner._buffer_since = [], {}, None
        finally:
            owner._lock.release()

    def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("assigned %d partitions", len(assigned))
