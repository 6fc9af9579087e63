"""The stored shape: Arrow schemas of the stored tables, stored rows built from validated records,
``failed_records`` rows, and what a write did to each row (:class:`RowStatus`, :class:`Counts`).

Every way records arrive (HTTP routes, ``ubi import``, the Kafka sink and loader) builds rows here, so the
dedup keys (``query_key``, ``event_key``) and the content hashes are computed in one place.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any, overload

import orjson
import pyarrow as pa

from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.ubi import (
    CANONICAL_OPTIONS,
    JSON_FIELD_MAX_LENGTH,
    EventAttributes,
    UbiEvent,
    UbiQuery,
)


def utcnow() -> datetime:
    """Now, as a naive UTC datetime (the stored convention for TIMESTAMP columns)."""
    return datetime.now(UTC).replace(tzinfo=None)


# ---------------------------------------------------------------- what a write did


class RowStatus(IntEnum):
    """What a committed write did to one query record or event."""

    INSERTED = 0
    DUPLICATE = 1  # the key was stored with the same content: a retry or a replay
    CONFLICT = 2  # the key was stored with different content: first write wins, this one is kept as failed


@dataclass
class Counts:
    """How many rows a write (or a run of writes) stored, found stored already, or kept as failed."""

    queries: int = 0
    query_duplicates: int = 0
    events: int = 0
    event_duplicates: int = 0
    conflicts: int = 0  # query records and events re-using a stored key with different content
    failed: int = 0  # rejected items kept in failed_records (conflicts and poison not included)
    poison: int = 0  # Kafka records the loader could not read

    @classmethod
    def of(cls, query_status: Iterable[RowStatus], event_status: Iterable[RowStatus], *, failed: int = 0,
           poison: int = 0) -> Counts:
        """Counts of per-row statuses."""
        queries, events = Counter(query_status), Counter(event_status)
        return cls(
            queries=queries[RowStatus.INSERTED],
            query_duplicates=queries[RowStatus.DUPLICATE],
            events=events[RowStatus.INSERTED],
            event_duplicates=events[RowStatus.DUPLICATE],
            conflicts=queries[RowStatus.CONFLICT] + events[RowStatus.CONFLICT],
            failed=failed,
            poison=poison,
        )

    @property
    def accepted(self) -> int:
        """Records newly stored."""
        return self.queries + self.events

    @property
    def duplicates(self) -> int:
        """Records already stored."""
        return self.query_duplicates + self.event_duplicates

    def add(self, other: Counts) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def public(self) -> dict[str, int]:
        return asdict(self)


# ---------------------------------------------------------------- Arrow schemas of stored rows

#: The Arrow type each DuckDB column type of ``ubi_pipeline.schemas.tables`` travels as (JSON columns travel as strings).
ARROW_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "VARCHAR[]": pa.list_(pa.string()),
    "TIMESTAMP": pa.timestamp("us"),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "UBIGINT": pa.uint64(),
    "DOUBLE": pa.float64(),
    "BLOB": pa.binary(),
}


def arrow_schema(table: tables.Table) -> pa.Schema:
    """The Arrow schema of ``table``'s stored rows, in its column order (types from :data:`ARROW_TYPES`)."""
    return pa.schema([(c.name, ARROW_TYPES[c.sql]) for c in table.columns])


QUERY_SCHEMA = arrow_schema(tables.QUERY_TABLE)
EVENT_SCHEMA = arrow_schema(tables.EVENT_TABLE)
FAILED_SCHEMA = arrow_schema(tables.FAILED_TABLE)
JUDGMENT_SCHEMA = arrow_schema(tables.JUDGMENT_TABLE)
JUDGMENT_RUN_SCHEMA = arrow_schema(tables.JUDGMENT_RUN_TABLE)
HUMAN_JUDGMENT_SCHEMA = arrow_schema(tables.HUMAN_JUDGMENT_TABLE)


# ---------------------------------------------------------------- query and event rows


class TooLongToStore(ValueError):
    """A free-form object of a record whose stored JSON is over :data:`JSON_FIELD_MAX_LENGTH`; ``field`` names it."""

    def __init__(self, field: str, length: int) -> None:
        super().__init__(
            f"{field} is {length:,} bytes of JSON once stored; at most {JSON_FIELD_MAX_LENGTH:,} "
            "(JSON_FIELD_MAX_LENGTH): send fewer or shorter keys"
        )
        self.field = field


def check_json_length(field: str, text: str | None) -> str | None:
    """``text`` (a JSON column's value) when it is within :data:`JSON_FIELD_MAX_LENGTH` bytes; raises
    :class:`TooLongToStore` naming ``field`` otherwise."""
    # characters first: a text within the limit in characters is within it in bytes unless it is not ASCII
    if text is not None and len(text) > JSON_FIELD_MAX_LENGTH // 4 and (size := len(text.encode())) > JSON_FIELD_MAX_LENGTH:
        raise TooLongToStore(field, size)
    return text


