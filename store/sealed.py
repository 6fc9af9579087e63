"""Sealed segments: what the one writer has stored, as immutable Parquet files that readers scan directly.

While ``ubi serve`` or ``ubi consume --db`` holds the DuckDB file no other process may open it, so a reader
asks the writer to *seal*: in one read transaction (DuckDB's MVCC: the state of one commit, writers keep
committing meanwhile) the writer copies only the rows stored since the last seal into new Parquet files,
and answers with the list of every sealed file plus the small mutable tables. The reader opens an in-memory
DuckDB whose ``ubi_queries``, ``ubi_events`` and ``failed_records`` are views over those files, and whose
``judgments``, ``judgment_runs`` and ``human_judgments`` hold the rows it was sent, so every reader's SQL runs unchanged.

Layout, beside the database (``Settings.seal_dir`` moves it)::

    <db>.sealed/manifest.json
    <db>.sealed/ubi_events/day=2026-12-01/seg-<generation>-000042-0.parquet
    <db>.sealed/ubi_queries/day=.../...
    <db>.sealed/failed_records/day=.../...

Hive-partitioned by the day rows were received (``received_at``), one file per seal and day.

The watermark: those three tables are append-only (rows are inserted, never updated or deleted; dedup
happens at insert), DuckDB appends each commit's rows after the last row, and commits are serial (every
write goes through :meth:`Store.transaction`, under the store's one lock), so the rows committed after a
seal's read transaction began all have a ``rowid`` above every row it saw. The
manifest keeps, per table, the highest ``rowid`` sealed, how many rows were sealed, and the key of that top
row; a seal copies the rows above it. Each seal first checks the count and the key against the store (a
store replaced, restored, or with rows deleted fails the check) and then seals again from scratch under a
new generation, so a reader never sees a row twice or misses one.

What is on disk belongs to the writer, never to a reader: segments are immutable and shared by every
reader, so a reader killed mid-read leaves nothing behind and a second reader costs no second copy. A seal
writes into a staging folder and renames into place before the manifest names the files; at start-up the
writer removes staging folders and any file the manifest does not name (a seal cut short, an old
generation). Segments are never compacted (see README, "One writer, many readers").
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import duckdb
import pyarrow as pa

from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.store.files import fsync_dir
from ubi_pipeline.store.sql import checked_columns, quote_ident


class SealedStore(Protocol):
    """What a :class:`Sealer` reads of its store (:class:`ubi_pipeline.store.duckdb_store.Store` has it)."""

    path: Path
    memory_limit: str | None

    def reading_cursor(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]: ...

#: Append-only tables sealed into segments, with the key that names a row.
SEALED_TABLES: dict[str, str] = {"ubi_queries": "query_key", "ubi_events": "event_key", "failed_records": "failed_id"}
#: Tables rows are replaced in (``Store.load_table``): each sealed as one Parquet snapshot named by a fingerprint
#: of its rows, written again only when the rows changed. (They were sent whole with every seal answer: at 20M
#: events, 416,660 judgments and 545 MB of parameters per reader, serialised in the collector's event loop.)
INLINE_TABLES = ("judgments", "judgment_runs", "human_judgments")
DDL = {name: table.ddl() for name, table in tables.TABLES.items()}
MANIFEST = "manifest.json"
#: Rows copied by one COPY statement: bounds the writer's memory while it seals a large backlog (DuckDB keeps
#: a row group per open partition), at the price of one file per chunk and day.
CHUNK_ROWS = 1_000_000
#: Rows DuckDB buffers per thread before it flushes a partitioned COPY to its files
#: (``partitioned_write_flush_threshold``; DuckDB's default 524,288). A partitioned write holds what it has not
#: flushed in the buffer pool: a 1M-row chunk of a 20M-event store's events (one day) ran out of the collector's
#: 256 MB pool at the default, and copies within it at this value (233 MB peak RSS of the whole process, same file size and time as at
#: 50,000 or 100,000; measured on that store).
FLUSH_ROWS = 20_000

log = logging.getLogger("ubi.store.sealed")
#: Media type of a seal answer (:func:`encode_seal`).
MEDIA_TYPE = "application/vnd.ubi.sealed"


class SealFailed(StoreError):
    """A seal could not be written (full disk, unwritable seal directory) or read back."""


@dataclass
class Sealed:
    """What a reader needs: every sealed file per table (absolute paths) and the inline tables' rows."""

    root: Path
    files: dict[str, list[Path]]
    inline: dict[str, pa.Table] = field(default_factory=dict)
    #: rows sealed by this call (not counting those sealed before), per table
    new_rows: dict[str, int] = field(default_factory=dict)
    #: wall seconds the writer spent sealing (the read transaction, the copy and publishing)
    seconds: float = 0.0


