"""UBI record models: every leniency of docs/ubi.md is accepted, every real malformation rejected."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from tests.conftest import shared_path
from ubi_pipeline.schemas.ubi import (
    COMMON_TIMESTAMP_RE,
    EPOCH_MS_MAX,
    EPOCH_MS_MIN,
    UbiEvent,
    UbiQuery,
    content_hash,
    event_key,
    json_schema,
    parse_timestamp,
    query_key,
)


def field_of(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return ".".join(str(p) for p in exc.value.errors()[0]["loc"])


# ---------------------------------------------------------------- leniencies (docs/ubi.md)


def test_null_optionals_are_accepted(make_event):
    e = UbiEvent.model_validate(make_event(message_type=None, message=None, query_id=None, user_id=None))
    assert (e.message_type, e.message, e.query_id, e.user_id) == (None, None, None, None)


def test_event_attributes_null(make_event):
    assert UbiEvent.model_validate(make_event(event_attributes=None)).event_attributes is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # 1715862896789 ms = 1,715,862,896 s + 789 ms; 1,715,862,896 s after the epoch is 2024-05-16T12:34:56Z
        # (date -u -d @1715862896).
        (1715862896789, datetime(2024, 5, 16, 12, 34, 56, 789000, tzinfo=UTC)),
        ("2024-05-16T12:34:56.789Z", datetime(2024, 5, 16, 12, 34, 56, 789000, tzinfo=UTC)),
        ("2024-05-16T12:34:56", datetime(2024, 5, 16, 12, 34, 56, tzinfo=UTC)),  # naive: taken as UTC
        (
            "2024-05-16T12:34:56+0000",
            datetime(2024, 5, 16, 12, 34, 56, tzinfo=UTC),
        ),  # Chorus' offset spelling
        ("2024-05-16T14:34:56+02:00", datetime(2024, 5, 16, 12, 34, 56, tzinfo=UTC)),  # converted to UTC
        ("2024-05-16 12:34:56.5z", datetime(2024, 5, 16, 12, 34, 56, 500000, tzinfo=UTC)),
    ],
)
def test_timestamp_forms(make_event, value, expected):
    ts = UbiEvent.model_validate(make_event(timestamp=value)).timestamp
    assert ts == expected
    assert ts.utcoffset().total_seconds() == 0


def test_legacy_ordinal_index(make_event):
    e = UbiEvent.model_validate(make_event(event_attributes={"position": {"ordinal": {"index": 4}}}))
    assert e.event_attributes.position.ordinal == 4


def test_flat_x_y_and_xy_object(make_event):
    flat = UbiEvent.model_validate(make_event(event_attributes={"position": {"x": 10, "y": 20.5}}))
    nested = UbiEvent.model_validate(make_event(event_attributes={"position": {"xy": {"x": 10, "y": 20.5}}}))
    assert (flat.event_attributes.position.x, flat.event_attributes.position.y) == (10.0, 20.5)
    assert nested.event_attributes.position == flat.event_attributes.position


def test_empty_position_and_extra_position_keys(make_event):
    empty = UbiEvent.model_validate(make_event(event_attributes={"position": {}}))
    assert empty.event_attributes.position.ordinal is None
    deep = UbiEvent.model_validate(
        make_event(event_attributes={"position": {"ordinal": 1, "page_depth": 2, "trail": "a>b"}})
    )
    assert deep.event_attributes.position.model_extra == {"page_depth": 2, "trail": "a>b"}


def test_extra_keys_are_kept_at_every_level(make_event):
    e = UbiEvent.model_validate(
        make_event(
            page_id="/docs",
            event_attributes={
                "object": {"object_id": "d1", "color": "red"},
                "position": {"ordinal": 0},
                "browser": "firefox",
            },
        )
    )
    assert e.extra == {"page_id": "/docs"}
    assert e.event_attributes.model_extra == {"browser": "firefox"}
    assert e.event_attributes.object.model_extra == {"color": "red"}


def test_custom_action_names(make_event):
    for name in ("search", "on_search", "product_hover", "global_click", "page_exit"):
        assert UbiEvent.model_validate(make_event(action_name=name)).action_name == name


def test_integer_object_ids_become_strings(make_event, make_query):
    e = UbiEvent.model_validate(make_event(event_attributes={"object": {"object_id": 123, "internal_id": 7}}))
    assert (e.event_attributes.object.object_id, e.event_attributes.object.internal_id) == ("123", "7")
    q = UbiQuery.model_validate(make_query(query_response_hit_ids=[5, "b", 6]))
    assert q.query_response_hit_ids == ["5", "b", "6"]


def test_spec_sample_event_is_accepted():
    """The spec's own sample: position {} and an object without object_id (docs/ubi.md)."""
    data = json.loads(shared_path("ubi-samples/event-opensearch.json").read_text())
    e = UbiEvent.model_validate(data)
    assert e.action_name == "page_exit"
    assert e.timestamp == datetime(2024, 5, 16, 12, 34, 56, 789000, tzinfo=UTC)
    assert e.event_attributes.object.object_id is None
    assert e.event_attributes.object.model_extra["idleTimeoutMs"] == 5000
    assert e.extra == {"page_id": "/docs/latest/"}


