"""The fast path of ``ubi import`` changes speed, never outcomes: compared with the exact path record by record.

Every comparison imports the same file twice into fresh stores, once with the fast path (``fast=True``, the
default) and once with the exact path for every record (``fast=False``: pydantic, as through a collector),
and asserts that the per-file reports (counts, rejected, every error with index, line, field and message)
and the stored tables (``ubi_queries``, ``ubi_events``, ``failed_records`` without the server's ids and
arrival times) are identical. Inputs: hypothesis-generated events and query records built from pieces
that sit on every edge of the plain shape (lengths 100/101, int32 bounds, timestamps that do not exist,
repeated keys, trailing commas, escapes, legacy shapes, extra keys, ids that collide), the shared samples,
and generated logs.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest import mock

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SAMPLE_LOG, shared_path
from ubi_pipeline.collector import blocks, fastpath, importer
from ubi_pipeline.collector.bodies import _PLAIN_ACTION, bulk_items, bulk_records, json_item
from ubi_pipeline.collector.importer import import_files
from ubi_pipeline.processors.simulation.bulk_log import write_files
from ubi_pipeline.schemas.errors import InputFileError
from ubi_pipeline.schemas.ubi import JSON_FIELD_MAX_LENGTH, USER_QUERY_MAX_LENGTH, UbiEvent, UbiQuery

_TABLES = {
    "ubi_queries": "* EXCLUDE (received_at)",
    "ubi_events": "* EXCLUDE (received_at)",
    "failed_records": "* EXCLUDE (failed_id, received_at)",
}


def _stored(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: sorted(con.execute(f"SELECT {cols} FROM {t}").fetchall(), key=repr) for t, cols in _TABLES.items()}
    finally:
        con.close()


def _both(tmp: Path, files: list[Path], **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fast, exact) outcomes of importing ``files``: reports and stored rows, with the source path normalised."""
    out = []
    for name, fast in (("fast", True), ("exact", False)):
        db = tmp / f"{name}.duckdb"
        try:
            reports, mode = import_files(files, db, fast=fast, max_errors=10_000, **kw)
        except InputFileError as exc:  # a file that is not NDJSON after all (a first line that is not JSON)
            out.append({"reports": str(exc), "stored": _stored(db)})
            continue
        assert mode == "direct"
        out.append({"reports": [r.public() for r in reports], "stored": _stored(db)})
    return out[0], out[1]


def _assert_same(tmp: Path, files: list[Path], **kw: Any) -> dict[str, Any]:
    fast, exact = _both(tmp, files, **kw)
    assert fast["reports"] == exact["reports"]
    for table in _TABLES:
        assert fast["stored"][table] == exact["stored"][table], table
    return fast


# ---------------------------------------------------------------- generated records on the edges

_S100, _S101 = "a" * 100, "b" * 101
_STRINGS = ["x", "", "with: colon", "with \"quote\"", "back\\\\slash", "caf\u00e9 \u00fc", "\U0001f600", _S100, _S101,
            "tab\\tsep", "line\\nbreak", "slash/ok", "<b>&amp;</b>"]
_JSON_VALUES = ['"x"', "null", '"a\\u003ab"', "1", "-1", "0", "1.5", "true", "[]", "{}", '["a"]', "NaN", '"\\u0041"',
                '"' + _S100 + '"', '"' + _S101 + '"', '"' + "c" * 257 + '"', '"' + "d" * 1024 + '"',
                '"' + "e" * 1025 + '"']
_TIMESTAMPS = ['"2024-05-16T12:34:56.789Z"', '"2024-02-29T00:00:00.000Z"', '"2023-02-29T00:00:00.000Z"',
               '"2024-02-30T00:00:00.000Z"', '"0000-01-01T00:00:00.000Z"', '"0001-01-01T00:00:00.000Z"',
               '"9999-12-31T23:59:59.999Z"', '"2024-01-01T24:00:00.000Z"', '"2024-01-01T23:59:60.000Z"',
               '"2024-01-01T00:00:00Z"', '"2024-01-01T00:00:00.000+0000"', '"2024-01-01 00:00:00"',
               "1715862896789", "1.5", "null", '"2024-13-01T00:00:00.000Z"', '"2024-1-01T00:00:00.000Z"',
               '"2024-05-16t12:34:56.789z"', '" 2024-05-16T12:34:56.789Z"', '"\u0662024-05-16T12:34:56.789Z"']
_ORDINALS = ["0", "3", "-1", "2147483647", "2147483648", "-2147483648", "-2147483649", "1.0", "1e2", '"3"',
             "true", "null", '{"index": 4}', '{"idx": 4}', "-0", "18446744073709551615", "99999999999999999999999"]
_IDS = ['"e1"', '"e2"', '"e3"', '""', "7", "null", '"' + "i" * 100 + '"', '"' + "j" * 101 + '"', '"id: with colon"',
        '"caf\u00e9"']


_VALID_STRINGS = st.sampled_from(['"x"', '"shop"', "null", '"with: colon"', '"caf\u00e9 \U0001f600"', '""',
                                  '"' + _S100 + '"', '"a/b"', '"<b>&amp;</b>"'])
_EDGE_STRINGS = st.one_of(st.sampled_from(_STRINGS).map(lambda s: f'"{s}"'), st.sampled_from(_JSON_VALUES),
                          st.text(max_size=12).map(lambda s: json.dumps(s, ensure_ascii=False)))
# Mostly values the fast path takes, so that many records test its rows; one in ten on an edge.
_STRING = st.one_of(*[_VALID_STRINGS] * 9, _EDGE_STRINGS)


