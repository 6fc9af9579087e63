"""Pydantic models of UBI 1.3.0 records as clients send them, with the leniency real producers need.

Source: the UBI 1.3.0 JSON Schemas (``query.request.schema.json``, ``event.schema.json``; Apache-2.0,
o19s/ubi). Required fields and length limits follow the schema. Accepted on top of the schema because real
producers send them (see ``docs/ubi.md``): ``null`` for optional fields, ``event_attributes: null``,
epoch-millisecond integer timestamps, naive ISO timestamps (taken as UTC), offsets written ``+0000``,
legacy positions (``ordinal: {index: n}``, flat ``x``/``y``, ``position: {}``), object ids given as
integers, events whose ``object`` has no ``object_id`` (the spec's own sample), custom action names and
extra keys, which are kept, never dropped.
"""

from __future__ import annotations

import hashlib
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictInt,
    WithJsonSchema,
    field_validator,
    model_validator,
)

#: The action names the schema lists; any other string of at most 100 characters is accepted too.
STANDARD_ACTIONS = ("add_to_cart", "click", "watch", "view", "purchase", "impression")

#: Longest ``user_query`` accepted, in characters, on query records and events (at most 8 KiB in UTF-8). UBI
#: 1.3.0 sets no limit ("No length limit specified"); ours is the longest query the big web search engines
#: take, and keeps every stored string within :data:`STORED_STRING_MAX_BYTES`.
USER_QUERY_MAX_LENGTH = 2048
#: The longest string a record puts in the store, in UTF-8 bytes: DuckDB's checkpoint rewrites the last row
#: group of a table it appends to, and long strings there must be pinned in memory together. A few dozen
#: multi-megabyte ``user_query`` s made it fail under the writer's memory limit and invalidated the database
#: (issue 25). Measured with DuckDB 2.0.1 under a 64MB limit, incompressible strings of 8 KiB in three
#: columns were stored to three times the limit; 16 KiB in three columns failed at 2.9 times, 32 KiB in one at
#: 1.9 times. Under the writer's default 256MB, 1 GiB of events with every string at its longest was stored
#: without a failed checkpoint; under 32MB one failed, and the store recovered (tests/collector/test_store_attack.py).
STORED_STRING_MAX_BYTES = 8192
#: Longest JSON text, in UTF-8 bytes, of each free-form object once stored: ``query_attributes``,
#: ``event_attributes`` (the object and position with any extra keys) and the top-level extra keys of a
#: record. Checked when the stored row is built (:func:`ubi_pipeline.store.rows.check_json_length`), on every
#: path a record enters.
JSON_FIELD_MAX_LENGTH = STORED_STRING_MAX_BYTES

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INT32 = 2**31 - 1
#: Epoch milliseconds that name an instant Python (and so the store) can hold: 0001-01-01 to 9999-12-31 UTC.
EPOCH_MS_MIN = -62_135_596_800_000
EPOCH_MS_MAX = 253_402_300_799_999

#: The ISO 8601 spellings producers use, and all that is accepted: a date, optionally a time after ``T`` or a
#: space (hours, minutes, seconds, a fraction after ``.`` or ``,``), optionally ``Z`` or an offset written
#: ``+hh``, ``+hh:mm`` or ``+hhmm``. The same pattern is in the exported JSON Schema, so a client checking
#: with it and the collector agree on the form; the collector also checks that the date exists.
TIMESTAMP_PATTERN = (
    r"^\s*\d{4}-\d{2}-\d{2}"
    r"([Tt ]\d{2}(:\d{2}(:\d{2}([.,]\d+)?)?)?([Zz]|[+-]\d{2}(:?\d{2}(:?\d{2}([.,]\d+)?)?)?)?)?\s*$"
)
_TIMESTAMP_RE = re.compile(TIMESTAMP_PATTERN)
#: The spellings inside TIMESTAMP_PATTERN that producers write most, taken by a shorter path in parse_timestamp:
#: UTC as ``Z`` (JavaScript's toISOString, Logstash) or ``+00:00`` (Python's isoformat), with or without a
#: fraction of up to six digits. ``fromisoformat`` reads both as UTC itself, so nothing is left to convert.
COMMON_TIMESTAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:Z|\+00:00)\Z")