def test_query_without_optional_fields(make_query):
    q = UbiQuery.model_validate({"user_query": "toner"})
    assert (q.query_id, q.timestamp, q.query_response_hit_ids) == (None, None, None)


# ---------------------------------------------------------------- rejections


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"action_name": ...}, "action_name"),
        ({"timestamp": ...}, "timestamp"),
        ({"action_name": 5}, "action_name"),
        ({"action_name": ""}, "action_name"),
        ({"timestamp": True}, "timestamp"),  # a boolean is not epoch milliseconds
        ({"timestamp": 1715862896.5}, "timestamp"),  # floats are ambiguous (seconds? ms?): rejected
        ({"timestamp": "yesterday"}, "timestamp"),
        ({"timestamp": "2024-13-40T00:00:00Z"}, "timestamp"),
        ({"timestamp": 10**20}, "timestamp"),  # out of datetime's range
        ({"query_id": 42}, "query_id"),
        ({"session_id": ["s"]}, "session_id"),
        ({"client_id": "c" * 101}, "client_id"),  # schema maxLength 100
        ({"message": "m" * 1025}, "message"),  # schema maxLength 1024
        ({"action_name": "a" * 101}, "action_name"),
        ({"event_attributes": "x"}, "event_attributes"),
        ({"event_attributes": {"object": {"object_id": "o" * 257}}}, "event_attributes.object.object_id"),
        ({"event_attributes": {"object": {"object_id": True}}}, "event_attributes.object.object_id"),
        ({"event_attributes": {"position": {"ordinal": "3"}}}, "event_attributes.position.ordinal"),
        ({"event_attributes": {"position": {"ordinal": 2**40}}}, "event_attributes.position.ordinal"),
        ({"event_attributes": {"position": {"ordinal": {"idx": 1}}}}, "event_attributes.position"),
        ({"event_attributes": {"position": {"xy": {"x": 1}}}}, "event_attributes.position"),
        ({"event_attributes": {"position": {"x": "nan", "y": 1}}}, "event_attributes.position.x"),
    ],
)
def test_event_rejections_name_the_field(make_event, overrides, field):
    with pytest.raises(ValidationError) as exc:
        UbiEvent.model_validate(make_event(**overrides))
    assert field_of(exc).startswith(field)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"user_query": ...}, "user_query"),
        ({"user_query": None}, "user_query"),
        ({"user_query": 7}, "user_query"),
        ({"query_id": "q" * 101}, "query_id"),
        ({"timestamp": "soon"}, "timestamp"),
        ({"timestamp": False}, "timestamp"),
        ({"query_attributes": ["a"]}, "query_attributes"),
        ({"query_response_hit_ids": "doc-1"}, "query_response_hit_ids"),
        ({"query_response_hit_ids": ["d" * 257]}, "query_response_hit_ids.0"),
    ],
)
def test_query_rejections_name_the_field(make_query, overrides, field):
    with pytest.raises(ValidationError) as exc:
        UbiQuery.model_validate(make_query(**overrides))
    assert field_of(exc).startswith(field)