#: The JSON columns of the stored tables, whose length :func:`check_json_length` bounds.
JSON_COLUMNS = {"queries": ("query_attributes", "extra"), "events": ("event_attributes", "extra")}


def _json(value: Any) -> str | None:
    if value is None:
        return None
    return orjson.dumps(value).decode()


def _naive_utc(ts: datetime | None) -> datetime | None:
    return ts.replace(tzinfo=None) if ts is not None else None


# The models' serializers, called directly: ``model_dump`` and ``model_dump_json`` add ~0.8 us of Python per
# call around the same Rust call, a fifth of an event's dump.
_QUERY_DUMP = UbiQuery.__pydantic_serializer__.to_python
_EVENT_DUMP = UbiEvent.__pydantic_serializer__.to_python
_ATTRIBUTES_JSON = EventAttributes.__pydantic_serializer__.to_json


def query_values(q: UbiQuery, received_at: datetime) -> tuple[Any, ...]:
    """One query record in ``QUERY_SCHEMA`` column order (hashing the canonical dump once)."""
    digest = hashlib.sha256(orjson.dumps(_QUERY_DUMP(q, exclude_none=True), option=CANONICAL_OPTIONS)).hexdigest()[:32]
    qid = q.query_id or ("h:" + digest)
    extra = q.__pydantic_extra__
    return (
        qid + "\x1f" + (q.query_response_id or ""),
        qid,
        q.user_query,
        q.client_id,
        q.application,
        _naive_utc(q.timestamp),
        check_json_length("query_attributes", _json(q.query_attributes)),
        q.object_id_field,
        q.query_response_id,
        q.query_response_hit_ids,
        check_json_length("extra", orjson.dumps(extra).decode() if extra else None),
        digest,
        received_at,
    )


def event_values(e: UbiEvent, received_at: datetime, bulk_id: str | None) -> tuple[Any, ...]:
    """One event in ``EVENT_SCHEMA`` column order; the key is ``ubi_pipeline.schemas.ubi.event_key`` (computed once)."""
    event_id = e.event_id or bulk_id
    attrs = e.event_attributes
    if event_id:
        key = "id:" + event_id
        attrs_json = _ATTRIBUTES_JSON(attrs, exclude_none=True).decode() if attrs is not None else None
    else:
        dump = _EVENT_DUMP(e, exclude_none=True)
        key = "h:" + hashlib.sha256(orjson.dumps(dump, option=CANONICAL_OPTIONS)).hexdigest()[:32]
        attrs_json = orjson.dumps(dump["event_attributes"]).decode() if attrs is not None else None
    obj = attrs.object if attrs is not None else None
    pos = attrs.position if attrs is not None else None
    extra = e.__pydantic_extra__
    return (
        key,
        event_id,
        e.action_name,
        e.query_id,
        e.session_id,
        e.client_id,
        e.user_id,
        e.application,
        e.timestamp.replace(tzinfo=None),
        e.message_type,
        e.message,
        e.user_query,
        obj.object_id if obj is not None else None,
        obj.object_id_field if obj is not None else None,
        obj.object_id_type if obj is not None else None,
        obj.internal_id if obj is not None else None,
        pos.ordinal if pos is not None else None,
        pos.x if pos is not None else None,
        pos.y if pos is not None else None,
        check_json_length("event_attributes", attrs_json),
        check_json_length("extra", orjson.dumps(extra).decode() if extra else None),
        received_at,
    )


def query_row(q: UbiQuery, received_at: datetime) -> dict[str, Any]:
    """The stored shape of a query record (``ubi_pipeline.schemas.tables.UBI_QUERIES``)."""
    return dict(zip(QUERY_SCHEMA.names, query_values(q, received_at), strict=True))


def event_row(e: UbiEvent, received_at: datetime, bulk_id: str | None = None) -> dict[str, Any]:
    """The stored shape of an event (``ubi_pipeline.schemas.tables.UBI_EVENTS``); ``bulk_id`` is a ``_bulk`` ``_id``."""
    return dict(zip(EVENT_SCHEMA.names, event_values(e, received_at, bulk_id), strict=True))


