"""The ingest stage: bytes in, validated rows out, one committed write.

Shared by every way records arrive (HTTP routes, ``ubi import``, the Kafka loader, tests): parse a body
(one JSON object, a JSON array, NDJSON, or an OpenSearch ``_bulk`` body), validate each item on its own,
turn the valid ones into Arrow batches of the stored shape, and keep every rejected one, with its reason
and raw bytes, for the ``failed_records`` table.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import orjson
import pyarrow as pa
from pydantic import TypeAdapter, ValidationError

from collector.errors import RequestError, TooLarge  # noqa: F401  (TooLarge: re-exported)
from schemas.ubi import Str100, UbiEvent, UbiQuery
from store.duckdb_store import Store
from store.rows import (
    EVENT_SCHEMA,
    QUERY_SCHEMA,
    Counts,
    RowStatus,
    event_values,
    failed_row,
    failed_table,
    query_values,
    rows_table,
    utcnow,
)

Kind = Literal["query", "event"]


class BodyError(RequestError):
    """A request body or file that cannot be parsed at all (400): names line and column."""

    status_code = 400
    kind = "body"

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None) -> None:
        self.line, self.column, self.message = line, column, message
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(where + message)
        self.message = where + message


@dataclass(frozen=True)
class RawItem:
    """One item of a body before validation: its kind, parsed value (or parse error) and raw bytes."""

    index: int
    kind: Kind | None
    value: Any
    #: The item's bytes; None for an item of a JSON array, serialised again from ``value`` only when asked
    #: for (:meth:`raw_bytes`): valid items never need them, and the copy cost 1.5 us an event.
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


class ItemBytes(Mapping[int, bytes]):
    """The raw bytes of a body's items by request position, produced only for the items asked for."""

    def __init__(self, items: Iterable[RawItem] = ()) -> None:
        self._items = {item.index: item for item in items}

    def __getitem__(self, index: int) -> bytes:
        return self._items[index].raw_bytes()

    def __iter__(self) -> Iterator[int]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class ItemError:
    """Why one item was rejected; ``index`` is its position in the request."""

    index: int
    field: str | None
    message: str
    kind: str
    raw: bytes

    def public(self) -> dict[str, Any]:
        return {"index": self.index, "field": self.field, "message": self.message}


@dataclass
class Validated:
    """Items of one body after validation, ready for one write."""

    queries: list[tuple[int, UbiQuery]] = field(default_factory=list)
    events: list[tuple[int, UbiEvent, str | None]] = field(default_factory=list)
    errors: list[ItemError] = field(default_factory=list)
    raws: Mapping[int, bytes] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.queries) + len(self.events) + len(self.errors)

    def reject(self, index: int, *, field: str | None, message: str, kind: str) -> None:
        """Move the valid item at request position ``index`` to the errors (for record filters)."""
        raw = self.raws.get(index, b"")
        self.queries = [(i, q) for i, q in self.queries if i != index]
        self.events = [(i, e, b) for i, e, b in self.events if i != index]
        self.errors.append(ItemError(index, field, message, kind, raw))
        self.errors.sort(key=lambda e: e.index)


#: ASGI scope key under which the security gate leaves the application of the request's API key.
APPLICATION_SCOPE_KEY = "ubi.api_key_application"


@dataclass(frozen=True)
class IngestContext:
    """Where a batch came from, for record filters: the route or file, request headers, the peer."""

    source: str
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names; empty for files
    client: str | None = None
    #: The application of the request's API key, as the security gate resolved it (None: no key).
    application: str | None = None


#: A step run on every validated batch before the sink (pseudonymisation, API-key checks, ...). It returns
#: the batch to store (it may change records or move items to the errors with ``Validated.reject``) or raises
#: a :class:`collector.errors.RequestError` to refuse the whole request.
RecordFilter = Callable[[Validated, IngestContext], Validated]


def apply_filters(validated: Validated, filters: Sequence[RecordFilter], ctx: IngestContext) -> Validated:
    """Run the record filters in order."""
    for step in filters:
        validated = step(validated, ctx)
    return validated


