"""The body and file formats, one parser each, shared by the HTTP routes, ``ubi import`` and the tests.

* NDJSON: one JSON value a line (:func:`ndjson_items`);
* a JSON array of records, or one object (:func:`array_items`, :func:`split_array`: an array in a stream
  is cut into its elements in bounded memory, so a file of any size is read a slice at a time);
* an OpenSearch ``_bulk`` body: an action line, then the document (:func:`bulk_items`);
* gzip: a request body with ``Content-Encoding: gzip`` is decompressed under the byte limit
  (:func:`gunzip`), a file by its magic bytes as it is read (:func:`open_file`).

Each parser takes numbered lines (or a stream), so the in-memory request bodies of the routes
(:func:`parse_items`, :func:`parse_bulk`) and the streamed files of ``ubi import`` go through the same code:
the same duplicate-key check, the same error messages naming line and column, the same items.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import orjson
from pydantic import TypeAdapter, ValidationError

from ubi_pipeline.collector.errors import RequestError, TooLarge
from ubi_pipeline.schemas.ubi import Str100

Kind = Literal["query", "event"]


class BodyError(RequestError):
    """A request body or file that cannot be parsed at all (400): names line and column."""

    status_code = 400
    kind = "body"

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None) -> None:
        self.line, self.column, self.reason = line, column, message  # reason: without the place
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(where + message)
        self.message = where + message


class NotGzip(RequestError):
    """A body that claims ``Content-Encoding: gzip`` but does not decompress (400); kept as sent."""

    status_code = 400
    kind = "body"


@dataclass(slots=True)
class RawItem:
    """One item of a body before validation: its kind, parsed value (or parse error) and raw bytes.

    Not frozen, though nothing changes one after it is made: a frozen dataclass sets each of its eleven
    fields through ``object.__setattr__``, 2.4 us an item against 0.6, and a body makes one per record.
    """

    index: int
    kind: Kind | None
    value: Any
    #: The item's bytes; None for an item of a JSON array parsed whole, serialised again from ``value``
    #: only when asked for (:meth:`raw_bytes`): valid items never need them, and the copy cost 1.5 us an event.
    raw: bytes | None
    error: str | None = None  # set when the item could not even be parsed
    field: str | None = None
    event_id: str | None = None  # from a _bulk action line's _id (validated as event_id is)
    line: int | None = None  # 1-based line of the item's document in the body, when known
    body: bytes = b""  # the whole body: what is kept for an array item too deeply nested to serialise
    action: str | None = None  # the _bulk action: index or create (the OpenSearch answer names it)
    index_name: str | None = None  # the _bulk _index as sent

    def raw_bytes(self) -> bytes:
        """The item's bytes as ``failed_records`` keeps them."""
        return self.raw if self.raw is not None else _item_bytes(self.value, self.body)


# ---------------------------------------------------------------- bytes and lines

BOM = b"\xef\xbb\xbf"


def strip_bom(body: bytes) -> bytes:
    """``body`` without a leading UTF-8 byte order mark (Windows tools write one; orjson refuses it)."""
    return body[3:] if body.startswith(BOM) else body


