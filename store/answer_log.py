"""The answer log: rows the collector answered for before DuckDB committed them, durable in the meantime.

A single-event request costs the collector about half a millisecond of CPU when its answer waits for the
DuckDB commit that stores it (``bench/ack_modes.py``): a commit's cost is nearly all fixed (BEGIN, an Arrow
INSERT, COMMIT: 3-5 ms of CPU for 16 rows), and at most one request per client connection can join it,
since each waits for its answer. With the log, the writer appends the request group's rows to a file,
fsyncs it and answers; DuckDB commits the rows of many groups at once, a few hundred milliseconds later
or before any read. That is the write-ahead log of a database, here in front of another database.

The answer is the one the commit would give. The writer answers from the log only when every key of the
group is surely new: not in the store (the key index's filter has no false negatives, see
:meth:`ubi_pipeline.store.duckdb_store.Store.surely_new`), not among the rows answered and not yet
committed, and not twice in the group. Such rows can only be inserted, so the answer (accepted, with the
rejected items and their reasons) is exact. Any other group (a retry, a duplicate, a conflict, a key the
filter is unsure of, a store that failed its last write) is written the usual way, after the answered rows
are committed, and answered after its commit.

Durability: the collector appends with a :class:`ubi_pipeline.collector.spool.Spool` (frames with a CRC,
fsync before the answer, a torn tail cut on open; the format is :mod:`ubi_pipeline.store.framelog`). The
cursor moves past a frame only after DuckDB committed the frame's rows. Whoever opens the store next
writes the frames past the cursor first (:func:`replay`, from :class:`ubi_pipeline.store.duckdb_store.Store`
and from a reader that finds the file free): rows committed already come back as duplicates, and
``failed_records`` rows carry their ``failed_id`` and are inserted OR IGNORE, so nothing is counted twice.
A frame is Arrow IPC: one stream per table that has rows, each after a one-byte tag and its length.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson
import pyarrow as pa

from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.store import framelog
from ubi_pipeline.store.rows import RowStatus, failed_row, failed_table


class Store(Protocol):
    """What the log needs of :class:`ubi_pipeline.store.duckdb_store.Store` (which imports this module)."""

    path: Path

    def write_rows(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`ubi_pipeline.store.duckdb_store.Store.write_rows`."""


log = logging.getLogger("ubi.store.answer_log")

#: The tables of a frame, in write order: query records, events, failed records.
KINDS = ("queries", "events", "failed")
_TAGS = {b"q": 0, b"e": 1, b"f": 2}
_LEN = struct.Struct("<I")

Tables = tuple[pa.Table | None, pa.Table | None, pa.Table | None]


class AnswerLogError(StoreError):
    """A frame of the answer log cannot be read back (the log was written by something else, or damaged
    past what its CRC can see)."""


def encode(tables: Tables) -> bytes:
    """One frame's payload: each table with rows as an Arrow IPC stream after its tag and length."""
    parts = []
    for tag, table in zip(_TAGS, tables, strict=True):
        if table is None or not table.num_rows:
            continue
        out = pa.BufferOutputStream()
        with pa.ipc.new_stream(out, table.schema) as writer:
            writer.write_table(table)
        body = out.getvalue().to_pybytes()
        parts.append(tag + _LEN.pack(len(body)) + body)
    return b"".join(parts)


def decode(payload: bytes) -> Tables:
    """The tables of one frame's payload (None where the frame has no rows of that table)."""
    found: list[pa.Table | None] = [None, None, None]
    for tag, body in _parts(payload):
        try:
            found[_TAGS[tag]] = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise AnswerLogError(f"a frame's {KINDS[_TAGS[tag]]} table is not an Arrow IPC stream: {exc}") from exc
    return found[0], found[1], found[2]


def _parts(payload: bytes) -> Iterator[tuple[bytes, bytes]]:
    pos = 0
    while pos < len(payload):
        tag = payload[pos : pos + 1]
        if tag not in _TAGS or pos + 1 + _LEN.size > len(payload):
            raise AnswerLogError(f"a frame has an unknown part {tag!r} at byte {pos}: not written by this collector")
        (length,) = _LEN.unpack_from(payload, pos + 1)
        start = pos + 1 + _LEN.size
        if start + length > len(payload):
            raise AnswerLogError(f"a frame's part at byte {pos} runs past the frame's end")
        yield tag, payload[start : start + length]
        pos = start + length


