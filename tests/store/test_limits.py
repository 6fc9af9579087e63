"""The stored columns' limits (``schemas/tables.py``) are the models' (``schemas/ubi.py``), and
``failed_records`` keeps long bodies truncated with their length and SHA-256."""

from __future__ import annotations

import hashlib
from typing import Any

from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.ubi import (
    JSON_FIELD_MAX_LENGTH,
    STORED_STRING_MAX_BYTES,
    USER_QUERY_MAX_LENGTH,
    UbiEvent,
    UbiQuery,
)
from ubi_pipeline.store.rows import failed_row


def _max_length(schema: dict[str, Any]) -> int | None:
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "string":
            return option.get("maxLength")
        if option.get("type") == "array":
            return _max_length(option["items"])
    return None


def test_stored_columns_have_the_models_limits() -> None:
    query = UbiQuery.model_json_schema()["properties"]
    event = UbiEvent.model_json_schema()
    obj = event["$defs"]["EventObject"]["properties"]
    limits = {c.name: c.max_length for c in tables.QUERY_TABLE.columns}
    for name in ("query_id", "user_query", "client_id", "application", "object_id_field", "query_response_id",
                 "query_response_hit_ids"):
        assert limits[name] == _max_length(query[name]), name
    limits = {c.name: c.max_length for c in tables.EVENT_TABLE.columns}
    for name in ("event_id", "action_name", "query_id", "session_id", "client_id", "user_id", "application",
                 "message_type", "message", "user_query"):
        assert limits[name] == _max_length(event["properties"][name]), name
    for name in ("object_id", "object_id_field", "object_id_type", "internal_id"):
        assert limits[name] == _max_length(obj[name]), name
    json_limits = {c.max_length for t in (tables.QUERY_TABLE, tables.EVENT_TABLE) for c in t.columns if c.sql == "JSON"}
    assert json_limits == {JSON_FIELD_MAX_LENGTH}
    assert USER_QUERY_MAX_LENGTH * 4 <= STORED_STRING_MAX_BYTES  # 4 bytes a character at most in UTF-8
    assert tables.FAILED_RAW_MAX_BYTES <= STORED_STRING_MAX_BYTES


def test_failed_rows_keep_long_bodies_truncated_with_length_and_hash() -> None:
    body = b"x" * (tables.FAILED_RAW_MAX_BYTES + 1)
    row = failed_row(source="/v1/events", kind="body", reason="malformed JSON", raw=body)
    assert row["raw"] == body[: tables.FAILED_RAW_MAX_BYTES]
    assert row["reason"] == (f"malformed JSON [raw truncated: {len(body):,} bytes, sha256 "
                             f"{hashlib.sha256(body).hexdigest()}; the first {tables.FAILED_RAW_MAX_BYTES:,} are kept]")
    at_limit = b"y" * tables.FAILED_RAW_MAX_BYTES
    row = failed_row(source="/v1/events", kind="body", reason="r", raw=at_limit, field="f" * 10_000)
    assert (row["raw"], row["reason"], len(row["field"])) == (at_limit, "r", tables.FAILED_TEXT_MAX_LENGTH)
    long_reason = failed_row(source="s", kind="body", reason="z" * 10_000, raw=None)["reason"]
    assert len(long_reason) == tables.FAILED_TEXT_MAX_LENGTH
