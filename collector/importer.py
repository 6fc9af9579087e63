"""``ubi import``: load UBI files through the same parsing and validation as the HTTP routes.

Files may be NDJSON (one record per line), a JSON array or a single object, or an OpenSearch ``_bulk``
export; the format is detected from the first line. Records go straight into the store when this process
can open it; when a running collector holds the file (DuckDB allows one writer), they are sent to that
collector's ``/v1/bulk`` route in chunks instead, so the one writer stays the one writer.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ubi_pipeline.collector.blocks import block_lines
from ubi_pipeline.collector.bodies import (
    BOM,
    BULK_INDEX,
    FILE_BUFFER,
    PLAIN_ACTION_PATTERN,
    BodyError,
    Kind,
    RawItem,
    array_items,
    bulk_items,
    bulk_record,
    ndjson_items,
    open_file,
    parses,
    split_json,
    starts_bulk,
    stream_lines,
)
from ubi_pipeline.collector.fastpath import (
    Candidates,
    Chunk,
    ParsedChunk,
    fast_parser,
    parse_chunk,
    store_chunk,
)
from ubi_pipeline.collector.ingest import (
    IngestContext,
    IngestResult,
    ItemError,
    RecordFilter,
    apply_filters,
    ingest,
    validate_items,
)
from ubi_pipeline.schemas.errors import InputFileError, StoreError, StoreLocked
from ubi_pipeline.store.client import collector_url
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import Counts, utcnow

#: Records per write (and per request to a running collector): under the default ``max_items`` of 10,000.
CHUNK_ITEMS = 5000
#: Largest request body sent to a running collector (under the default ``max_body_bytes`` of 5 MB).
CHUNK_BYTES = 4 * 1024 * 1024


@dataclass
class FileReport:
    """What importing one file did; ``errors`` are ``(index, line, field, message)`` of rejected records.

    ``index`` is the record's 0-based position in the file (array item, NDJSON record, ``_bulk`` pair) and
    ``line`` the 1-based line of its document (where it starts, for an item of a JSON array).
    """

    path: str
    counts: Counts = field(default_factory=Counts)  # what the chunks' writes stored and found stored already
    rejected: int = 0  # records refused (conflicts included), as IngestResult.rejected
    errors: list[tuple[int, int | None, str | None, str]] = field(default_factory=list)

    def add(self, result: IngestResult, chunk: Sequence[RawItem] | Mapping[int, int | None], max_errors: int) -> None:
        """Count one written chunk (items numbered by their position in the file, as its errors are); ``chunk``:
        its items, or the line of each rejected item by index."""
        lines = chunk if isinstance(chunk, Mapping) else {it.index: it.line for it in chunk}
        self.counts.add(result.counts)
        self.rejected += result.rejected
        for err in result.errors:
            if len(self.errors) < max_errors:
                self.errors.append((err.index, lines.get(err.index), err.field, err.message))

    def public(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "queries": self.counts.queries,
            "events": self.counts.events,
            "accepted": self.counts.accepted,
            "duplicates": self.counts.duplicates,
            "rejected": self.rejected,
            "errors": [{"index": i, "line": ln, "field": f, "message": m} for i, ln, f, m in self.errors],
        }


_EVENT_ONLY = (
    "action_name",
    "event_attributes",
    "session_id",
    "message_type",
    "message",
    "user_id",
    "event_id",
)
_QUERY_ONLY = ("query_response_hit_ids", "query_attributes", "query_response_id", "object_id_field")


def guess_kind(value: Any, default: Kind) -> Kind:
    """An item's kind from its keys: fields only events have, then fields only query records have.

    Events repeat ``user_query`` (UBI 1.3.0), so it only decides when no event field is present; an item
    with neither kind's fields takes the file's ``default``. ``--kind`` overrides all of this.
    """
    if isinstance(value, dict):
        if any(k in value for k in _EVENT_ONLY):
            return "event"
        if any(k in value for k in _QUERY_ONLY) or "user_query" in value:
            return "query"
    return default


def _open(path: Path) -> io.BufferedReader:
    try:
        return open_file(path)
    except OSError as exc:
        raise InputFileError(str(path), None, f"cannot read: {exc.strerror or exc}") from exc


class FileCursor:
    """How far into a file its reader is, in (compressed) bytes of the file on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = path.stat().st_size
        self._raw: BinaryIO | None = None

    def attach(self, fh: BinaryIO) -> None:
        inner = getattr(fh, "raw", None)  # the GzipFile under a BufferedReader
        self._raw = getattr(inner, "fileobj", None) or fh

    @property
    def done(self) -> int:
        try:
            return int(self._raw.tell()) if self._raw is not None else 0
        except (OSError, ValueError):  # closed at the end
            return self.size