@pytest.mark.parametrize(
    "value",
    [
        "0001-01-01T00:00:00+05:00",  # 0000-12-31T19:00Z: year 0 does not exist in Python (or the store)
        "9999-12-31T23:00:00-05:00",  # 10000-01-01T04:00Z
        EPOCH_MS_MIN - 1,
        EPOCH_MS_MAX + 1,
        -(10**20),
    ],
)
def test_timestamps_outside_years_1_to_9999_in_utc_are_a_field_error(make_event, value):
    """An offset pushing the instant past year 1 or 9999 used to raise OverflowError, which pydantic does not
    catch: the whole batch failed (422) and `ubi import` crashed. Now it is a ValueError on the field."""
    with pytest.raises(ValidationError) as exc:
        UbiEvent.model_validate(make_event(timestamp=value))
    assert field_of(exc) == "timestamp"
    assert "outside 0001-01-01..9999-12-31" in str(exc.value) or "out of range" in str(exc.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0001-01-01T00:00:00-05:00", datetime(1, 1, 1, 5, tzinfo=UTC)),
        ("9999-12-31T18:59:59+05:00", datetime(9999, 12, 31, 13, 59, 59, tzinfo=UTC)),
        # -62,135,596,800,000 ms = -62,135,596,800 s: 719,162 days (0001-01-01 to 1970-01-01) x 86,400 s
        (EPOCH_MS_MIN, datetime(1, 1, 1, tzinfo=UTC)),
        # 253,402,300,799,999 ms: 2,932,897 days (1970-01-01 to 10000-01-01) x 86,400 s less 1 ms
        (EPOCH_MS_MAX, datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)),
        (
            datetime(2024, 5, 16, 14, 34, 56, tzinfo=timezone(timedelta(hours=2))),
            datetime(2024, 5, 16, 12, 34, 56, tzinfo=UTC),
        ),
    ],
)
def test_timestamps_at_the_edges_of_the_range(value, expected):
    ts = parse_timestamp(value)
    assert ts == expected and ts.tzinfo is UTC


def test_ids_above_64_bits_are_refused_with_a_fix(make_event, make_query):
    """orjson reads integers up to 2**64 - 1 exactly and larger ones as floats whose digits are gone
    (12345678901234567890123 -> 1.2345678901234568e+22): refused, asking for a string, never stored rounded."""
    body = b'{"action_name": "click", "timestamp": 1, "event_attributes": {"object": {"object_id": 12345678901234567890123}}}'
    with pytest.raises(ValidationError) as exc:
        UbiEvent.model_validate(orjson.loads(body))
    assert field_of(exc) == "event_attributes.object.object_id"
    assert "outside 64 bits" in str(exc.value) and "as strings" in str(exc.value)
    biggest = orjson.loads(
        b'{"action_name": "c", "timestamp": 1, "event_attributes": {"object": {"object_id": 18446744073709551615}}}'
    )
    assert UbiEvent.model_validate(biggest).event_attributes.object.object_id == "18446744073709551615"
    with pytest.raises(ValidationError, match="outside 64 bits"):
        UbiQuery.model_validate(orjson.loads(b'{"user_query": "q", "query_response_hit_ids": [1, 1e30]}'))
    with pytest.raises(ValidationError, match="outside 64 bits"):
        UbiQuery.model_validate({"user_query": "q", "query_response_hit_ids": [2**64]})  # from Python, exact


def test_parse_timestamp_messages_say_how_to_fix():
    with pytest.raises(ValueError, match="ISO 8601 such as 2024-05-16T12:34:56Z"):
        parse_timestamp("16/05/2024")
    with pytest.raises(ValueError, match="boolean"):
        parse_timestamp(True)


# ---------------------------------------------------------------- identity


