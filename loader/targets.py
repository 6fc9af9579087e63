"""Where the loader writes a decoded batch, durably, before its offsets are committed.

* :class:`DuckDBLoader`: the DuckDB store. DuckDB has one writing process, so one loader per store file
  (a second one fails with :class:`~ubi_pipeline.schemas.errors.StoreLocked`); readers read the segments it seals as from a
  collector (:mod:`ubi_pipeline.loader.admin` serves the same admin protocol, :mod:`ubi_pipeline.transport.admin`).
* :class:`ParquetLoader`: a folder of Parquet files (:mod:`ubi_pipeline.store.parquet_store`), one writer per
  partition, so several loaders in one group scale out.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ubi_pipeline.loader.decode import Decoded, Origin
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.parquet_store import ORIGIN, TABLE_DIRS, PartitionWriter
from ubi_pipeline.store.rows import Counts, event_content_hash, failed_row, failed_table, utcnow


class Loader(Protocol):
    """Where loaded batches go. ``write`` returns only once the batch is durable."""

    def write(self, batch: Decoded) -> Counts: ...

    def close(self) -> None: ...




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

    def write(self, batch: Decoded) -> Counts:
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
            return failed_table(kept) if kept else None

        def keep_event_conflicts(positions: Any) -> pa.Table | None:
            if events is None:
                return None
            taken = events.take(pa.array(positions, pa.int64())).to_pylist()
            rows = [conflict_row(
                conflict_id(row["event_key"], event_content_hash(row)), batch.event_origin[pos], "event_id",
                f"event_id {row['event_id']!r} is already stored for an event with different content; first "
                "write wins, this event is kept as a conflict") for pos, row in zip(positions, taken, strict=True)]
            kept = [r for r in rows if r is not None]
            return failed_table(kept) if kept else None

        outcome = self.store.write_rows(queries, events, failed_table(failed) if failed else None,
                                        conflicts=keep_conflicts, event_conflicts=keep_event_conflicts)
        poison = sum(1 for f in failed if f["kind"] == "poison")
        return Counts.of(outcome.query_status, outcome.event_status, failed=len(failed) - poison, poison=poison)

    def close(self) -> None:
        self.store.close()


# ---------------------------------------------------------------- Parquet


class ParquetLoader:
    """A loader (see :class:`collector.consumer.Loader`) writing one Parquet file per table and partition per batch."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        try:
            for d in TABLE_DIRS:
                (self.root / d).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.root}: cannot create the Parquet store: {exc}") from exc
        self._cleanup_temporaries()
        self.writers: dict[tuple[str, int], PartitionWriter] = {}

    def _cleanup_temporaries(self) -> None:
        # Left by a loader killed mid-write: never renamed, never committed, so the batch comes again.
        for tmp in self.root.glob("*/*/.part-*.parquet.tmp"):
            tmp.unlink(missing_ok=True)

    def _writer(self, topic: str, partition: int) -> PartitionWriter:
        key = (topic, partition)
        if key not in self.writers:
            self.writers[key] = PartitionWriter(self.root, topic, partition)
        return self.writers[key]

    def _write_rows(self, table_dir: str, table: pa.Table | None, origin: list[Origin]) -> int:
        if table is None or not table.num_rows:
            return 0
        parts = pa.array([o.record.partition for o in origin], pa.int32())
        table = (table.append_column(ORIGIN.field("kafka_partition"), parts)
                 .append_column(ORIGIN.field("kafka_offset"), pa.array([o.record.offset for o in origin], pa.int64()))
                 .append_column(ORIGIN.field("kafka_line"), pa.array([o.line for o in origin], pa.int32())))
        topic = origin[0].record.topic
        for p in sorted(set(parts.to_pylist())):
            rows = table.filter(pc.equal(table.column("kafka_partition"), p))
            offs = rows.column("kafka_offset")
            self._writer(topic, p).write(table_dir, rows, pc.min(offs).as_py(), pc.max(offs).as_py())
        return table.num_rows

    def write(self, batch: Decoded) -> Counts:
        q = self._write_rows("ubi_queries", batch.queries, batch.query_origin)
        e = self._write_rows("ubi_events", batch.events, batch.event_origin)
        groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for f in batch.failed:
            groups.setdefault((f["kafka_topic"] or "", f["kafka_partition"] or 0), []).append(f)
        for (topic, part), rows in sorted(groups.items()):
            offs = [r["kafka_offset"] or 0 for r in rows]
            self._writer(topic, part).write("failed_records", failed_table(rows), min(offs), max(offs))
        # Dedup happens when reading (the views), so every row counts as loaded here.
        poison = sum(1 for f in batch.failed if f["kind"] == "poison")
        return Counts(queries=q, events=e, failed=len(batch.failed) - poison, poison=poison)

    def close(self) -> None:
        return