def read_items(path: Path, kind: Kind | None = None) -> tuple[list[RawItem], int]:
    """Every item of a file with its line number, and the file's size (all in memory: small files, tests)."""
    return list(iter_items(path, kind)), path.stat().st_size


def iter_items(path: Path, kind: Kind | None = None, cursor: FileCursor | None = None) -> Iterator[RawItem]:
    """The items of a file one by one, with their line numbers; ``kind`` None: per item, by its keys.

    Every format is streamed (plain or gzip): NDJSON and ``_bulk`` a line at a time, a JSON array an
    element at a time (:func:`ubi_pipeline.collector.bodies.split_json`), so memory does not grow with the file. The
    parsers are the HTTP routes' own (:mod:`ubi_pipeline.collector.bodies`). A JSON array that stops being JSON half-way
    raises :class:`InputFileError` naming the line and column, after the items before it.
    """
    with _opened(path, cursor) as (fh, fmt):
        try:
            if fmt == "bulk":
                yield from bulk_items(stream_lines(fh))
            elif fmt == "array":
                elements = split_json(fh)
                yield from _with_kinds(elements, kind, lambda e: orjson.loads(e[2]), array_items)
            elif fmt == "ndjson":
                yield from _with_kinds(stream_lines(fh), kind, lambda ln: orjson.loads(ln[1]), ndjson_items)
        except BodyError as exc:
            raise _file_error(path, exc) from exc


