"""A local durable spool: what the collector acknowledged while the broker could not take it.

Layout of one spool directory::

    lock                     flock'd by the one process that owns the spool
    seg-000000000001.log     append-only segments of frames
    seg-000000000002.log
    cursor                   {"segment": n, "offset": b}: everything before it has been replayed

A frame is a 16-byte header (magic ``UBIS``, payload length, record count, CRC-32 of the payload) and the
payload (the format is :mod:`ubi_pipeline.store.framelog`, shared with the store's answer log). :meth:`Spool.append` writes whole frames and fsyncs before it returns, so an entry that was
acknowledged survives a crash; a torn frame at the tail (the process died mid-write, before the fsync,
hence before any acknowledgement) is cut off when the spool is opened again. Replay reads entries in the
order they were appended and moves the cursor (written atomically: temp file, fsync, rename) only after the
broker acknowledged them, so a crash during replay replays some entries twice, never zero times; the
loader's dedup keys absorb the copies.

Several collectors on one host share a root directory: each claims the first free ``slot-N`` (by flock),
and a collector adopts and drains slots left behind by collectors that died (:func:`orphaned_slots`).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ubi_pipeline.collector.errors import SinkUnavailable
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.store.files import fsync_dir
from ubi_pipeline.store.framelog import (  # noqa: F401  (HEADER, MAGIC: re-exported for the spool's tests)
    HEADER,
    MAGIC,
    FrameLogError,
    Position,
    cut_after,
    frame,
    frames,
    read_cursor,
    segment_path,
    segments,
    unapplied,
    write_cursor,
)


class SpoolError(UbiError):
    """The spool directory cannot be used (permissions, another process holds it, corrupt cursor)."""


class SpoolLocked(SpoolError):
    """Another process owns this spool directory."""


class SpoolFull(SinkUnavailable):
    """The spool holds ``spool_max_bytes`` already: nothing more can be accepted until the broker is back (503)."""

    kind = "spool_full"


@dataclass(frozen=True)
class Entry:
    """One appended payload and where the next entry starts (what to acknowledge after replaying it)."""

    records: int
    payload: bytes
    end: Position


class Spool:
    """One spool directory, owned by this process (thread-safe)."""

    def __init__(
        self,
        directory: Path | str,
        *,
        max_bytes: int = 1024**3,
        segment_bytes: int = 64 * 1024**2,
        name: str = "local spool",
        full_reason: str = "(UBI_SPOOL_MAX_BYTES) while the Kafka broker is unreachable",
    ) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.name, self.full_reason = name, full_reason  # what it is and why it fills, for the 503 when full
        self._lock = threading.Lock()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SpoolError(f"{self.dir}: cannot use as a spool directory: {exc}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise SpoolLocked(f"{self.dir} is owned by another running collector") from exc
        self._closed = False
        #: records and entries replayed (acknowledged by the broker) since this process opened the spool
        self.replayed_records = 0
        self.replayed_entries = 0
        self._recover()

    # ------------------------------------------------------------ opening

    def _segments(self) -> list[int]:
        return segments(self.dir)

    def _path(self, segment: int) -> Path:
        return segment_path(self.dir, segment)

    def _recover(self) -> None:
        self.cursor = self._read_cursor()
        for s in self._segments():
            if s < self.cursor.segment:
                self._path(s).unlink(missing_ok=True)
        self.depth_bytes = self.depth_entries = self.depth_records = 0
        end = self.cursor
        for frame_end, records, payload in unapplied(self.dir):
            end = frame_end
            self.depth_entries += 1
            self.depth_records += records
            self.depth_bytes += HEADER.size + len(payload)
        # A torn or corrupt tail after the last whole frame was never fsync'd, hence never acknowledged.
        cut_after(self.dir, end)
        segments = self._segments()
        self._write_segment = segments[-1] if segments else max(self.cursor.segment, 1)
        self._fh = open(self._path(self._write_segment), "ab")
        self._write_offset = self._fh.tell()
        fsync_dir(self.dir)

    def _read_cursor(self) -> Position:
        try:
            return read_cursor(self.dir)
        except FrameLogError as exc:
            raise SpoolError(str(exc)) from exc

    # ------------------------------------------------------------ writing

    def append(self, payloads: Iterable[tuple[int, bytes]]) -> Position:
        """Append entries ``(records, payload)`` and fsync; all or none (raises :class:`SpoolFull`). Returns
        where the next entry will start: :meth:`ack_through` it once the entries are stored elsewhere."""
        items = list(payloads)
        framed = [frame(n, p) for n, p in items]
        size = sum(len(f) for f in framed)
        with self._lock:
            if self._closed:
                raise SpoolError(f"{self.dir}: the spool is closed")
            if self.depth_bytes + size > self.max_bytes:
                raise SpoolFull(
                    f"the {self.name} is full ({self.depth_bytes} of {self.max_bytes} bytes) {self.full_reason}; "
                    "retry later", retry_after=5)
            if self._write_offset >= self.segment_bytes:
                self._rotate()
            try:
                self._fh.write(b"".join(framed))
                self._fh.flush()
                os.fsync(self._fh.fileno())
            except OSError as exc:
                # The tail may now hold part of this write: cut it back so the spool stays readable.
                self._fh.truncate(self._write_offset)
                raise SinkUnavailable(f"could not write the local spool {self.dir}: {exc}") from exc
            self._write_offset += size
            self.depth_bytes += size
            self.depth_entries += len(framed)
            self.depth_records += sum(n for n, _ in items)
            return Position(self._write_segment, self._write_offset)

    def _rotate(self) -> None:
        self._fh.close()
        self._write_segment += 1
        self._fh = open(self._path(self._write_segment), "ab")
        self._write_offset = 0
        fsync_dir(self.dir)

    # ------------------------------------------------------------ replaying

    def read(self, max_records: int = 10_000, max_bytes: int = 16 * 1024**2) -> list[Entry]:
        """The oldest entries not yet acknowledged, in order (at least one when the spool is not empty)."""
        with self._lock:
            if self._closed:
                raise SpoolError(f"{self.dir}: the spool is closed")
            out: list[Entry] = []
            pos = self.cursor
            records = size = 0
            while pos.segment <= self._write_segment:
                path = self._path(pos.segment)
                data = path.read_bytes() if path.exists() else b""
                if pos.segment == self._write_segment:
                    data = data[:self._write_offset]
                for end, n, payload in frames(data, pos.offset):
                    if out and (records + n > max_records or size + len(payload) > max_bytes):
                        return out
                    out.append(Entry(n, payload, Position(pos.segment, end)))
                    records += n
                    size += len(payload)
                if pos.segment == self._write_segment:
                    break
                pos = Position(pos.segment + 1, 0)
            return out

    def ack(self, entries: list[Entry]) -> None:
        """Mark ``entries`` (the first ones :meth:`read` returned) as replayed: persist the cursor, drop old segments."""
        if not entries:
            return
        self.ack_through(entries[-1].end, entries=len(entries), records=sum(e.records for e in entries),
                         size=sum(HEADER.size + len(e.payload) for e in entries))

    def ack_through(self, end: Position, *, entries: int, records: int, size: int) -> None:
        """Mark everything before ``end`` as replayed: ``entries`` entries of ``records`` records, ``size`` bytes
        with their headers (what :meth:`append` or :meth:`read` gave for them)."""
        with self._lock:
            if self._closed:
                raise SpoolError(f"{self.dir}: the spool is closed")
            if end <= self.cursor:
                return
            write_cursor(self.dir, end)
            old = self.cursor
            self.cursor = end
            for s in range(old.segment, end.segment):
                self._path(s).unlink(missing_ok=True)
            self.depth_bytes -= size
            self.depth_entries -= entries
            self.depth_records -= records
            self.replayed_entries += entries
            self.replayed_records += records

    # ------------------------------------------------------------ state

    @property
    def empty(self) -> bool:
        return self.depth_entries == 0

    def state(self) -> dict[str, int | str]:
        """Depth and replay progress, for ``/healthz`` and ``/metrics``."""
        return {"dir": str(self.dir), "bytes": self.depth_bytes, "entries": self.depth_entries,
                "records": self.depth_records, "max_bytes": self.max_bytes,
                "replayed_records": self.replayed_records, "replayed_entries": self.replayed_entries}

    def close(self) -> None:
        """Release the directory (what is spooled stays for the next owner)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._fh.close()
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- several collectors on one host


def slot_dir(root: Path, n: int) -> Path:
    return Path(root) / f"slot-{n}"


def claim(root: Path | str, **kwargs: Any) -> Spool:
    """Open the first spool slot under ``root`` that no running process owns."""
    root = Path(root)
    n = 0
    while True:
        try:
            return Spool(slot_dir(root, n), **kwargs)
        except SpoolLocked:
            n += 1
            if n > 10_000:
                raise SpoolError(f"{root}: no free spool slot among 10,000") from None


def orphaned_slots(root: Path | str, own: Path) -> list[Path]:
    """Slot directories under ``root`` other than ``own`` that hold segments (their owner may have died)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("slot-*") if p.is_dir() and p.resolve() != own.resolve()
                  and any(p.glob("seg-*.log")))
