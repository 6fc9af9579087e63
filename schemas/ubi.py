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
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    WithJsonSchema,
    field_validator,
    model_validator,
)

#: The action names the schema lists; any other string of at most 100 characters is accepted too.
STANDARD_ACTIONS = ("add_to_cart", "click", "watch", "view", "purchase", "impression")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INT32 = 2**31 - 1


def parse_timestamp(value: Any) -> datetime:
    """Parse a UBI timestamp to an aware UTC datetime.

    Accepts ISO 8601 strings (``Z``, ``+00:00``, ``+0000`` or naive, naive taken as UTC) and integers as
    epoch milliseconds (the ``ubi-demo`` producer). Booleans, floats and anything unparseable are rejected.
    """
    if isinstance(value, bool):
        raise ValueError("expected an ISO 8601 string or epoch milliseconds, got a boolean")
    if isinstance(value, int):
        try:
            return _EPOCH + timedelta(milliseconds=value)
        except OverflowError as exc:
            raise ValueError(f"epoch milliseconds {value} are out of range") from exc
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str):
        raise ValueError(f"expected an ISO 8601 string or epoch milliseconds, got {type(value).__name__}")
    # Python >= 3.11 reads every ISO 8601 form producers use (Z, +0000, naive, space separator).
    text = value.strip()
    if text[-1:] == "z":
        text = text[:-1] + "Z"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(
            f"unparseable timestamp {value[:60]!r}: expected ISO 8601 such as "
            "2024-05-16T12:34:56Z, or epoch milliseconds"
        ) from exc
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    if parsed.utcoffset() == timedelta(0):
        return parsed if parsed.tzinfo is UTC else parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _id_to_str(value: Any) -> Any:
    """Object ids may be strings or integers (schema ``anyOf``); store both as strings."""
    if isinstance(value, bool):
        return value  # let the str check reject it
    if isinstance(value, int):
        return str(value)
    return value


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    return value


_TIMESTAMP_SCHEMA = {
    "anyOf": [
        {
            "type": "string",
            "format": "date-time",
            "description": "ISO 8601; Z, +00:00 and +0000 offsets; without an offset it is taken as UTC",
        },
        {"type": "integer", "description": "milliseconds since 1970-01-01T00:00:00Z"},
    ],
    "examples": [
        "2024-05-16T12:34:56.789Z",
        "2024-05-16T12:34:56+0000",
        "2024-05-16T12:34:56",
        1715862896789,
    ],
}
_ID_SCHEMA = {"anyOf": [{"type": "string", "maxLength": 256}, {"type": "integer"}]}

Timestamp = Annotated[datetime, BeforeValidator(parse_timestamp), WithJsonSchema(_TIMESTAMP_SCHEMA)]
Str100 = Annotated[str, Field(max_length=100)]
ObjectId = Annotated[str, BeforeValidator(_id_to_str), Field(max_length=256), WithJsonSchema(_ID_SCHEMA)]
HitId = Annotated[str, BeforeValidator(_id_to_str), Field(max_length=256), WithJsonSchema(_ID_SCHEMA)]
Coordinate = Annotated[float, BeforeValidator(_finite), Field(allow_inf_nan=False)]


class Position(BaseModel):
    """Where on the page an event happened: ``ordinal`` (nth result) and/or screen ``x``/``y``.

    Normalises the legacy shapes: ``{"ordinal": {"index": n}}`` (UBI <= 1.2.0), flat ``{"x": .., "y": ..}``
    (the OpenSearch plugin mapping) and ``{}``. Other keys (``page_depth``, ``scroll_depth``, ``trail``)
    are kept.
    """

    model_config = ConfigDict(extra="allow", frozen=True, title="Position")

    ordinal: StrictInt | None = Field(
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
    user_query: str | None = Field(None, description="The query text, repeated on the event (1.3.0).")
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

    user_query: str = Field(description="The text the user typed (no length limit in the spec).")
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