def _obj(pairs: list[tuple[str, str]], sep: str = ",", trailing: bool = False) -> str:
    body = sep.join(f'"{k}":{v}' if sep == "," else f'"{k}": {v}' for k, v in pairs)
    return "{" + body + ("," if trailing and pairs else "") + "}"


@st.composite
def _pairs(draw: Any, fields: dict[str, st.SearchStrategy[str]], required: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Some of ``fields`` (the required ones usually), now and then a key twice or an extra key, in some order."""
    names = [n for n in fields if n in required or draw(st.booleans())]
    if required and draw(st.integers(0, 9)) == 0:  # sometimes drop a required field
        names = [n for n in names if n != required[0]]
    pairs = [(n, draw(fields[n])) for n in names]
    if pairs and draw(st.integers(0, 14)) == 0:  # a repeated key
        k, _ = pairs[draw(st.integers(0, len(pairs) - 1))]
        pairs.append((k, draw(fields[k])))
    if draw(st.integers(0, 14)) == 0:  # an extra key
        pairs.append(("extra_key", draw(st.sampled_from(['"v"', "1", '{"a": 1}', "null"]))))
    if len(pairs) > 1 and draw(st.booleans()):
        pairs.reverse()
    return pairs


_PLAIN_STR = st.one_of(st.sampled_from(['"sku-1"', '"sku-2"', '"doc/7"', '"\u00fcber"', '"über"', '"a\\"b"']),
                       _STRING)
_OBJECT = _pairs({"object_id": _PLAIN_STR, "object_id_field": _STRING, "object_id_type": _STRING,
                  "internal_id": _PLAIN_STR}).map(_obj)
_POSITION = st.one_of(
    _pairs({"ordinal": st.one_of(st.sampled_from(_ORDINALS[:3]), st.sampled_from(_ORDINALS))}).map(_obj),
    _pairs({"ordinal": st.one_of(st.sampled_from(_ORDINALS[:3]), st.sampled_from(_ORDINALS))}).map(_obj),
    _pairs({"ordinal": st.sampled_from(_ORDINALS), "x": st.sampled_from(["1", "2.5", '"3"']),
            "y": st.sampled_from(["1", "2.5"]), "xy": st.sampled_from(['{"x": 1, "y": 2}', "null", "3"])}).map(_obj),
)
_ATTRS = st.one_of(
    _pairs({"object": st.one_of(_OBJECT, st.sampled_from(["null", '"o"', "{}"])),
            "position": st.one_of(_POSITION, st.sampled_from(["null", "{}", "[]"]))}).map(_obj),
    _pairs({"object": _OBJECT, "position": _POSITION}, ("object", "position")).map(_obj),
    st.sampled_from(["null", "{}", '"attrs"', "[]"]),
)
_EVENT_FIELDS: dict[str, st.SearchStrategy[str]] = {
    "action_name": st.one_of(st.sampled_from(['"click"', '"impression"', '""', '"' + _S100 + '"']), _STRING),
    "timestamp": st.one_of(*[st.sampled_from(_TIMESTAMPS[:2])] * 3, st.sampled_from(_TIMESTAMPS)),
    "event_id": st.one_of(*[st.sampled_from(_IDS[:3])] * 3, st.sampled_from(_IDS)),
    "query_id": _STRING,
    "session_id": _STRING,
    "client_id": _STRING,
    "user_id": _STRING,
    "application": _STRING,
    "message_type": _STRING,
    "message": _STRING,
    "user_query": _STRING,
    "event_attributes": _ATTRS,
}
_HITS = st.lists(st.one_of(st.sampled_from(['"h1"', '"h2"', "3", '"' + "h" * 257 + '"', "null"]), _STRING),
                 max_size=4).map(lambda xs: "[" + ",".join(xs) + "]")
_QUERY_FIELDS: dict[str, st.SearchStrategy[str]] = {
    "user_query": _STRING,
    "query_id": st.sampled_from(['"q1"', '"q2"', '""', "5", "null", '"' + "q" * 101 + '"']),
    "client_id": _STRING,
    "application": _STRING,
    "timestamp": st.one_of(st.sampled_from(_TIMESTAMPS[:2]), st.sampled_from(_TIMESTAMPS)),
    "query_attributes": st.sampled_from(['{}', '{"ranker": "a"}', '{"a": null, "b": {"c": 1.50}}', '"x"', "null",
                                         '{"a": 1, "a": 2}', '{"n": [1, {"d": true}]}', '{"u": "é"}']),
    "object_id_field": _STRING,
    "query_response_id": st.sampled_from(['"r1"', '""', "null", "1"]),
    "query_response_hit_ids": st.one_of(_HITS, st.sampled_from(["null", '"h"', "[]"])),
}


def _render(pairs: list[tuple[str, str]], style: tuple[str, bool]) -> str:
    return _obj(pairs, *style)


_STYLE = st.tuples(st.sampled_from([",", ", "]), st.integers(0, 19).map(lambda n: n == 0))  # separator, trailing ','
event_line = st.builds(_render, _pairs(_EVENT_FIELDS, ("action_name", "timestamp", "event_id")), _STYLE)
query_line = st.builds(_render, _pairs(_QUERY_FIELDS, ("user_query",)), _STYLE)


_LINES = st.lists(st.one_of(event_line, event_line, query_line,
                            st.sampled_from(["{bad", "[]", "3", '{"a":1}', "not json", '"s"'])),
                  min_size=1, max_size=30)


#: Line ends and blank lines the block reader must treat as stream_lines does; block sizes (bytes read at a
#: time, ubi_pipeline.collector.blocks.LINE_BLOCK) that put block ends inside lines, and the default.
_SEPARATORS = st.sampled_from(["\n", "\n", "\r\n", "\n\n \t\n", " \n"])
_BLOCKS = st.sampled_from([7, 50, 333, 0])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=_LINES, kind=st.sampled_from([None, None, "event", "query"]), sep=_SEPARATORS, block=_BLOCKS)
def test_ndjson_fast_and_exact_paths_agree(tmp_path_factory: pytest.TempPathFactory, lines: list[str],
                                           kind: str | None, sep: str, block: int) -> None:
    tmp = tmp_path_factory.mktemp("nd")
    path = tmp / "in.ndjson"
    path.write_text(sep.join(lines) + sep, encoding="utf-8")
    with mock.patch.object(blocks, "LINE_BLOCK", block or blocks.LINE_BLOCK):
        _assert_same(tmp, [path], kind=kind)


_ACTIONS = ['{"index":{"_index":"ubi_events","_id":"e1"}}', '{"index": {"_index": "ubi_events", "_id": "e2"}}',
            '{"create":{"_index":"ubi_events"}}', '{"index":{"_index":"ubi_queries","_id":"q1"}}',
            '{"index":{"_id":"e3","_index":"ubi_events"}}', '{"index":{"_index":"ubi_events","_id":7}}',
            '{"index":{"_index":"ubi_events","_id":""}}', '{"index":{"_index":"nope"}}', '{"delete":{"_id":"x"}}',
            '{"update":{"_index":"ubi_events"}}', '{"index":{"_index":"ubi_events","_index":"ubi_events"}}',
            '{"index":{"_index":"ubi_events","_id":"' + "k" * 101 + '"}}', "{bad"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(st.sampled_from(_ACTIONS), st.one_of(event_line, query_line)), min_size=1,
                      max_size=20),
       tail=st.sampled_from(["", '{"index":{"_index":"ubi_events"}}']), sep=_SEPARATORS, block=_BLOCKS)
def test_bulk_fast_and_exact_paths_agree(tmp_path_factory: pytest.TempPathFactory, pairs: list[tuple[str, str]],
                                         tail: str, sep: str, block: int) -> None:
    tmp = tmp_path_factory.mktemp("bulk")
    path = tmp / "in.bulk.ndjson"
    lines = ['{"index":{"_index":"ubi_events","_id":"first"}}', '{"action_name":"click","timestamp":1}']
    for action, doc in pairs:
        lines.append(action)
        if '"delete"' not in action:
            lines.append(doc)
    path.write_text(sep.join([*lines, tail]) + sep, encoding="utf-8")
    with mock.patch.object(blocks, "LINE_BLOCK", block or blocks.LINE_BLOCK):
        _assert_same(tmp, [path])


def test_plain_action_lines_mean_what_the_general_path_finds() -> None:
    """A line the regex takes gives the same item as the general path (same kind, _id, verb, index)."""
    doc = b'{"action_name":"click","timestamp":"2024-05-16T12:34:56.789Z"}'
    for action in _ACTIONS:
        line = action.encode()
        general = list(bulk_items([(1, line), (2, doc)]))
        fast = list(bulk_records([(1, line), (2, doc)], plain=True))
        if _PLAIN_ACTION.fullmatch(line):
            assert type(fast[0]) is tuple and json_item(*fast[0][:4], event_id=fast[0][4], action=fast[0][5],
                                                        index_name=fast[0][6]) == general[0]
        else:
            assert fast == general
    assert _PLAIN_ACTION.fullmatch(b'{"index":{"_index":"ubi_events","_id":"e1"}}')
    assert not _PLAIN_ACTION.fullmatch(b'{"index":{"_index":"ubi_events","_id":"a\\"b"}}')


# ---------------------------------------------------------------- samples and generated logs


def test_the_esci_sample_imports_alike_and_mostly_fast(tmp_path: Path) -> None:
    path = shared_path(SAMPLE_LOG)
    fast = _assert_same(tmp_path, [path])
    (report,) = fast["reports"]
    assert report["accepted"] > 0


def test_fixed_edge_records_agree(tmp_path: Path) -> None:
    """Hand-picked records on the edges (each line commented with what it tests), both directions of dedup."""
    lines = [
        '{"event_id":"a","action_name":"click","timestamp":"2024-05-16T12:34:56.789Z"}',  # plain
        '{"event_id":"a","action_name":"click","timestamp":"2024-05-16T12:34:56.789Z"}',  # duplicate
        '{"event_id":"a","action_name":"view","timestamp":"2024-05-16T12:34:56.789Z"}',  # conflict
        '{"action_name":"click","timestamp":"2024-05-16T12:34:56.789Z"}',  # no id: hash key (exact path)
        '{"event_id":"b","action_name":"click","timestamp":"2024-05-16T12:34:56.789Z","event_attributes":'
        '{"object":{"object_id":"\u00fcber-1","object_id_field":"sku"},"position":{"ordinal":-0}}}',  # non-ASCII, -0
        '{"event_id":"c","action_name":"click","timestamp":"2024-05-16T12:34:56.789Z","event_attributes":{}}',
        '{"event_id":"d","action_name":"click","timestamp":"2024-05-16T12:34:56.789Z","event_attributes":'
        '{"object":null,"position":{}}}',
        '{"event_id":"e","action_name":"click","timestamp":"2024-05-16T12:34:56.789Z","event_attributes":'
        '{"object":{},"position":{"ordinal":null}}}',
        '{"event_id":"f","action_name":"click","timestamp":"2024-05-16T12:34:56.789Z","user_query":"a: b"}',
        '{"event_id":"g","action_name":"click","timestamp":"2024-05-16T12:34:56.789Z","message":"' + "m" * 1024 + '"}',
        '{"query_id":"q","user_query":"shoes","timestamp":"2024-05-16T12:34:56.000Z","query_attributes":{"a":null}}',
        '{"query_id":"q","user_query":"shoes","timestamp":"2024-05-16T12:34:56.000Z","query_attributes":{"a":null}}',
        '{"query_id":"q","user_query":"boots"}',  # query conflict
        '{"query_id":"","user_query":"no id","query_response_id":""}',
    ]
    path = tmp_path / "edge.ndjson"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fast = _assert_same(tmp_path, [path])
    (report,) = fast["reports"]
    # 14 lines: 1 event duplicate and 1 query duplicate, 1 event and 1 query conflict (hand count)
    assert (report["duplicates"], report["rejected"], report["accepted"]) == (2, 2, 10)
    # a second import of the same file: every record a duplicate or a conflict, on both paths
    again = tmp_path / "again"
    again.mkdir()
    _assert_same(again, [path, path])


def test_records_over_the_length_limits_agree(tmp_path: Path) -> None:
    """user_query at and over USER_QUERY_MAX_LENGTH, query_attributes at and over JSON_FIELD_MAX_LENGTH: both
    paths take the ones at the limit and refuse the ones over it, with the same messages."""
    at, over = "q" * USER_QUERY_MAX_LENGTH, "\u00e9" * (USER_QUERY_MAX_LENGTH + 1)  # over: counted in characters
    ts = '"timestamp":"2024-05-16T12:34:56.789Z"'
    # {"k":"vvv..."} is 8 bytes of JSON around the value
    attrs_at, attrs_over = "v" * (JSON_FIELD_MAX_LENGTH - 8), "v" * (JSON_FIELD_MAX_LENGTH - 7)
    lines = [
        '{"event_id":"a","action_name":"click",' + ts + ',"user_query":"' + at + '"}',
        '{"event_id":"b","action_name":"click",' + ts + ',"user_query":"' + over + '"}',
        '{"query_id":"q1","user_query":"' + at + '"}',
        '{"query_id":"q2","user_query":"' + over + '"}',
        '{"query_id":"q3","user_query":"x","query_attributes":{"k":"' + attrs_at + '"}}',
        '{"query_id":"q4","user_query":"x","query_attributes":{"k":"' + attrs_over + '"}}',
        '{"event_id":"c","action_name":"click",' + ts + ',"extra_key":"' + attrs_over + '"}',
    ]
    path = tmp_path / "limits.ndjson"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fast = _assert_same(tmp_path, [path])
    (report,) = fast["reports"]
    # lines 2, 4, 6 and 7 are over a limit (hand count)
    assert (report["accepted"], report["rejected"]) == (3, 4)
    errors = {e["index"]: e for e in report["errors"]}
    assert f"at most {USER_QUERY_MAX_LENGTH} characters" in errors[1]["message"]
    assert f"at most {USER_QUERY_MAX_LENGTH} characters" in errors[3]["message"]
    assert errors[5]["field"] == "query_attributes" and f"{JSON_FIELD_MAX_LENGTH + 1:,} bytes" in errors[5]["message"]
    assert errors[6]["field"] == "extra"


#: Valid events of each spelling issue 26 lists, one per line: (what it is, the line, whether the columnar
#: path decides it; the others are left to the exact path).
ISSUE_SHAPES = [
    ("no event_id: content-hash key", '{"action_name":"click","timestamp":"2024-05-16T12:34:56.789Z"}', True),
    ("no fraction", '{"event_id":"s1","action_name":"click","timestamp":"2024-05-16T12:34:56Z"}', True),
    ("offset +hh:mm, 3 digits", '{"action_name":"click","timestamp":"2024-05-16T12:34:56.5+05:30"}', True),
    ("offset -hhmm, comma", '{"action_name":"click","timestamp":"2024-05-16T00:04:56,123456-0130"}', True),
    ("offset +hh, space, naive", '{"action_name":"view","timestamp":"2024-05-16 12:34:56+02"}', True),
    ("naive, lower-case t and z", '{"action_name":"view","timestamp":"2024-05-16t12:34:56.7z"}', True),
    ("epoch milliseconds", '{"action_name":"view","timestamp":1715862896789}', True),
    ("session_id, message_type, user_query on the event",
     '{"action_name":"click","timestamp":"2024-05-16T12:34:56Z","session_id":"s","message_type":"QUERY",'
     '"user_query":"red shoes","message":"m"}', True),
    ("object_id_field inside object", '{"action_name":"click","timestamp":"2024-05-16T12:34:56Z",'
     '"event_attributes":{"object":{"object_id":"sku-1","object_id_field":"sku","object_id_type":"product",'
     '"internal_id":"7"},"position":{"ordinal":2}}}', True),
    ("spaces after separators (json.dumps)", '{"action_name": "click", "timestamp": "2024-05-16T12:34:56Z", '
     '"event_attributes": {"object": {"object_id": "sku-2"}, "position": {"ordinal": 0}}}', True),
    ("\\u escapes", '{"action_name":"cl\\u0069ck","timestamp":"2024-05-16T12:34:56Z","query_id":"caf\\u00e9",'
     '"event_attributes":{"object":{"object_id":"\\u00fcber"}}}', True),
    ("integer ids", '{"action_name":"click","timestamp":"2024-05-16T12:34:56Z","event_attributes":'
     '{"object":{"object_id":123,"internal_id":-18446744073709551}}}', True),
    ("nulls everywhere", '{"event_id":null,"action_name":"click","timestamp":"2024-05-16T12:34:56Z","query_id":null,'
     '"event_attributes":{"object":null,"position":null}}', True),
    ("extra keys", '{"action_name":"click","timestamp":"2024-05-16T12:34:56Z","page":"/p","ab":{"arm":1},"n":null}', True),
    ("Logstash's @timestamp and @version", '{"action_name":"click","timestamp":"2024-05-16T12:34:56Z",'
     '"@timestamp":"2024-05-16T12:34:57.000Z","@version":"1"}', True),
    ("the reference JavaScript client (extras in object)", '{"application":"shop","action_name":"click",'
     '"query_id":"q","session_id":"s","client_id":"c","user_id":"","timestamp":"2024-05-16T12:34:56.789Z",'
     '"message_type":"INFO","message":"","event_attributes":{"object":{"object_id":"7","object_id_field":"sku",'
     '"description":"Red shoe","price":12.5,"tags":["a",null]},"position":{"ordinal":3,"page":1},"note":null}}',
     True),
    ("legacy ordinal {index}", '{"action_name":"click","timestamp":"2024-05-16T12:34:56Z","event_attributes":'
     '{"position":{"ordinal":{"index":4}}}}', False),
    ("flat x, y", '{"action_name":"click","timestamp":"2024-05-16T12:34:56Z","event_attributes":'
     '{"position":{"x":1.5,"y":2}}}', False),
]


#: Valid query records of the same spellings, all decided by the columnar path.
QUERY_SHAPES = [
    '{"query_id":"q1","user_query":"red shoes","timestamp":"2024-05-16T12:34:56Z"}',
    '{"user_query": "no id", "timestamp": "2024-05-16 12:34:56.5+05:30", "query_response_hit_ids": [1, "b"]}',
    '{"query_id":"q3","user_query":"caf\\u00e9","timestamp":1715862896789,"client_id":null,"page":2,'
    '"query_attributes":{"f":[1.5,null]}}',
]


def test_every_spelling_of_the_issue_agrees_and_takes_the_columnar_path(tmp_path: Path) -> None:
    """Each valid spelling issue 26 lists is stored alike by both paths (keys and timestamps included), twice
    over (the second import: all duplicates, so the content-hash keys match); the columnar path decides all
    but legacy positions, which pydantic (the exact path) still reads."""
    lines = [line for _, line, _ in ISSUE_SHAPES] + QUERY_SHAPES
    path = tmp_path / "shapes.ndjson"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fast = _assert_same(tmp_path, [path])
    (report,) = fast["reports"]
    assert (report["accepted"], report["rejected"]) == (len(lines), 0), report["errors"]
    again = tmp_path / "again"
    again.mkdir()
    twice = _assert_same(again, [path, path])
    assert twice["reports"][1]["duplicates"] == len(lines)
    sent: list[Any] = []
    original = fastpath.validate_items

    def spy(items: Any) -> Any:
        sent.extend(items)
        return original(items)

    fastpath.validate_items = spy  # type: ignore[assignment]
    try:
        import_files([path], tmp_path / "spy.duckdb")
    finally:
        fastpath.validate_items = original  # type: ignore[assignment]
    assert sorted(item.index for item in sent) == [i for i, (_, _, columnar) in enumerate(ISSUE_SHAPES)
                                                   if not columnar]


@pytest.mark.parametrize("fmt", ["ndjson", "bulk"])
def test_generated_logs_agree_and_take_the_fast_path(tmp_path: Path, fmt: str) -> None:
    files = write_files(tmp_path / "in", 3_000, fmt=fmt, seed=2)
    fast = _assert_same(tmp_path, files)
    # every generated record is plain: the fast path stores all of them without pydantic
    chunk_events = []
    original = fastpath.validate_items

    def spy(items: Any) -> Any:
        chunk_events.extend(items)
        return original(items)

    fastpath.validate_items = spy  # type: ignore[assignment]
    try:
        import_files(files, tmp_path / "spy.duckdb")
    finally:
        fastpath.validate_items = original  # type: ignore[assignment]
    assert chunk_events == []
    assert sum(r["accepted"] for r in fast["reports"]) > 3_000


@pytest.mark.parametrize("fmt", ["ndjson", "bulk"])
def test_chunks_end_at_a_byte_bound_and_still_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    fmt: str) -> None:
    """A chunk ends at ``max_bytes`` of lines as well as at ``size`` records (``FAST_CHUNK_BYTES``: before it, a
    file of the largest records the limits accept was validated as one chunk). Every record is in exactly one
    chunk, in file order; every chunk but the last reached the bound with its last record and not before;
    and an import cut that way, with transactions cut at ``BATCH_BYTES``, stores what the exact path stores."""
    files = write_files(tmp_path / "in", 1_500, fmt=fmt, seed=4)
    bound = 20_000  # bytes: about 50 generated records (330-470 bytes a document)
    for path in files:
        chunks = list(importer.fast_chunks(path, max_bytes=bound))
        assert len(chunks) >= path.stat().st_size // (3 * bound)  # every file here holds 2+ bounds' worth
        seen: list[int] = []
        for c in chunks:
            seen.extend(sorted([*c.events.index.tolist(), *c.queries.index.tolist(), *(it.index for it in c.exact)]))
        assert seen == list(range(len(seen)))  # each record once, chunks in file order
        whole = list(importer.fast_chunks(path))
        assert len(whole) == 1 and len(whole[0]) == len(seen)
        longest = max(len(line) for line in path.read_bytes().splitlines())
        for c in chunks[:-1]:
            assert bound <= c.nbytes < bound + longest, c.nbytes
        assert 0 < chunks[-1].nbytes < bound + longest
    monkeypatch.setattr(importer, "fast_chunks", functools.partial(importer.fast_chunks, max_bytes=bound))
    monkeypatch.setattr(importer, "BATCH_BYTES", 3 * bound)
    commits = []
    batch = importer.Store.batch

    def counted(self: Any) -> Any:
        commits.append(1)
        return batch(self)

    monkeypatch.setattr(importer.Store, "batch", counted)
    fast = _assert_same(tmp_path, files)
    assert sum(r["accepted"] for r in fast["reports"]) > 1_500
    assert len(commits) > 5  # cut by bytes: the default batch_records would have been one transaction a file


#: Event lines of the shape LEAN_EVENT_SQL reads (compact, no null) with the edge pieces above.
compact_event_line = st.builds(
    _render,
    _pairs({k: v.filter(lambda x: "null" not in x) for k, v in _EVENT_FIELDS.items()}, ("action_name", "timestamp", "event_id")),
    st.just((",", False)),
)


@settings(max_examples=50, deadline=None)
@given(lines=st.lists(st.one_of(compact_event_line, compact_event_line, event_line), min_size=1, max_size=40),
       bulk_ids=st.lists(st.sampled_from([None, None, "e1", "e2", "k" * 101]), min_size=40, max_size=40))
def test_the_lean_statement_takes_only_what_the_general_one_takes(lines: list[str],
                                                                  bulk_ids: list[str | None]) -> None:
    """LEAN_EVENT_SQL may leave a line to GENERAL_EVENT_SQL, never take one it would not, nor make another row
    of it: every row it makes is GENERAL_EVENT_SQL's row of that line, column by column (content keys
    included: the general statement leaves them to _finish)."""
    c = fastpath.Candidates()
    for i, line in enumerate(lines):
        c.add(i, i + 1, line.encode(), bulk_ids[i])
    table, _ = fastpath._lines_table(c)
    con = fastpath.fast_parser()
    when = datetime(2025, 1, 2, 3, 4, 5)
    try:
        general = fastpath._general_events(con, table, when)
        three = fastpath._finish(general, table).to_pylist()
        one = fastpath._events_of(con, fastpath.LEAN_EVENT_SQL, table, when).to_pylist()
    finally:
        con.close()
    by_pos = {row["_pos"]: row for row in three}
    assert all(by_pos.get(row["_pos"]) == row for row in one)
    # what is left over, GENERAL_EVENT_SQL decides alone: the union is what plain_events returns
    con = fastpath.fast_parser()
    try:
        assert fastpath.plain_events(con, c, when).to_pylist() == three
    finally:
        con.close()


def test_the_one_pass_statement_takes_the_common_shape() -> None:
    """Compact lines without a null (what the reference JavaScript client and OpenSearch exports send) take the
    one JSON pass; a null or a space before an object value leaves the line to GENERAL_EVENT_SQL (same rows)."""
    common = ('{"event_id":"e1","action_name":"click","query_id":"q: 1","timestamp":"2024-05-16T12:34:56.789Z",'
              '"event_attributes":{"object":{"object_id":"sku-1","object_id_field":"sku"},"position":{"ordinal":3}}}')
    with_null = common.replace('"query_id":"q: 1"', '"query_id":null')
    spaced = common.replace('"object":{', '"object": {')
    c = fastpath.Candidates()
    for i, line in enumerate([common, with_null, spaced]):
        c.add(i, i + 1, line.encode())
    table, _ = fastpath._lines_table(c)
    con = fastpath.fast_parser()
    when = datetime(2025, 1, 2)
    try:
        one = fastpath._events_of(con, fastpath.LEAN_EVENT_SQL, table, when).to_pylist()
        rows = fastpath.plain_events(con, c, when).to_pylist()
    finally:
        con.close()
    assert [r["_pos"] for r in one] == [0]
    assert [r["_pos"] for r in rows] == [0, 1, 2]
    # the stored event_attributes is what pydantic's model_dump_json(exclude_none=True) writes (field order)
    assert one[0]["event_attributes"] == '{"object":{"object_id":"sku-1","object_id_field":"sku"},"position":{"ordinal":3}}'
    assert (one[0]["query_id"], one[0]["position_ordinal"], rows[1]["query_id"]) == ("q: 1", 3, None)
    assert {k: v for k, v in rows[2].items() if k != "_pos"} == {k: v for k, v in one[0].items() if k != "_pos"}


def test_the_fast_path_limits_are_the_models() -> None:
    """EVENT_STRINGS, OBJECT_STRINGS and the query limits repeat the models' maxLength (their JSON Schema)."""
    def max_length(schema: dict[str, Any]) -> int | None:
        for option in schema.get("anyOf", [schema]):
            if option.get("type") == "string":
                return option.get("maxLength")
        return None

    event = UbiEvent.model_json_schema()
    for name, limit in fastpath.EVENT_STRINGS:
        if name != "timestamp":
            assert max_length(event["properties"][name]) == limit, name
    obj = event["$defs"]["EventObject"]["properties"]
    for name, limit in fastpath.OBJECT_STRINGS:
        assert max_length(obj[name]) == limit, name
    query = UbiQuery.model_json_schema()["properties"]
    for name, limit in fastpath.QUERY_LIMITS.items():
        assert max_length(query[name]) == limit, name
    assert set(fastpath.EVENT_KEYS) == set(UbiEvent.model_fields)