def _to_utc(parsed: datetime, shown: object) -> datetime:
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    if parsed.utcoffset() == timedelta(0):
        return parsed if parsed.tzinfo is UTC else parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError as exc:
        # 0001-01-01T00:00+05:00 is in year 0 in UTC, 9999-12-31T23:00-05:00 in year 10000: neither exists.
        raise ValueError(
            f"timestamp {str(shown)[:60]!r} falls outside 0001-01-01..9999-12-31 once converted to UTC"
        ) from exc


def parse_timestamp(value: Any) -> datetime:
    """Parse a UBI timestamp to an aware UTC datetime.

    Accepts ISO 8601 strings of :data:`TIMESTAMP_PATTERN` (``Z``, ``+00:00``, ``+0000`` or naive, naive taken
    as UTC) and integers as epoch milliseconds (the ``ubi-demo`` producer). Booleans, floats, anything
    unparseable and instants outside years 1..9999 in UTC raise ``ValueError`` (never ``OverflowError``).
    """
    if type(value) is str and COMMON_TIMESTAMP_RE.match(value):
        # The shapes most producers send (2024-05-16T12:34:56.789Z, ...56.789000+00:00) first: TIMESTAMP_PATTERN
        # matches them, so only the date's existence is left to check, by fromisoformat as below (it reads Z
        # and +00:00 as UTC, the tzinfo _to_utc would leave as it is).
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass  # no such date: the general path below says so
    if isinstance(value, bool):
        raise ValueError("expected an ISO 8601 string or epoch milliseconds, got a boolean")
    if isinstance(value, int):
        if not EPOCH_MS_MIN <= value <= EPOCH_MS_MAX:
            raise ValueError(
                f"epoch milliseconds {value} are out of range: expected {EPOCH_MS_MIN} (0001-01-01) "
                f"to {EPOCH_MS_MAX} (9999-12-31)"
            )
        return _EPOCH + timedelta(milliseconds=value)
    if isinstance(value, datetime):
        return _to_utc(value, value.isoformat())
    if isinstance(value, float):
        raise ValueError(
            f"expected an ISO 8601 string or integer epoch milliseconds, got the number {value!r}"
            + (
                " (an integer above 64 bits? those lose their digits in JSON parsers)"
                if value.is_integer()
                else ""
            )
        )
    if not isinstance(value, str):
        raise ValueError(f"expected an ISO 8601 string or epoch milliseconds, got {type(value).__name__}")
    if _TIMESTAMP_RE.match(value):
        text = value.strip()
        if text[-1:] == "z":
            text = text[:-1] + "Z"
        try:
            parsed: datetime | None = datetime.fromisoformat(text)
        except ValueError:
            parsed = None  # shaped right, but no such date or time (2024-02-30, 25:00)
    else:
        parsed = None
    if parsed is None:
        raise ValueError(
            f"unparseable timestamp {value[:60]!r}: expected ISO 8601 such as "
            "2024-05-16T12:34:56Z (offset optional, naive is UTC), or epoch milliseconds"
        )
    return _to_utc(parsed, value)


#: Integer ids are accepted from -2**63 to 2**64 - 1: what JSON parsers (orjson here) read as exact integers.
ID_INT_MIN, ID_INT_MAX = -(2**63), 2**64 - 1


def _id_to_str(value: Any) -> Any:
    """Object ids may be strings or integers (schema ``anyOf``); store both as strings.

    An integer outside 64 bits reaches us as a float whose digits are already gone (orjson, like most JSON
    parsers, reads it as a double), so it is rejected with a message asking for a string, never stored
    rounded.
    """
    if type(value) is str:  # the common case first
        return value
    if isinstance(value, bool):
        return value  # let the str check reject it
    if isinstance(value, int):
        if not ID_INT_MIN <= value <= ID_INT_MAX:
            raise ValueError(f"integer id {value} is outside 64 bits; send ids this long as strings")
        return str(value)
    if isinstance(value, float) and value.is_integer() and abs(value) >= 2**63:
        raise ValueError(
            f"integer id of about {value:.6g} is outside 64 bits and lost its digits in JSON parsing; "
            "send ids this long as strings"
        )
    return value


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    return value


