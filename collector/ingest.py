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
from collector.store import DUPLICATE, INSERTED, Store, failed_row, failed_table, utcnow
from schemas.ubi import UbiEvent, UbiQuery, content_hash, event_key, query_key

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
    raw: bytes
    error: str | None = None  # set when the item could not even be parsed
    field: str | None = None
    event_id: str | None = None  # from a _bulk action line's _id
    line: int | None = None  # 1-based line of the item's document in the body, when known


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
    raws: dict[int, bytes] = field(default_factory=dict)

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

    accepted: int
    duplicates: int
    rejected: int
    errors: tuple[ItemError, ...]
    queries: int = 0  # accepted query records
    events: int = 0  # accepted events
    query_duplicates: int = 0
    event_duplicates: int = 0

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


def _lines(body: bytes) -> Iterator[tuple[int, bytes]]:
    for number, line in enumerate(body.split(b"\n"), start=1):
        stripped = line.strip()
        if stripped:
            yield number, stripped


def parse_items(body: bytes, kind: Kind, *, ndjson: bool = False) -> list[RawItem]:
    """Split a body of ``kind`` records into items: one object, a JSON array, or NDJSON (one per line).

    A JSON array or single object that does not parse raises :class:`BodyError` naming line and column.
    In NDJSON each line is its own item, so a bad line rejects that item only.
    """
    text = body.strip()
    if not text:
        raise BodyError("empty body: expected a JSON object, a JSON array or NDJSON", line=1, column=1)
    if not ndjson:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            # Several lines of which the first is a whole JSON value: NDJSON sent without its content type.
            first = text.split(b"\n", 1)[0].strip()
            if b"\n" in text and _parses(first):
                return _ndjson_items(text, kind)
            raise _decode_error(exc) from exc
        if isinstance(value, list):
            return [RawItem(i, kind, v, orjson.dumps(v)) for i, v in enumerate(value)]
        return [RawItem(0, kind, value, text)]
    return _ndjson_items(text, kind)


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
            items.append(RawItem(index, kind, orjson.loads(line), line))
        except orjson.JSONDecodeError as exc:
            items.append(
                RawItem(index, kind, None, line, error=f"line {number}, column {exc.colno}: malformed JSON: {exc.msg}")
            )
    return items


_BULK_INDEX: dict[str, Kind] = {"ubi_queries": "query", "ubi_events": "event"}


def parse_bulk(body: bytes) -> list[RawItem]:
    """Split an OpenSearch ``_bulk`` body: an action line, then the document, for each record.

    ``index`` and ``create`` actions are supported; ``_index`` says the kind (``ubi_queries`` or
    ``ubi_events``) and an event's ``_id`` becomes its ``event_id``, so replaying an export deduplicates.
    A bad pair rejects that record only; items are numbered by record, and messages name the line.
    """
    lines = list(_lines(body))
    if not lines:
        raise BodyError("empty body: expected an OpenSearch _bulk body (action line, then document)", line=1, column=1)
    items: list[RawItem] = []
    i = 0
    while i < len(lines):
        number, line = lines[i]
        index = len(items)
        try:
            action = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            items.append(RawItem(index, None, None, line, error=f"line {number}, column {exc.colno}: malformed action line: {exc.msg}"))
            i += 1
            continue
        if not isinstance(action, dict) or len(action) != 1:
            items.append(RawItem(index, None, None, line, error=f"line {number}: expected an action line such as "
                                 '{"index": {"_index": "ubi_events"}}'))
            i += 1
            continue
        verb, meta = next(iter(action.items()))
        if verb not in ("index", "create") or not isinstance(meta, dict):
            items.append(RawItem(index, None, None, line, error=f"line {number}: unsupported bulk action {verb!r}; "
                                 "expected 'index' or 'create'", field="action"))
            i += 1 if verb == "delete" else 2
            continue
        kind = _BULK_INDEX.get(str(meta.get("_index", "")))
        if i + 1 >= len(lines):
            items.append(RawItem(index, kind, None, line, error=f"line {number}: action line without a document after it"))
            break
        doc_number, doc = lines[i + 1]
        i += 2
        if kind is None:
            items.append(RawItem(index, None, None, doc, field="_index", error=f"line {number}: _index "
                                 f"{meta.get('_index')!r} is not ubi_queries or ubi_events"))
            continue
        try:
            value = orjson.loads(doc)
        except orjson.JSONDecodeError as exc:
            items.append(RawItem(index, kind, None, doc, error=f"line {doc_number}, column {exc.colno}: malformed JSON: {exc.msg}"))
            continue
        doc_id = meta.get("_id")
        items.append(RawItem(index, kind, value, doc, event_id=str(doc_id) if doc_id is not None else None))
    return items


# ---------------------------------------------------------------- validation


