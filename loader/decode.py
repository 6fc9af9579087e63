"""Kafka records back to stored-shape rows: the loader's half of the wire format (:mod:`ubi_pipeline.transport.wire`).

A batch of consumed records is parsed against the stored Arrow schema in one go (Arrow's JSON reader, in
C++); only a batch that fails is taken apart, halved and halved again down to the lines at fault, so every
good row is kept and each unreadable one becomes a ``poison`` row of ``failed_records`` carrying topic,
partition, offset and line.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ubi_pipeline.schemas import tables
from ubi_pipeline.store.rows import failed_row, truncated_raw, utcnow
from ubi_pipeline.transport.wire import REQUIRED, SCHEMAS, TopicKind, Topics, failed_from_value


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
        pieces: list[pa.Table] = []
        kept: list[Origin] = []
        _read_good(kind, lines, origin, pieces, kept, out, now)
        table = pa.concat_tables(pieces) if len(pieces) > 1 else (pieces[0] if pieces else None)
        origin = kept
    if table is not None and table.num_rows:
        table, origin = _within_limits(kind, table, origin, out, now)
    if kind == "queries":
        out.queries, out.query_origin = table, origin
    else:
        out.events, out.event_origin = table, origin


def _read_good(kind: Literal["queries", "events"], lines: list[bytes], origin: list[Origin], pieces: list[pa.Table],
               kept: list[Origin], out: Decoded, now: datetime) -> None:
    """Parse ``lines`` into ``pieces`` (their origins into ``kept``, in order); each line that is not a stored row
    becomes a poison row of ``out``.

    A batch that fails is halved, and each half parsed again, down to the lines at fault: one poison line in a
    batch of n costs about 2 log2(n) parses instead of n. Parsing line by line (about a millisecond a line)
    made a batch of 15,000 rows with one poison line take 14 s, past the loader's max.poll.interval: put out
    of the group, its commit failed and the batch came again, decoded as slowly, with no offset ever
    committed (found by bench/faults.py --kafka).
    """
    try:
        pieces.append(_read_rows(kind, lines))
        kept.extend(origin)
        return
    except (pa.ArrowInvalid, ValueError) as exc:
        if len(lines) > 1:
            half = len(lines) // 2
            _read_good(kind, lines[:half], origin[:half], pieces, kept, out, now)
            _read_good(kind, lines[half:], origin[half:], pieces, kept, out, now)
            return
        line, o = lines[0], origin[0]
        where = f"line {o.line + 1}: " if (o.record.value or b"").count(b"\n") else ""
        out.failed.append(poison_row(
            o.record, f"{where}not {_ARTICLE[kind]} record of the stored shape ({_explain(kind, line, exc)})",
            line=o.line, raw=line if where else None, received_at=now))


def row_problems(kind: Literal["queries", "events"], table: pa.Table) -> dict[int, str]:
    """By row position, why a stored-shape row of ``kind`` breaks the collector's rules: a string over its
    column's ``max_length`` (``ubi_pipeline.schemas.tables``, the models' limits), an empty ``action_name``, or a
    JSON column that is not a JSON object within its length. Rows that pass are what the collector would
    have stored; the first problem of each row is named."""
    problems: dict[int, str] = {}

    def flag(mask: Any, sizes: pa.Array | None, what: str) -> None:
        hits = np.flatnonzero(np.asarray(mask.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool))
        for pos in hits.tolist():
            problems.setdefault(pos, what.format(sizes[pos].as_py() if sizes is not None else None))

    for col in TABLE[kind].columns:
        if col.max_length is None:
            continue
        values = table.column(col.name).combine_chunks()
        if col.sql == "VARCHAR[]":
            items = pc.utf8_length(pc.list_flatten(values))
            if len(items) and pc.max(items).as_py() > col.max_length:
                over = pc.list_parent_indices(values).filter(pc.greater(items, col.max_length)).to_numpy()
                mask = np.zeros(table.num_rows, dtype=bool)
                mask[over] = True
                flag(pa.array(mask), None, f"an item of '{col.name}' is over {col.max_length} characters")
        elif col.sql == "JSON":
            size = pc.binary_length(values.cast(pa.binary()))
            flag(pc.greater(size, col.max_length), size,
                 f"'{col.name}' is {{:,}} bytes of JSON; at most {col.max_length:,}")
            for pos, text in enumerate(values.to_pylist()):
                if text is None or pos in problems:
                    continue
                try:
                    parsed = orjson.loads(text)
                except orjson.JSONDecodeError as exc:
                    problems[pos] = f"'{col.name}' is not valid JSON ({exc.msg})"
                    continue
                if not isinstance(parsed, dict):
                    problems[pos] = f"'{col.name}' must be a JSON object, got {type(parsed).__name__}"
        else:
            length = pc.utf8_length(values)
            flag(pc.greater(length, col.max_length), length,
                 f"'{col.name}' is {{:,}} characters; at most {col.max_length}")
    if kind == "events":
        flag(pc.equal(pc.utf8_length(table.column("action_name")), 0), None, "'action_name' is empty")
    return problems


def _within_limits(kind: Literal["queries", "events"], table: pa.Table, origin: list[Origin], out: Decoded,
                   now: datetime) -> tuple[pa.Table | None, list[Origin]]:
    """``table`` without the rows :func:`row_problems` finds, each of those kept as a poison row instead."""
    problems = row_problems(kind, table)
    if not problems:
        return table, origin
    for pos, why in sorted(problems.items()):
        o = origin[pos]
        where = f"line {o.line + 1}: " if (o.record.value or b"").count(b"\n") else ""
        out.failed.append(poison_row(
            o.record, f"{where}{_ARTICLE[kind]} record the collector would refuse: {why}",
            line=o.line, raw=o.raw() if where else None, received_at=now))
    keep = [pos for pos in range(table.num_rows) if pos not in problems]
    kept = table.take(pa.array(keep, pa.int64())) if keep else None
    return kept, [origin[pos] for pos in keep]


_ARTICLE = {"queries": "a query", "events": "an event"}
TABLE = {"queries": tables.QUERY_TABLE, "events": tables.EVENT_TABLE}


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


def _decode_failed(rec: InRecord, now: datetime) -> dict[str, Any]:
    """A ``.failed`` message back to its ``failed_records`` row; a malformed one becomes poison itself."""
    try:
        row = failed_from_value(rec.value or b"", received_default=now)
    except ValueError as exc:
        return poison_row(rec, f"not a failed record of the stored shape ({_short(exc)})", received_at=now)
    row["reason"], row["raw"] = truncated_raw(row["reason"], row["raw"])
    if row["field"] is not None:
        row["field"] = row["field"][: tables.FAILED_TEXT_MAX_LENGTH]
    return {**row, "kafka_topic": rec.topic, "kafka_partition": rec.partition, "kafka_offset": rec.offset}


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