def body_lines(body: bytes) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of an in-memory body, stripped, with their 1-based numbers."""
    for number, line in enumerate(body.split(b"\n"), start=1):
        stripped = line.strip()
        if stripped:
            yield number, stripped


#: Longest line of a file read a line at a time: a UBI record is far smaller (its strings are capped), so a
#: longer line is refused by its number before it is held whole (a 1 MB gzip file can hold a 1 GB line).
MAX_LINE_BYTES = 16 << 20


def line_too_long(number: int, limit: int = MAX_LINE_BYTES) -> BodyError:
    """The error of a line over ``limit`` bytes, naming it."""
    return BodyError(f"the line is longer than {limit:,} bytes, far more than any UBI record; the file is not "
                     "NDJSON or _bulk (or a line break is missing): split or repair it", line=number)


def stream_lines(fh: Iterable[bytes], max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """:func:`body_lines` of a stream read a line at a time (memory: one line, at most ``max_line`` bytes;
    a longer one raises :func:`line_too_long`)."""
    readline = getattr(fh, "readline", None)
    lines: Iterable[bytes] = iter(lambda: readline(max_line + 1), b"") if readline is not None else fh
    for number, line in enumerate(lines, start=1):
        if len(line) > max_line and not (len(line) == max_line + 1 and line.endswith(b"\n")):
            raise line_too_long(number, max_line)
        stripped = line.strip()
        if stripped:
            yield number, stripped


#: read buffer of files: the format is decided from the first line, which must fit in it
FILE_BUFFER = 1 << 20


def open_file(path: Path) -> io.BufferedReader:
    """The file, decompressed on the fly when it is gzip (by its magic bytes, whatever its name).

    Raises ``OSError`` as ``open`` does; the caller closes what it gets.
    """
    raw: io.BufferedReader = io.BufferedReader(io.FileIO(path, "rb"), FILE_BUFFER)
    try:
        magic = raw.peek(2)[:2]
    except OSError:
        raw.close()
        raise
    if magic == b"\x1f\x8b":
        # buffered, so that peek() sees a whole first line
        return io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), FILE_BUFFER)  # type: ignore[arg-type]
    return raw


def gunzip(body: bytes, limit: int) -> bytes:
    """A gzip body decompressed, refusing (413) as soon as the output passes ``limit`` bytes, so a small
    body that inflates to gigabytes (a zip bomb) costs at most ``limit`` bytes of memory."""
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header and trailer, one member
    try:
        out = inflate.decompress(body, limit + 1)
        if len(out) > limit:
            raise TooLarge(
                f"body is over the limit of {limit} bytes once decompressed ({len(body)} bytes gzip-compressed): "
                "split it into batches"
            )
        if not inflate.eof:
            raise NotGzip("Content-Encoding: gzip, but the body ends before its gzip stream does (truncated?)")
    except zlib.error as exc:
        raise NotGzip(f"Content-Encoding: gzip, but the body is not gzip data ({exc}): send it plain, "
                      "without that header, or compress it") from exc
    if inflate.unused_data.strip():
        raise NotGzip("Content-Encoding: gzip, but bytes follow the gzip stream (several members are not read)")
    return out


def parses(text: bytes) -> bool:
    """Whether ``text`` is one whole JSON value."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


#: ``_bulk`` verbs OpenSearch knows; only ``index`` and ``create`` carry a record to store.
BULK_VERBS = ("index", "create", "delete", "update")


def bulk_verb(value: Any) -> str | None:
    """The verb of a parsed ``_bulk`` action line (``{"index": {...}}``), or None when ``value`` is not one."""
    if isinstance(value, dict) and len(value) == 1:
        verb, meta = next(iter(value.items()))
        if verb in BULK_VERBS and isinstance(meta, dict):
            return str(verb)
    return None


def starts_bulk(line: bytes) -> bool:
    """Whether a body's first line is a ``_bulk`` action carrying a record (``index``/``create`` + ``_index``)."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return bulk_verb(value) in ("index", "create") and "_index" in next(iter(value.values()))


# ---------------------------------------------------------------- one record of JSON text


#: Chooses an item's kind from its parsed value (``ubi import`` without ``--kind``: by the item's keys).
KindOf = Callable[[Any], "Kind | None"]


def json_item(
    index: int, number: int, text: bytes, kind: Kind | None, *, kind_of: KindOf | None = None, **meta: Any
) -> RawItem:
    """The item of one record's JSON text (an NDJSON line, a ``_bulk`` document, a streamed array element)
    at line ``number``: its value, or why it cannot be read (malformed JSON, a repeated key). ``kind_of``,
    when given, chooses the kind from the parsed value instead of ``kind``."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return RawItem(index, kind_of(None) if kind_of else kind, None, text, line=number, **meta,
                       error=f"line {number}, column {exc.colno}: malformed JSON: {exc.msg}")
    if kind_of is not None:
        kind = kind_of(value)
    repeat = duplicate_keys(text)[0] if dropped_keys(text, value) else None
    if repeat is not None:
        return RawItem(index, kind, None, text, field=repeat, line=number, **meta,
                       error=f"line {number}: {_repeat_error(repeat)}")
    return RawItem(index, kind, value, text, line=number, **meta)