def _error_from_validation(index: int, exc: ValidationError, kind: str, raw: bytes) -> ItemError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    msg = first["msg"]
    if first["type"] == "missing":
        msg = f"'{loc}' is required"
    elif first.get("input") is not None and first["type"] not in ("missing",):
        shown = repr(first["input"])
        msg = f"{msg} (got {shown[:80]})"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return ItemError(index, loc or None, msg + more, kind, raw)


def validate_items(items: Iterable[RawItem]) -> Validated:
    """Validate each item on its own; valid ones are kept in order, invalid ones become :class:`ItemError`."""
    out = Validated()
    for item in items:
        out.raws[item.index] = item.raw
        if item.error is not None:
            out.errors.append(ItemError(item.index, item.field, item.error, item.kind or "body", item.raw))
            continue
        if not isinstance(item.value, dict):
            out.errors.append(ItemError(item.index, None, f"expected a JSON object, got {_json_type(item.value)}",
                                        item.kind or "body", item.raw))
            continue
        try:
            if item.kind == "query":
                out.queries.append((item.index, UbiQuery.model_validate(item.value)))
            else:
                out.events.append((item.index, UbiEvent.model_validate(item.value), item.event_id))
        except ValidationError as exc:
            out.errors.append(_error_from_validation(item.index, exc, item.kind or "event", item.raw))
    return out


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


# ---------------------------------------------------------------- rows


def _json(value: Any) -> str | None:
    if value is None:
        return None
    return orjson.dumps(value).decode()


def _naive_utc(ts: datetime | None) -> datetime | None:
    return ts.replace(tzinfo=None) if ts is not None else None


QUERY_SCHEMA = pa.schema([
    ("query_key", pa.string()), ("query_id", pa.string()), ("user_query", pa.string()),
    ("client_id", pa.string()), ("application", pa.string()), ("timestamp", pa.timestamp("us")),
    ("query_attributes", pa.string()), ("object_id_field", pa.string()), ("query_response_id", pa.string()),
    ("query_response_hit_ids", pa.list_(pa.string())), ("extra", pa.string()), ("content_hash", pa.string()),
    ("received_at", pa.timestamp("us")),
])

EVENT_SCHEMA = pa.schema([
    ("event_key", pa.string()), ("event_id", pa.string()), ("action_name", pa.string()), ("query_id", pa.string()),
    ("session_id", pa.string()), ("client_id", pa.string()), ("user_id", pa.string()), ("application", pa.string()),
    ("timestamp", pa.timestamp("us")), ("message_type", pa.string()), ("message", pa.string()),
    ("user_query", pa.string()), ("object_id", pa.string()), ("object_id_field", pa.string()),
    ("object_id_type", pa.string()), ("internal_id", pa.string()), ("position_ordinal", pa.int32()),
    ("position_x", pa.float64()), ("position_y", pa.float64()), ("event_attributes", pa.string()),
    ("extra", pa.string()), ("received_at", pa.timestamp("us")),
])


def query_row(q: UbiQuery, received_at: datetime) -> dict[str, Any]:
    """The stored shape of a query record (``schemas.tables.UBI_QUERIES``)."""
    key = query_key(q)
    return {
        "query_key": key,
        "query_id": key.split("\x1f", 1)[0],
        "user_query": q.user_query,
        "client_id": q.client_id,
        "application": q.application,
        "timestamp": _naive_utc(q.timestamp),
        "query_attributes": _json(q.query_attributes),
        "object_id_field": q.object_id_field,
        "query_response_id": q.query_response_id,
        "query_response_hit_ids": q.query_response_hit_ids,
        "extra": _json(q.extra) if q.extra else None,
        "content_hash": content_hash(q),
        "received_at": received_at,
    }


def event_row(e: UbiEvent, received_at: datetime, bulk_id: str | None = None) -> dict[str, Any]:
    """The stored shape of an event (``schemas.tables.UBI_EVENTS``); ``bulk_id`` is a ``_bulk`` ``_id``."""
    if bulk_id is not None and e.event_id is None:
        e = e.model_copy(update={"event_id": bulk_id})
    attrs = e.event_attributes
    obj = attrs.object if attrs else None
    pos = attrs.position if attrs else None
    return {
        "event_key": event_key(e),
        "event_id": e.event_id,
        "action_name": e.action_name,
        "query_id": e.query_id,
        "session_id": e.session_id,
        "client_id": e.client_id,
        "user_id": e.user_id,
        "application": e.application,
        "timestamp": _naive_utc(e.timestamp),
        "message_type": e.message_type,
        "message": e.message,
        "user_query": e.user_query,
        "object_id": obj.object_id if obj else None,
        "object_id_field": obj.object_id_field if obj else None,
        "object_id_type": obj.object_id_type if obj else None,
        "internal_id": obj.internal_id if obj else None,
        "position_ordinal": pos.ordinal if pos else None,
        "position_x": pos.x if pos else None,
        "position_y": pos.y if pos else None,
        "event_attributes": attrs.model_dump_json(exclude_none=True) if attrs else None,
        "extra": _json(e.extra) if e.extra else None,
        "received_at": received_at,
    }


