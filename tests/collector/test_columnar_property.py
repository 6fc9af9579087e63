"""Records generated from the UBI 1.3.0 JSON Schema, valid and invalid: the columnar path and the exact path
(pydantic, record by record) store the same rows and reject the same records with the same messages.

The records are drawn from the spec's own ``event.schema.json`` and ``query.request.schema.json``
(``../shared/ubi-spec/1.3.0``) by :func:`from_schema`, a generator for the part of JSON Schema those two files
use (``type``, ``properties``, ``required``, ``additionalProperties``, ``maxLength``, ``enum``, ``oneOf`` /
``anyOf``, ``format: date-time``). hypothesis-jsonschema 0.23.1 does that in general, but fails under the
locked hypothesis 6.170 (``'many' object has no attribute 'more'``), so it is not a dependency. Invalid
records are valid ones with one thing broken (a required key dropped, a value of the wrong type, a string
over its limit, an impossible timestamp, a key repeated). Each record is written in one of the producers'
byte layouts (``JSON.stringify``: compact; Python ``json.dumps``: spaces after separators, ``\\u`` escapes).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import shared_path
from ubi_pipeline.collector import fastpath
from ubi_pipeline.collector.importer import import_files

SPEC = "ubi-spec/1.3.0"

#: Any JSON value, for extra keys (additionalProperties: true).
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_KEY = st.text(st.characters(codec="utf-8", categories=["L", "N", "P"]), min_size=1, max_size=8)
#: RFC 3339 date-times (the schema's format) in every spelling producers use: a fraction of 0-9 digits or
#: none, Z, z, an offset with or without a colon, or none; T, t or a space.
_DATE_TIME = st.builds(
    lambda d, sep, frac, zone: d.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + frac + zone,
    st.datetimes(),
    st.sampled_from(["T", "T", "t", " "]),
    st.one_of(st.just(""), st.integers(1, 9).flatmap(lambda n: st.text("0123456789", min_size=n, max_size=n))
              .map(lambda f: "." + f)),
    st.one_of(st.sampled_from(["Z", "z", "", "+00:00", "-0000"]),
              st.builds(lambda s, h, m, colon: f"{s}{h:02d}{colon}{m:02d}", st.sampled_from("+-"),
                        st.integers(0, 23), st.integers(0, 59), st.sampled_from([":", ""]))),
)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid for ``schema`` (the subset of JSON Schema the UBI spec files use)."""
    for combinator in ("oneOf", "anyOf"):
        if combinator in schema:
            return st.one_of([from_schema({**{k: v for k, v in schema.items() if k != combinator}, **option})
                              for option in schema[combinator]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        if schema.get("format") == "date-time":
            return _DATE_TIME
        return st.text(max_size=min(schema.get("maxLength", 40), 40)) | st.text(
            "ab", min_size=schema.get("maxLength", 40), max_size=schema.get("maxLength", 40))
    if kind == "integer":
        return st.integers(-(2**31), 2**31 - 1) | st.integers(-(2**63), 2**64 - 1)
    if kind == "number":
        return st.integers(-1000, 1000) | st.floats(-1e6, 1e6)
    if kind == "object":
        props: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", ()))

        @st.composite
        def obj(draw: Any) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name, sub in props.items():
                if name in required or draw(st.booleans()):
                    out[name] = draw(from_schema(sub))
            if schema.get("additionalProperties", True) is not False and draw(st.integers(0, 5)) == 0:
                out.update(draw(st.dictionaries(_KEY.filter(lambda k: k not in props), _JSON, max_size=2)))
            return out

        return obj()
    return _JSON


def _spec(name: str) -> dict[str, Any]:
    return json.loads(shared_path(f"{SPEC}/{name}").read_text(encoding="utf-8"))


_WRONG = st.sampled_from([None, 1, -1, 1.5, True, [], {}, "", "x" * 101, "x" * 1025, "2024-02-30T00:00:00Z",
                          "0000-01-01T00:00:00Z", "24:00", 2**64, 1715862896789])


@st.composite
def _broken(draw: Any, valid: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """A valid record with one thing broken (or none: most records stay valid)."""
    record = dict(draw(valid))
    how = draw(st.integers(0, 5))
    if how == 0 and record:  # a key dropped (a required one sometimes)
        record.pop(draw(st.sampled_from(sorted(record))))
    elif how == 1 and record:  # a value of another type or out of its limits
        record[draw(st.sampled_from(sorted(record)))] = draw(_WRONG)
    return record


EVENTS = _broken(from_schema(_spec("event.schema.json")))
QUERIES = _broken(from_schema(_spec("query.request.schema.json")))


def record_line(record: dict[str, Any], style: int, repeat: bool) -> str:
    """One record in a producer's layout: 0 JSON.stringify, 1 json.dumps (spaces, \\u escapes), 2 compact
    with non-ASCII as is; ``repeat``: the first key written twice (a repeated key)."""
    if style == 0:
        text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
    elif style == 1:
        text = json.dumps(record)
    else:
        text = json.dumps(record, separators=(",", ":"))
    if repeat and record:
        first = next(iter(record))
        text = "{" + json.dumps(first) + ":" + json.dumps(record[first]) + "," + text[1:]
    return text


_TABLES = {
    "ubi_queries": "* EXCLUDE (received_at)",
    "ubi_events": "* EXCLUDE (received_at)",
    "failed_records": "* EXCLUDE (failed_id, received_at)",
}


def _import(files: list[Path], db: Path, *, fast: bool) -> tuple[Any, dict[str, list[tuple[Any, ...]]]]:
    reports, _ = import_files(files, db, fast=fast, max_errors=10_000)
    con = duckdb.connect(str(db), read_only=True)
    try:
        stored = {t: sorted(con.execute(f"SELECT {cols} FROM {t}").fetchall(), key=repr) for t, cols in _TABLES.items()}
    finally:
        con.close()
    return [r.public() for r in reports], stored


def _assert_events_store_alike(tmp: Path, events: list[tuple[dict[str, Any], int, bool]]) -> None:
    """``events`` (record, layout, repeated key) written as one NDJSON file and imported through both paths:
    the same reports and the same stored rows."""
    path = tmp / "events.ndjson"
    path.write_text("".join(record_line(*e) + "\n" for e in events), encoding="utf-8")
    fast = _import([path], tmp / "fast.duckdb", fast=True)
    exact = _import([path], tmp / "exact.duckdb", fast=False)
    assert fast[0] == exact[0]
    for table in _TABLES:
        assert fast[1][table] == exact[1][table], table


@settings(max_examples=40, deadline=timedelta(seconds=10), suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(events=st.lists(st.tuples(EVENTS, st.integers(0, 2), st.integers(0, 19).map(lambda n: n == 0)),
                       min_size=1, max_size=25),
       queries=st.lists(st.tuples(QUERIES, st.integers(0, 2), st.integers(0, 19).map(lambda n: n == 0)),
                        max_size=6))
def test_records_from_the_spec_schema_store_and_fail_alike(
    tmp_path_factory: pytest.TempPathFactory,
    events: list[tuple[dict[str, Any], int, bool]],
    queries: list[tuple[dict[str, Any], int, bool]],
) -> None:
    tmp = tmp_path_factory.mktemp("spec")
    ev_path, q_path = tmp / "events.ndjson", tmp / "queries.ndjson"
    ev_path.write_text("".join(record_line(*e) + "\n" for e in events), encoding="utf-8")
    q_path.write_text("".join(record_line(*q) + "\n" for q in queries) or "\n", encoding="utf-8")
    files = [ev_path, q_path]
    fast = _import(files, tmp / "fast.duckdb", fast=True)
    exact = _import(files, tmp / "exact.duckdb", fast=False)
    assert fast[0] == exact[0]
    for table in _TABLES:
        assert fast[1][table] == exact[1][table], table


def test_valid_spec_records_stay_off_pydantic(tmp_path: Path) -> None:
    """Valid records of the spec's commonest shape (ordinal positions, no nested extras) never reach the
    exact path: one example of each spelling, spied on (``fastpath.validate_items`` is the exact path's
    entry); the others the generator draws are compared above."""
    lines = [
        '{"action_name": "click", "timestamp": "2018-11-13T20:20:39+00:00", "client_id": "c", '
        '"event_attributes": {"object": {"object_id": 123, "object_id_type": "product"}, "position": {"ordinal": 1}}}',
        '{"action_name":"impression","timestamp":"2018-11-13T20:20:39","event_attributes":{"position":{"ordinal":3}}}',
        '{"user_query": "shoes", "timestamp": "2018-11-13T20:20:39Z", "query_attributes": {"page": 1}}',
    ]
    path = tmp_path / "spec.ndjson"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    sent: list[Any] = []
    original = fastpath.validate_items

    def spy(items: Any) -> Any:
        sent.extend(items)
        return original(items)

    fastpath.validate_items = spy  # type: ignore[assignment]
    try:
        reports, _ = import_files([path], tmp_path / "s.duckdb")
    finally:
        fastpath.validate_items = original  # type: ignore[assignment]
    assert sent == []
    assert reports[0].public()["accepted"] == 3


#: Top-level extra keys as other producers add them (Logstash's ``@timestamp`` and ``@version``, tags,
#: counters): mostly plain names and scalars, which GENERAL_EVENT_SQL writes itself, now and then a key or a
#: value it leaves to ``_finish`` (escapes, a float, an integer past 18 digits or 64 bits, an object).
_PLAIN_KEY = st.text("abcXYZ019_@.-", min_size=1, max_size=6) | _KEY
_EXTRA_VALUE = (
    st.text(max_size=6) | st.text("ab\"\\\x01é/", max_size=4) | st.booleans() | st.none()
    | st.integers(-(2**63), 2**64 - 1) | st.sampled_from([0, -1, 10**17, 10**18, -(10**18), 2**63, 2**64 - 1])
    | st.floats(allow_nan=False, allow_infinity=False) | st.just({"a": 1}) | st.just([1])
)
_EXTRA_EVENT = st.fixed_dictionaries(
    {"action_name": st.sampled_from(["click", "impression"]),
     "timestamp": st.sampled_from(["2025-01-01T00:00:00Z", "2025-01-01T00:00:00.123+02:00"])},
    optional={"event_id": st.text("abc", min_size=1, max_size=3), "query_id": st.just("q1"),
              "event_attributes": st.just({"object": {"object_id": "sku-1"}, "position": {"ordinal": 2}})},
).flatmap(lambda base: st.dictionaries(_PLAIN_KEY.filter(lambda k: k not in fastpath.EVENT_KEYS), _EXTRA_VALUE,
                                       min_size=1, max_size=3).map(lambda extra: {**base, **extra}))


@settings(max_examples=40, deadline=timedelta(seconds=10), suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(events=st.lists(st.tuples(_EXTRA_EVENT, st.integers(0, 2), st.integers(0, 29).map(lambda n: n == 0)),
                       min_size=1, max_size=20))
def test_top_level_extras_store_alike(tmp_path_factory: pytest.TempPathFactory,
                                      events: list[tuple[dict[str, Any], int, bool]]) -> None:
    """Events with extra keys at the top level: the rows the statement writes itself (``extra``, the
    content-hash key of an event without an id) and those ``_finish`` reads back are the exact path's."""
    _assert_events_store_alike(tmp_path_factory.mktemp("extras"), events)


def _spy_finish(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The records ``_finish`` reads back in Python (``_with_extras``), in the order it reads them."""
    seen: list[Any] = []
    original = fastpath._with_extras

    def spy(value: Any, row: Any) -> Any:
        seen.append(value)
        return original(value, row)

    monkeypatch.setattr(fastpath, "_with_extras", spy)
    return seen


def test_plain_top_level_extras_stay_in_sql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Logstash's ``@timestamp`` and ``@version`` and other plain scalars at the top level are written by the
    statement: neither ``_finish``'s Python (``_with_extras``) nor pydantic sees them; an escaped string
    still goes to ``_finish``. Expected rows: the extras as orjson writes them, in the order sent."""
    lines = [
        '{"action_name": "click", "timestamp": "2025-01-01T00:00:00Z", "@timestamp": "2025-01-01T00:00:01.000Z", '
        '"@version": "1", "n": -12, "ok": true, "none": null}',
        '{"event_id":"e2","action_name":"click","timestamp":"2025-01-01T00:00:00Z","big":999999999999999999,'
        '"tag":"caf\\u00e9"}',
        '{"event_id":"e3","action_name":"click","timestamp":"2025-01-01T00:00:00Z","q":"say \\"hi\\""}',
    ]
    path = tmp_path / "extras.ndjson"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    seen = _spy_finish(monkeypatch)
    monkeypatch.setattr(fastpath, "validate_items", lambda items: pytest.fail(f"exact path reached: {items}"))
    reports, _ = import_files([path], tmp_path / "x.duckdb")
    assert reports[0].public()["accepted"] == 3
    assert [v.get("event_id") for v in seen] == ["e3"]  # the escaped quote: read back in Python
    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    try:
        extra = dict(con.execute("SELECT coalesce(event_id, '-'), extra FROM ubi_events").fetchall())
    finally:
        con.close()
    assert extra == {
        "-": '{"@timestamp":"2025-01-01T00:00:01.000Z","@version":"1","n":-12,"ok":true,"none":null}',
        "e2": '{"big":999999999999999999,"tag":"café"}',
        "e3": '{"q":"say \\"hi\\""}',
    }


#: Extra keys inside ``event_attributes.object``, as the reference JavaScript client spreads an object's
#: details there (``description``, ``brand``, ...): names sorting before, between and after the known ones
#: (the content hash sorts them together), null values (the dump drops them), and values the statement
#: leaves to ``_finish``.
_OBJECT_KEY = st.sampled_from(["brand", "description", "a", "internal", "object_idx", "object_id_fieldz", "zz",
                               "price", "@x"]) | _PLAIN_KEY
_OBJECT_EVENT = st.fixed_dictionaries(
    {"action_name": st.sampled_from(["click", "impression"]),
     "timestamp": st.sampled_from(["2025-01-01T00:00:00Z", "2025-01-01T00:00:00.123+02:00"]),
     "event_attributes": st.fixed_dictionaries(
         {"object": st.fixed_dictionaries({}, optional={
             "object_id": st.sampled_from(["sku-1", 42]), "object_id_field": st.just("sku"),
             "internal_id": st.just("i-9"), "object_id_type": st.just("product")})},
         optional={"position": st.just({"ordinal": 3})})},
    optional={"event_id": st.text("abc", min_size=1, max_size=3), "query_id": st.just("q1"),
              "message": st.just(""), "user_id": st.just(""),
              "tag": _EXTRA_VALUE},
).flatmap(lambda base: st.dictionaries(_OBJECT_KEY.filter(lambda k: k not in fastpath._OBJ_NAMES), _EXTRA_VALUE,
                                       min_size=1, max_size=3).map(
    lambda extra: {**base, "event_attributes": {**base["event_attributes"],
                                                "object": {**base["event_attributes"]["object"], **extra}}}))


@settings(max_examples=40, deadline=timedelta(seconds=10), suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(events=st.lists(st.tuples(_OBJECT_EVENT, st.integers(0, 2), st.integers(0, 29).map(lambda n: n == 0)),
                       min_size=1, max_size=20))
def test_object_extras_store_alike(tmp_path_factory: pytest.TempPathFactory,
                                   events: list[tuple[dict[str, Any], int, bool]]) -> None:
    """Events with extra keys inside ``event_attributes.object`` (and now and then at the top level): the
    stored ``event_attributes`` and the content-hash keys the statement writes itself, and those ``_finish``
    reads back, are the exact path's."""
    _assert_events_store_alike(tmp_path_factory.mktemp("object"), events)


def test_plain_object_extras_stay_in_sql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The JavaScript client's events (no id, ``description`` and details inside ``object``) are written by
    the statement: key, ``event_attributes`` and all; an object with an escaped string, a nested value or a
    repeated key still goes to ``_finish`` or the exact path. Expected values: the model's dump (known
    fields, then the extras in the order sent, nulls dropped) and the SHA-256 of the canonical dump
    computed here with orjson, as ``ubi_pipeline.store.rows.event_values`` does."""
    import hashlib

    import orjson

    from ubi_pipeline.schemas.ubi import CANONICAL_OPTIONS

    js = ('{"application":"shop","action_name":"click","query_id":"q1","session_id":"s1","client_id":"c1",'
          '"user_id":"","timestamp":"2025-01-01T00:00:00.100Z","message_type":"INFO","message":"",'
          '"event_attributes":{"object":{"object_id":"sku-1","object_id_field":"sku","description":"product sku-1",'
          '"brand":"acme","gone":null,"n":7},"position":{"ordinal":0}}}')
    lines = [
        js,
        '{"event_id":"e2","action_name":"click","timestamp":"2025-01-01T00:00:00Z",'
        '"event_attributes":{"object":{"object_id":"a","note":"say \\"hi\\""}}}',
        '{"event_id":"e3","action_name":"click","timestamp":"2025-01-01T00:00:00Z",'
        '"event_attributes":{"object":{"object_id":"a","nested":{"k":1}}}}',
        '{"event_id":"e4","action_name":"click","timestamp":"2025-01-01T00:00:00Z",'
        '"event_attributes":{"object":{"object_id":"a","x":1,"x":2}}}',
    ]
    path = tmp_path / "js.ndjson"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    seen = _spy_finish(monkeypatch)
    sent: list[Any] = []
    exact = fastpath.validate_items

    def spy_exact(items: Any) -> Any:
        sent.extend(items)
        return exact(items)

    monkeypatch.setattr(fastpath, "validate_items", spy_exact)
    reports, _ = import_files([path], tmp_path / "x.duckdb")
    assert reports[0].public()["accepted"] == 3 and reports[0].public()["rejected"] == 1
    # e2 (escaped quote) and e3 (nested object) are read back in Python; e4 (repeated key) too, which
    # leaves it to the exact path to name the key
    assert sorted(v.get("event_id") for v in seen) == ["e2", "e3", "e4"]
    assert [item.index for item in sent] == [3]
    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    try:
        key, attrs = con.execute("SELECT event_key, event_attributes FROM ubi_events WHERE event_id IS NULL").fetchone()
    finally:
        con.close()
    assert attrs == ('{"object":{"object_id":"sku-1","object_id_field":"sku","description":"product sku-1",'
                     '"brand":"acme","n":7},"position":{"ordinal":0}}')
    dump = {k: v for k, v in orjson.loads(js).items() if v is not None}
    del dump["event_attributes"]["object"]["gone"]
    dump["timestamp"] = "2025-01-01T00:00:00.100000Z"
    assert key == "h:" + hashlib.sha256(orjson.dumps(dump, option=CANONICAL_OPTIONS)).hexdigest()[:32]
