"""The record format on the Kafka topics: what ``ubi serve --sink kafka`` writes and ``ubi consume`` reads.

Three topics per prefix: ``<prefix>.queries``, ``<prefix>.events`` and ``<prefix>.failed``. A message on
``.queries`` / ``.events`` holds the rows of one search (one ``query_id``) from one request, one row per
line (NDJSON); a row is the stored shape (``schemas.tables``: the columns of ``ubi_queries`` /
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
import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from collector.ingest import EVENT_SCHEMA, QUERY_SCHEMA, ItemError, Validated, event_row, query_row
from collector.store import FAILED_SCHEMA, failed_row, utcnow
from schemas.errors import UbiError

TopicKind = Literal["queries", "events", "failed"]
TOPIC_KINDS: tuple[TopicKind, ...] = ("queries", "events", "failed")

#: Columns that may not be null in a stored row (NOT NULL in ``schemas.tables``).
REQUIRED = {
    "queries": ("query_key", "query_id", "user_query", "content_hash", "received_at"),
    "events": ("event_key", "action_name", "timestamp", "received_at"),
}
SCHEMAS = {"queries": QUERY_SCHEMA, "events": EVENT_SCHEMA}


class KafkaError(UbiError):
    """The Kafka broker could not be reached or refused a request (wraps kafka-python's errors)."""


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


# ---------------------------------------------------------------- encoding (collector side)


@dataclass(frozen=True)
class Message:
    """One record to produce: which topic (by kind), its key and its JSON value."""

    kind: TopicKind
    key: bytes | None
    value: bytes


def failed_value(row: dict[str, Any]) -> bytes:
    """A ``failed_records`` row as a ``.failed`` message value (``raw`` as base64, timestamps ISO)."""
    out = dict(row)
    raw = out.pop("raw", None)
    out["raw_b64"] = base64.b64encode(raw).decode() if raw is not None else None
    for k in ("kafka_topic", "kafka_partition", "kafka_offset"):
        out.pop(k, None)
    return orjson.dumps(out)


@dataclass
class Encoded:
    """One validated body as messages, with what the 202 reports about it."""

    msgs: list[Message]
    queries: int
    events: int
    errors: list[ItemError]


#: What building a stored row can raise for a record that validated (as in ``collector.ingest.prepare``).
_ROW_ERRORS = (orjson.JSONEncodeError, ValueError, OverflowError, TypeError)


#: Largest message value built from rows (a search with more rows is split over several messages).
MAX_VALUE_BYTES = 256 * 1024


def _group(kind: TopicKind, rows: list[tuple[str, bytes]]) -> list[Message]:
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


def encode(validated: Validated, *, source: str, received_at: datetime | None = None) -> Encoded:
    """The messages of one validated body: its stored rows, and its rejected items with their reasons.

    Rows go straight from the validated records to JSON (no Arrow round trip). A record that validated
    but cannot be stored is rejected on its own, as :func:`collector.ingest.prepare` does.
    """
    now = received_at or utcnow()
    errors = list(validated.errors)
    late: list[ItemError] = []
    qrows: list[tuple[str, bytes]] = []
    erows: list[tuple[str, bytes]] = []
    for index, q in validated.queries:
        try:
            row = query_row(q, now)
            qrows.append((row["query_id"], orjson.dumps(row)))
        except _ROW_ERRORS as exc:
            late.append(ItemError(index, None, f"cannot be stored: {exc}", "query", validated.raws.get(index, b"")))
    for index, e, bulk_id in validated.events:
        try:
            row = event_row(e, now, bulk_id)
            erows.append((row["query_id"] or row["event_key"], orjson.dumps(row)))
        except _ROW_ERRORS as exc:
            late.append(ItemError(index, None, f"cannot be stored: {exc}", "event", validated.raws.get(index, b"")))
    if late:
        errors = sorted([*errors, *late], key=lambda err: err.index)
    msgs = _group("queries", qrows) + _group("events", erows)
    for err in errors:
        row = failed_row(source=source, kind=err.kind, reason=err.message, raw=err.raw, item_index=err.index,
                         field=err.field, received_at=now)
        msgs.append(Message("failed", None, failed_value(row)))
    return Encoded(msgs, len(qrows), len(erows), errors)


def body_message(body: bytes, *, source: str, reason: str, kind: str) -> Message:
    """A whole refused body (unparseable, wrong type) as a ``.failed`` message."""
    return Message("failed", None, failed_value(failed_row(source=source, kind=kind, reason=reason, raw=body)))


# ---------------------------------------------------------------- decoding (loader side)


class InRecord(NamedTuple):
    """One consumed record: where it came from and its value."""

    topic: str
    partition: int
    offset: int
    value: bytes | None


class Origin(NamedTuple):
    """Where one row came from: its message, and its line in the message (0-based)."""

    record: InRecord
    line: int

    def raw(self) -> bytes:
        """The row's own bytes (its line of the message)."""
        return (self.record.value or b"").split(b"\n")[self.line]


@dataclass
class Decoded:
    """One consumed batch turned into stored-shape Arrow tables, plus the records that could not be."""

    queries: pa.Table | None = None
    events: pa.Table | None = None
    #: where each row of ``queries`` / ``events`` came from (parallel to the tables' rows)
    query_origin: list[Origin] = field(default_factory=list)
    event_origin: list[Origin] = field(default_factory=list)
    #: ``failed_records`` rows: from the ``.failed`` topic, and poison records (kind ``poison``)
    failed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def poison(self) -> int:
        return sum(1 for f in self.failed if f["kind"] == "poison")


def poison_id(rec: InRecord, line: int | None = None) -> str:
    """Deterministic ``failed_id`` of a poison record (or of one bad line of it): re-delivered, kept once."""
    h = hashlib.sha256(f"{rec.topic}\x1f{rec.partition}\x1f{rec.offset}\x1f{line}\x1f".encode() + (rec.value or b""))
    return "kafka:" + h.hexdigest()[:32]


def poison_row(rec: InRecord, reason: str, *, line: int | None = None, raw: bytes | None = None,
               received_at: datetime | None = None) -> dict[str, Any]:
    """The ``failed_records`` row of a record (or a line of it) the loader cannot read, with topic, partition,
    offset, and the line as ``item_index``."""
    row = failed_row(source=rec.topic, kind="poison", reason=reason, raw=rec.value if raw is None else raw,
                     item_index=line, received_at=received_at, kafka=(rec.topic, rec.partition, rec.offset))
    row["failed_id"] = poison_id(rec, line)
    return row


_PARSE = {
    kind: pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error", newlines_in_values=False)
    for kind, schema in SCHEMAS.items()
}
_READ = pj.ReadOptions(use_threads=False, block_size=64 * 1024 * 1024)


def _read_rows(kind: Literal["queries", "events"], values: list[bytes]) -> pa.Table:
    """Parse JSON rows against the stored schema; raises ValueError naming what is wrong."""
    table = pj.read_json(io.BytesIO(b"\n".join(values)), parse_options=_PARSE[kind], read_options=_READ)
    if table.num_rows != len(values):
        raise ValueError(f"expected {len(values)} JSON objects, found {table.num_rows} (empty value or a raw "
                         "newline inside one)")
    for col in REQUIRED[kind]:
        if table.column(col).null_count:
            raise ValueError(f"'{col}' is required (a column of ubi_{kind} that may not be null)")
    for col in ("query_key", "event_key"):  # an empty dedup key would merge unrelated records
        if col in table.column_names and pc.any(pc.equal(table.column(col), "")).as_py():
            raise ValueError(f"'{col}' is empty")
    return table.cast(SCHEMAS[kind])


def _decode_rows(kind: Literal["queries", "events"], recs: list[InRecord], out: Decoded, now: datetime) -> None:
    lines: list[bytes] = []
    origin: list[Origin] = []
    for r in recs:
        if not r.value:
            out.failed.append(poison_row(r, "empty message value", received_at=now))
            continue
        for i, line in enumerate(r.value.split(b"\n")):
            lines.append(line)
            origin.append(Origin(r, i))
    table: pa.Table | None = None
    if lines:
        try:
            table = _read_rows(kind, lines)
        except (pa.ArrowInvalid, ValueError):
            # Somewhere in the batch is poison: parse line by line to keep every good row.
            pieces: list[pa.Table] = []
            kept: list[Origin] = []
            for line, o in zip(lines, origin, strict=True):
                try:
                    pieces.append(_read_rows(kind, [line]))
                    kept.append(o)
                except (pa.ArrowInvalid, ValueError) as exc:
                    where = f"line {o.line + 1}: " if (o.record.value or b"").count(b"\n") else ""
                    out.failed.append(poison_row(
                        o.record, f"{where}not {_ARTICLE[kind]} record of the stored shape "
                                  f"({_explain(kind, line, exc)})",
                        line=o.line, raw=line if where else None, received_at=now))
            table = pa.concat_tables(pieces) if pieces else None
            origin = kept
    if kind == "queries":
        out.queries, out.query_origin = table, origin
    else:
        out.events, out.event_origin = table, origin


_ARTICLE = {"queries": "a query", "events": "an event"}


def _explain(kind: Literal["queries", "events"], value: bytes, exc: Exception) -> str:
    """Why one value is not a stored row, naming the offending keys where Arrow's message does not."""
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as err:
        return f"malformed JSON: {err.msg}"
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    unknown = sorted(set(obj) - set(SCHEMAS[kind].names))
    if unknown:
        return f"unexpected keys {', '.join(unknown[:5])}; expected the columns of ubi_{kind}"
    return _short(exc)


def _short(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


_FAILED_FIELDS = {"failed_id": str, "source": str, "kind": str, "reason": str}


def _decode_failed(rec: InRecord, now: datetime) -> dict[str, Any]:
    """A ``.failed`` message back to its ``failed_records`` row; a malformed one becomes poison itself."""
    try:
        obj = orjson.loads(rec.value or b"")
        if not isinstance(obj, dict):
            raise ValueError("expected a JSON object")
        for name, typ in _FAILED_FIELDS.items():
            if not isinstance(obj.get(name), typ):
                raise ValueError(f"'{name}' must be a string")
        raw_b64 = obj.get("raw_b64")
        raw = base64.b64decode(raw_b64, validate=True) if raw_b64 is not None else None
        received = datetime.fromisoformat(obj["received_at"]) if obj.get("received_at") else now
        index, fld = obj.get("item_index"), obj.get("field")
        if index is not None and not isinstance(index, int):
            raise ValueError("'item_index' must be an integer")
        if fld is not None and not isinstance(fld, str):
            raise ValueError("'field' must be a string")
        return {
            "failed_id": obj["failed_id"], "received_at": received.replace(tzinfo=None), "source": obj["source"],
            "kind": obj["kind"], "item_index": index, "field": fld, "reason": obj["reason"], "raw": raw,
            "kafka_topic": rec.topic, "kafka_partition": rec.partition, "kafka_offset": rec.offset,
        }
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError) as exc:
        return poison_row(rec, f"not a failed record of the stored shape ({_short(exc)})", received_at=now)


def decode(records: Sequence[InRecord], names: Topics) -> Decoded:
    """Turn consumed records into stored-shape tables; anything unreadable becomes a ``poison`` failed row."""
    now = utcnow()
    out = Decoded()
    by_kind: dict[TopicKind, list[InRecord]] = {"queries": [], "events": [], "failed": []}
    for r in records:
        kind = names.kind(r.topic)
        if kind is None:
            out.failed.append(poison_row(r, f"topic {r.topic!r} is not one of {', '.join(names)}", received_at=now))
        else:
            by_kind[kind].append(r)
    _decode_rows("queries", by_kind["queries"], out, now)
    _decode_rows("events", by_kind["events"], out, now)
    out.failed.extend(_decode_failed(r, now) for r in by_kind["failed"])
    return out


def failed_arrow(rows: list[dict[str, Any]]) -> pa.Table:
    """``failed_records`` rows as an Arrow table of the store's schema."""
    return pa.Table.from_pylist(rows, schema=FAILED_SCHEMA)