# ---------------------------------------------------------------- many mostly plain records, seeded

def _mostly_plain_lines(n: int, seed: int) -> list[str]:
    """``n`` records (events, about one query record in eight), each a plain one with, one time in three, one
    piece swapped for an edge piece of the pools above: the fast path takes most of them, so their stored
    rows are compared, and the rest test that it hands on exactly what it must."""
    import random

    rnd = random.Random(seed)
    out = []
    for i in range(n):
        if i % 8 == 7:
            fields = {"query_id": f'"q{rnd.randrange(n // 4 + 1)}"', "user_query": rnd.choice(['"shoes"', '"red: shoes"']),
                      "client_id": '"c1"', "timestamp": '"2024-05-16T12:34:56.000Z"',
                      "query_attributes": rnd.choice(['{}', '{"ranker": "a", "page": 1.50}', '{"a": null}']),
                      "query_response_hit_ids": rnd.choice(['["d1", "d2"]', "[]", '["' + "h" * 256 + '"]'])}
            pools: dict[str, list[str]] = {"query_id": ['"q"', '""', "5", "null"], "user_query": _JSON_VALUES,
                                           "timestamp": _TIMESTAMPS, "query_attributes": ['"x"', '{"a": 1, "a": 2}'],
                                           "query_response_hit_ids": ['[3]', '"h"', '["' + "h" * 257 + '"]']}
        else:
            fields = {"event_id": f'"e{rnd.randrange(n)}"', "action_name": rnd.choice(['"click"', '"impression"']),
                      "query_id": '"q1"', "session_id": '"s1"', "client_id": rnd.choice(['"c1"', '"c\u00e9"']),
                      "timestamp": rnd.choice(_TIMESTAMPS[:2]), "message_type": '"INFO"',
                      "event_attributes": f'{{"object": {{"object_id": "sku-{rnd.randrange(50)}", '
                                          f'"object_id_field": "sku"}}, "position": {{"ordinal": {rnd.randrange(20)}}}}}'}
            pools = {"event_id": _IDS, "action_name": _JSON_VALUES, "timestamp": _TIMESTAMPS, "query_id": _JSON_VALUES,
                     "user_query": _JSON_VALUES, "message": _JSON_VALUES,
                     "event_attributes": ['{"object": {"object_id": 12}}',
                                          f'{{"position": {{"ordinal": {rnd.choice(_ORDINALS)}}}}}',
                                          '{"position": {"x": 1, "y": 2}}', '"a"', "null",
                                          '{"object": {"object_id": "a", "object_id": "b"}}', '{"extra": 1}']}
        if rnd.random() < 1 / 3:
            key = rnd.choice(list(pools))
            fields[key] = rnd.choice(pools[key])
        pairs = list(fields.items())
        if rnd.random() < 0.03:
            pairs.append(("extra_key", '"v"'))
        if rnd.random() < 0.03:
            pairs.append(pairs[0])
        rnd.shuffle(pairs)
        out.append(_obj(pairs, rnd.choice([",", ", "]), rnd.random() < 0.02))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_mostly_plain_records_agree_and_most_take_the_fast_path(tmp_path: Path, seed: int) -> None:
    lines = _mostly_plain_lines(3_000, seed)
    path = tmp_path / "in.ndjson"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    exact_items: list[Any] = []
    original = fastpath.validate_items

    def spy(items: Any) -> Any:
        items = list(items)
        exact_items.extend(items)
        return original(items)

    fastpath.validate_items = spy  # type: ignore[assignment]
    try:
        fast = _assert_same(tmp_path, [path])
    finally:
        fastpath.validate_items = original  # type: ignore[assignment]
    # with about one record in three altered, a clear majority is plain (the fast path's share is printed)
    share = 1 - len(exact_items) / len(lines)
    print(f"fast path took {share:.0%} of {len(lines)} records")
    assert 0.5 < share < 1
    (report,) = fast["reports"]
    assert report["rejected"] > 0 and report["duplicates"] > 0


