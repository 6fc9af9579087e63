"""The ingest stage: bytes in, validated rows out, one committed write.

Shared by every way records arrive (HTTP routes, ``ubi import``, the Kafka loader, tests): parse a body
(one JSON object, a JSON array, NDJSON, or an OpenSearch ``_bulk`` body: the parsers of
:mod:`ubi_pipeline.collector.bodies`, re-exported here), validate each item on its own, turn the valid ones into Arrow
batches of the stored shape, and keep every rejected one, with its reason and raw bytes, for the
``failed_records`` table.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from pydantic import TypeAdapter, ValidationError

from ubi_pipeline.collector.bodies import (  # noqa: F401  (re-exported: the parsers' long-standing home)
    BodyError,
    Kind,
    RawItem,
    dropped_keys,
    duplicate_keys,
    json_type,
    parse_bulk,
    parse_items,
    strip_bom,
)
from ubi_pipeline.collector.errors import TooLarge  # noqa: F401  (re-exported)
from ubi_pipeline.schemas.ubi import UbiEvent, UbiQuery
from ubi_pipeline.store import keys as key_index
from ubi_pipeline.store.answer_log import Tables
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import (
    EVENT_SCHEMA,
    QUERY_SCHEMA,
    Counts,
    RowStatus,
    TableRows,
    event_values,
    failed_row,
    failed_table,
    query_values,
    rows_table,
    utcnow,
)


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
#: a :class:`ubi_pipeline.collector.errors.RequestError` to refuse the whole request.
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


#: Validators of many records in one call: pydantic-core loops over the list in Rust, about a fifth less CPU
#: than one ``model_validate`` call per record (bench/import_speed.py prints both).
_MANY: dict[str, TypeAdapter[list[Any]]] = {
    "query": TypeAdapter(list[UbiQuery]),
    "event": TypeAdapter(list[UbiEvent]),
}


def _validate_many(kind: str, items: list[RawItem]) -> list[Any] | None:
    """The models of ``items`` (objects of one kind) in one call; None when any is invalid (the caller then
    validates them one by one, so that each error names its own item and field)."""
    if len(items) < 2:
        return None
    try:
        return _MANY[kind].validate_python([item.value for item in items])
    except ValidationError:
        return None


def validate_items(items: Iterable[RawItem]) -> Validated:
    """Validate each item on its own; valid ones are kept in order, invalid ones become :class:`ItemError`.

    The objects of each kind are validated together first (:func:`_validate_many`); a batch holding an
    invalid record is validated again record by record, which gives the same models and the errors.
    """
    items = list(items)
    out = Validated(raws=ItemBytes(items))
    objects: dict[str, list[RawItem]] = {"query": [], "event": []}
    for item in items:
        if item.error is not None:
            out.errors.append(ItemError(item.index, item.field, item.error, item.kind or "body", item.raw_bytes()))
        elif not isinstance(item.value, dict):
            out.errors.append(
                ItemError(
                    item.index,
                    None,
                    f"expected a JSON object, got {json_type(item.value)}",
                    item.kind or "body",
                    item.raw_bytes(),
                )
            )
        else:
            objects["query" if item.kind == "query" else "event"].append(item)
    queries = _validate_many("query", objects["query"])
    if queries is not None:
        out.queries = [(item.index, q) for item, q in zip(objects["query"], queries, strict=True)]
    else:
        for item in objects["query"]:
            try:
                out.queries.append((item.index, UbiQuery.model_validate(item.value)))
            except ValidationError as exc:
                out.errors.append(_error_from_validation(item.index, exc, "query", item.raw_bytes()))
    events = _validate_many("event", objects["event"])
    for pos, item in enumerate(objects["event"]):
        if events is not None:
            event = events[pos]
        else:
            try:
                event = UbiEvent.model_validate(item.value)
            except ValidationError as exc:
                out.errors.append(_error_from_validation(item.index, exc, item.kind or "event", item.raw_bytes()))
                continue
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
    out.errors.sort(key=lambda e: e.index)
    return out


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
    #: Column-ordered tuples, or a :class:`TableRows` when the rows came as a table (a parse worker's).
    query_rows: Sequence[tuple[Any, ...]]
    event_rows: Sequence[tuple[Any, ...]]
    failed_rows: list[dict[str, Any]]
    #: Request position of each query row.
    query_index: list[int] = field(default_factory=list)
    #: (request position, the document's event_id, the ``_bulk`` ``_id``) of each event row: what an answer
    #: and a conflict's message name.
    event_ids: list[tuple[int, str | None, str | None]] = field(default_factory=list)
    #: The rows' tables (queries, events, failed) and their answer-log payload, when a parse worker framed
    #: them (``ubi_pipeline.collector.workers``): the writer logs the payload as it is.
    frame: tuple[Tables, bytes] | None = None
    #: The key index's hashes of :meth:`query_keys` and :meth:`event_keys`
    #: (:func:`ubi_pipeline.store.keys.key_hashes`), when a parse worker computed them with the rows.
    key_hashes: tuple[np.ndarray, np.ndarray] | None = None

    def hashes(self) -> tuple[np.ndarray, np.ndarray]:
        """:attr:`key_hashes`, or computed now (about 0.4 us a key)."""
        if self.key_hashes is not None:
            return self.key_hashes
        return key_index.key_hashes(self.query_keys()), key_index.key_hashes(self.event_keys())

    @property
    def n_queries(self) -> int:
        return len(self.query_rows)

    @property
    def n_events(self) -> int:
        return len(self.event_rows)

    @property
    def n_rows(self) -> int:
        """Query, event and failed_records rows."""
        return len(self.query_rows) + len(self.event_rows) + len(self.failed_rows)

    def query_keys(self) -> list[str]:
        return _column(self.query_rows, QUERY_SCHEMA, "query_key")

    def event_keys(self) -> list[str]:
        return _column(self.event_rows, EVENT_SCHEMA, "event_key")

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
    q_index: list[int] = []
    e_ids: list[tuple[int, str | None, str | None]] = []
    late: list[ItemError] = []
    queries, events = validated.queries, validated.events
    for index, q in validated.queries:
        try:
            qrows.append(query_values(q, now))
            q_index.append(index)
        except _ROW_ERRORS as exc:
            late.append(ItemError(index, getattr(exc, "field", None), _unstorable(exc), "query",
                                  validated.raws.get(index, b"")))
    for index, e, bulk_id in validated.events:
        try:
            erows.append(event_values(e, now, bulk_id))
            e_ids.append((index, e.event_id, bulk_id))
        except _ROW_ERRORS as exc:
            late.append(ItemError(index, getattr(exc, "field", None), _unstorable(exc), "event",
                                  validated.raws.get(index, b"")))
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
        query_index=q_index,
        event_ids=e_ids,
    )


def _table(rows: Sequence[tuple[Any, ...]], schema: pa.Schema) -> pa.Table | None:
    return rows_table(rows, schema) if rows else None


def _column(rows: Sequence[tuple[Any, ...]], schema: pa.Schema, name: str) -> list[Any]:
    """One column of stored rows of ``schema``: read from the table when they came as one, else from each tuple."""
    if isinstance(rows, TableRows):
        return rows.column(name)
    position = schema.get_field_index(name)
    return [r[position] for r in rows]


def group_table(batches: Sequence[Prepared], kind: str) -> pa.Table | None:
    """The ``kind`` (``query`` or ``event``) rows of several bodies as one table, in the bodies' order: the
    tables of bodies whose rows came as one kept as they are, the tuples of the others converted together
    (one conversion per run of such bodies: a table costs ~5 us a column whatever its length)."""
    schema = QUERY_SCHEMA if kind == "query" else EVENT_SCHEMA
    parts: list[pa.Table] = []
    pending: list[tuple[Any, ...]] = []
    for p in batches:
        rows = p.query_rows if kind == "query" else p.event_rows
        if isinstance(rows, TableRows):
            if pending:
                parts.append(rows_table(pending, schema))
                pending = []
            if rows.table is not None and rows.table.num_rows:
                parts.append(rows.table)
        else:
            pending.extend(rows)
    if pending:
        parts.append(rows_table(pending, schema))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def frame_tables(batches: Sequence[Prepared]) -> Tables:
    """The query, event and ``failed_records`` rows of several bodies as the answer log frames them."""
    failed = [r for p in batches for r in p.failed_rows]
    return group_table(batches, "query"), group_table(batches, "event"), failed_table(failed) if failed else None


def _conflict_error(p: Prepared, pos: int) -> ItemError:
    index, row = p.query_index[pos], p.query_rows[pos]
    # a record sent without a query_id is keyed by its content: it can be a duplicate, never a conflict
    message = (
        f"query_id {row[1]!r} (query_response_id {row[8]!r}) is already stored "
        "with different content; first write wins, this record is kept as a conflict"
    )
    return ItemError(index, "query_id", message, "conflict", p.validated.raws.get(index, b""))


def _event_conflict_error(p: Prepared, pos: int) -> ItemError:
    index, event_id, bulk_id = p.event_ids[pos]
    sent = f"event_id {event_id!r}" if event_id else f"_bulk _id {bulk_id!r}"
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
        group_table(batches, "query"),
        group_table(batches, "event"),
        failed_table(failed) if (failed := [r for p in batches for r in p.failed_rows]) else None,
        conflicts=keep_conflicts,
        event_conflicts=lambda positions: keep_conflicts(positions, events=True),
    )
    return [
        result_of(
            p,
            outcome.query_status[q_offsets[b] : q_offsets[b] + p.n_queries],
            outcome.event_status[e_offsets[b] : e_offsets[b] + p.n_events],
            conflict_errors.get(b, ()),
        )
        for b, p in enumerate(batches)
    ]


def result_of(
    p: Prepared,
    qs: Sequence[RowStatus] | None = None,
    es: Sequence[RowStatus] | None = None,
    conflicts: Sequence[ItemError] = (),
) -> IngestResult:
    """The answer for body ``p`` whose query rows and event rows were written with statuses ``qs`` and ``es``
    (None: every row inserted, as for an answer from the answer log); ``conflicts``: the errors of its rows
    that conflicted with stored ones."""
    if qs is None and es is None:
        counts = Counts(queries=p.n_queries, events=p.n_events, failed=len(p.validated.errors))
    else:
        counts = None
    if qs is None:
        qs = [RowStatus.INSERTED] * p.n_queries
    if es is None:
        es = [RowStatus.INSERTED] * p.n_events
    status: dict[int, tuple[RowStatus, str]] = {}
    for index, query_id, st in zip(p.query_index, _column(p.query_rows, QUERY_SCHEMA, "query_id"), qs, strict=True):
        if st != RowStatus.CONFLICT:
            status[index] = (st, query_id)
    for (index, _, _), key, st in zip(p.event_ids, p.event_keys(), es, strict=True):
        if st != RowStatus.CONFLICT:
            stored = key[3:] if key.startswith("id:") else key
            status[index] = (st, stored)
    errors = list(p.validated.errors)
    if conflicts:
        errors.extend(conflicts)
        errors.sort(key=lambda e: e.index)
    if counts is None:
        counts = Counts.of(qs, es, failed=len(p.validated.errors))
    return IngestResult(counts=counts, rejected=len(errors), errors=tuple(errors), item_status=status)


def ingest(store: Store, validated: Validated, *, source: str) -> IngestResult:
    """Write one validated body in a single committed transaction; keep every rejected item.

    Conflicting query records (a stored ``query_key`` with different content) are rejected and kept in
    ``failed_records`` in the same transaction.
    """
    return ingest_many(store, [prepare(validated, source=source)])[0]


def keep_unparseable(store: Store, body: bytes, *, source: str, reason: str, kind: str = "body") -> None:
    """Keep a whole body that could not be parsed (within the size limit) in ``failed_records``."""
    store.write(failed=failed_table([failed_row(source=source, kind=kind, reason=reason, raw=body)]))