_TIMESTAMP_SCHEMA = {
    "anyOf": [
        {
            "type": "string",
            "pattern": TIMESTAMP_PATTERN,
            "description": "ISO 8601 date and time, T or space between them; Z, +hh:mm, +hhmm or +hh offsets; "
            "without an offset it is taken as UTC. Not JSON Schema's strict date-time format: naive and "
            "+0000 forms are accepted on purpose. The date must exist and, in UTC, fall in years 1 to 9999.",
        },
        {
            "type": "integer",
            "minimum": EPOCH_MS_MIN,
            "maximum": EPOCH_MS_MAX,
            "description": "milliseconds since 1970-01-01T00:00:00Z",
        },
    ],
    "examples": [
        "2024-05-16T12:34:56.789Z",
        "2025-01-24T07:31:30.699+0000",
        "2024-05-16T12:34:56",
        "2024-05-16 12:34:56.5",
        1715862896789,
    ],
}
_ID_SCHEMA = {
    "anyOf": [
        {"type": "string", "maxLength": 256},
        {
            "type": "integer",
            "minimum": ID_INT_MIN,
            "maximum": ID_INT_MAX,
            "description": "stored as its decimal string; larger ids must be sent as strings",
        },
    ]
}
_ORDINAL_SCHEMA = {
    "anyOf": [
        {"type": "integer", "minimum": -_INT32 - 1, "maximum": _INT32},
        {
            "type": "object",
            "description": "UBI <= 1.2.0 shape",
            "properties": {"index": {"type": "integer", "minimum": -_INT32 - 1, "maximum": _INT32}},
            "required": ["index"],
        },
        {"type": "null"},
    ],
}
_XY_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"],
        },
        {"type": "null"},
    ],
    "description": "Screen position as an object (the OpenSearch plugin mapping); stored as x and y.",
}

Timestamp = Annotated[datetime, BeforeValidator(parse_timestamp), WithJsonSchema(_TIMESTAMP_SCHEMA)]
Str100 = Annotated[str, Field(max_length=100)]
#: what a query record's ids may not hold, and the query_id form kept for records without one (UbiQuery._key_safe)
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")
RESERVED_QUERY_ID = re.compile(r"h:[0-9a-f]{32}")
ObjectId = Annotated[str, BeforeValidator(_id_to_str), Field(max_length=256), WithJsonSchema(_ID_SCHEMA)]
HitId = Annotated[str, BeforeValidator(_id_to_str), Field(max_length=256), WithJsonSchema(_ID_SCHEMA)]
#: Strict: numbers only (an int is fine), as the schema says; lax pydantic would also take "10.5" strings.
Coordinate = Annotated[float, BeforeValidator(_finite), Strict(), Field(allow_inf_nan=False)]


class Position(BaseModel):
    """Where on the page an event happened: ``ordinal`` (nth result) and/or screen ``x``/``y``.

    Normalises the legacy shapes: ``{"ordinal": {"index": n}}`` (UBI <= 1.2.0), flat ``{"x": .., "y": ..}``
    (the OpenSearch plugin mapping) and ``{}``. Other keys (``page_depth``, ``scroll_depth``, ``trail``)
    are kept.
    """

    model_config = ConfigDict(
        extra="allow",
        frozen=True,
        title="Position",
        json_schema_extra=lambda schema: schema["properties"].update(xy=_XY_SCHEMA),
    )

    ordinal: Annotated[StrictInt | None, WithJsonSchema(_ORDINAL_SCHEMA)] = Field(
        None,
        ge=-_INT32 - 1,
        le=_INT32,
        description="The nth result on the page, as the client counts (0-based for OpenSearch tooling). "
        'Also accepted as {"index": n} (UBI <= 1.2.0).',
        examples=[0, 3, 24],
    )
    x: Coordinate | None = Field(None, description="Horizontal screen position; also accepted as xy.x.")
    y: Coordinate | None = Field(None, description="Vertical screen position; also accepted as xy.y.")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        ordinal = data.get("ordinal")
        xy = data.get("xy")
        if not isinstance(ordinal, dict) and xy is None and "xy" not in data:
            return data
        out = dict(data)
        if isinstance(ordinal, dict):
            if "index" not in ordinal:
                raise ValueError("position.ordinal as an object needs an 'index' (UBI <= 1.2.0 shape)")
            out["ordinal"] = ordinal["index"]
        xy = out.pop("xy", None)
        if xy is not None:
            if not isinstance(xy, dict) or "x" not in xy or "y" not in xy:
                raise ValueError("position.xy must be an object with numbers 'x' and 'y'")
            out["x"], out["y"] = xy["x"], xy["y"]
        return out