def test_chunks_that_share_a_transaction_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 300 records written four to a transaction (``batch_records``, Store.batch): a record that
    repeats one of an earlier chunk of the same transaction is a duplicate or a conflict there, as it is
    between transactions and on the exact path."""
    base = _mostly_plain_lines(2_000, 3)
    # lines 600-899 repeat lines 0-299: chunk 2 repeats chunk 0, both in the first transaction (records 0-1199)
    lines = base[:600] + base[:300] + base[600:]
    path = tmp_path / "in.ndjson"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(importer, "fast_chunks", functools.partial(importer.fast_chunks, size=300))
    fast = _assert_same(tmp_path, [path], batch_records=1_000)
    (report,) = fast["reports"]
    alone = tmp_path / "alone.ndjson"
    alone.write_text("\n".join(base) + "\n", encoding="utf-8")
    (base_report,), _ = import_files([alone], tmp_path / "alone.duckdb")
    # the 300 repeats store nothing: each is a duplicate (214 here) or rejected again (86; a conflict, or a
    # line the models refuse), so the accepted count is the file's without them
    assert report["accepted"] == base_report.counts.accepted
    assert report["duplicates"] + report["rejected"] == base_report.counts.duplicates + base_report.rejected + 300
    assert report["duplicates"] > base_report.counts.duplicates + 150


_ID_PIECES = st.sampled_from(["e1", "a b", "index", "ubi_events", "", "k" * 100, "k" * 101, '"', "\\\\", "\u00fc", ",", "}"])


@settings(max_examples=200, deadline=None)
@given(verb=st.sampled_from(["index", "create", "delete"]), name=st.sampled_from(["ubi_events", "ubi_queries", "x"]),
       doc_id=st.one_of(st.none(), st.lists(_ID_PIECES, max_size=3).map("".join)),
       spaced=st.sampled_from(["", " "]), tail=st.sampled_from(["", " ", ',"x":1']))
def test_action_lines_read_in_arrow_mean_what_the_pattern_finds(verb: str, name: str, doc_id: str | None,
                                                                 spaced: str, tail: str) -> None:
    """importer._plain_actions (fixed head and tail, the pattern only for other lines) agrees with
    _PLAIN_ACTION.fullmatch on whether a line is plain and on its verb, _index and _id."""
    inner = f'"_index":{spaced}"{name}"' + (f',{spaced}"_id":{spaced}"{doc_id}"' if doc_id is not None else "")
    line = ("{" + spaced + f'"{verb}":{spaced}{{{inner}{tail}}}{spaced}}}').encode()
    lines = pa.array([b'{"action_name":"x"}', line], pa.large_binary())
    ok, verbs, names, id_at, ids = importer._plain_actions(lines)
    match = _PLAIN_ACTION.fullmatch(line)
    assert not ok[0] and bool(ok[1]) == (match is not None)
    if match is not None:
        assert (importer._VERBS[verbs[1]], importer._NAMES[names[1]]) == (match["verb"].decode(), match["name"].decode())
        assert (ids[int(id_at[1])].as_py() if id_at[1] >= 0 else None) == match["id"]


def test_query_ids_that_would_share_a_key_are_refused_alike(tmp_path: Path) -> None:
    """issue 25: the query key is query_id + U+001F + query_response_id ("h:" + digest without a query_id), so
    query_id "col\\x1fb" and (query_id "col", query_response_id "b\\x1f") shared one key, and a query_id of the
    digest form took over the key of an id-less record. Both paths refuse the three, with the same messages."""
    digest_form = "h:" + "0" * 32
    lines = [
        '{"query_id":"col\\u001fb","user_query":"x"}',
        '{"query_id":"col","query_response_id":"b\\u001f","user_query":"y"}',
        '{"query_id":"' + digest_form + '","user_query":"z"}',
        '{"query_id":"col","query_response_id":"b","user_query":"kept"}',  # control: a plain record stored
        '{"query_id":"h:short","user_query":"kept too"}',  # only the exact digest form is reserved
    ]
    path = tmp_path / "keys.ndjson"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fast = _assert_same(tmp_path, [path])
    (report,) = fast["reports"]
    assert (report["accepted"], report["rejected"]) == (2, 3)
    messages = [e["message"] for e in report["errors"]]
    assert any("query_id must not hold control characters" in m for m in messages)
    assert any("query_response_id must not hold control characters" in m for m in messages)
    assert any("reserved for records sent without one" in m for m in messages)


def test_a_parser_of_several_threads_makes_the_same_rows_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ubi import`` parses with one DuckDB thread per core over batches of LINE_BATCH_ROWS lines:
    plain_events gives the one-thread parser's rows, in candidate order (DuckDB keeps the scan's order,
    ``preserve_insertion_order``; _events_of would restore it otherwise). Small batches (100 lines) so that 3,000 mostly plain records make 30 of them; lines without an
    id among them take the general statement too."""
    monkeypatch.setattr(fastpath, "LINE_BATCH_ROWS", 100)
    lines = [line for line in _mostly_plain_lines(3_000, 3) if '"user_query": "' not in line[:40]]
    c = fastpath.Candidates()
    for i, line in enumerate(lines):
        c.add(i, i + 1, line.replace('"event_id": ', '"eid": ', 1 if i % 2 else 0).encode())
    when = datetime(2025, 1, 2)
    rows = {}
    for threads in (1, 2):
        con = fastpath.fast_parser(threads)
        try:
            rows[threads] = fastpath.plain_events(con, c, when)
        finally:
            con.close()
    assert rows[1].num_rows > 1_000
    assert rows[2].to_pylist() == rows[1].to_pylist()
    assert rows[2].column("_pos").to_pylist() == sorted(rows[1].column("_pos").to_pylist())


