"""The ingest stage: bytes in, validated rows out, one committed write.

Shared by every way records arrive (HTTP routes, ``ubi import``, the Kafka loader, tests): parse a body
(one JSON object, a JSON array, NDJSON, or an OpenSearch ``_bulk`` body), validate each item on its own,
turn the valid ones into Arrow batches of the stored shape, and keep every rejected one, with its reason
and raw bytes, for the ``failed_records`` table.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import orjson
import pyarrow as pa
from pydantic import ValidationError

from collector.errors import RequestError, TooLarge  # noqa: F401  (TooLarge: re-exported)
from schemas.ubi import UbiEvent, UbiQuery
from store.duckdb_store import Store
from store.rows import (
    EVENT_SCHEMA,
    QUERY_SCHEMA,
    Counts,
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
    event_id: str | None = None  # from a _bulk action line's _id
    line: int | None = None  # 1-based line of the item's document in the body, when known
    body: bytes = b""  # the whole body: what is kept for an array item too deeply nested to serialise

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


@dataclass(frozen=True)
class IngestContext:
    """Where a batch came from, for record filters: the route or file, request headers, the peer."""

    source: str
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names; empty for files
    client: str | None = None


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
        if isinstance(value, list):
            return [RawItem(i, kind, v, None, body=text) for i, v in enumerate(value)]
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
            items.append(RawItem(index, kind, orjson.loads(line), line, line=number))
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


def parse_bulk(body: bytes) -> list[RawItem]:
    """Split an OpenSearch ``_bulk`` body: an action line, then the document, for each record.

    ``index`` and ``create`` actions are supported; ``_index`` says the kind (``ubi_queries`` or
    ``ubi_events``) and an event's ``_id`` becomes its ``event_id``, so replaying an export deduplicates.
    A bad pair rejects that record only; items are numbered by record, and messages name the line. Each
    item's ``line`` is its document's line in the body (the action line's when there is no document).
    """
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
        if not isinstance(action, dict) or len(action) != 1:
            items.append(
                RawItem(
                    index,
                    None,
                    None,
                    line,
                    error=f"line {number}: expected an action line such as "
                    '{"index": {"_index": "ubi_events"}}',
                    line=number,
                )
            )
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
                    line=number,
                )
            )
            i += 1 if verb == "delete" else 2
            continue
        kind = _BULK_INDEX.get(str(meta.get("_index", "")))
        if i + 1 >= len(lines):
            items.append(
                RawItem(
                    index,
                    kind,
                    None,
                    line,
                    error=f"line {number}: action line without a document after it",
                    line=number,
                )
            )
            break
        doc_number, doc = lines[i + 1]
        i += 2
        if kind is None:
            items.append(
                RawItem(
                    index,
                    None,
                    None,
                    doc,
                    field="_index",
                    error=f"line {number}: _index {meta.get('_index')!r} is not ubi_queries or ubi_events",
                    line=doc_number,
                )
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
                    line=doc_number,
                )
            )
            continue
        doc_id = meta.get("_id")
        event_id = str(doc_id) if doc_id is not None else None
        items.append(RawItem(index, kind, value, doc, event_id=event_id, line=doc_number))
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
                out.events.append((item.index, UbiEvent.model_validate(item.value), item.event_id))
        except ValidationError as exc:
            out.errors.append(_error_from_validation(item.index, exc, item.kind or "event", item.raw_bytes()))
    return out


def _json_type(value: Any) -> str:
    return {
        list: "an array",
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
        errors = list(p.validated.errors)
        if b in conflict_errors:
            errors.extend(conflict_errors[b])
            errors.sort(key=lambda e: e.index)
        counts = Counts.of(qs, es, failed=len(p.validated.errors))
        results.append(IngestResult(counts=counts, rejected=len(errors), errors=tuple(errors)))
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