def concat(frames: Sequence[Tables]) -> Tables:
    """The tables of several frames, each kind in one table (None where none has rows of it)."""
    out: list[pa.Table | None] = []
    for i in range(len(KINDS)):
        parts = [f[i] for f in frames if f[i] is not None and f[i].num_rows]  # type: ignore[union-attr]
        out.append(pa.concat_tables(parts) if parts else None)
    return out[0], out[1], out[2]


def answer_log_dir(db: Path | str) -> Path:
    """The answer log of the store at ``db``: a directory beside it (``ubi.duckdb`` -> ``ubi.duckdb.answers``)."""
    return Path(db).with_name(Path(db).name + ".answers")


def has_unapplied(db: Path | str) -> bool:
    """Whether the answer log of ``db`` may hold frames DuckDB has not committed (a collector stopped by a
    crash): bytes past the cursor (sizes only; a torn tail there counts, and is cut by the next writer)."""
    directory = answer_log_dir(db)
    if not directory.is_dir():
        return False
    try:
        return framelog.bytes_after_cursor(directory) > 0
    except (OSError, framelog.FrameLogError):
        return True  # unreadable: let the writer's open say why


def write_frames(
    store: Store,
    tables: Tables,
    *,
    replay: bool = False,
    key_hashes: tuple[np.ndarray | None, np.ndarray | None] = (None, None),
) -> int:
    """Write the rows of answered frames in one transaction; the rows that were not new (0 unless rows were
    written around the collector, or this is a replay). Rows whose key turns out to be taken by different
    content are kept in ``failed_records``, never dropped. ``key_hashes``: the key index's hashes of the
    queries' and events' keys, when the writer has them (:meth:`Store.write_rows`)."""
    queries, events, failed = tables

    def keep(rows: pa.Table | None, kind: str) -> Callable[[Sequence[int]], pa.Table | None]:
        def conflicts(positions: Sequence[int]) -> pa.Table | None:
            if rows is None:
                return None
            return failed_table([
                failed_row(
                    source="answer log", kind="conflict", raw=orjson.dumps(row, default=str),
                    reason=f"this {kind} was answered as accepted, then its key was found stored with different "
                           "content (written around the collector?); kept here instead",
                    received_at=row.get("received_at"),
                )
                for row in rows.take(pa.array(positions, pa.int64())).to_pylist()
            ])
        return conflicts

    outcome = store.write_rows(
        queries, events, failed, conflicts=keep(queries, "query record"), event_conflicts=keep(events, "event"),
        failed_or_ignore=replay, key_hashes=key_hashes,
    )
    return sum(st is not RowStatus.INSERTED for st in (*outcome.query_status, *outcome.event_status))


#: :func:`replay` writes frames in transactions of at most this many rows or payload bytes (the bytes: as the
#: collector commits them, so that a store under a tight memory limit can take them on open too).
REPLAY_ROWS = 50_000
REPLAY_BYTES = 4 * 1024**2


def replay(store: Store) -> int:
    """Write the frames of the store's answer log that DuckDB did not commit (the collector that answered
    them stopped first), then move the log's cursor past them; the rows written (0: nothing to do)."""
    directory = answer_log_dir(store.path)
    if not directory.is_dir():
        return 0
    written = 0
    batch: list[Tables] = []
    rows = size = 0
    end: framelog.Position | None = None
    for end_of, records, payload in framelog.unapplied(directory):
        batch.append(decode(payload))
        rows += records
        size += len(payload)
        end = end_of
        if rows >= REPLAY_ROWS or size >= REPLAY_BYTES:
            write_frames(store, concat(batch), replay=True)
            framelog.write_cursor(directory, end)
            written, batch, rows, size = written + rows, [], 0, 0
    if batch and end is not None:
        write_frames(store, concat(batch), replay=True)
        framelog.write_cursor(directory, end)
        written += rows
    if framelog.bytes_after_cursor(directory):  # a torn tail after the last whole frame: never answered
        framelog.cut_after(directory, framelog.read_cursor(directory))
    if written:
        log.warning("%s: wrote %d rows answered before the collector stopped but not committed (answer log %s)",
                    store.path, written, directory)
    return written