# ---------------------------------------------------------------- the stage


@dataclass(frozen=True)
class Prepared:
    """One validated body turned into Arrow tables of the stored shape, ready to be merged into a write."""

    validated: Validated
    source: str
    received_at: datetime
    queries: pa.Table | None
    events: pa.Table | None
    failed: pa.Table | None

    @property
    def n_queries(self) -> int:
        return self.queries.num_rows if self.queries is not None else 0

    @property
    def n_events(self) -> int:
        return self.events.num_rows if self.events is not None else 0


def prepare(validated: Validated, *, source: str, received_at: datetime | None = None) -> Prepared:
    """Build the stored rows of one validated body (and the ``failed_records`` rows of its rejected items)."""
    now = received_at or utcnow()
    qrows = [query_row(q, now) for _, q in validated.queries]
    erows = [event_row(e, now, bulk_id) for _, e, bulk_id in validated.events]
    failed = [
        failed_row(source=source, kind=err.kind, reason=err.message, raw=err.raw, item_index=err.index,
                   field=err.field, received_at=now)
        for err in validated.errors
    ]
    return Prepared(
        validated=validated,
        source=source,
        received_at=now,
        queries=pa.Table.from_pylist(qrows, schema=QUERY_SCHEMA) if qrows else None,
        events=pa.Table.from_pylist(erows, schema=EVENT_SCHEMA) if erows else None,
        failed=failed_table(failed) if failed else None,
    )


def _concat(tables: list[pa.Table | None]) -> pa.Table | None:
    present = [t for t in tables if t is not None and t.num_rows]
    if not present:
        return None
    return present[0] if len(present) == 1 else pa.concat_tables(present)


def _conflict_error(p: Prepared, pos: int) -> ItemError:
    index, q = p.validated.queries[pos]
    message = (f"query_id {q.query_id!r} (query_response_id {q.query_response_id!r}) is already stored "
               "with different content; first write wins, this record is kept as a conflict")
    return ItemError(index, "query_id", message, "conflict", p.validated.raws.get(index, b""))


def ingest_many(store: Store, batches: list[Prepared]) -> list[IngestResult]:
    """Write several prepared bodies in ONE committed transaction (group commit); one result per body.

    Deduplication runs across the whole group in order, so two requests carrying the same event count it
    once (the first accepted, the second a duplicate), exactly as if they had been written one by one.
    Conflicting query records are kept in ``failed_records`` in the same transaction.
    """
    q_offsets, e_offsets = [], []
    nq = ne = 0
    for p in batches:
        q_offsets.append(nq)
        e_offsets.append(ne)
        nq += p.n_queries
        ne += p.n_events
    conflict_errors: dict[int, list[ItemError]] = {}

    def keep_conflicts(positions: Sequence[int]) -> pa.Table:
        rows = []
        for pos in positions:
            b = bisect.bisect_right(q_offsets, pos) - 1
            # skip bodies with no queries that share the offset
            while batches[b].n_queries == 0:
                b -= 1
            p = batches[b]
            err = _conflict_error(p, pos - q_offsets[b])
            conflict_errors.setdefault(b, []).append(err)
            rows.append(failed_row(source=p.source, kind="conflict", reason=err.message, raw=err.raw,
                                   item_index=err.index, field=err.field, received_at=p.received_at))
        return failed_table(rows)

    outcome = store.write_rows(
        _concat([p.queries for p in batches]),
        _concat([p.events for p in batches]),
        _concat([p.failed for p in batches]),
        conflicts=keep_conflicts,
    )
    results = []
    for b, p in enumerate(batches):
        qs = outcome.query_status[q_offsets[b]:q_offsets[b] + p.n_queries]
        es = outcome.event_inserted[e_offsets[b]:e_offsets[b] + p.n_events]
        q_ins = sum(1 for s in qs if s == INSERTED)
        q_dup = sum(1 for s in qs if s == DUPLICATE)
        e_ins = sum(es)
        errors = list(p.validated.errors)
        if b in conflict_errors:
            errors.extend(conflict_errors[b])
            errors.sort(key=lambda e: e.index)
        results.append(IngestResult(
            accepted=q_ins + e_ins,
            duplicates=q_dup + (p.n_events - e_ins),
            rejected=len(errors),
            errors=tuple(errors),
            queries=q_ins,
            events=e_ins,
            query_duplicates=q_dup,
            event_duplicates=p.n_events - e_ins,
        ))
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