def ndjson_items(
    lines: Iterable[tuple[int, bytes]], kind: Kind | None, *, kind_of: KindOf | None = None
) -> Iterator[RawItem]:
    """NDJSON: one item per non-blank line; a bad line rejects that item only."""
    for index, (number, line) in enumerate(lines):
        yield json_item(index, number, line, kind, kind_of=kind_of)


# ---------------------------------------------------------------- JSON arrays, in memory and streamed


def parse_items(body: bytes, kind: Kind, *, ndjson: bool = False) -> list[RawItem]:
    """Split a body of ``kind`` records into items: one object, a JSON array, or NDJSON (one per line).

    A JSON array or single object that does not parse raises :class:`BodyError` naming line and column.
    In NDJSON each line is its own item, so a bad line rejects that item only. A leading UTF-8 byte order
    mark is dropped.
    """
    body = strip_bom(body)
    text = body.strip()
    if not text:
        raise BodyError("empty body: expected a JSON object, a JSON array or NDJSON", line=1, column=1)
    if not ndjson:
        try:
            value = orjson.loads(body)  # the body as sent, so that line numbers in errors are the client's
        except orjson.JSONDecodeError as exc:
            # Several lines of which the first is a whole JSON value: NDJSON sent without its content type.
            first = text.split(b"\n", 1)[0].strip()
            if b"\n" in text and parses(first):
                return list(ndjson_items(body_lines(body), kind))
            raise BodyError(f"malformed JSON: {exc.msg}", line=exc.lineno, column=exc.colno) from exc
        repeats = _repeats(body) if dropped_keys(body, value) else []
        if isinstance(value, list):
            items = [RawItem(i, kind, v, None, body=text) for i, v in enumerate(value)]
            for i, (path, sent) in enumerate(repeats):
                if path is not None and i < len(items):
                    items[i] = RawItem(i, kind, None, sent, error=_repeat_error(path), field=path)
            return items
        if repeats and repeats[0][0] is not None:
            return [RawItem(0, kind, None, text, error=_repeat_error(repeats[0][0]), field=repeats[0][0])]
        return [RawItem(0, kind, value, text)]
    return list(ndjson_items(body_lines(body), kind))


#: Largest array element (or single object) a stream may hold, in characters: far above any UBI record.
MAX_ELEMENT = 64 * 1024 * 1024

_WS = " \t\r\n"
_NUMBER_START = "-0123456789"
_NUMBER_CHARS = "0123456789+-.eE"


class _Scanner:
    """A sliding window of decoded text over a byte stream, with the line number of its read position."""

    def __init__(self, fh: BinaryIO, block: int) -> None:
        self.fh, self.block = fh, block
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")()  # drops a byte order mark
        self.buf, self.pos, self.line, self.eof = "", 0, 1, False
        self.base = 0  # characters of the stream before buf[0]
        self.line_start = 0  # where the read position's line starts, in characters of the stream

    def more(self) -> bool:
        """Read another block (dropping what was consumed); False at the end of the stream."""
        if self.eof:
            return False
        data = self.fh.read(self.block)
        self.eof = not data
        try:
            text = self.decoder.decode(data, final=self.eof)
        except UnicodeDecodeError as exc:
            raise BodyError(f"not valid UTF-8 ({exc.reason})", line=self.line) from exc
        self.base += self.pos
        self.buf = self.buf[self.pos :] + text
        self.pos = 0
        return True

    def advance(self, to: int) -> None:
        newlines = self.buf.count("\n", self.pos, to)
        if newlines:
            self.line += newlines
            self.line_start = self.base + self.buf.rfind("\n", self.pos, to) + 1
        self.pos = to

    def skip_ws(self) -> str:
        """The next character that is not whitespace ('' at the end), the position left on it."""
        while True:
            n, buf, pos = len(self.buf), self.buf, self.pos
            while pos < n and buf[pos] in _WS:
                pos += 1
            self.advance(pos)
            if pos < n:
                return buf[pos]
            if not self.more():
                return ""

    def error(self, message: str, at: int | None = None) -> BodyError:
        at = self.pos if at is None else at
        newlines = self.buf.count("\n", self.pos, at)
        start = self.base + self.buf.rfind("\n", self.pos, at) + 1 if newlines else self.line_start
        return BodyError(message, line=self.line + newlines, column=self.base + at - start + 1)