@dataclass
class _TableMark:
    upto_rowid: int = -1
    rows: int = 0
    last_key: str | None = None
    files: list[str] = field(default_factory=list)  # relative to the seal root


@dataclass
class _Manifest:
    generation: str
    seals: int = 0
    tables: dict[str, _TableMark] = field(default_factory=dict)
    #: per derived table (INLINE_TABLES): its snapshot file (relative to the root; None: no rows) and the
    #: fingerprint of the rows it holds
    snapshots: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    @classmethod
    def fresh(cls) -> _Manifest:
        return cls(uuid.uuid4().hex[:12], 0, {t: _TableMark() for t in SEALED_TABLES})

    def to_json(self) -> str:
        return json.dumps({
            "generation": self.generation,
            "seals": self.seals,
            "tables": {t: vars(m) for t, m in self.tables.items()},
            "snapshots": {t: list(v) for t, v in self.snapshots.items()},
        })

    @classmethod
    def read(cls, path: Path) -> _Manifest | None:
        try:
            raw = json.loads(path.read_text())
            marks = {t: _TableMark(**raw["tables"][t]) for t in SEALED_TABLES}
            snaps = {t: (str(v[0]), None if v[1] is None else str(v[1]))
                     for t, v in raw.get("snapshots", {}).items() if t in INLINE_TABLES}
            return cls(str(raw["generation"]), int(raw["seals"]), marks, snaps)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable: sealed again from scratch, and the files it named become orphans


def default_root(db: Path) -> Path:
    """Where the segments of ``db`` go unless ``Settings.seal_dir`` says otherwise."""
    return Path(str(db) + ".sealed")