class EventObject(BaseModel):
    """The result an event is about. ``object_id`` may be a string (<= 256) or an integer."""

    model_config = ConfigDict(extra="allow", frozen=True, title="EventObject")

    object_id: ObjectId | None = Field(
        None,
        description="Id of the object (document, product) as found in the corpus; string or integer. "
        "Required by the spec, optional here (the spec's own sample omits it).",
        examples=["B07XLFYN6S", "ISBN 0-061-96436-0", 123],
    )
    object_id_field: Str100 | None = Field(
        None, description="Name of the field the id comes from (sku, _id)."
    )
    object_id_type: Str100 | None = Field(
        None, description="Kind of object: product, user, post, ... or any string."
    )
    internal_id: ObjectId | None = Field(
        None, description="The search engine's own id for the object (e.g. _id)."
    )


class EventAttributes(BaseModel):
    """``event_attributes``: the object and the position, plus any extra keys the client sends."""

    model_config = ConfigDict(extra="allow", frozen=True, title="EventAttributes")

    object: EventObject | None = Field(None, description="The result the event is about.")
    position: Position | None = Field(None, description="Where the result was: ordinal and/or x, y.")


class UbiEvent(BaseModel):
    """An event as a client sends it (UBI 1.3.0 ``event.schema.json``).

    ``event_id`` is our extension: a client-chosen stable id that makes retries idempotent. Without it the
    collector deduplicates on a hash of the canonical event (:func:`event_key`).
    """

    model_config = ConfigDict(
        extra="allow",
        frozen=True,
        title="UbiEvent",
        json_schema_extra={
            "description": (
                "A UBI 1.3.0 event as the ubi-pipeline collector accepts it. Required: action_name and timestamp. "
                "Optional fields may be null. Keys outside the schema are kept as sent. Send event_id (any "
                "string <= 100) to make retries idempotent; without it the collector deduplicates on a hash "
                "of the whole event."
            )
        },
    )

    action_name: Annotated[str, Field(min_length=1, max_length=100)] = Field(
        description="What happened: impression, click, add_to_cart, purchase, watch, view, or any string.",
        examples=list(STANDARD_ACTIONS),
    )
    timestamp: Timestamp = Field(description="When it happened.")
    event_id: Str100 | None = Field(None, description="Client-chosen unique id of the event (dedup key).")
    query_id: Str100 | None = Field(None, description="The search instance the event belongs to.")
    session_id: Str100 | None = Field(None, description="The user's session.")
    client_id: Str100 | None = Field(None, description="The browser, service or bot; not a person.")
    user_id: Str100 | None = Field(None, description="The signed-in user, if any; may be empty.")
    application: Str100 | None = Field(
        None,
        description="Source of searches: primary-search, type-ahead, ...",
        examples=["primary-search", "type-ahead"],
    )
    message_type: Str100 | None = Field(None, description="A bin for messages, e.g. QUERY, CONVERSION.")
    message: Annotated[str, Field(max_length=1024)] | None = Field(None, description="Free text, <= 1024.")
    user_query: Annotated[str, Field(max_length=USER_QUERY_MAX_LENGTH)] | None = Field(
        None, description=f"The query text, repeated on the event (1.3.0); <= {USER_QUERY_MAX_LENGTH} (ours)."
    )
    event_attributes: EventAttributes | None = Field(
        None, description="The object and position; may be null."
    )

    @property
    def extra(self) -> dict[str, Any]:
        """Top-level keys outside the schema, kept as sent."""
        return dict(self.__pydantic_extra__ or {})