@dataclass(frozen=True)
class IngestResult:
    """The collector's answer for one body: ``{"accepted", "duplicates", "rejected", "errors"}``."""

    counts: Counts  # what the write stored (per kind) and found stored already
    rejected: int  # items refused (conflicts included); each is kept in failed_records
    errors: tuple[ItemError, ...]
    #: Request position -> (its :class:`RowStatus`, the stored key) of each item written (conflicts are
    #: errors instead), for answers that report items one by one (OpenSearch ``_bulk``); empty from sinks
    #: that cannot tell (Kafka).
    item_status: Mapping[int, tuple[RowStatus, str]] = field(default_factory=dict)

    @property
    def accepted(self) -> int:
        return self.counts.accepted

    @property
    def duplicates(self) -> int:
        return self.counts.duplicates

    @property
    def queries(self) -> int:
        return self.counts.queries

    @property
    def events(self) -> int:
        return self.counts.events

    def public(self, max_errors: int = 1000) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "errors": [e.public() for e in self.errors[:max_errors]],
        }


# ---------------------------------------------------------------- parsing


def _decode_error(exc: orjson.JSONDecodeError, *, line_offset: int = 0) -> BodyError:
    return BodyError(f"malformed JSON: {exc.msg}", line=exc.lineno + line_offset, column=exc.colno)


def strip_bom(body: bytes) -> bytes:
    """``body`` without a leading UTF-8 byte order mark (Windows tools write one; orjson refuses it)."""
    return body[3:] if body.startswith(b"\xef\xbb\xbf") else body


def _lines(body: bytes) -> Iterator[tuple[int, bytes]]:
    for number, line in enumerate(body.split(b"\n"), start=1):
        stripped = line.strip()
        if stripped:
            yield number, stripped


# ---------------------------------------------------------------- duplicate keys

def _dropped_keys(raw: bytes, value: Any) -> bool:
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
    for an array; ``[]`` when ``raw`` does not parse. The exact, slower check behind :func:`_dropped_keys`."""
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
            if b"\n" in text and _parses(first):
                return _ndjson_items(body, kind)
            raise _decode_error(exc) from exc
        repeats = _repeats(body) if _dropped_keys(body, value) else []
        if isinstance(value, list):
            items = [RawItem(i, kind, v, None, body=text) for i, v in enumerate(value)]
            for i, (path, sent) in enumerate(repeats):
                if path is not None and i < len(items):
                    items[i] = RawItem(i, kind, None, sent, error=_repeat_error(path), field=path)
            return items
        if repeats and repeats[0][0] is not None:
            return [RawItem(0, kind, None, text, error=_repeat_error(repeats[0][0]), field=repeats[0][0])]
        return [RawItem(0, kind, value, text)]
    return _ndjson_items(body, kind)


def _item_bytes(value: Any, body: bytes) -> bytes:
    """An array item's bytes for ``failed_records``: the item re-serialised (same JSON value), or the whole
    body when the item is nested too deeply to serialise (orjson writes 254 levels, reads 1024)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return body