def split_json(fh: BinaryIO, *, block: int = FILE_BUFFER) -> Iterator[tuple[int, int, bytes]]:
    """``(index, line, text)`` of each element of the JSON array in ``fh`` (or of the one object it holds),
    read a block at a time: memory holds a block and the element being read, whatever the stream's size.

    Elements are cut with the standard library's C scanner (``json.JSONDecoder.raw_decode``), which says
    where a value ends; their text is then parsed like any record (:func:`json_item`, with orjson), so an
    element of a streamed array and the same record on an NDJSON line give the same item. Raises
    :class:`BodyError` (line, column) where the stream stops being a JSON array: elements before it have
    been yielded already.
    """
    scan = _Scanner(fh, block)
    decoder = json.JSONDecoder()
    first = scan.skip_ws()
    if first == "":
        return
    if first not in "[{":
        raise scan.error("expected a JSON array or object")
    array = first == "["
    if array:
        scan.advance(scan.pos + 1)
        if scan.skip_ws() == "]":
            scan.advance(scan.pos + 1)
            array = False  # empty: nothing to yield, only the end to check
            first = ""
    index = 0
    while first:
        start_line = scan.line
        while True:
            try:
                _, end = decoder.raw_decode(scan.buf, scan.pos)
            except json.JSONDecodeError as exc:
                if len(scan.buf) - scan.pos > MAX_ELEMENT:
                    raise scan.error(f"item {index} is longer than {MAX_ELEMENT:,} characters") from exc
                if scan.more():
                    continue
                raise scan.error(f"malformed JSON in item {index}: {exc.msg}", exc.pos) from exc
            if scan.buf[scan.pos] in _NUMBER_START and not scan.buf[end:].strip(_NUMBER_CHARS) and scan.more():
                continue  # a number cut by the block's end ("0" of "0.5"): read on, decode again
            break
        text = scan.buf[scan.pos : end]
        scan.advance(end)
        yield index, start_line, text.encode()
        index += 1
        if not array:
            break
        sep = scan.skip_ws()
        if sep == "]":
            scan.advance(scan.pos + 1)
            break
        if sep != ",":
            raise scan.error(f"expected ',' or ']' after item {index - 1}" + ("" if sep else ", got the end"))
        scan.advance(scan.pos + 1)
        if scan.skip_ws() == "]":
            raise scan.error("a ',' before ']': trailing commas are not JSON")
    if scan.skip_ws() != "":
        raise scan.error("data after the JSON value: one array (or object) per file, or NDJSON")


def array_items(
    elements: Iterable[tuple[int, int, bytes]], kind: Kind | None, *, kind_of: KindOf | None = None
) -> Iterator[RawItem]:
    """Items of streamed array elements (:func:`split_json`), each parsed as one record's text."""
    for index, number, text in elements:
        yield json_item(index, number, text, kind, kind_of=kind_of)


