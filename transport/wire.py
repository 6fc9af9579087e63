"""The record format on the Kafka topics: what ``ubi serve --sink kafka`` writes and ``ubi consume`` reads.

Three topics per prefix: ``<prefix>.queries``, ``<prefix>.events`` and ``<prefix>.failed``. A message on
``.queries`` / ``.events`` holds the rows of one search (one ``query_id``) from one request, one row per
line (NDJSON); a row is the stored shape (``ubi_pipeline.schemas.tables``: the columns of ``ubi_queries`` /
``ubi_events``) as a JSON object, timestamps as naive-UTC ISO strings. Messages are keyed by that
``query_id`` (rows without one are keyed, and sent, one by one under their own dedup key), so a search's
query and events share a partition and stay in order, and copies of a row always meet in one partition.

Why several rows per message: kafka-python spends tens of microseconds per message on each side
(record building and parsing in Python), several times what a row costs us; a search's events arrive
together anyway, and grouping them is what lets the collector and the loader move more events per second
than kafka-python moves messages. Messages stay under 256 KiB (a big search is split).

The collector validated each row and computed its dedup key (``query_key`` / ``event_key``) before
producing it, so:

* re-delivery (a replayed spool, a loader restarted before its commit) carries the same bytes, hence the
  same keys, and the store's dedup absorbs it;
* the loader re-validates cheaply: Arrow's JSON reader parses a whole batch against the stored schema in
  C++, and only a batch that fails is taken apart, message by message and line by line, to find the poison.

``<prefix>.failed`` carries one ``failed_records`` row per message (rejected items with their reason,
``raw`` base64).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

import orjson
import pyarrow as pa

from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.store.rows import EVENT_SCHEMA, QUERY_SCHEMA

TopicKind = Literal["queries", "events", "failed"]
TOPIC_KINDS: tuple[TopicKind, ...] = ("queries", "events", "failed")

#: Columns that may not be null in a stored row (NOT NULL or the key in ``ubi_pipeline.schemas.tables``).
REQUIRED = {"queries": tables.QUERY_TABLE.required, "events": tables.EVENT_TABLE.required}
#: The Arrow schema a row line of each kind must fit (the stored shape).
SCHEMAS: dict[str, pa.Schema] = {"queries": QUERY_SCHEMA, "events": EVENT_SCHEMA}


class Topics(NamedTuple):
    """The three topic names of one prefix."""

    queries: str
    events: str
    failed: str

    def of(self, kind: TopicKind) -> str:
        return str(getattr(self, kind))

    def kind(self, topic: str) -> TopicKind | None:
        for k in TOPIC_KINDS:
            if getattr(self, k) == topic:
                return k
        return None


def topics(prefix: str) -> Topics:
    """Topic names for ``prefix`` (``ubi`` gives ``ubi.queries``, ``ubi.events``, ``ubi.failed``)."""
    if not prefix or any(c not in _TOPIC_CHARS for c in prefix):
        raise UbiError(f"topic prefix {prefix!r}: use letters, digits, '.', '_' and '-' only (Kafka topic names)")
    return Topics(f"{prefix}.queries", f"{prefix}.events", f"{prefix}.failed")


_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


# ---------------------------------------------------------------- messages


@dataclass(frozen=True)
class Message:
    """One record to produce: which topic (by kind), its key and its JSON value."""

    kind: TopicKind
    key: bytes | None
    value: bytes


def row_line(row: dict[str, Any]) -> bytes:
    """A stored row (``ubi_pipeline.store.rows.query_row`` / ``event_row``) as one line of a ``.queries`` / ``.events`` value."""
    return orjson.dumps(row)


def failed_value(row: dict[str, Any]) -> bytes:
    """A ``failed_records`` row as a ``.failed`` message value (``raw`` as base64, timestamps ISO)."""
    out = dict(row)
    raw = out.pop("raw", None)
    out["raw_b64"] = base64.b64encode(raw).decode() if raw is not None else None
    for k in ("kafka_topic", "kafka_partition", "kafka_offset"):
        out.pop(k, None)
    return orjson.dumps(out)


#: Largest message value built from rows (a search with more rows is split over several messages).
MAX_VALUE_BYTES = 256 * 1024


def group_rows(kind: TopicKind, rows: list[tuple[str, bytes]]) -> list[Message]:
    """Rows (key, JSON) of one kind as messages: one per key in first-seen order, lines in row order."""
    by_key: dict[str, list[bytes]] = {}
    for key, line in rows:
        by_key.setdefault(key, []).append(line)
    out: list[Message] = []
    for key, lines in by_key.items():
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            if chunk and size + len(line) + 1 > MAX_VALUE_BYTES:
                out.append(Message(kind, key.encode(), b"\n".join(chunk)))
                chunk, size = [], 0
            chunk.append(line)
            size += len(line) + 1
        out.append(Message(kind, key.encode(), b"\n".join(chunk)))
    return out


_FAILED_FIELDS = {"failed_id": str, "source": str, "kind": str, "reason": str}
_FAILED_LIMITS = {c.name: c.max_length or 0 for c in tables.FAILED_TABLE.columns if c.name in ("failed_id", "source", "kind")}


def failed_from_value(value: bytes, *, received_default: datetime) -> dict[str, Any]:
    """A ``.failed`` message value back to its ``failed_records`` row (without the kafka_* columns).

    The inverse of :func:`failed_value`; raises ``ValueError`` naming what is wrong with a malformed one.
    """
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON: {exc.msg}") from exc
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    for name, typ in _FAILED_FIELDS.items():
        if not isinstance(obj.get(name), typ):
            raise ValueError(f"'{name}' must be a string")
    raw_b64 = obj.get("raw_b64")
    try:
        raw = base64.b64decode(raw_b64, validate=True) if raw_b64 is not None else None
        received = datetime.fromisoformat(obj["received_at"]) if obj.get("received_at") else received_default
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from exc
    for name in ("failed_id", "source", "kind"):
        limit = _FAILED_LIMITS[name]
        if not obj[name] or len(obj[name]) > limit:
            raise ValueError(f"'{name}' must be 1 to {limit} characters, got {len(obj[name]):,}")
    index, fld = obj.get("item_index"), obj.get("field")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)
                              or not -(2**31) <= index < 2**31):
        raise ValueError(f"'item_index' must be an integer of 32 bits (the column's type), got {str(index)[:40]}")
    if fld is not None and not isinstance(fld, str):
        raise ValueError("'field' must be a string")
    return {
        "failed_id": obj["failed_id"], "received_at": received.replace(tzinfo=None), "source": obj["source"],
        "kind": obj["kind"], "item_index": index, "field": fld, "reason": obj["reason"], "raw": raw,
    }