def _parses(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


def _ndjson_items(body: bytes, kind: Kind) -> list[RawItem]:
    items: list[RawItem] = []
    for number, line in _lines(body):
        index = len(items)
        try:
            value = orjson.loads(line)
            repeat = duplicate_keys(line)[0] if _dropped_keys(line, value) else None
            if repeat is not None:
                error = f"line {number}: {_repeat_error(repeat)}"
                items.append(RawItem(index, kind, None, line, line=number, error=error, field=repeat))
            else:
                items.append(RawItem(index, kind, value, line, line=number))
        except orjson.JSONDecodeError as exc:
            items.append(
                RawItem(
                    index,
                    kind,
                    None,
                    line,
                    line=number,
                    error=f"line {number}, column {exc.colno}: malformed JSON: {exc.msg}",
                )
            )
    return items


_BULK_INDEX: dict[str, Kind] = {"ubi_queries": "query", "ubi_events": "event"}

#: ``_id`` is checked as ``UbiEvent.event_id`` is (it becomes the event's event_id): a string of at most
#: 100 characters. A number is taken as its decimal text, as OpenSearch does; anything else is refused.
_ID: TypeAdapter[str] = TypeAdapter(Str100)  # UbiEvent.event_id's type


def bulk_id(meta: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the ``_id`` of an action line, or why it is refused)."""
    doc_id = meta.get("_id")
    if doc_id is None:
        return None, None
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str):
        return None, f"_id must be a string (it becomes the event_id), got {_json_type(doc_id)}"
    if not doc_id:
        return None, "_id must not be empty"
    try:
        _ID.validate_python(doc_id)
    except ValidationError as exc:
        why = exc.errors(include_url=False)[0]["msg"]
        return None, f"_id is checked as event_id (it becomes the event's event_id): {why}; got {len(doc_id):,} characters"
    return doc_id, None


def parse_bulk(
    body: bytes, *, indices: Mapping[str, Kind] | None = None, default_index: str | None = None
) -> list[RawItem]:
    """Split an OpenSearch ``_bulk`` body: an action line, then the document, for each record.

    ``index`` and ``create`` actions are supported; ``_index`` (else ``default_index``, the index of a
    ``/{index}/_bulk`` path) names the kind through ``indices`` (default ``ubi_queries`` and ``ubi_events``),
    and an event's ``_id`` becomes its ``event_id``, so replaying an export deduplicates. ``_id`` is
    validated as ``event_id`` is. A bad pair rejects that record only; items are numbered by record, and
    messages name the line. Each item's ``line`` is its document's line in the body (the action line's when
    there is no document).
    """
    indices = _BULK_INDEX if indices is None else indices
    lines = list(_lines(strip_bom(body)))
    if not lines:
        raise BodyError(
            "empty body: expected an OpenSearch _bulk body (action line, then document)", line=1, column=1
        )
    items: list[RawItem] = []
    i = 0
    while i < len(lines):
        number, line = lines[i]
        index = len(items)
        try:
            action = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            items.append(
                RawItem(
                    index,
                    None,
                    None,
                    line,
                    error=f"line {number}, column {exc.colno}: malformed action line: {exc.msg}",
                    line=number,
                )
            )
            i += 1
            continue
        repeat = duplicate_keys(line)[0] if _dropped_keys(line, action) else None
        if not isinstance(action, dict) or len(action) != 1 or repeat is not None:
            error = f"line {number}: " + (
                _repeat_error(repeat) if repeat is not None
                else 'expected an action line such as {"index": {"_index": "ubi_events"}}'
            )
            items.append(RawItem(index, None, None, line, error=error, field=repeat, line=number))
            i += 1
            continue
        verb, meta = next(iter(action.items()))
        if verb not in ("index", "create") or not isinstance(meta, dict):
            items.append(
                RawItem(
                    index,
                    None,
                    None,
                    line,
                    error=f"line {number}: unsupported bulk action {verb!r}; expected 'index' or 'create'",
                    field="action",
                    action=str(verb),
                    line=number,
                )
            )
            i += 1 if verb == "delete" else 2
            continue
        target = meta.get("_index", default_index)
        kind = indices.get(target) if isinstance(target, str) else None
        name = target if isinstance(target, str) else None
        if i + 1 >= len(lines):
            items.append(
                RawItem(
                    index, kind, None, line, error=f"line {number}: action line without a document after it",
                    action=verb, index_name=name, line=number,
                )
            )
            break
        doc_number, doc = lines[i + 1]
        i += 2
        if kind is None:
            known = " or ".join(indices)
            error = (
                f"line {number}: no such index [{target}]; _index must be {known}"
                if isinstance(target, str)
                else f"line {number}: the action names no _index (or not as a string); send _index "
                f"({known}) or post to /{{index}}/_bulk"
            )
            items.append(
                RawItem(
                    index,
                    None,
                    None,
                    doc,
                    field="_index",
                    error=error,
                    action=verb,
                    index_name=name,
                    line=doc_number,
                )
            )
            continue
        doc_id, id_error = bulk_id(meta)
        if id_error is not None:
            items.append(
                RawItem(index, kind, None, doc, field="_id", error=f"line {number}: {id_error}",
                        line=doc_number, action=verb, index_name=name)
            )
            continue
        try:
            value = orjson.loads(doc)
        except orjson.JSONDecodeError as exc:
            items.append(
                RawItem(
                    index,
                    kind,
                    None,
                    doc,
                    error=f"line {doc_number}, column {exc.colno}: malformed JSON: {exc.msg}",
                    action=verb,
                    index_name=name,
                    event_id=doc_id,
                    line=doc_number,
                )
            )
            continue
        repeat = duplicate_keys(doc)[0] if _dropped_keys(doc, value) else None
        if repeat is not None:
            items.append(
                RawItem(index, kind, None, doc, field=repeat, error=f"line {doc_number}: {_repeat_error(repeat)}",
                        line=doc_number, action=verb, index_name=name, event_id=doc_id)
            )
            continue
        items.append(
            RawItem(index, kind, value, doc, event_id=doc_id, line=doc_number, action=verb, index_name=name)
        )
    return items


# ---------------------------------------------------------------- validation


def _loc(error: Any) -> str:
    return ".".join(str(p) for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))


def _describe(error: Any) -> str:
    """One pydantic error as a sentence: what is wrong, and the value when it helps."""
    if error["type"] == "missing":
        return f"'{_loc(error)}' is required"
    msg = str(error["msg"])
    if msg.startswith("Value error, "):  # our own validators already quote the value
        return msg[len("Value error, ") :]
    value = error.get("input")
    if value is not None and not isinstance(value, dict | list):
        msg += f" (got {repr(value)[:80]})"
    return msg


def _error_from_validation(index: int, exc: ValidationError, kind: str, raw: bytes) -> ItemError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    msg = _describe(first)
    also = [_describe(e) if e["type"] == "missing" else f"'{_loc(e)}': {_describe(e)}" for e in errors[1:4]]
    if also:
        msg += "; also " + "; ".join(also) + (f" (+{len(errors) - 4} more)" if len(errors) > 4 else "")
    return ItemError(index, _loc(first) or None, msg, kind, raw)


def validate_items(items: Iterable[RawItem]) -> Validated:
    """Validate each item on its own; valid ones are kept in order, invalid ones become :class:`ItemError`."""
    items = list(items)
    out = Validated(raws=ItemBytes(items))
    for item in items:
        if item.error is not None:
            out.errors.append(ItemError(item.index, item.field, item.error, item.kind or "body", item.raw_bytes()))
            continue
        if not isinstance(item.value, dict):
            out.errors.append(
                ItemError(
                    item.index,
                    None,
                    f"expected a JSON object, got {_json_type(item.value)}",
                    item.kind or "body",
                    item.raw_bytes(),
                )
            )
            continue
        try:
            if item.kind == "query":
                out.queries.append((item.index, UbiQuery.model_validate(item.value)))
            else:
                event = UbiEvent.model_validate(item.value)
                if item.event_id is not None and event.event_id and event.event_id != item.event_id:
                    out.errors.append(
                        ItemError(
                            item.index,
                            "_id",
                            f"_id {item.event_id!r} and the document's event_id {event.event_id!r} differ; "
                            "the _id becomes the event_id, so send one or make them equal",
                            "event",
                            item.raw_bytes(),
                        )
                    )
                    continue
                out.events.append((item.index, event, item.event_id))
        except ValidationError as exc:
            out.errors.append(_error_from_validation(item.index, exc, item.kind or "event", item.raw_bytes()))
    return out


def _json_type(value: Any) -> str:
    return {
        list: "an array",
        dict: "an object",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        type(None): "null",
    }.get(type(value), type(value).__name__)


# ---------------------------------------------------------------- the stage


@dataclass(frozen=True)
class Prepared:
    """One validated body as stored rows (column-ordered tuples), ready to be merged into a group write.

    Rows stay Python tuples until the write: building an Arrow table costs ~5 us per column whatever its
    length, so a single-event request would pay ~140 us for a one-row table; the writer builds one table
    for a whole group of requests instead.
    """

    validated: Validated
    source: str
    received_at: datetime
    query_rows: list[tuple[Any, ...]]
    event_rows: list[tuple[Any, ...]]
    failed_rows: list[dict[str, Any]]

    @property
    def n_queries(self) -> int:
        return len(self.query_rows)

    @property
    def n_events(self) -> int:
        return len(self.event_rows)

    # Arrow views of the rows (built on each call; the group write does not use them).
    @property
    def queries(self) -> pa.Table | None:
        return _table(self.query_rows, QUERY_SCHEMA)

    @property
    def events(self) -> pa.Table | None:
        return _table(self.event_rows, EVENT_SCHEMA)

    @property
    def failed(self) -> pa.Table | None:
        return failed_table(self.failed_rows) if self.failed_rows else None

    def event_dicts(self) -> list[dict[str, Any]]:
        """Event rows as dicts keyed by stored column name."""
        return [dict(zip(EVENT_SCHEMA.names, r, strict=True)) for r in self.event_rows]


#: What building a stored row can raise for a record that validated: nesting deeper than orjson writes
#: (254 levels), or a value the column type cannot hold.
_ROW_ERRORS = (orjson.JSONEncodeError, ValueError, OverflowError, TypeError)


def _unstorable(exc: Exception) -> str:
    if isinstance(exc, orjson.JSONEncodeError) and "ecursion" in str(exc):
        return "cannot be stored: objects nested more than 254 levels deep; flatten the extra keys"
    return f"cannot be stored: {exc}"


def prepare(validated: Validated, *, source: str, received_at: datetime | None = None) -> Prepared:
    """Build the stored rows of one validated body (and the ``failed_records`` rows of its rejected items).

    A record that validated but cannot be stored (say, extra keys nested deeper than 254 levels) is
    rejected here, on its own, like any invalid item.
    """
    now = received_at or utcnow()
    qrows: list[tuple[Any, ...]] = []
    erows: list[tuple[Any, ...]] = []
    late: list[ItemError] = []
    queries, events = validated.queries, validated.events
    for index, q in validated.queries:
        try:
            qrows.append(query_values(q, now))
        except _ROW_ERRORS as exc:
            late.append(ItemError(index, None, _unstorable(exc), "query", validated.raws.get(index, b"")))
    for index, e, bulk_id in validated.events:
        try:
            erows.append(event_values(e, now, bulk_id))
        except _ROW_ERRORS as exc:
            late.append(ItemError(index, None, _unstorable(exc), "event", validated.raws.get(index, b"")))
    if late:
        bad = {err.index for err in late}
        validated = Validated(
            queries=[(i, q) for i, q in queries if i not in bad],
            events=[(i, e, b) for i, e, b in events if i not in bad],
            errors=sorted([*validated.errors, *late], key=lambda err: err.index),
            raws=validated.raws,
        )
    failed = [
        failed_row(
            source=source,
            kind=err.kind,
            reason=err.message,
            raw=err.raw,
            item_index=err.index,
            field=err.field,
            received_at=now,
        )
        for err in validated.errors
    ]
    return Prepared(
        validated=validated,
        source=source,
        received_at=now,
        query_rows=qrows,
        event_rows=erows,
        failed_rows=failed,
    )


def _table(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.Table | None:
    return rows_table(rows, schema) if rows else None


def _conflict_error(p: Prepared, pos: int) -> ItemError:
    index, q = p.validated.queries[pos]
    message = (
        f"query_id {q.query_id!r} (query_response_id {q.query_response_id!r}) is already stored "
        "with different content; first write wins, this record is kept as a conflict"
    )
    return ItemError(index, "query_id", message, "conflict", p.validated.raws.get(index, b""))


def _event_conflict_error(p: Prepared, pos: int) -> ItemError:
    index, e, bulk_id = p.validated.events[pos]
    sent = f"event_id {e.event_id!r}" if e.event_id else f"_bulk _id {bulk_id!r}"
    message = (
        f"{sent} is already stored for an event with different content; first write wins, this event is "
        "kept as a conflict (give each event its own id)"
    )
    return ItemError(index, "event_id", message, "conflict", p.validated.raws.get(index, b""))


def ingest_many(store: Store, batches: list[Prepared]) -> list[IngestResult]:
    """Write several prepared bodies in ONE committed transaction (group commit); one result per body.

    Deduplication runs across the whole group in order, so two requests carrying the same event count it
    once (the first accepted, the second a duplicate), exactly as if they had been written one by one.
    Conflicting query records and events (a taken key, different content) are kept in ``failed_records``
    in the same transaction.
    """
    q_offsets, e_offsets = [], []
    nq = ne = 0
    for p in batches:
        q_offsets.append(nq)
        e_offsets.append(ne)
        nq += p.n_queries
        ne += p.n_events
    conflict_errors: dict[int, list[ItemError]] = {}

    def keep_conflicts(positions: Sequence[int], *, events: bool = False) -> pa.Table:
        offsets, size, error = (
            (e_offsets, "n_events", _event_conflict_error)
            if events
            else (q_offsets, "n_queries", _conflict_error)
        )
        rows = []
        for pos in positions:
            b = bisect.bisect_right(offsets, pos) - 1
            # skip bodies with no rows of this kind that share the offset
            while getattr(batches[b], size) == 0:
                b -= 1
            p = batches[b]
            err = error(p, pos - offsets[b])
            conflict_errors.setdefault(b, []).append(err)
            rows.append(
                failed_row(
                    source=p.source,
                    kind="conflict",
                    reason=err.message,
                    raw=err.raw,
                    item_index=err.index,
                    field=err.field,
                    received_at=p.received_at,
                )
            )
        return failed_table(rows)

    outcome = store.write_rows(
        _table([r for p in batches for r in p.query_rows], QUERY_SCHEMA),
        _table([r for p in batches for r in p.event_rows], EVENT_SCHEMA),
        failed_table(failed) if (failed := [r for p in batches for r in p.failed_rows]) else None,
        conflicts=keep_conflicts,
        event_conflicts=lambda positions: keep_conflicts(positions, events=True),
    )
    results = []
    for b, p in enumerate(batches):
        qs = outcome.query_status[q_offsets[b] : q_offsets[b] + p.n_queries]
        es = outcome.event_status[e_offsets[b] : e_offsets[b] + p.n_events]
        status: dict[int, tuple[RowStatus, str]] = {}
        for (index, _), row, st in zip(p.validated.queries, p.query_rows, qs, strict=True):
            if st != RowStatus.CONFLICT:
                status[index] = (st, row[1])
        for (index, _, _), row, st in zip(p.validated.events, p.event_rows, es, strict=True):
            if st != RowStatus.CONFLICT:
                key = row[0]
                stored = key[3:] if key.startswith("id:") else key
                status[index] = (st, stored)
        errors = list(p.validated.errors)
        if b in conflict_errors:
            errors.extend(conflict_errors[b])
            errors.sort(key=lambda e: e.index)
        counts = Counts.of(qs, es, failed=len(p.validated.errors))
        results.append(
            IngestResult(counts=counts, rejected=len(errors), errors=tuple(errors), item_status=status)
        )
    return results


def ingest(store: Store, validated: Validated, *, source: str) -> IngestResult:
    """Write one validated body in a single committed transaction; keep every rejected item.

    Conflicting query records (a stored ``query_key`` with different content) are rejected and kept in
    ``failed_records`` in the same transaction.
    """
    return ingest_many(store, [prepare(validated, source=source)])[0]


def keep_unparseable(store: Store, body: bytes, *, source: str, reason: str, kind: str = "body") -> None:
    """Keep a whole body that could not be parsed (within the size limit) in ``failed_records``."""
    store.write(failed=failed_table([failed_row(source=source, kind=kind, reason=reason, raw=body)]))
