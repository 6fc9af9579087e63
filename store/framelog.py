"""The on-disk format of the collector's durable logs: segments of CRC'd frames and a cursor.

Two logs use it: the Kafka sink's spool (``ubi_pipeline.collector.spool``: what was acknowledged while the
broker could not take it) and the DuckDB store's answer log (:mod:`ubi_pipeline.store.answer_log`: what was
acknowledged before DuckDB committed it). Layout of one log directory::

    seg-000000000001.log     append-only segments of frames
    seg-000000000002.log
    cursor                   {"segment": n, "offset": b}: everything before it has been applied

A frame is a 16-byte header (magic ``UBIS``, payload length, record count, CRC-32 of the payload) and the
payload. The cursor is written atomically (temp file, fsync, rename).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.store.files import fsync_dir

MAGIC = b"UBIS"
HEADER = struct.Struct("<4sIII")  # magic, payload length, records, crc32(payload)
SEGMENT = "seg-{:012d}.log"


class FrameLogError(StoreError):
    """A log directory cannot be used (permissions, corrupt cursor)."""


@dataclass(frozen=True, order=True)
class Position:
    """A place in a log: segment number and byte offset in it."""

    segment: int
    offset: int


def frame(records: int, payload: bytes) -> bytes:
    """One frame: header and payload."""
    return HEADER.pack(MAGIC, len(payload), records, zlib.crc32(payload)) + payload


def frames(data: bytes, start: int = 0) -> Iterator[tuple[int, int, bytes]]:
    """Valid frames of a segment's bytes from ``start``: (end offset, records, payload); stops at the first bad one."""
    pos = start
    while pos + HEADER.size <= len(data):
        magic, length, records, crc = HEADER.unpack_from(data, pos)
        body_end = pos + HEADER.size + length
        if magic != MAGIC or body_end > len(data):
            return
        payload = data[pos + HEADER.size:body_end]
        if zlib.crc32(payload) != crc:
            return
        pos = body_end
        yield pos, records, payload


def segments(directory: Path) -> list[int]:
    """The segment numbers in ``directory``, in order."""
    out = []
    for p in Path(directory).glob("seg-*.log"):
        try:
            out.append(int(p.stem[4:]))
        except ValueError:
            continue
    return sorted(out)


def segment_path(directory: Path, segment: int) -> Path:
    return Path(directory) / SEGMENT.format(segment)


def read_cursor(directory: Path) -> Position:
    """Where the frames not yet applied start (the first segment's start when no cursor was written)."""
    path = Path(directory) / "cursor"
    try:
        obj = json.loads(path.read_text())
        return Position(int(obj["segment"]), int(obj["offset"]))
    except FileNotFoundError:
        found = segments(directory)
        return Position(found[0] if found else 1, 0)
    except (ValueError, KeyError, TypeError) as exc:
        raise FrameLogError(f"{path}: unreadable log cursor ({exc}); inspect the segments before deleting it, "
                            "or entries would be applied again from the start") from exc


def write_cursor(directory: Path, end: Position) -> None:
    """Record that everything before ``end`` is applied (atomically: temp file, fsync, rename)."""
    directory = Path(directory)
    tmp = directory / "cursor.tmp"
    with open(tmp, "w") as fh:
        fh.write(json.dumps({"segment": end.segment, "offset": end.offset}))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, directory / "cursor")
    fsync_dir(directory)


def unapplied(directory: Path) -> Iterator[tuple[Position, int, bytes]]:
    """The valid frames after the cursor, in order: (where the next one starts, records, payload). A torn tail
    ends the walk (it was never fsync'd, hence never acknowledged)."""
    directory = Path(directory)
    cursor = read_cursor(directory)
    for s in segments(directory):
        if s < cursor.segment:
            continue
        data = segment_path(directory, s).read_bytes()
        start = cursor.offset if s == cursor.segment else 0
        end = start
        for end, records, payload in frames(data, start):
            yield Position(s, end), records, payload
        if end < len(data):
            return


def bytes_after_cursor(directory: Path) -> int:
    """Bytes of the segments past the cursor (file sizes only, nothing read)."""
    directory = Path(directory)
    cursor = read_cursor(directory)
    total = 0
    for s in segments(directory):
        if s >= cursor.segment:
            size = segment_path(directory, s).stat().st_size
            total += max(0, size - cursor.offset) if s == cursor.segment else size
    return total


def cut_after(directory: Path, end: Position) -> None:
    """Drop what the log holds past ``end`` (a torn tail: never fsync'd, hence never acknowledged): truncate
    its segment there and remove later ones. Only for the log's one writer."""
    directory = Path(directory)
    for s in segments(directory):
        path = segment_path(directory, s)
        if s > end.segment:
            path.unlink(missing_ok=True)
        elif s == end.segment and path.stat().st_size > end.offset:
            with open(path, "r+b") as fh:
                fh.truncate(end.offset)
                os.fsync(fh.fileno())
    fsync_dir(directory)