class Sealer:
    """Seals one store's append-only tables, incrementally; one seal at a time per process."""

    def __init__(self, store: SealedStore, root: Path | None = None) -> None:
        self.store = store
        self.root = Path(root) if root is not None else default_root(store.path)
        self._lock = threading.Lock()
        self._manifest: _Manifest | None = None

    # ------------------------------------------------------------ housekeeping

    def clean(self) -> list[Path]:
        """Remove staging folders and every segment the manifest does not name; return what was removed.

        Run at the writer's start-up, when no reader can hold a file named only by a seal cut short.
        """
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        manifest = _Manifest.read(self.root / MANIFEST)
        named = {f for m in manifest.tables.values() for f in m.files} if manifest else set()
        named |= {f for _, f in manifest.snapshots.values() if f} if manifest else set()
        for staging in self.root.glob(".staging-*"):
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
        # Segments sit in a folder per day, snapshots directly under their table's folder.
        files = [(t, "*/*.parquet") for t in SEALED_TABLES] + [(t, "*.parquet") for t in INLINE_TABLES]
        for table, pattern in files:
            for f in sorted((self.root / table).glob(pattern)):
                if str(f.relative_to(self.root)) not in named:
                    with contextlib.suppress(OSError):
                        f.unlink()
                    removed.append(f)
        for table in SEALED_TABLES:
            for day in (self.root / table).glob("*"):
                with contextlib.suppress(OSError):
                    day.rmdir()  # only when empty
        return removed

    def disk_bytes(self) -> int:
        """Bytes of every file under the seal root."""
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file()) if self.root.is_dir() else 0

    # ------------------------------------------------------------ sealing

    def seal(self) -> Sealed:
        """Seal what was committed since the last seal; return every sealed file and the inline tables.

        Runs on its own cursor in one read transaction, outside the store lock: writers keep committing,
        and the result holds every row of a committed write or none of it.
        """
        with self._lock:
            return self._seal_locked()

    def _load_manifest(self) -> _Manifest:
        if self._manifest is None:
            self._manifest = _Manifest.read(self.root / MANIFEST) or _Manifest.fresh()
        return self._manifest

    def _seal_locked(self) -> Sealed:
        started = time.perf_counter()
        old = self._load_manifest()
        staging = self.root / f".staging-{uuid.uuid4().hex[:12]}"
        with self.store.reading_cursor() as cur:
            cur.execute(f"SET partitioned_write_flush_threshold = {int(FLUSH_ROWS)}")
            cur.execute("BEGIN TRANSACTION")
            try:
                # A copy: a seal cut short must leave the manifest in force as it was.
                manifest = copy.deepcopy(old) if self._still_valid(cur, old) else _Manifest.fresh()
                seal_no = manifest.seals + 1
                tops: dict[str, tuple[int, int, str | None]] = {}
                try:
                    staging.mkdir(parents=True)
                    for table, key in SEALED_TABLES.items():
                        tops[table] = self._copy_new(cur, table, key, manifest.tables[table], staging,
                                                     f"seg-{manifest.generation}-{seal_no:06d}")
                    snaps = {t: self._snapshot(cur, t, manifest.snapshots.get(t), staging) for t in INLINE_TABLES}
                except duckdb.OutOfMemoryException as exc:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise SealFailed(
                        f"sealing {self.store.path} ran out of the writer's DuckDB memory "
                        f"({self.store.memory_limit or 'DuckDB default'}): {exc}. Raise UBI_WRITER_MEMORY_LIMIT "
                        "for the collector; nothing was sealed and the last seal stays in force"
                    ) from exc
                except (duckdb.IOException, OSError) as exc:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise SealFailed(
                        f"could not write sealed segments or snapshots of {self.store.path} to {self.root}: {exc}. "
                        "Free space there, or point UBI_SEAL_DIR at a disk with room for the store's Parquet copy."
                    ) from exc
            finally:
                with contextlib.suppress(duckdb.Error):
                    cur.execute("COMMIT")
        try:
            new_rows = self._publish(manifest, staging, seal_no, tops, snaps)
        except OSError as exc:
            raise SealFailed(f"could not publish sealed segments under {self.root}: {exc}") from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        files = {t: [self.root / f for f in m.files] for t, m in manifest.tables.items()}
        files.update({t: [self.root / f] if f else [] for t, (_, f) in manifest.snapshots.items()})
        seconds = time.perf_counter() - started
        if any(new_rows.values()):
            log.info("sealed %s new rows of %s in %.2f s", new_rows, self.store.path, seconds)
        return Sealed(self.root, files, {}, new_rows, seconds)

    def _snapshot(self, cur: duckdb.DuckDBPyConnection, table: str, old: tuple[str, str | None] | None,
                  staging: Path) -> tuple[str, str | None, Path | None]:
        """(fingerprint, file relative to the root, staged file to publish or None) of a derived table's rows.

        The fingerprint is the row count and the sum of every row's hash over all its columns, in the seal's
        read transaction: rows unchanged since the last snapshot keep its file (nothing is written), else they
        are copied to a new file named by the fingerprint; an empty table has none.
        """
        cols = ", ".join(quote_ident(c) for c in tables.TABLE_COLUMNS[table])
        name = quote_ident(table)  # a fixed name (INLINE_TABLES), quoted all the same
        n, total = _one(cur, f"SELECT count(*), coalesce(sum(hash({cols})), 0) FROM {name}")
        fingerprint = f"{int(n)}-{int(total):x}"
        if not n:
            return fingerprint, None, None
        rel = f"{table}/snap-{hashlib.sha256(fingerprint.encode()).hexdigest()[:24]}.parquet"
        if old is not None and old[0] == fingerprint and old[1] == rel and (self.root / rel).exists():
            return fingerprint, rel, None
        out = staging / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        cur.execute(f"COPY (SELECT {cols} FROM {name}) TO '{str(out).replace(chr(39), chr(39) * 2)}' "
                    "(FORMAT parquet, COMPRESSION zstd)")
        return fingerprint, rel, out

    @staticmethod
    def _still_valid(cur: duckdb.DuckDBPyConnection, manifest: _Manifest) -> bool:
        """Whether the rows the manifest says were sealed are still the store's rows up to its watermark.

        Costs look-ups, not a scan of the store: DuckDB answers ``count(*)`` from its row-group metadata and
        prunes row groups on a ``rowid`` filter, so only the rows past the watermark are read. As many rows
        at or below the watermark as were sealed, and the sealed key at the watermark row, say that nothing
        was deleted or renumbered (a replaced, restored or vacuumed store fails one of them).
        """
        for name, key_name in SEALED_TABLES.items():
            mark = manifest.tables[name]
            table, key = quote_ident(name), quote_ident(key_name)
            row = _one(
                cur,
                f"SELECT (SELECT count(*) FROM {table}) - (SELECT count(*) FROM {table} WHERE rowid > ?), "
                f"(SELECT max({key}) FROM {table} WHERE rowid = ?)",
                [mark.upto_rowid, mark.upto_rowid],
            )
            if int(row[0]) != mark.rows or (mark.upto_rowid >= 0 and row[1] != mark.last_key):
                return False
        return True

    @staticmethod
    def _copy_new(
        cur: duckdb.DuckDBPyConnection, table: str, key: str, mark: _TableMark, staging: Path, stem: str
    ) -> tuple[int, int, str | None]:
        """Copy the rows past the mark to ``staging/table/day=.../``; return (new top rowid, rows, last key).

        In chunks of :data:`CHUNK_ROWS` rowids, each one COPY, all in the caller's one read transaction.
        """
        out = str(staging / table).replace("'", "''")
        cols = ", ".join(quote_ident(c) for c in tables.TABLE_COLUMNS[table])
        table, key = quote_ident(table), quote_ident(key)  # fixed names (SEALED_TABLES), quoted all the same
        top = int(_one(cur, f"SELECT coalesce(max(rowid), -1) FROM {table}")[0])
        if top <= mark.upto_rowid:
            return mark.upto_rowid, 0, mark.last_key
        count = 0
        for chunk, low in enumerate(range(mark.upto_rowid, top, CHUNK_ROWS)):
            window = f"FROM {table} WHERE rowid > {int(low)} AND rowid <= {min(top, low + CHUNK_ROWS)}"
            (copied,) = cur.execute(
                f"COPY (SELECT {cols}, strftime(received_at, '%Y-%m-%d') AS day {window}) TO '{out}' "
                f"(FORMAT parquet, COMPRESSION zstd, PARTITION_BY (day), APPEND, "
                f"FILENAME_PATTERN '{stem}-{chunk:04d}-{{uuid}}')"
            ).fetchall()[0]
            count += int(copied)
        last = _one(cur, f"SELECT max({key}) FROM {table} WHERE rowid = {top}")[0]
        return top, count, last

    def _publish(
        self, manifest: _Manifest, staging: Path, seal_no: int, tops: dict[str, tuple[int, int, str | None]],
        snaps: dict[str, tuple[str, str | None, Path | None]],
    ) -> dict[str, int]:
        """Move staged files into place, then write the manifest that names them (atomically).

        A snapshot replaced by a newer one stays on disk (a reader may still be scanning it) until the writer's
        next start (:meth:`clean`)."""
        new_rows: dict[str, int] = {}
        for table, (fingerprint, rel, staged) in snaps.items():
            if staged is not None and rel is not None:
                dest = self.root / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, dest)
                fsync_dir(dest.parent)
            manifest.snapshots[table] = (fingerprint, rel)
        for table, (top, count, last) in tops.items():
            mark = manifest.tables[table]
            new_rows[table] = count
            if not count:
                continue
            for seg in sorted((staging / table).glob("*/*.parquet")):
                seg_rel = seg.relative_to(staging)
                dest = self.root / seg_rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(seg, dest)
                fsync_dir(dest.parent)
                mark.files.append(str(seg_rel))
            mark.upto_rowid, mark.rows, mark.last_key = top, mark.rows + count, last
        manifest.seals = seal_no
        tmp = self.root / f".{MANIFEST}.tmp"
        with open(tmp, "w") as fh:
            fh.write(manifest.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.root / MANIFEST)
        fsync_dir(self.root)
        self._manifest = manifest
        return new_rows