class UbiQuery(BaseModel):
    """A query record as a client sends it (UBI 1.3.0 ``query.request.schema.json``)."""

    model_config = ConfigDict(
        extra="allow",
        frozen=True,
        title="UbiQuery",
        json_schema_extra={
            "description": (
                "A UBI 1.3.0 query record (one per search instance) as the ubi-pipeline collector accepts it. "
                "Required: user_query. Identity is (query_id, query_response_id): the first record wins, and a "
                "different record re-using them is kept as a conflict. Keys outside the schema are kept."
            )
        },
    )

    user_query: str = Field(
        max_length=USER_QUERY_MAX_LENGTH,
        description=f"The text the user typed; <= {USER_QUERY_MAX_LENGTH} characters (ours: the spec sets no limit).",
    )
    query_id: Str100 | None = Field(None, description="Unique per search instance, often a UUID.")
    client_id: Str100 | None = Field(None, description="The browser, service or bot issuing the query.")
    application: Str100 | None = Field(
        None, description="Source of searches: primary-search, type-ahead, ..."
    )
    timestamp: Timestamp | None = Field(None, description="When the query was issued.")
    query_attributes: dict[str, Any] | None = Field(
        None,
        description="Free-form object: filters, page, experiment or ranker ids.",
        examples=[{"experiment": "ranker-b", "page": 1}],
    )
    object_id_field: Str100 | None = Field(None, description="Field the hit ids come from (sku, asin, _id).")
    query_response_id: Annotated[str, Field(max_length=100)] | None = Field(
        None, description="Id of the engine's response; distinguishes sub-searches sharing a query_id."
    )
    query_response_hit_ids: list[HitId] | None = Field(
        None,
        description="Ids of the results in the order returned: the ranking that was shown.",
        examples=[["B07XLFYN6S", "B013UFPODY"]],
    )

    @field_validator("query_attributes", mode="before")
    @classmethod
    def _attributes_object(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, dict):
            raise ValueError("query_attributes must be a JSON object")
        return value

    @field_validator("query_id", "query_response_id")
    @classmethod
    def _key_safe(cls, value: str | None, info: Any) -> str | None:
        # the record's key is query_id + U+001F + query_response_id, and "h:<digest>" for a record without a
        # query_id (query_key): a control character in either id, or a query_id of the digest form, would let
        # two different records share one key
        if value is None:
            return value
        if CONTROL_CHARACTER.search(value):
            raise ValueError(f"{info.field_name} must not hold control characters (U+0000-U+001F, U+007F)")
        if info.field_name == "query_id" and RESERVED_QUERY_ID.fullmatch(value):
            raise ValueError("query_id of the form 'h:' + 32 hex digits is reserved for records sent without one")
        return value

    @property
    def extra(self) -> dict[str, Any]:
        """Top-level keys outside the schema, kept as sent."""
        return dict(self.__pydantic_extra__ or {})


#: orjson options of the canonical JSON used for content hashes (sorted keys, UTC "Z" timestamps).
CANONICAL_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC


def canonical_json(record: BaseModel, *, exclude: set[str] | None = None) -> bytes:
    """The canonical JSON of a validated record: None fields dropped, keys sorted, timestamps in UTC ``Z``.

    Raises ``orjson.JSONEncodeError`` for values nested more than 254 levels deep.
    """
    return orjson.dumps(record.model_dump(exclude_none=True, exclude=exclude), option=CANONICAL_OPTIONS)


def event_key(event: UbiEvent) -> str:
    """Stable dedup key: the client's ``event_id`` when sent, else a hash of the canonical event.

    The canonical event is the validated model dumped with sorted keys and the timestamp in UTC, so the same
    event sent twice (a retry, or the same export replayed) gets the same key whatever its key order or
    timestamp spelling.
    """
    if event.event_id:
        return "id:" + event.event_id
    return "h:" + content_hash(event)


def content_hash(record: BaseModel, *, exclude: set[str] | None = None) -> str:
    """SHA-256 (hex, first 32 chars = 128 bits) of the canonical JSON of a validated record."""
    return hashlib.sha256(canonical_json(record, exclude=exclude)).hexdigest()[:32]


def query_key(query: UbiQuery) -> str:
    """Identity of a query record: its ``query_id`` plus its ``query_response_id`` when present.

    Multi-search front ends (Chorus, in the samples) log every sub-search of one search instance under the
    same ``query_id`` with distinct ``query_response_id`` s; those are distinct responses, not conflicts.
    A query without a ``query_id`` gets one derived from its content, so retries still deduplicate.
    """
    qid = query.query_id or ("h:" + content_hash(query))
    return qid + "\x1f" + (query.query_response_id or "")


#: The JSON Schema dialect of :func:`json_schema` (pydantic writes draft 2020-12).
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def json_schema(model: type[UbiQuery] | type[UbiEvent]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of what the collector accepts for ``model``, leniencies included.

    The pydantic models stay the validators; this is their description for client authors. Its own ``$id``
    makes every ``#/$defs/..`` reference resolve inside it, even when printed inside a larger document.
    """
    kind = "event" if model is UbiEvent else "query"
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"urn:ubi-pipeline:schema:ubi-{kind}",
        **model.model_json_schema(),
    }