def test_event_key_ignores_key_order_and_timestamp_spelling(make_event):
    a = make_event(event_id=None)
    b = dict(reversed(list(a.items())))
    b["timestamp"] = 1715863496789  # the same instant as 2024-05-16T12:44:56.789Z (600 s later than a's)
    a["timestamp"] = "2024-05-16T14:44:56.789+02:00"
    assert event_key(UbiEvent.model_validate(a)) == event_key(UbiEvent.model_validate(b))


def test_event_key_uses_the_client_event_id(make_event):
    e = UbiEvent.model_validate(make_event(event_id="abc"))
    assert event_key(e) == "id:abc"


def test_event_key_differs_when_content_differs(make_event):
    a = make_event()
    b = dict(a, event_attributes={**a["event_attributes"], "position": {"ordinal": 3}})
    assert event_key(UbiEvent.model_validate(a)) != event_key(UbiEvent.model_validate(b))


def test_query_key_is_query_id_plus_response_id(make_query):
    q = UbiQuery.model_validate(make_query(query_id="q1", query_response_id="r2"))
    assert query_key(q) == "q1\x1fr2"
    anonymous = UbiQuery.model_validate({"user_query": "x"})
    assert query_key(anonymous) == "h:" + content_hash(anonymous) + "\x1f"


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.text(max_size=5),
    st.floats(allow_nan=False, allow_infinity=False),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(
    extras=st.dictionaries(
        st.text(min_size=1, max_size=6).filter(lambda k: k not in UbiEvent.model_fields),
        json_value,
        max_size=4,
    )
)
def test_event_key_is_a_function_of_content_not_of_key_order(extras):
    """Law: permuting the keys of an event (top level and extras) never changes its dedup key."""
    base = {"action_name": "click", "timestamp": "2024-05-16T12:34:56Z", **extras}
    permuted = dict(reversed(list(base.items())))
    permuted = {
        k: (dict(reversed(list(v.items()))) if isinstance(v, dict) else v) for k, v in permuted.items()
    }
    assert event_key(UbiEvent.model_validate(base)) == event_key(UbiEvent.model_validate(permuted))


def test_json_schema_documents_the_leniencies():
    schema = json_schema(UbiEvent)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["required"] == ["action_name", "timestamp"]
    ts = schema["properties"]["timestamp"]
    assert [alt["type"] for alt in ts["anyOf"]] == ["string", "integer"]
    assert "format" not in ts["anyOf"][0]  # date-time would refuse the naive and +0000 forms we accept
    assert schema["additionalProperties"] is True
    assert schema["properties"]["client_id"]["anyOf"][0]["maxLength"] == 100
    assert "event_id" in schema["properties"] and schema["properties"]["event_id"]["description"]
    assert UbiQuery.model_json_schema()["required"] == ["user_query"]


# ---------------------------------------------------------------- the exported JSON Schema agrees


def _schema_accepts(kind: str, record: object) -> bool:
    model = UbiEvent if kind == "event" else UbiQuery
    validator = Draft202012Validator(json_schema(model), format_checker=Draft202012Validator.FORMAT_CHECKER)
    return validator.is_valid(record)


def _model_accepts(kind: str, record: object) -> bool:
    try:
        (UbiEvent if kind == "event" else UbiQuery).model_validate(record)
    except ValidationError:
        return False
    return True


_EV = {"action_name": "click", "timestamp": "2024-05-16T12:34:56Z"}