@contextmanager
def _opened(path: Path, cursor: FileCursor | None) -> Iterator[tuple[io.BufferedReader, str | None]]:
    """The file open (gzip undone), attached to ``cursor`` for progress, and its format (:func:`_format`).

    A file that stops being readable while it is read raises :class:`InputFileError` naming it: a gzip file cut
    short (an interrupted copy or download), gzip data that is corrupt, a read error of the disk. The records
    read before are kept as for any error that ends a file (``ubi import`` writes them first)."""
    fh = _open(path)
    if cursor is not None:
        cursor.attach(fh)
    with fh:
        try:
            yield fh, _format(fh, path)
        except EOFError as exc:  # gzip's "Compressed file ended before the end-of-stream marker was reached"
            raise InputFileError(str(path), None, f"the gzip data ends early, {_read_so_far(path, cursor)}: the file "
                                 "is cut short (an interrupted copy or download?)") from exc
        except (zlib.error, OSError) as exc:  # gzip.BadGzipFile is an OSError
            raise InputFileError(str(path), None, f"cannot read on, {_read_so_far(path, cursor)}: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from exc


def _read_so_far(path: Path, cursor: FileCursor | None) -> str:
    """Where reading stopped, for a message: bytes of the file on disk read of its size."""
    if cursor is None:
        return f"in {path.stat().st_size:,} bytes"
    return f"after {cursor.done:,} of {cursor.size:,} bytes"


def _file_error(path: Path, exc: BodyError) -> InputFileError:
    where = f"column {exc.column}: " if exc.column is not None else ""
    return InputFileError(str(path), exc.line, where + exc.reason)


def _format(fh: io.BufferedReader, path: Path) -> str | None:
    """The format of an open file from its first line (``bulk``, ``array``, ``ndjson``; None: empty), the
    byte order mark skipped."""
    try:
        head = fh.peek(FILE_BUFFER)[:FILE_BUFFER]
    except OSError as exc:
        raise InputFileError(str(path), None, f"cannot read: {exc}") from exc
    if head.startswith(BOM):  # Windows tools write one; it is not JSON, and not worth rejecting a file for
        fh.read(len(BOM))
        head = head[len(BOM):]
    text = head.lstrip()
    first_line = text.split(b"\n", 1)[0].strip()
    if not text.strip() and not fh.read(1):
        return None
    if starts_bulk(first_line):
        return "bulk"
    if text[:1] == b"[" or (text[:1] == b"{" and not parses(first_line)):
        return "array"
    return "ndjson"


#: Records per chunk on the fast path (a store this process holds, no record filters): what is validated
#: at once; a chunk of 50,000 events holds about 25 MB of lines.
FAST_CHUNK_ITEMS = 50_000
#: ... and bytes of lines per chunk, whichever comes first: every producer's layout measured (330-470 bytes
#: a record) fills a chunk by records first, while a file of the largest records the limits accept (about
#: 29 kB each) gets chunks of about 1,100. Without it, 40,000 such records (1.16 GB) were validated as one
#: chunk and the import peaked at 9.0 GiB of RSS.
FAST_CHUNK_BYTES = 32 * 1024 * 1024
#: Bytes of lines per transaction on the fast path, whatever ``Settings.import_batch_records``: the largest
#: records' chunks are committed four at a time (40,000 of them in one transaction peaked at 2.6 GiB of RSS).
BATCH_BYTES = 4 * FAST_CHUNK_BYTES
#: Records per transaction on the fast path (``Settings.import_batch_records``): one chunk.
BATCH_RECORDS = 50_000


def fast_chunks(path: Path, kind: Kind | None = None, cursor: FileCursor | None = None,
                size: int = FAST_CHUNK_ITEMS, max_bytes: int = FAST_CHUNK_BYTES) -> Iterator[Chunk]:
    """The records of a file in chunks for :func:`ubi_pipeline.collector.fastpath.write_chunk`: NDJSON lines and plain
    ``_bulk`` documents as fast-path candidates, everything else (and every JSON array item) as the items
    :func:`iter_items` yields for it, with the same indexes, lines and kinds. A chunk ends at ``size``
    records or once its records' lines reach ``max_bytes`` (a record is never split: a chunk holds one at least)."""
    with _opened(path, cursor) as (fh, fmt):
        try:
            if fmt == "bulk":
                yield from _bulk_chunks(fh, size, max_bytes)
            elif fmt == "ndjson":
                yield from _ndjson_chunks(fh, kind, size, max_bytes)
            elif fmt == "array":
                elements = split_json(fh)
                items = _with_kinds(elements, kind, lambda e: orjson.loads(e[2]), array_items)
                for part in chunks(items, size, max_bytes):
                    yield Chunk(exact=part)
        except BodyError as exc:
            raise _file_error(path, exc) from exc


def _sized(blocks: Iterator[tuple[np.ndarray, pa.Array]], size: int,
           max_bytes: int) -> Iterator[tuple[np.ndarray, pa.Array, int]]:
    """The lines of ``blocks`` regrouped into runs of ``size`` lines, or fewer where their bytes reach
    ``max_bytes`` first (a run ends with the line that reaches it; the last run may be shorter), each with
    its line numbers and its bytes."""
    numbers: list[np.ndarray] = []
    lines: list[pa.Array] = []
    have = have_bytes = 0
    for block_numbers, block in blocks:
        ends = np.cumsum(pc.binary_length(block).to_numpy(zero_copy_only=False), dtype=np.int64)
        pos = 0
        while pos < len(block):
            take = min(size - have, len(block) - pos)
            before = int(ends[pos - 1]) if pos else 0
            # the first line at which the run's bytes reach max_bytes ends it
            full = int(np.searchsorted(ends[pos:pos + take], before + max_bytes - have_bytes, side="left"))
            if full < take:
                take = full + 1
            numbers.append(block_numbers[pos:pos + take])
            lines.append(block.slice(pos, take))
            have, have_bytes = have + take, have_bytes + int(ends[pos + take - 1]) - before
            pos += take
            if have == size or have_bytes >= max_bytes:
                yield np.concatenate(numbers), pa.concat_arrays(lines), have_bytes
                numbers, lines, have, have_bytes = [], [], 0, 0
    if have:
        yield np.concatenate(numbers), pa.concat_arrays(lines), have_bytes


def _ndjson_chunks(fh: BinaryIO, kind: Kind | None, size: int, max_bytes: int) -> Iterator[Chunk]:
    """NDJSON lines as event and query candidates, a block at a time (:mod:`ubi_pipeline.collector.blocks`): with no
    ``--kind``, a line is an event candidate when it names ``action_name`` (a plain event does, a plain
    query record does not: the key guess), and the kind of the first records is the default of those that
    say neither, as :func:`_with_kinds` has it."""
    blocks: Iterator[tuple[np.ndarray, pa.Array]] = block_lines(fh)
    kind_of = None
    if kind is None:
        head: list[tuple[np.ndarray, pa.Array]] = []
        seen = 0
        for block in blocks:
            head.append(block)
            seen += len(block[1])
            if seen >= _LOOKAHEAD:
                break
        values = []
        for text in itertools.islice((t for _, b in head for t in b.slice(0, _LOOKAHEAD).to_pylist()), _LOOKAHEAD):
            try:
                values.append(orjson.loads(text))
            except orjson.JSONDecodeError:
                continue
        default = _dominant(values)
        kind_of = lambda value: guess_kind(value, default)  # noqa: E731
        blocks = itertools.chain(head, blocks)
    given: dict[str, str | None] = {"event": kind, "query": kind}
    index = 0
    for numbers, lines, nbytes in _sized(blocks, size, max_bytes):
        n = len(lines)
        positions = np.arange(index, index + n, dtype=np.int64)
        if kind == "event":
            is_event = np.ones(n, dtype=bool)
        elif kind == "query":
            is_event = np.zeros(n, dtype=bool)
        else:
            is_event = pc.match_substring(lines, '"action_name"').to_numpy(zero_copy_only=False)
        events, queries = Candidates(), Candidates()
        for c, mask in ((events, is_event), (queries, ~is_event)):
            if mask.all():
                c.extend(positions, numbers, lines)
            elif mask.any():
                c.extend(positions[mask], numbers[mask], lines.filter(pa.array(mask)))
        index += n
        yield Chunk(events=events, queries=queries, given=given, kind_of=kind_of, nbytes=nbytes)


#: :data:`ubi_pipeline.collector.bodies.PLAIN_ACTION_PATTERN` for Arrow (RE2), matching the whole line as ``fullmatch``.
_PLAIN_ACTION_RE2 = f"^(?:{PLAIN_ACTION_PATTERN})$"
#: The ``_id`` of a plain action line (the pattern's ``id`` group, whole).
_PLAIN_ID_RE2 = r"^[ !#-\[\]-~]{1,100}$"
_VERBS, _NAMES = ("index", "create"), ("ubi_events", "ubi_queries")
_VERB_TEXT, _NAME_TEXT = pa.array(_VERBS, pa.string()), pa.array(_NAMES, pa.string())


def _plain_actions(lines: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, pa.Array]:
    """Per line: whether it is a plain action line (:data:`_PLAIN_ACTION_RE2`), its verb and ``_index`` (as
    positions in ``_VERBS`` and ``_NAMES``) and where its ``_id`` is in the array returned last (-1: none,
    or not plain).

    Only lines that begin as the pattern's can (``{"index"``, ``{"create"``, or ``{`` and a space or tab)
    are looked at. The compact spelling exports write (``{"index":{"_index":"ubi_events","_id":"..."}}``)
    is then found by its fixed head and tail, its ``_id`` checked with the pattern's own class; the pattern
    itself (RE2, several times dearer) runs only on the other candidates. A compact line is one the pattern
    matches with exactly these groups: its ``_id`` holds no quote, so where it starts and ends is not in doubt.
    """
    n = len(lines)
    ok = np.zeros(n, dtype=bool)
    verb = np.zeros(n, dtype=np.int8)
    name = np.zeros(n, dtype=np.int8)
    id_at = np.full(n, -1, dtype=np.int64)
    found: list[pa.Array] = []
    have = 0
    starts = np.zeros(n, dtype=bool)
    for head in ('{"index"', '{"create"', "{ ", "{\t"):
        starts |= pc.starts_with(lines, head).to_numpy(zero_copy_only=False)
    where = np.flatnonzero(starts)
    if not len(where):
        return ok, verb, name, id_at, pa.array([], pa.large_binary())
    some = lines.take(pa.array(where))
    closed = pc.ends_with(some, '"}}').to_numpy(zero_copy_only=False)
    compact = np.zeros(len(where), dtype=bool)
    for v, verb_text in enumerate(_VERBS):
        for k, index_text in enumerate(_NAMES):
            head = f'{{"{verb_text}":{{"_index":"{index_text}"'
            bare = pc.equal(some, head + "}}").to_numpy(zero_copy_only=False)
            with_id = pc.starts_with(some, head + ',"_id":"').to_numpy(zero_copy_only=False) & closed
            if with_id.any():
                sub = np.flatnonzero(with_id)
                value = pc.binary_slice(some.take(pa.array(sub)), len(head) + 8, -3)
                good = pc.match_substring_regex(value, _PLAIN_ID_RE2).to_numpy(zero_copy_only=False)
                with_id[sub[~good]] = False
                kept = value.filter(pa.array(good))
                id_at[where[sub[good]]] = np.arange(have, have + len(kept))
                found.append(kept)
                have += len(kept)
            taken = bare | with_id
            compact |= taken
            at = where[taken]
            ok[at], verb[at], name[at] = True, v, k
    rest = np.flatnonzero(~compact)
    if len(rest):
        others = some.take(pa.array(rest))
        match = pc.match_substring_regex(others, _PLAIN_ACTION_RE2).to_numpy(zero_copy_only=False)
        if match.any():
            at = where[rest[match]]
            meta = pc.extract_regex(others.filter(pa.array(match)), _PLAIN_ACTION_RE2)
            ok[at] = True
            verb[at] = pc.equal(meta.field("verb"), b"create").to_numpy(zero_copy_only=False)
            name[at] = pc.equal(meta.field("name"), b"ubi_queries").to_numpy(zero_copy_only=False)
            value = meta.field("id")
            has = pc.not_equal(value, b"").to_numpy(zero_copy_only=False)
            kept = value.filter(pa.array(has))
            id_at[at[has]] = np.arange(have, have + len(kept))
            found.append(kept)
            have += len(kept)
    return ok, verb, name, id_at, (pa.concat_arrays(found) if found else pa.array([], pa.large_binary()))


class _Counting:
    """An iterator over lines ``start..`` of a block that counts what it gave."""

    def __init__(self, numbers: np.ndarray, lines: pa.Array, start: int) -> None:
        self.numbers, self.lines, self.pos, self.taken = numbers, lines, start, 0

    def __iter__(self) -> _Counting:
        return self

    def __next__(self) -> tuple[int, bytes]:
        if self.pos >= len(self.lines):
            raise StopIteration
        pos = self.pos
        self.pos += 1
        self.taken += 1
        return int(self.numbers[pos]), self.lines[pos].as_py()


def _bulk_chunks(fh: BinaryIO, size: int, max_bytes: int) -> Iterator[Chunk]:
    """``_bulk`` lines as candidates, a block at a time (:mod:`ubi_pipeline.collector.blocks`): runs of plain action lines
    (:data:`ubi_pipeline.collector.bodies.PLAIN_ACTION_PATTERN`), each followed by its document, are paired in Arrow
    without Python per line; at any other action line :func:`ubi_pipeline.collector.bodies.bulk_record` (what
    :func:`ubi_pipeline.collector.bodies.bulk_records` does for a line) takes one record, and pairing resumes after it.
    Records, indexes and lines are :func:`bulk_records`' (``plain=True``). A chunk ends at ``size`` records or
    with the record whose lines take it to ``max_bytes`` (documents only, for paired lines)."""
    given: dict[str, str | None] = {"event": "event", "query": "query"}
    chunk = Chunk(given=given)
    chunk_bytes = 0
    blocks = block_lines(fh)
    numbers, lines = np.zeros(0, np.int64), pa.array([], pa.large_binary())
    index = 0
    eof = False
    while not eof or len(lines):
        block = next(blocks, None) if not eof else None
        if block is None:
            eof = True
        else:
            numbers = np.concatenate([numbers, block[0]])
            lines = pa.concat_arrays([lines, block[1]]) if len(lines) else block[1]
        plain, verbs, names, id_at, ids = _plain_actions(lines)
        lengths = pc.binary_length(lines).to_numpy(zero_copy_only=False)
        p = 0
        while p < len(lines):
            if len(lines) - p < 2 and not eof:
                break  # its document may be in the next block
            run = plain[p:len(lines) - 1:2]  # actions at p, p+2, ... that have a line after them here
            stop = int(np.argmin(run)) if len(run) and not run.all() else len(run)
            pairs = min(stop, size - len(chunk))
            more = True
            if pairs:
                ends = np.cumsum(lengths[p + 1:p + 2 * pairs:2], dtype=np.int64)
                full = int(np.searchsorted(ends, max_bytes - chunk_bytes, side="left"))
                pairs = min(pairs, full + 1)
                chunk_bytes += int(ends[pairs - 1])
                docs = pa.array(np.arange(p + 1, p + 2 * pairs, 2, dtype=np.int64))
                verb = _VERB_TEXT.take(pa.array(verbs[p:p + 2 * pairs:2]))
                name_codes = names[p:p + 2 * pairs:2]
                name = _NAME_TEXT.take(pa.array(name_codes))
                at = id_at[p:p + 2 * pairs:2]
                doc_id = ids.take(pa.array(at, mask=at < 0))
                text, doc_numbers = lines.take(docs), numbers[p + 1:p + 2 * pairs:2]
                positions = np.arange(index, index + pairs, dtype=np.int64)
                is_event = name_codes == 0
                for c, mask in ((chunk.events, is_event), (chunk.queries, ~is_event)):
                    if mask.all():
                        c.extend(positions, doc_numbers, text, doc_id, verb, name)
                    elif mask.any():
                        m = pa.array(mask)
                        c.extend(positions[mask], doc_numbers[mask], text.filter(m), doc_id.filter(m),
                                 verb.filter(m), name.filter(m))
                index += pairs
                p += 2 * pairs
            else:
                rest = _Counting(numbers, lines, p + 1)
                record, more = bulk_record(index, int(numbers[p]), lines[p].as_py(), rest, BULK_INDEX, None,
                                           plain=True)
                if type(record) is tuple:
                    i, number, doc, kind, bid, action, index_name = record
                    (chunk.events if kind == "event" else chunk.queries).add(i, number, doc, bid, action,
                                                                             index_name)
                else:
                    chunk.exact.append(record)  # type: ignore[arg-type]
                index += 1
                chunk_bytes += int(lengths[p:p + 1 + rest.taken].sum())
                p += 1 + rest.taken
            if len(chunk) >= size or chunk_bytes >= max_bytes:
                chunk.nbytes = chunk_bytes
                yield chunk
                chunk = Chunk(given=given)
                chunk_bytes = 0
            if not more:
                eof, p = True, len(lines)
        numbers, lines = numbers[p:], lines.slice(p)
    if len(chunk):
        chunk.nbytes = chunk_bytes
        yield chunk


def _with_kinds(
    records: Iterator[Any],
    kind: Kind | None,
    peek: Callable[[Any], Any],
    parse: Callable[..., Iterator[RawItem]],
) -> Iterator[RawItem]:
    """``parse(records)`` with each item's kind: ``kind``, else guessed by its keys, with the kind most of
    the first ``_LOOKAHEAD`` records have as the default for records that say neither."""
    if kind is not None:
        return parse(records, kind)
    head = list(itertools.islice(records, _LOOKAHEAD))
    values = []
    for record in head:
        try:
            values.append(peek(record))
        except orjson.JSONDecodeError:
            continue
    default = _dominant(values)
    return parse(itertools.chain(head, records), None, kind_of=lambda value: guess_kind(value, default))


def _dominant(values: Sequence[Any]) -> Kind:
    """The kind most of the first 100 items have (events when undecided)."""
    kinds = [guess_kind(v, "event") for v in values[:100] if isinstance(v, dict)]
    return "query" if kinds.count("query") > kinds.count("event") else "event"


#: items read ahead to decide a file's dominant kind (``_dominant`` looks at the first 100)
_LOOKAHEAD = 100


def chunks(
    items: Iterable[RawItem], max_items: int = CHUNK_ITEMS, max_bytes: int = CHUNK_BYTES
) -> Iterator[list[RawItem]]:
    """Consecutive runs of items, each at most ``max_items`` items and about ``max_bytes`` raw bytes."""
    chunk: list[RawItem] = []
    size = 0
    for item in items:
        cost = len(item.raw_bytes()) + 80
        if chunk and (len(chunk) >= max_items or size + cost > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += cost
    if chunk:
        yield chunk


def _renumber(chunk: list[RawItem]) -> list[RawItem]:
    return [dataclasses.replace(it, index=i) for i, it in enumerate(chunk)]


def bulk_body(chunk: Sequence[RawItem]) -> bytes:
    """An OpenSearch ``_bulk`` body carrying the items (raw documents as read) to a running collector."""
    out: list[bytes] = []
    for it in chunk:
        meta: dict[str, str] = {
            "_index": {"query": "ubi_queries", "event": "ubi_events"}.get(it.kind or "", "unknown")
        }
        if it.event_id is not None:
            meta["_id"] = it.event_id
        out.append(orjson.dumps({"index": meta}))
        out.append(it.raw_bytes().replace(b"\n", b" "))
    return b"\n".join(out) + b"\n"


class DirectWriter:
    """Writes chunks into a store this process holds."""

    def __init__(self, store: Store, filters: Sequence[RecordFilter]) -> None:
        self.store, self.filters = store, filters

    def __call__(self, chunk: list[RawItem], source: str) -> IngestResult:
        validated = apply_filters(validate_items(chunk), self.filters, IngestContext(source=source))
        return ingest(self.store, validated, source=source)


def _answer_message(resp: Any) -> str:
    """The ``message`` of a collector's JSON error answer, else its first 300 characters."""
    try:
        return str(resp.json().get("message") or resp.text[:300])
    except ValueError:
        return str(resp.text[:300])


class CollectorWriter:
    """Sends chunks to the running collector that holds the store, as ``_bulk`` bodies."""

    def __init__(self, url: str) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.client = httpx.Client(timeout=600)

    def __call__(self, chunk: list[RawItem], source: str) -> IngestResult:
        # One request per kind, so the collector's counts say exactly how many queries and events were new.
        totals = {"query": [0, 0, 0], "event": [0, 0, 0]}
        errors: list[ItemError] = []
        for kind in ("query", "event"):
            part = [it for it in chunk if (it.kind == "query") == (kind == "query")]
            if not part:
                continue
            data = self._post(_renumber(part))
            totals[kind] = [data["accepted"], data["duplicates"], data["rejected"]]
            for e in data["errors"]:
                item = part[e["index"]] if 0 <= e["index"] < len(part) else None
                # An item that failed to parse here has our message, with the file's line, not the body's.
                message = item.error if item is not None and item.error else e["message"]
                errors.append(
                    ItemError(item.index if item else e["index"], e.get("field"), message, kind, b"")
                )
        errors.sort(key=lambda e: e.index)
        q, ev = totals["query"], totals["event"]
        counts = Counts(queries=q[0], query_duplicates=q[1], events=ev[0], event_duplicates=ev[1])
        return IngestResult(counts=counts, rejected=q[2] + ev[2], errors=tuple(errors))

    def _post(self, part: list[RawItem]) -> dict[str, Any]:
        """The collector's answer to ``part`` (indices relative to it). A body the collector refuses as too large
        (413) is sent again in halves, so one record over its limit is that record's error, not the end of the
        import (the records after it are still sent)."""
        import httpx

        try:
            resp = self.client.post(
                self.url + "/v1/bulk",
                content=bulk_body(part),
                headers={"content-type": "application/x-ndjson"},
            )
        except httpx.HTTPError as exc:
            raise StoreError(f"the collector at {self.url} did not answer: {exc}") from exc
        if resp.status_code == 413:
            if len(part) == 1:
                reason = _answer_message(resp)
                return {"accepted": 0, "duplicates": 0, "rejected": 1, "errors": [
                    {"index": 0, "field": None, "message": f"the collector refused this record as too large: {reason}"}]}
            half = len(part) // 2
            first, second = self._post(_renumber(part[:half])), self._post(_renumber(part[half:]))
            return {key: first[key] + second[key] for key in ("accepted", "duplicates", "rejected")} | {
                "errors": first["errors"] + [dict(e, index=e["index"] + half) for e in second["errors"]]}
        if resp.status_code != 202:
            raise StoreError(
                f"the collector at {self.url} refused a chunk ({resp.status_code}): {resp.text[:300]}"
            )
        data: dict[str, Any] = resp.json()
        return data

    def close(self) -> None:
        self.client.close()


def _import_fast(
    store: Store,
    parser: duckdb.DuckDBPyConnection,
    pool: ThreadPoolExecutor,
    path: Path,
    kind: Kind | None,
    cursor: FileCursor,
    report: FileReport,
    max_errors: int,
    on_progress: Callable[[str, int, int, int], None] | None,
    batch_records: int = BATCH_RECORDS,
) -> int:
    """Import one file through the fast path, two chunks at a time; returns the records read.

    A chunk is validated (:func:`ubi_pipeline.collector.fastpath.parse_chunk`, in ``pool``'s one thread) while the one
    before it is written (:func:`ubi_pipeline.collector.fastpath.store_chunk`, here) and the one after it read. Both
    halves spend most of their time in DuckDB, which releases the GIL, so they share the two cores. Chunks
    are written one at a time, in file order, into transactions of ``batch_records`` records or more, or of
    :data:`BATCH_BYTES` of lines (:meth:`ubi_pipeline.store.duckdb_store.Store.batch`; the last of a file may be
    smaller): the outcome of every record is
    what :func:`ubi_pipeline.collector.fastpath.write_chunk` of each chunk in turn gives, and a chunk's counts, errors and
    progress are reported once its transaction committed. Validation reads nothing of the store, so running
    it a chunk early changes nothing. Memory: three chunks at most (read, validated, written); the open
    transaction's rows are DuckDB's (its buffer pool, and row groups written to the file).
    """
    records = 0
    source = str(path)
    written: list[tuple[IngestResult, Mapping[int, int | None], int, int]] = []  # not committed yet
    batch: Any = None  # the open Store.batch() context
    in_batch = in_batch_bytes = 0

    def commit() -> None:
        nonlocal batch, in_batch, in_batch_bytes, records
        if batch is None:
            return
        batch, open_batch = None, batch
        open_batch.__exit__(None, None, None)
        in_batch = in_batch_bytes = 0
        for result, lines, n, done in written:
            report.add(result, lines, max_errors)
            records += n
            if on_progress:
                on_progress(source, done, cursor.size, records)  # the bytes read when the chunk was complete
        written.clear()

    def write(pending: tuple[Future[ParsedChunk], int, int, int]) -> None:
        nonlocal batch, in_batch, in_batch_bytes
        parsed, n, nbytes, done = pending
        if batch is None:
            batch = store.batch()
            batch.__enter__()
        result, lines = store_chunk(store, parsed.result())
        written.append((result, lines, n, done))
        in_batch += n
        in_batch_bytes += nbytes
        if in_batch >= batch_records or in_batch_bytes >= BATCH_BYTES:
            commit()

    def rollback(exc: BaseException) -> None:
        """Roll the open transaction back (nothing of it was reported), releasing the store lock it holds."""
        nonlocal batch
        if batch is not None:
            batch, open_batch = None, batch
            open_batch.__exit__(type(exc), exc, exc.__traceback__)

    pending: tuple[Future[ParsedChunk], int, int, int] | None = None

    def finish() -> None:
        """Write the chunk read last and commit. Always inside a try that rolls back: a failure here with the
        transaction left open would hold the store lock, and closing the store would wait for ever."""
        nonlocal pending
        if pending is not None:
            previous, pending = pending, None
            write(previous)
        commit()

    try:
        for part in fast_chunks(path, kind, cursor):
            parsed = pool.submit(parse_chunk, parser, part, source=source, received_at=utcnow())
            if pending is not None:
                previous, pending = pending, None
                write(previous)
            pending = (parsed, len(part), part.nbytes, cursor.done)
        finish()
    except InputFileError:
        # The file stops being readable after this chunk: its records are written before the error is
        # raised, as they are without the read-ahead.
        try:
            finish()
        except BaseException as exc:
            rollback(exc)
            raise
        raise
    except BaseException as exc:
        rollback(exc)
        raise
    return records


def import_files(
    paths: Sequence[Path],
    db: Path,
    *,
    kind: Kind | None = None,
    filters: Sequence[RecordFilter] = (),
    max_errors: int = 20,
    on_progress: Callable[[str, int, int, int], None] | None = None,
    fast: bool = True,
    memory_limit: str | None = "256MB",
    batch_records: int = BATCH_RECORDS,
) -> tuple[list[FileReport], str]:
    """Import every file; returns a report per file and how the store was reached (``direct`` or a URL).

    Files are read as streams (NDJSON and ``_bulk``, plain or gzip) and written in chunks, each one
    transaction: memory stays flat whatever the file's size. Into a store this process holds, without record
    filters, chunks are of ``FAST_CHUNK_ITEMS`` and go through the columnar fast path
    (:mod:`ubi_pipeline.collector.fastpath`; ``fast=False``: the exact path for every record, as through a collector, in
    chunks of ``CHUNK_ITEMS``); the outcome of every record is the same either way. An import that is
    interrupted can simply be run again: the dedup keys (``event_id`` or the canonical hash, ``query_id`` +
    ``query_response_id``) make every record already stored a duplicate, so each is stored once.
    ``on_progress(path, bytes_done, bytes_total, records_done)`` is called after each chunk (bytes of the
    file on disk, compressed when it is gzip). ``memory_limit``: DuckDB's on the store
    (``Settings.writer_memory_limit``); nothing of the store needs to stay in memory (:mod:`ubi_pipeline.store.keys`).
    ``batch_records``: records per transaction on the fast path (``Settings.import_batch_records``).
    """
    store: Store | None = None
    remote: CollectorWriter | None = None
    parser: duckdb.DuckDBPyConnection | None = None
    try:
        store = Store(db, memory_limit=memory_limit)
        write: Callable[[list[RawItem], str], IngestResult] = DirectWriter(store, filters)
        mode = "direct"
    except StoreLocked:
        remote = CollectorWriter(collector_url(db))
        write, mode = remote, remote.url
    # The fast path (ubi_pipeline.collector.fastpath) needs the store itself and no record filter (filters work on models).
    parser = fast_parser(os.cpu_count() or 1) if store is not None and not filters and fast else None
    # One thread validates the next chunk while this one writes its chunk (see _import_fast).
    pool = ThreadPoolExecutor(1, thread_name_prefix="ubi-import-parse") if parser is not None else None
    reports = []
    try:
        for path in paths:
            report = FileReport(str(path))
            cursor = FileCursor(path)
            if on_progress:
                on_progress(str(path), 0, cursor.size, 0)
            records = 0
            if parser is not None and store is not None and pool is not None:
                try:
                    records = _import_fast(store, parser, pool, path, kind, cursor, report, max_errors,
                                           on_progress, batch_records)
                except BodyError as exc:  # a line over MAX_LINE_BYTES: named with its file
                    raise _file_error(path, exc) from exc
            else:
                for chunk in chunks(iter_items(path, kind, cursor)):
                    # Items keep their position in the file: it is the item_index failed_records keeps for them.
                    result = write(chunk, str(path))
                    report.add(result, chunk, max_errors)
                    records += len(chunk)
                    if on_progress:
                        on_progress(str(path), cursor.done, cursor.size, records)
            if on_progress:
                on_progress(str(path), cursor.size, cursor.size, records)
            reports.append(report)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        if parser is not None:
            parser.close()
        if store is not None:
            store.close()
        if remote is not None:
            remote.close()
    return reports, mode