def _item_bytes(value: Any, body: bytes) -> bytes:
    """An array item's bytes for ``failed_records``: the item re-serialised (same JSON value), or the whole
    body when the item is nested too deeply to serialise (orjson writes 254 levels, reads 1024)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return body


# ---------------------------------------------------------------- OpenSearch _bulk

BULK_INDEX: dict[str, Kind] = {"ubi_queries": "query", "ubi_events": "event"}

#: ``_id`` is checked as ``UbiEvent.event_id`` is (it becomes the event's event_id): a string of at most
#: 100 characters. A number is taken as its decimal text, as OpenSearch does; anything else is refused.
_ID: TypeAdapter[str] = TypeAdapter(Str100)  # UbiEvent.event_id's type


def bulk_id(meta: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the ``_id`` of an action line, or why it is refused)."""
    doc_id = meta.get("_id")
    if doc_id is None:
        return None, None
    if type(doc_id) is str and 0 < len(doc_id) <= 100:  # the common case, as _ID would find it (100 characters)
        return doc_id, None
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str):
        return None, f"_id must be a string (it becomes the event_id), got {json_type(doc_id)}"
    if not doc_id:
        return None, "_id must not be empty"
    try:
        _ID.validate_python(doc_id)
    except ValidationError as exc:
        why = exc.errors(include_url=False)[0]["msg"]
        return None, f"_id is checked as event_id (it becomes the event's event_id): {why}; got {len(doc_id):,} characters"
    return doc_id, None


#: A ``_bulk`` action line of the plain shape exports have: ``{"index": {"_index": "ubi_events", "_id": "..."}}``
#: (or ``create``, or without ``_id``), the ``_id`` printable ASCII without quote or backslash. For such a line
#: :func:`bulk_records` knows what the general path would find (a supported action, this kind, this ``_id``,
#: valid) without parsing it; anything else takes the general path.
PLAIN_ACTION_PATTERN = (
    r'\{[ \t]*"(?P<verb>index|create)"[ \t]*:[ \t]*\{[ \t]*"_index"[ \t]*:[ \t]*"(?P<name>ubi_events|ubi_queries)"[ \t]*'
    r'(?:,[ \t]*"_id"[ \t]*:[ \t]*"(?P<id>[ !#-\[\]-~]{1,100})"[ \t]*)?\}[ \t]*\}'
)
_PLAIN_ACTION = re.compile(PLAIN_ACTION_PATTERN.encode())

#: A document of a plain ``_bulk`` pair, not parsed yet: (index, line, text, kind, ``_id``, verb, ``_index``),
#: the arguments :func:`bulk_items` would give :func:`json_item` for it.
PlainDocument = tuple[int, int, bytes, Kind, "str | None", str, str]


def bulk_items(
    lines: Iterable[tuple[int, bytes]],
    *,
    indices: Mapping[str, Kind] | None = None,
    default_index: str | None = None,
) -> Iterator[RawItem]:
    """The records of ``_bulk`` lines (an action line, then the document), one item per action.

    ``index`` and ``create`` actions are supported; ``_index`` (else ``default_index``, the index of a
    ``/{index}/_bulk`` path) names the kind through ``indices`` (default ``ubi_queries`` and ``ubi_events``),
    and an event's ``_id`` becomes its ``event_id``, so replaying an export deduplicates. ``_id`` is
    validated as ``event_id`` is. A bad pair rejects that record only; items are numbered by record, and
    messages name the line. Each item's ``line`` is its document's line (the action line's when there is
    no document). A ``delete`` action has no document; other unsupported actions have one, skipped.
    """
    yield from bulk_records(lines, indices=indices, default_index=default_index)  # type: ignore[misc]


def bulk_records(
    lines: Iterable[tuple[int, bytes]],
    *,
    indices: Mapping[str, Kind] | None = None,
    default_index: str | None = None,
    plain: bool = False,
) -> Iterator[RawItem | PlainDocument]:
    """:func:`bulk_items`, with ``plain``: the documents of plain action lines (:data:`_PLAIN_ACTION`, the
    default indices) as :data:`PlainDocument` tuples instead of parsed items (``ubi import``'s fast path)."""
    plain = plain and indices is None
    indices = BULK_INDEX if indices is None else indices
    it = iter(lines)
    index = 0
    for number, line in it:
        record, more = bulk_record(index, number, line, it, indices, default_index, plain)
        yield record
        if not more:
            return
        index += 1