class TableRows(Sequence[tuple[Any, ...]]):
    """The rows of an Arrow table of stored rows as column-ordered tuples, made only when first read.

    Rows that arrive as a table (from a parse worker) are mostly never read one by one: their table is
    written as it is, and their keys come from one column (:meth:`column`). Reading a row (a conflict's
    message, a test) converts them all once, to the values :func:`rows_table` was given.
    """

    def __init__(self, table: pa.Table | None) -> None:
        self.table = table
        self._rows: list[tuple[Any, ...]] | None = None

    def column(self, name: str) -> list[Any]:
        """One column's values, in row order."""
        return self.table.column(name).to_pylist() if self.table is not None else []

    def _all(self) -> list[tuple[Any, ...]]:
        if self._rows is None:
            t = self.table
            self._rows = list(zip(*(c.to_pylist() for c in t.columns), strict=True)) if t is not None else []
        return self._rows

    def __len__(self) -> int:
        return self.table.num_rows if self.table is not None else 0

    @overload
    def __getitem__(self, index: int) -> tuple[Any, ...]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[Any, ...]]: ...

    def __getitem__(self, index: int | slice) -> tuple[Any, ...] | list[tuple[Any, ...]]:
        return self._all()[index]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._all())


def rows_table(rows: Sequence[tuple[Any, ...]], schema: pa.Schema) -> pa.Table:
    """Stored rows (column-ordered tuples) as an Arrow table of ``schema`` (a :class:`TableRows`' own table)."""
    if isinstance(rows, TableRows) and rows.table is not None and rows.table.schema.equals(schema):
        return rows.table
    # Column-wise conversion is several times faster than Table.from_pylist over dicts.
    columns = list(zip(*rows, strict=True))
    return pa.Table.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)], schema=schema
    )


# ---------------------------------------------------------------- event content (retry or conflict)

#: Columns of an event that are its content: all but the dedup key and the server's arrival time.
EVENT_CONTENT_COLUMNS = tuple(c for c in tables.EVENT_COLUMNS if c not in ("event_key", "received_at"))
_EVENT_JSON = frozenset({"event_attributes", "extra"})


def event_content_hash(row: Mapping[str, Any]) -> str:
    """SHA-256 (first 32 hex) of a stored event row's content, the same whatever its JSON key order.

    Compared only for rows whose ``event_key`` is already taken, to tell a retry (same content) from a
    different event re-using an ``event_id`` (a conflict). The JSON columns are parsed so that
    ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}`` count as the same content.
    """
    return event_content_digest([row[c] for c in EVENT_CONTENT_COLUMNS])


def event_content_digest(values: Sequence[Any]) -> str:
    """:func:`event_content_hash` of the values of :data:`EVENT_CONTENT_COLUMNS`, in that order."""
    parsed = [
        orjson.loads(v) if c in _EVENT_JSON and v is not None else v
        for c, v in zip(EVENT_CONTENT_COLUMNS, values, strict=True)
    ]
    return hashlib.sha256(
        orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS | orjson.OPT_NAIVE_UTC)
    ).hexdigest()[:32]


# ---------------------------------------------------------------- failed records


def failed_row(
    *,
    source: str,
    kind: str,
    reason: str,
    raw: bytes | None,
    item_index: int | None = None,
    field: str | None = None,
    received_at: datetime | None = None,
    kafka: tuple[str, int, int] | None = None,
) -> dict[str, Any]:
    """One ``failed_records`` row as a dict (see ``ubi_pipeline.schemas.tables.FAILED_RECORDS``).

    ``raw`` over :data:`~ubi_pipeline.schemas.tables.FAILED_RAW_MAX_BYTES` is kept truncated, its full length
    and SHA-256 appended to ``reason``; ``reason`` and ``field`` are cut at ``FAILED_TEXT_MAX_LENGTH``.
    """
    topic, partition, offset = kafka or (None, None, None)
    reason, raw = truncated_raw(reason, raw)
    return {
        "failed_id": uuid.uuid4().hex,
        "received_at": received_at or utcnow(),
        "source": source,
        "kind": kind,
        "item_index": item_index,
        "field": field[: tables.FAILED_TEXT_MAX_LENGTH] if field is not None else None,
        "reason": reason,
        "raw": raw,
        "kafka_topic": topic,
        "kafka_partition": partition,
        "kafka_offset": offset,
    }


def truncated_raw(reason: str, raw: bytes | None) -> tuple[str, bytes | None]:
    """``(reason, raw)`` as ``failed_records`` keeps them: ``raw`` cut at ``FAILED_RAW_MAX_BYTES`` with its
    length and SHA-256 appended to ``reason`` when it was, ``reason`` cut at ``FAILED_TEXT_MAX_LENGTH``."""
    limit, text_limit = tables.FAILED_RAW_MAX_BYTES, tables.FAILED_TEXT_MAX_LENGTH
    if len(reason) > text_limit:
        reason = reason[: text_limit - 1] + "\u2026"
    if raw is not None and len(raw) > limit:
        reason += (f" [raw truncated: {len(raw):,} bytes, sha256 {hashlib.sha256(raw).hexdigest()}; "
                   f"the first {limit:,} are kept]")
        raw = raw[:limit]
    return reason, raw


def failed_table(rows: list[dict[str, Any]]) -> pa.Table:
    """``failed_records`` rows as an Arrow table of the store's schema."""
    return pa.Table.from_pylist(rows, schema=FAILED_SCHEMA)
