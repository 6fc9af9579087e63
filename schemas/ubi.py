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
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, field_validator, model_validator

#: The action names the schema lists; any other string of at most 100 characters is accepted too.
STANDARD_ACTIONS = ("add_to_cart", "click", "watch", "view", "purchase", "impression")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Python 3.11 parses most ISO 8601 forms; "+0000" offsets (seen from Chorus) need a colon first.
_COMPACT_OFFSET = re.compile(r"([+-])(\d{2})(\d{2})$")


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
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    text = _COMPACT_OFFSET.sub(r"\1\2:\3", text) if "T" in text or " " in text else text
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"unparseable timestamp {value!r}: expected ISO 8601 such as 2024-05-16T12:34:56Z") from exc
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _id_to_str(value: Any) -> Any:
    """Object ids may be strings or integers (schema ``anyOf``); store both as strings."""
    if isinstance(value, bool):
        return value  # let the str check reject it
    if isinstance(value, int):
        return str(value)
    return value


Timestamp = Annotated[datetime, BeforeValidator(parse_timestamp)]
Str100 = Annotated[str, Field(max_length=100)]
ObjectId = Annotated[str, BeforeValidator(_id_to_str), Field(max_length=256)]
HitId = Annotated[str, BeforeValidator(_id_to_str), Field(max_length=256)]


class Position(BaseModel):
    """Where on the page an event happened: ``ordinal`` (nth result) and/or screen ``x``/``y``.

    Normalises the legacy shapes: ``{"ordinal": {"index": n}}`` (UBI <= 1.2.0), flat ``{"x": .., "y": ..}``
    (the OpenSearch plugin mapping) and ``{}``. Other keys (``page_depth``, ``scroll_depth``, ``trail``)
    are kept.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    ordinal: StrictInt | None = None
    x: float | None = None
    y: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        ordinal = out.get("ordinal")
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

    model_config = ConfigDict(extra="allow", frozen=True)

    object_id: ObjectId | None = None
    object_id_field: Str100 | None = None
    object_id_type: Str100 | None = None
    internal_id: ObjectId | None = None


class EventAttributes(BaseModel):
    """``event_attributes``: the object and the position, plus any extra keys the client sends."""

    model_config = ConfigDict(extra="allow", frozen=True)

    object: EventObject | None = None
    position: Position | None = None


class UbiEvent(BaseModel):
    """An event as a client sends it (UBI 1.3.0 ``event.schema.json``).

    ``event_id`` is our extension: a client-chosen stable id that makes retries idempotent. Without it the
    collector deduplicates on a hash of the canonical event (:func:`event_key`).
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    action_name: Annotated[str, Field(min_length=1, max_length=100)]
    timestamp: Timestamp
    event_id: Str100 | None = None
    query_id: Str100 | None = None
    session_id: Str100 | None = None
    client_id: Str100 | None = None
    user_id: Str100 | None = None
    application: Str100 | None = None
    message_type: Str100 | None = None
    message: Annotated[str, Field(max_length=1024)] | None = None
    user_query: str | None = None
    event_attributes: EventAttributes | None = None

    @property
    def extra(self) -> dict[str, Any]:
        """Top-level keys outside the schema, kept as sent."""
        return dict(self.__pydantic_extra__ or {})


class UbiQuery(BaseModel):
    """A query record as a client sends it (UBI 1.3.0 ``query.request.schema.json``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    user_query: str
    query_id: Str100 | None = None
    client_id: Str100 | None = None
    application: Str100 | None = None
    timestamp: Timestamp | None = None
    query_attributes: dict[str, Any] | None = None
    object_id_field: Str100 | None = None
    query_response_id: Annotated[str, Field(max_length=100)] | None = None
    query_response_hit_ids: list[HitId] | None = None

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


def _canonical_bytes(data: Any) -> bytes:
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z)


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
    """SHA-256 (hex, 32 chars) of the canonical JSON of a validated record."""
    data = record.model_dump(mode="json", exclude_none=True, exclude=exclude)
    return hashlib.sha256(_canonical_bytes(data)).hexdigest()[:32]


def query_key(query: UbiQuery) -> str:
    """Identity of a query record: its ``query_id`` plus its ``query_response_id`` when present.

    Multi-search front ends (Chorus, in the samples) log every sub-search of one search instance under the
    same ``query_id`` with distinct ``query_response_id`` s; those are distinct responses, not conflicts.
    A query without a ``query_id`` gets one derived from its content, so retries still deduplicate.
    """
    qid = query.query_id or ("h:" + content_hash(query))
    return qid + "\x1f" + (query.query_response_id or "")