def bulk_record(
    index: int,
    number: int,
    line: bytes,
    it: Iterator[tuple[int, bytes]],
    indices: Mapping[str, Kind],
    default_index: str | None,
    plain: bool,
) -> tuple[RawItem | PlainDocument, bool]:
    """The record :func:`bulk_records` makes of action ``line`` (taking its document from ``it``, when it has
    one), and whether the lines go on (False: ``it`` ended where a document was wanted)."""
    match = _PLAIN_ACTION.fullmatch(line) if plain else None
    if match is not None:
        following = next(it, None)
        if following is not None:
            verb, name, doc_id = match.groups()
            return (index, following[0], following[1], BULK_INDEX[name.decode()],
                    doc_id.decode() if doc_id is not None else None, verb.decode(), name.decode()), True
    item, skip_doc = _bulk_action(index, number, line, indices, default_index)
    if item is None:  # a supported action: its document follows
        verb, meta, kind, name = skip_doc
        following = next(it, None)
        if following is None:
            return RawItem(index, kind, None, line, action=verb, index_name=name, line=number,
                           error=f"line {number}: action line without a document after it"), False
        return _bulk_document(index, number, following, verb, meta, kind, name, indices), True
    return item, not (skip_doc and next(it, None) is None)


def _bulk_action(
    index: int, number: int, line: bytes, indices: Mapping[str, Kind], default_index: str | None
) -> tuple[RawItem | None, Any]:
    """(an item refusing the action, whether a document line follows to skip), or (None, what it says)."""
    try:
        action = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        error = f"line {number}, column {exc.colno}: malformed action line: {exc.msg}"
        return RawItem(index, None, None, line, error=error, line=number), False
    repeat = duplicate_keys(line)[0] if dropped_keys(line, action) else None
    if not isinstance(action, dict) or len(action) != 1 or repeat is not None:
        error = f"line {number}: " + (
            _repeat_error(repeat) if repeat is not None
            else 'expected an action line such as {"index": {"_index": "ubi_events"}}'
        )
        return RawItem(index, None, None, line, error=error, field=repeat, line=number), False
    verb, meta = next(iter(action.items()))
    if verb not in ("index", "create") or not isinstance(meta, dict):
        error = f"line {number}: unsupported bulk action {verb!r}; expected 'index' or 'create'"
        item = RawItem(index, None, None, line, error=error, field="action", action=str(verb), line=number)
        return item, verb != "delete"
    target = meta.get("_index", default_index)
    kind = indices.get(target) if isinstance(target, str) else None
    name = target if isinstance(target, str) else None
    return None, (verb, meta, kind, name)


def _bulk_document(
    index: int,
    number: int,
    following: tuple[int, bytes],
    verb: str,
    meta: Mapping[str, Any],
    kind: Kind | None,
    name: str | None,
    indices: Mapping[str, Kind],
) -> RawItem:
    doc_number, doc = following
    if kind is None:
        known = " or ".join(indices)
        error = (
            f"line {number}: no such index [{name}]; _index must be {known}"
            if name is not None
            else f"line {number}: the action names no _index (or not as a string); send _index "
            f"({known}) or post to /{{index}}/_bulk"
        )
        return RawItem(index, None, None, doc, field="_index", error=error, action=verb, index_name=name,
                       line=doc_number)
    doc_id, id_error = bulk_id(meta)
    if id_error is not None:
        return RawItem(index, kind, None, doc, field="_id", error=f"line {number}: {id_error}",
                       line=doc_number, action=verb, index_name=name)
    return json_item(index, doc_number, doc, kind, event_id=doc_id, action=verb, index_name=name)