@pytest.mark.parametrize(
    ("record", "accepted"),
    [
        # leniencies of docs/ubi.md: both accept
        (dict(_EV, timestamp="2025-01-24T07:31:30.699+0000"), True),  # Chorus' offset spelling
        (dict(_EV, timestamp="2024-05-16T12:34:56"), True),  # naive: UTC
        (dict(_EV, timestamp="2024-05-16 12:34:56.5"), True),  # space separator
        (dict(_EV, timestamp="2024-05-16T12:34:56+02"), True),
        (dict(_EV, timestamp=1715862896789), True),  # epoch ms
        (dict(_EV, timestamp=EPOCH_MS_MAX), True),
        (dict(_EV, event_attributes={"position": {"ordinal": {"index": 2}}}), True),  # UBI <= 1.2.0
        (dict(_EV, event_attributes={"position": {"xy": {"x": 1, "y": 2.5}}}), True),
        (dict(_EV, event_attributes={"position": {"x": 1, "y": 2.5, "page_depth": 3}}), True),
        (dict(_EV, event_attributes={"position": {}}), True),
        (dict(_EV, event_attributes=None, message=None, message_type=None), True),
        (dict(_EV, event_attributes={"object": {"object_id": 123, "internal_id": 2**64 - 1}}), True),
        (dict(_EV, action_name="product_hover", page_id="/x"), True),  # custom action, extra key
        # malformations: both reject
        (dict(_EV, timestamp="yesterday"), False),
        (dict(_EV, timestamp="2024-05-16X12:34:56"), False),  # fromisoformat would take any separator
        (dict(_EV, timestamp="2024-W20-4"), False),
        (dict(_EV, timestamp=1715862896.5), False),
        (dict(_EV, timestamp=True), False),
        (dict(_EV, timestamp=EPOCH_MS_MAX + 1), False),
        (dict(_EV, timestamp=None), False),
        ({"timestamp": 1}, False),
        (dict(_EV, action_name=""), False),
        (dict(_EV, client_id="c" * 101), False),
        (dict(_EV, event_attributes={"position": {"ordinal": "3"}}), False),
        (dict(_EV, event_attributes={"position": {"ordinal": 2**40}}), False),
        (dict(_EV, event_attributes={"position": {"ordinal": {"idx": 1}}}), False),
        (dict(_EV, event_attributes={"position": {"xy": {"x": 1}}}), False),
        (dict(_EV, event_attributes={"position": {"x": "10", "y": 1}}), False),
        (dict(_EV, event_attributes={"object": {"object_id": 2**64}}), False),
        (dict(_EV, event_attributes={"object": {"object_id": True}}), False),
        (dict(_EV, event_attributes="x"), False),
    ],
)
def test_json_schema_and_model_agree_on_events(record, accepted):
    assert (_model_accepts("event", record), _schema_accepts("event", record)) == (accepted, accepted)


@pytest.mark.parametrize(
    ("record", "accepted"),
    [
        ({"user_query": "toner"}, True),
        ({"user_query": "t", "timestamp": "2024-05-16T12:34:56", "query_response_hit_ids": [1, "b"]}, True),
        ({"user_query": "t", "query_attributes": None, "timestamp": None}, True),
        ({"query_id": "q"}, False),
        ({"user_query": None}, False),
        ({"user_query": "t", "query_attributes": ["a"]}, False),
        ({"user_query": "t", "query_response_hit_ids": "doc-1"}, False),
        ({"user_query": "t", "timestamp": "soon"}, False),
    ],
)
def test_json_schema_and_model_agree_on_queries(record, accepted):
    assert (_model_accepts("query", record), _schema_accepts("query", record)) == (accepted, accepted)


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
       st.sampled_from(["Z", "+00:00"]), st.integers(0, 6), st.sampled_from([30, 31, 29]))
def test_the_short_path_for_utc_spellings_gives_the_general_paths_answer(when, zone, digits, day):
    """parse_timestamp's short path (COMMON_TIMESTAMP_RE) against the general one it skips (forced here by a
    leading space, which TIMESTAMP_PATTERN allows and the short path does not): the same instant, the same
    tzinfo object, or the same error for a day that does not exist (2023-02-30)."""
    text = (f"{when.year:04d}-{when.month:02d}-{when.day:02d}T{when.hour:02d}:{when.minute:02d}:{when.second:02d}"
            + (f".{when.microsecond:06d}"[: digits + 1] if digits else "") + zone)
    if day != when.day:
        text = text[:8] + f"{day:02d}" + text[10:]
    assert COMMON_TIMESTAMP_RE.match(text)
    try:
        short = parse_timestamp(text)
    except ValueError as exc:
        with pytest.raises(ValueError) as general_error:
            parse_timestamp(" " + text)
        assert str(exc) == str(general_error.value).replace(" " + text, text, 1)
        return
    general = parse_timestamp(" " + text)
    assert short == general and short.tzinfo is general.tzinfo is UTC