def _one(cur: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> tuple[Any, ...]:
    """The one row of an aggregate query, its result fetched to the end (DuckDB then takes the next statement)."""
    rows = cur.execute(sql, params or []).fetchall()
    return tuple(rows[0])


# ---------------------------------------------------------------- the wire: one answer, no file per reader


def encode_seal(sealed: Sealed) -> Iterator[bytes]:
    """A seal answer: a length-prefixed JSON header (the files), then each inline table as an Arrow IPC stream.

    Every part is an 8-byte big-endian length followed by that many bytes.
    """
    head = json.dumps({
        "root": str(sealed.root),
        "files": {t: [str(p) for p in ps] for t, ps in sealed.files.items()},
        "inline": list(sealed.inline),
        "new_rows": sealed.new_rows,
        "seconds": sealed.seconds,
    }).encode()
    yield struct.pack(">Q", len(head)) + head
    for data in sealed.inline.values():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, data.schema) as writer:
            writer.write_table(data)
        buf = sink.getvalue().to_pybytes()
        yield struct.pack(">Q", len(buf)) + buf


def decode_seal(body: bytes) -> Sealed:
    """The :class:`Sealed` of an answer made by :func:`encode_seal`; raises :class:`SealFailed` if malformed."""
    parts: list[bytes] = []
    pos = 0
    while pos < len(body):
        if pos + 8 > len(body):
            raise SealFailed(f"seal answer cut short at byte {pos} of {len(body)} (a part's length)")
        (n,) = struct.unpack(">Q", body[pos:pos + 8])
        if pos + 8 + n > len(body):
            raise SealFailed(f"seal answer cut short: part at byte {pos} says {n} bytes, {len(body) - pos - 8} left")
        parts.append(body[pos + 8:pos + 8 + n])
        pos += 8 + n
    try:
        head: dict[str, Any] = json.loads(parts[0])
        names = list(head["inline"])
        if len(parts) != 1 + len(names):
            raise SealFailed(f"seal answer has {len(parts) - 1} inline tables, its header names {len(names)}")
        inline = {n: pa.ipc.open_stream(pa.py_buffer(p)).read_all() for n, p in zip(names, parts[1:], strict=True)}
        files = {t: [Path(p) for p in ps] for t, ps in head["files"].items()}
        return Sealed(Path(head["root"]), files, inline, {t: int(v) for t, v in head.get("new_rows", {}).items()},
                      float(head.get("seconds", 0.0)))
    except (IndexError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        raise SealFailed(f"seal answer is malformed: {type(exc).__name__}: {exc}") from exc


# ---------------------------------------------------------------- reading


def open_sealed(sealed: Sealed, *, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the store's five tables, read from ``sealed``.

    The append-only tables are views over their segments (the store's declared columns, in order, with
    the declared types), and the derived tables over their snapshot; a table with no file yet is an empty
    table. Derived tables sent as rows (``Sealed.inline``) are filled from them. Nothing is written to disk.
    ``threads``: DuckDB's worker threads (default: one per core), set when the database starts, so no more
    threads than that are ever started.
    """

    con = duckdb.connect(config={"threads": int(threads)} if threads is not None else {})
    try:
        # the derived tables are snapshot files too, when the writer sealed them so (rows sent inline otherwise)
        for table in (*SEALED_TABLES, *(t for t in INLINE_TABLES if t in sealed.files)):
            files = [str(p) for p in sealed.files.get(table, [])]
            missing = [f for f in files if not os.path.exists(f)]
            if missing:
                raise SealFailed(f"sealed segment {missing[0]} of {table} is gone; ask the writer to seal again")
            if not files:
                con.execute(DDL[table])
                continue
            # each column cast to its declared type (ubi_pipeline.schemas.tables), whatever the files' own types
            cols = ", ".join(f"{quote_ident(c.name)}::{c.sql} AS {quote_ident(c.name)}"
                             for c in tables.TABLES[table].columns)
            listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            con.execute(f"CREATE VIEW {quote_ident(table)} AS SELECT {cols} FROM read_parquet([{listed}], "
                        "hive_partitioning = false)")
        for table in INLINE_TABLES:
            if table in sealed.files:
                continue
            con.execute(DDL[table])
            data = sealed.inline.get(table)
            if data is not None and data.num_rows:
                cols = checked_columns(table, data.column_names)  # names from an answer: on the fixed list
                con.register("_inline", data)
                con.execute(f"INSERT INTO {quote_ident(table)} ({cols}) SELECT {cols} FROM _inline")
                con.unregister("_inline")
    except BaseException:
        con.close()
        raise
    return con