def parse_bulk(
    body: bytes, *, indices: Mapping[str, Kind] | None = None, default_index: str | None = None
) -> list[RawItem]:
    """Split an in-memory OpenSearch ``_bulk`` body into items (:func:`bulk_items`); an empty body is a
    :class:`BodyError`."""
    lines = list(body_lines(strip_bom(body)))
    if not lines:
        raise BodyError(
            "empty body: expected an OpenSearch _bulk body (action line, then document)", line=1, column=1
        )
    return list(bulk_items(lines, indices=indices, default_index=default_index))


# ---------------------------------------------------------------- duplicate keys

def dropped_keys(raw: bytes, value: Any) -> bool:
    """Whether parsing ``raw`` into ``value`` dropped a repeated key (orjson keeps the last value silently).

    Exact, and about as cheap as serialising ``value`` once (C code throughout), so it runs on every body.
    In JSON text a colon is either the one after a key or a character inside a string (literal, or escaped
    as ``\\u003a``). orjson writes ``value`` back with one colon per key it kept and every string's colons
    literally, so, for input without ``\\u003a`` escapes, the output has fewer colons than the input iff a
    pair was dropped: a dropped pair takes at least its key's colon with it. Whitespace does not matter.
    Input with such an escape (rare) goes to the exact parse of :func:`duplicate_keys`.
    """
    if not isinstance(value, dict | list):
        return False
    if b"\\u003" in raw:  # \u003a / \u003A: a colon the count would miss (and its neighbours: harmless)
        return any(duplicate_keys(raw))
    try:
        again = orjson.dumps(value)
    except orjson.JSONEncodeError:  # nested deeper than orjson writes: parse exactly
        return any(duplicate_keys(raw))
    return again.count(b":") < raw.count(b":")


class _Object(dict[str, Any]):
    """A parsed JSON object that remembers its first repeated key (a dotted path into it) and its pairs."""

    __slots__ = ("repeated", "pairs")
    repeated: str | None
    pairs: list[tuple[str, Any]]


def _as_sent(value: Any) -> str:
    """JSON text of a value parsed by :func:`duplicate_keys`, repeated keys included (for failed_records)."""
    if isinstance(value, _Object):
        return "{" + ",".join(f"{json.dumps(k)}:{_as_sent(v)}" for k, v in value.pairs) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_as_sent(v) for v in value) + "]"
    return json.dumps(value)


def _inner_repeat(value: Any) -> str | None:
    if isinstance(value, _Object):
        return value.repeated
    if isinstance(value, list):
        for i, item in enumerate(value):
            inner = _inner_repeat(item)
            if inner is not None:
                return f"{i}.{inner}"
    return None


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    obj.repeated, obj.pairs = None, pairs
    for key, item in pairs:
        if obj.repeated is None:
            if key in obj:
                obj.repeated = key
            else:
                inner = _inner_repeat(item)
                if inner is not None:
                    obj.repeated = f"{key}.{inner}"
        obj[key] = item
    return obj


def duplicate_keys(raw: bytes) -> list[str | None]:
    """The first repeated key (dotted path) of each item of ``raw``: one entry for an object, one per element
    for an array; ``[]`` when ``raw`` does not parse. The exact, slower check behind :func:`dropped_keys`."""
    return [path for path, _ in _repeats(raw)]


def _repeats(raw: bytes) -> list[tuple[str | None, bytes]]:
    """(first repeated key or None, the item's JSON text with every key as sent) per item of ``raw``."""
    try:
        value = json.loads(raw, object_pairs_hook=_object)
    except (ValueError, RecursionError):
        return []
    items = value if isinstance(value, list) else [value]
    out: list[tuple[str | None, bytes]] = []
    for item in items:
        path = _inner_repeat(item)
        out.append((path, _as_sent(item).encode() if path is not None else b""))
    return out


def _repeat_error(path: str) -> str:
    return (
        f"duplicate key {path!r}: an object names the same key twice, and which value was meant cannot be "
        "told; send each key once"
    )


def json_type(value: Any) -> str:
    """How a JSON value's type reads in an error message: "an array", "an object", "a string", ..."""
    return {
        list: "an array",
        dict: "an object",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        type(None): "null",
    }.get(type(value), type(value).__name__)