def test_the_one_pass_probe_is_skipped_where_no_line_has_an_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines without an id (the JavaScript client's, json.dumps') cannot take LEAN_EVENT_SQL, so plain_events
    does not run its probe (about 20 ms a chunk) and gives the same rows; lines with ids still run it."""
    ran: list[str] = []
    original = fastpath._events_of

    def spy(con: Any, sql: str, lines: Any, when: Any) -> Any:
        ran.append("lean" if sql is fastpath.LEAN_EVENT_SQL else "general")
        return original(con, sql, lines, when)

    line = ('{"action_name":"click","query_id":"q1","timestamp":"2024-05-16T12:34:56.789Z",'
            '"event_attributes":{"object":{"object_id":"sku-%d"},"position":{"ordinal":3}}}')
    when = datetime(2025, 1, 2)
    rows = {}
    for with_ids in (False, True):
        c = fastpath.Candidates()
        for i in range(1_200):
            text = line % i if not with_ids else f'{{"event_id":"e{i}",' + (line % i)[1:]
            c.add(i, i + 1, text.encode())
        monkeypatch.setattr(fastpath, "_events_of", spy)
        ran.clear()
        con = fastpath.fast_parser()
        try:
            rows[with_ids] = fastpath.plain_events(con, c, when)
        finally:
            con.close()
            monkeypatch.setattr(fastpath, "_events_of", original)
        assert ("lean" in ran) is with_ids, ran
        assert rows[with_ids].num_rows == 1_200
    # the id-less rows are those the general statement makes with the probe run first (none taken by it)
    c = fastpath.Candidates()
    for i in range(1_200):
        c.add(i, i + 1, (line % i).encode())
    table, _ = fastpath._lines_table(c)
    con = fastpath.fast_parser()
    try:
        expected = fastpath._finish(fastpath._general_events(con, table, when), table)
    finally:
        con.close()
    assert rows[False].to_pylist() == expected.to_pylist()
