"""The columnar path of ``ubi import``: valid records of every common spelling never become Python objects.

A file's records arrive in chunks of tens of thousands. The events of a chunk are parsed, checked and turned
into stored rows by DuckDB's JSON functions over the whole chunk at once: :data:`LEAN_EVENT_SQL` for the
compact shape the project's simulator writes (one JSON pass), :data:`GENERAL_EVENT_SQL` for every other
spelling the ``UbiEvent`` model accepts and the statement can decide (any escapes, spaces, nulls, events
without an id - keyed by the same content hash as the exact path, computed in the statement -, RFC 3339 and
ISO 8601 timestamps with or without a fraction or an offset, epoch milliseconds, integer object ids, every
optional field, extra keys). Its query records (about one per twelve events) go through a short Python check and
orjson (:func:`plain_query_row`).

What the statements leave - invalid records, legacy position shapes, floats, repeated keys, anything DuckDB's
JSON reader tolerates and orjson does not - is handed back (extra keys with nested, escaped or float values are
read back by orjson first, :func:`_finish`), and the importer sends it through the exact path
(:func:`ubi_pipeline.collector.bodies.json_item`, :func:`ubi_pipeline.collector.ingest.validate_items`,
pydantic), which gives it its exact status and message.
So the columnar path changes speed, never outcomes: a record it accepts is one pydantic accepts, with the
same stored row (``tests/collector/test_fastpath.py`` compares the two record by record).
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ubi_pipeline.collector.bodies import RawItem, dropped_keys, json_item
from ubi_pipeline.collector.ingest import (
    IngestResult,
    ItemBytes,
    ItemError,
    Prepared,
    Validated,
    prepare,
    validate_items,
)
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.schemas.ubi import (
    CANONICAL_OPTIONS,
    CONTROL_CHARACTER,
    EPOCH_MS_MAX,
    EPOCH_MS_MIN,
    ID_INT_MAX,
    ID_INT_MIN,
    JSON_FIELD_MAX_LENGTH,
    RESERVED_QUERY_ID,
    USER_QUERY_MAX_LENGTH,
    UbiEvent,
    UbiQuery,
    parse_timestamp,
)
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import (
    EVENT_SCHEMA,
    QUERY_SCHEMA,
    Counts,
    failed_row,
    failed_table,
    rows_table,
    utcnow,
)

# The statements' results are read through ``execute`` (one bind, not two: :func:`_events_of`), for which DuckDB
# warns that Arrow output copies the rows once more: measured, the copy costs less than the second bind.
warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning, module=__name__)

#: Fields of an event the statements read, in the order of their path lists: (JSON path, longest
#: string the model allows, None: no limit). ``tests/collector/test_fastpath.py`` checks the limits against
#: the models' JSON Schema.
EVENT_STRINGS: tuple[tuple[str, int | None], ...] = (
    ("action_name", 100),
    ("timestamp", None),
    ("event_id", 100),
    ("query_id", 100),
    ("session_id", 100),
    ("client_id", 100),
    ("user_id", 100),
    ("application", 100),
    ("message_type", 100),
    ("message", 1024),
    ("user_query", USER_QUERY_MAX_LENGTH),
)
OBJECT_STRINGS: tuple[tuple[str, int], ...] = (
    ("object_id", 256),
    ("object_id_field", 100),
    ("object_id_type", 100),
    ("internal_id", 256),
)
EVENT_KEYS = (*(name for name, _ in EVENT_STRINGS), "event_attributes")

_TS = "'%Y-%m-%dT%H:%M:%S.%gZ'"
_TS_SHAPE = r"'[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z'"


def _colons(expr: str) -> str:
    return f"(strlen({expr}) - strlen(replace({expr}, ':', '')))"


# ---------------------------------------------------------------- the common case in one JSON pass

#: One ``json_transform`` of a line: every plain path's value as JSON text (SQL NULL: absent or null).
_LEAN_TYPE = (
    "{" + ",".join(f'"{name}":"JSON"' for name, _ in EVENT_STRINGS)
    + ',"event_attributes":{"object":{' + ",".join(f'"{name}":"JSON"' for name, _ in OBJECT_STRINGS)
    + '},"position":{"ordinal":"JSON"}}}'
)
_L_TOP = {name: f"s.{name}" for name, _ in EVENT_STRINGS}
_L_OBJ = {name: f"s.event_attributes.object.{name}" for name, _ in OBJECT_STRINGS}
_L_ATTRS, _L_O, _L_P = "s.event_attributes", "s.event_attributes.object", "s.event_attributes.position"
_L_ORD = "CAST(s.event_attributes.position.ordinal AS VARCHAR)"


def _unq(leaf: str) -> str:
    """A string's value from its JSON text: the text between the quotes (a line without a backslash has no
    escapes, and DuckDB writes such a string back as it was sent: tests/collector/test_fastpath.py)."""
    return f"CAST({leaf} AS VARCHAR)[2:-2]"


def _lean_string(leaf: str, limit: int | None) -> str:
    within = f" AND length({leaf}) <= {limit + 2}" if limit is not None else ""
    return f"({leaf} IS NULL OR (starts_with({leaf}, '\"'){within}))"


def _lean_object_json() -> str:
    parts = ", ".join(f"""CASE WHEN {_L_OBJ[n]} IS NOT NULL THEN '"{n}":"' || {_unq(_L_OBJ[n])} || '"' END"""
                      for n, _ in OBJECT_STRINGS)
    return f"""CASE WHEN {_L_O} IS NOT NULL THEN '"object":{{' || concat_ws(',', {parts}) || '}}' END"""


_LEAN_ATTRS_JSON = (
    f"CASE WHEN {_L_ATTRS} IS NOT NULL THEN '{{' || concat_ws(',', {_lean_object_json()}, "
    f"""CASE WHEN {_L_P} IS NOT NULL THEN '"position":{{' || """
    f"""coalesce('"ordinal":' || CAST({_L_ORD} AS BIGINT)::VARCHAR, '') || '}}' END) || '}}' END"""
)
_L_EID = _L_TOP["event_id"]
_L_STRINGS = [*_L_TOP.values(), *_L_OBJ.values()]

#: What makes a line one :data:`LEAN_EVENT_SQL` takes: a compact event, read from one pass.
#: With no ``null`` in the line a path's value is SQL NULL exactly when it is absent, so the colon count is
#: the one of keys found; a value is a string when its JSON text starts with a quote; an object value
#: is an object when the line holds its key followed by ``{`` (a quote never sits inside a string here,
#: and the colon count has ruled out any other key of that name).
_LEAN_PLAIN = " AND ".join([
    f"colons = {' + '.join(f'({x} IS NOT NULL)::INTEGER' for x in [*_L_TOP.values(), _L_ATTRS, _L_O, _L_P, *_L_OBJ.values(), _L_ORD])}"
    f" + {_colons('concat(' + ', '.join(_L_STRINGS) + ')')}",
    f"starts_with({_L_TOP['action_name']}, '\"') AND length({_L_TOP['action_name']}) BETWEEN 3 AND 102",
    f"starts_with({_L_TOP['timestamp']}, '\"')",
    f"regexp_full_match(ts, {_TS_SHAPE})",
    "substr(ts, 1, 4) <> '0000'",
    f"try_strptime(ts, {_TS}) IS NOT NULL",
    *(_lean_string(_L_TOP[name], limit) for name, limit in EVENT_STRINGS[2:]),
    f"""({_L_ATTRS} IS NULL OR contains(line, '"event_attributes":{{'))""",
    f"""({_L_O} IS NULL OR contains(line, '"object":{{'))""",
    f"""({_L_P} IS NULL OR contains(line, '"position":{{'))""",
    *(_lean_string(_L_OBJ[name], limit) for name, limit in OBJECT_STRINGS),
    f"({_L_ORD} IS NULL OR (regexp_full_match({_L_ORD}, '-?[0-9]{{1,10}}') "
    f"AND TRY_CAST({_L_ORD} AS BIGINT) BETWEEN -2147483648 AND 2147483647))",
    "eid IS NOT NULL",
])

#: :data:`GENERAL_EVENT_SQL` for the lines of the simulator's compact shape, in one JSON pass. It takes a
#: line only when :data:`GENERAL_EVENT_SQL` would, with the same row (``tests/collector/test_fastpath.py``
#: runs both on every generated line); it leaves the rest to it: lines with a ``null``, an escape, no id, or
#: a space between a key and an object value.
LEAN_EVENT_SQL = f"""
WITH src AS (
    SELECT _pos, _bid, line, {_colons('line')} AS colons, json_transform(line, '{_LEAN_TYPE}') AS s
    FROM _ubi_fast_lines
    WHERE starts_with(line, '{{') AND NOT contains(line, '\\') AND NOT contains(line, 'null')
          AND NOT (contains(line, ',}}') OR contains(line, ',]')
                   OR (regexp_matches(line, ',[ \\t\\r]') AND regexp_matches(line, ',[ \\t\\r]+[\\]}}]')))
          AND json_valid(line)
), parsed AS (
    SELECT *, {_unq(_L_TOP['timestamp'])} AS ts,
           CASE WHEN starts_with({_L_EID}, '"') AND length({_L_EID}) BETWEEN 3 AND 102
                     AND (_bid IS NULL OR _bid = {_unq(_L_EID)}) THEN {_unq(_L_EID)}
                WHEN {_L_EID} IS NULL AND _bid IS NOT NULL THEN _bid END AS eid
    FROM src
)
SELECT 'id:' || eid AS event_key, eid AS event_id, {_unq(_L_TOP['action_name'])} AS action_name,
       {', '.join(f"{_unq(_L_TOP[n])} AS {n}" for n in ('query_id', 'session_id', 'client_id', 'user_id', 'application'))},
       strptime(ts, {_TS}) AS timestamp, {_unq(_L_TOP['message_type'])} AS message_type,
       {_unq(_L_TOP['message'])} AS message, {_unq(_L_TOP['user_query'])} AS user_query,
       {', '.join(f"{_unq(_L_OBJ[n])} AS {n}" for n, _ in OBJECT_STRINGS)},
       CAST({_L_ORD} AS INTEGER) AS position_ordinal, NULL::DOUBLE AS position_x, NULL::DOUBLE AS position_y,
       {_LEAN_ATTRS_JSON} AS event_attributes, NULL::VARCHAR AS extra, ?::TIMESTAMP AS received_at,
       _pos, {_L_EID} IS NOT NULL AS _doc_id
FROM parsed
WHERE {_LEAN_PLAIN}
"""


# ---------------------------------------------------------------- every spelling the models accept, in columns

def _sql_list(names: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


#: The UbiEvent spellings :data:`GENERAL_EVENT_SQL` decides by itself, derived from the models' declarations
#: (:data:`EVENT_STRINGS`, :data:`OBJECT_STRINGS`, the epoch and id ranges of ``ubi_pipeline.schemas.ubi``): the
#: top-level keys, ``event_attributes``' and ``object``'s and ``position``'s, each once; strings (any escapes)
#: within their limits; object ids as strings or integers of 64 bits; ``ordinal`` an integer of 32 bits;
#: timestamps as epoch milliseconds or RFC 3339 / ISO 8601 with seconds (``T``, ``t`` or a space, a fraction
#: of up to 6 digits after ``.`` or ``,``, ``Z``, ``z``, ``+hh``, ``+hhmm``, ``+hh:mm`` or none), the date and
#: time existing and falling in years 1-9999 once in UTC; ids or none (the key is then the content hash,
#: computed from the row as pydantic's dump would give it); extra keys anywhere, kept as the exact path
#: keeps them (plain names with scalar values at the top level, as ``_bulk`` exports add them, and inside
#: ``event_attributes.object``, as the reference JavaScript client adds them, written and hashed by the
#: statement: :data:`_G_XPLAIN`; the others read back by :func:`_finish`). What it
#: leaves - floats, legacy positions, object strings that need escaping in the stored JSON, anything invalid - the
#: exact path decides, so outcomes stay pydantic's (``tests/collector/test_fastpath.py``,
#: ``tests/collector/test_columnar_property.py``).
_G_TYPE = (
    "{" + ",".join(f'"{name}":"JSON"' for name, _ in EVENT_STRINGS)
    + ',"event_attributes":{"object":{' + ",".join(f'"{name}":"JSON"' for name, _ in OBJECT_STRINGS)
    + '},"position":{"ordinal":"JSON"}}}'
)
#: The objects of an event the statement reads: the record, event_attributes, its object and position.
_G_OBJECTS = ("$", "$.event_attributes", "$.event_attributes.object", "$.event_attributes.position")
_G_PATHS = _sql_list(_G_OBJECTS)
#: The key paths under each object.
_G_UNDER = {
    "$": [f"$.{name}" for name in EVENT_KEYS],
    "$.event_attributes": ["$.event_attributes.object", "$.event_attributes.position"],
    "$.event_attributes.object": [f"$.event_attributes.object.{name}" for name, _ in OBJECT_STRINGS],
    "$.event_attributes.position": ["$.event_attributes.position.ordinal"],
}
#: json_type of the objects then of every key the statement reads: one parse gives which keys are there
#: (SQL NULL: absent; 'NULL': null) and their JSON types.
_G_ALL = [*_G_OBJECTS, *(p for o in _G_OBJECTS for p in _G_UNDER[o] if p not in _G_OBJECTS)]
_G_TYPE_PATHS = _sql_list(_G_ALL)


def _ty(path: str) -> str:
    return f"ty[{_G_ALL.index(path) + 1}]"


def _found(obj: str) -> str:
    """How many of the known keys under ``obj`` it holds (each counted once)."""
    return " + ".join(f"({_ty(p)} IS NOT NULL)::INTEGER" for p in _G_UNDER[obj])


def _g_level(i: int, obj: str) -> str:
    """``obj`` is absent or null, or an object (it may hold keys besides the known ones: :data:`_G_EXTRA`)."""
    return f"(coalesce({_ty(obj)}, 'NULL') = 'NULL' OR {_ty(obj)} = 'OBJECT')"


#: The record is an object; so are event_attributes, its object and its position when they are there.
_G_KEYS_OK = " AND ".join([f"{_ty('$')} = 'OBJECT'", *(_g_level(i, o) for i, o in enumerate(_G_OBJECTS) if i)])
#: An object holds more keys than the known ones found in it: extra keys (kept) or a repeated key (refused),
#: told apart by :func:`_finish` (an unknown key, or a known one repeated, is one more than those found).
_G_EXTRA = " OR ".join(f"coalesce(len(ks[{i + 1}]) > {_found(o)}, false)" for i, o in enumerate(_G_OBJECTS))
_ID_NAMES = ("object_id", "internal_id")  # ObjectId fields: a string or an integer in 64 bits


def _is_str(leaf: str) -> str:
    return f"starts_with({leaf}, '\"')"


def _g_string(leaf: str, limit: int | None) -> str:
    """Absent or null, or a string of at most ``limit`` code points once unescaped (as pydantic counts)."""
    # escapes only shorten a string: its JSON text within the limit (quotes aside) settles most at no cost
    within = (f" AND (length({leaf}) <= {limit + 2} OR length({leaf}->>'$') <= {limit})"
              if limit is not None else "")
    return f"({leaf} IS NULL OR ({_is_str(leaf)}{within}))"


_INT_TEXT = "'-?[0-9]{1,20}'"


def _g_id(leaf: str, limit: int) -> str:
    """An ObjectId: absent or null, a string within ``limit``, or an integer of 64 bits (stored as its digits)."""
    return (f"({_g_string(leaf, limit)} OR (regexp_full_match({leaf}, {_INT_TEXT}) AND "
            f"TRY_CAST({leaf} AS HUGEINT) BETWEEN {ID_INT_MIN} AND {ID_INT_MAX}))")


def _g_id_value(leaf: str) -> str:
    return f"CASE WHEN {_is_str(leaf)} THEN ({leaf}->>'$') ELSE CAST(TRY_CAST({leaf} AS HUGEINT) AS VARCHAR) END"


def _is_object(leaf: str) -> str:
    return f"({leaf} IS NULL OR starts_with({leaf}, '{{'))"


#: The timestamp spellings decided here (a subset of TIMESTAMP_PATTERN that datetime.fromisoformat reads).
_G_TS_RE = (r"'^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:[.,]([0-9]{1,6}))?"
            r"(?:([Zz])|([+-])([0-9]{2})(?::?([0-9]{2}))?)?$'")
_G_TS_GROUPS = "['y', 'mo', 'd', 'h', 'mi', 's', 'f', 'z', 'sg', 'oh', 'om']"
# strings that stored JSON (event_attributes) would have to escape: left to the exact path's serialiser
_NEEDS_ESCAPE = r"""'["\\\x00-\x1f]'"""

_OBJ_NAMES = tuple(name for name, _ in OBJECT_STRINGS)
#: Extra keys the statement writes itself: plain names (no escapes in the stored JSON, and a JSON path
#: needs no quoting rules beyond ``"..."``) ...
_X_KEY = "[A-Za-z0-9_@.-]+"
#: ... whose values are JSON scalars DuckDB writes back (``json_extract``) exactly as orjson does: strings
#: without escapes, integers of up to 18 digits (64 bits at most; DuckDB reads larger ones as DOUBLE but may
#: write them as digits), booleans and null. Anything else (floats, arrays, objects, escapes, longer
#: integers, keys repeated, extras elsewhere than the top level and the object) is read back by :func:`_finish`. One regular
#: expression per record for each test: per key, they cost more than the rest of the statement.
_X_SCALAR = '(?:"[^"\\\\\\x01]*"|true|false|null|-?[0-9]{1,18})'


def _x_keys_plain(keys: str) -> str:
    """Every key in the list ``keys`` is plain (:data:`_X_KEY`)."""
    return f"regexp_full_match(array_to_string({keys}, ','), '{_X_KEY}(?:,{_X_KEY})*')"


def _x_values(line: str, keys: str) -> str:
    """The JSON text of each top-level extra key in the list ``keys``; NULL when any key is not plain (its
    path might not parse). Paths in a list must be constants, so one ``json_extract`` per key."""
    return (f"CASE WHEN {_x_keys_plain(keys)} "
            f"THEN list_transform({keys}, lambda k: json_extract({line}, '$.\"' || k || '\"')::VARCHAR) END")


def _x_plain(values: str) -> str:
    """Every value in the list ``values`` (the extras' JSON text; NULL: a key that is not plain) is one the
    statement writes itself."""
    return f"coalesce(regexp_full_match(array_to_string({values}, chr(1)), '{_X_SCALAR}(?:\\x01{_X_SCALAR})*'), false)"


def _x_texts(keys: str, values: str) -> str:
    """The list of ``"key":value`` texts of the extras (keys in the list ``keys``, their JSON text in
    ``values``), in document order, as orjson writes them."""
    return f"list_transform({keys}, lambda k, i: '\"' || k || '\":' || {values}[i])"


def _x_dumped(keys: str, values: str) -> str:
    """:func:`_x_texts` of the extras the dump keeps (not null)."""
    return f"list_filter({_x_texts(keys, values)}, lambda x: NOT suffix(x, ':null'))"


def _x_pairs(keys: str, values: str) -> str:
    """``"key":value,...`` of the extras in document order (NULL when none), as orjson writes them."""
    return f"nullif(array_to_string({_x_texts(keys, values)}, ','), '')"


def _x_sorted(pairs: Sequence[str], extras: str) -> str:
    """The non-null ``"key":value`` texts of ``pairs`` (known keys) and of the list ``extras`` merged in key
    order, comma-separated (``array_to_string`` skips the nulls): what ``OPT_SORT_KEYS`` writes. Sorting the
    texts sorts by key, since a plain key (:data:`_X_KEY`) holds no character below the quote that ends it."""
    return f"array_to_string(list_sort(list_concat([{', '.join(pairs)}], {extras})), ',')"


_OBJ_PATH = "$.event_attributes.object"
#: The extra keys of ``event_attributes.object`` (the reference JavaScript client spreads an object's
#: details there), in document order, read where that object holds more keys than the known ones found.
_OBJ_EXTRA = f"coalesce(len(ks[3]) > {_found(_OBJ_PATH)}, false)"
_OXK = f"CASE WHEN {_OBJ_EXTRA} THEN list_filter(ks[3], lambda k: NOT list_contains({_sql_list(_OBJ_NAMES)}, k)) END"
#: ``"key":value`` of each of the object's extras that is not null (the dump leaves nulls out), in
#: document order (column ``oxp``; NULL when none).
_OX_PAIRS = f"CASE WHEN len(oxk) > 0 THEN nullif({_x_dumped('oxk', 'oxv')}, []) END"

_G_OBJ_VALUES = {name: f"({_g_id_value(f'o.{name}') if name in _ID_NAMES else f'o.{name}->>$$$$'})".replace("$$$$", "'$'")
                 for name, _ in OBJECT_STRINGS}
_G_ATTRS_JSON = (
    "CASE WHEN ty[2] = 'OBJECT' THEN '{' || concat_ws(',', "
    "CASE WHEN ty[3] = 'OBJECT' THEN '\"object\":{' || concat_ws(',', "
    + ", ".join(f"""CASE WHEN {n} IS NOT NULL THEN '"{n}":"' || {n} || '"' END""" for n in _G_OBJ_VALUES)
    + ", array_to_string(oxp, ',')) || '}' END, "
    "CASE WHEN ty[4] = 'OBJECT' THEN '\"position\":{' || "
    "coalesce('\"ordinal\":' || CAST(CAST(p.ordinal AS BIGINT) AS VARCHAR), '') || '}' END) || '}' END"
)

def _pair(name: str, value: str | None = None) -> str:
    """``"name":value`` as orjson writes it, or NULL when the value is (a key the dump leaves out)."""
    v = value or name
    return f"""CASE WHEN {v} IS NOT NULL THEN '"{name}":' || to_json({v})::VARCHAR END"""


_OBJ_SORTED = sorted(name for name, _ in OBJECT_STRINGS)
#: The canonical dump of an event without an id and without extra keys, as
#: ``orjson.dumps(model_dump(exclude_none=True), option=CANONICAL_OPTIONS)`` writes it (sorted keys, UTC
#: ``Z`` times with microseconds when there are any): its SHA-256 is the content-hash key, computed in the
#: statement instead of a Python loop (``tests/collector/test_fastpath.py`` checks it against the exact path).
_C_OBJECT = [_pair(n) for n in _OBJ_SORTED]


def _c_top(obj: str) -> list[str]:
    """The ``"key":value`` texts of the known top-level keys in key order, ``event_attributes`` with ``obj``
    for its object's content."""
    return [
        _pair("action_name"), _pair("application"), _pair("client_id"),
        "CASE WHEN ty[2] = 'OBJECT' THEN '\"event_attributes\":{' || concat_ws(',', "
        f"CASE WHEN ty[3] = 'OBJECT' THEN '\"object\":{{' || {obj} || '}}' END, "
        "CASE WHEN ty[4] = 'OBJECT' THEN '\"position\":{' || coalesce('\"ordinal\":' || position_ordinal, '') "
        "|| '}' END) || '}' END",
        _pair("message"), _pair("message_type"), _pair("query_id"), _pair("session_id"),
        """'"timestamp":"' || CASE WHEN microsecond(timestamp) % 1000000 = 0 """
        """THEN strftime(timestamp, '%Y-%m-%dT%H:%M:%SZ') ELSE strftime(timestamp, '%Y-%m-%dT%H:%M:%S.%fZ') END """
        """|| '"'""",
        _pair("user_id"), _pair("user_query"),
    ]


#: The top-level extras the dump holds (null values left out), as ``"key":value`` texts.
_C_EXTRAS = _x_dumped("xk", "xv")
#: The object's content: its known keys only, or with its extras (``oxp``) sorted in.
_C_OBJECT_KNOWN = f"concat_ws(',', {', '.join(_C_OBJECT)})"
_C_OBJECT_ALL = _x_sorted(_C_OBJECT, "oxp")
_CANONICAL = "'{' || concat_ws(',', " + ", ".join(_c_top(_C_OBJECT_KNOWN)) + ") || '}'"
#: The same with extra keys in the object ...
_CANONICAL_OBJECT_EXTRAS = "'{' || concat_ws(',', " + ", ".join(_c_top(_C_OBJECT_ALL)) + ") || '}'"
#: ... and with extra keys at the top level too (each kept apart: a sort costs more than the rest).
_CANONICAL_EXTRAS = (
    "'{' || " + _x_sorted(_c_top(f"CASE WHEN oxp IS NOT NULL THEN {_C_OBJECT_ALL} ELSE {_C_OBJECT_KNOWN} END"),
                          _C_EXTRAS) + " || '}'"
)
_HASHED_TEXT = ["action_name", "application", "client_id", "message", "message_type", "query_id", "session_id",
                "user_id", "user_query", *_OBJ_SORTED]
#: Control characters DuckDB's to_json escapes with upper-case hex digits (orjson: lower case): their
#: events are hashed by :func:`_finish` instead.
_HEX_CASE = r"'[\x0b\x0e\x0f\x1a-\x1f]'"


#: The record's extra keys (evaluated only where some object has more keys than the known ones found in
#: it) are ones the statement writes itself: at the top level and in ``event_attributes.object``, plain
#: (:func:`_x_plain`), none repeated; none in ``event_attributes`` or ``position``. Otherwise :func:`_finish`
#: reads the record back.
_G_XPLAIN = " AND ".join([
    # a known key repeated is one more key than found; an extra one, a repeat in xk
    f"len(ks[1]) = {_found('$')} + len(xk)",
    f"(len(xk) = 0 OR (list_unique(xk) = len(xk) AND {_x_plain('xv')}))",
    f"coalesce(len(ks[2]) = {_found('$.event_attributes')}, true)",
    f"(coalesce(len(ks[3]) = {_found(_OBJ_PATH)}, true) OR (len(ks[3]) = {_found(_OBJ_PATH)} + len(oxk) "
    f"AND list_unique(oxk) = len(oxk) AND {_x_plain('oxv')}))",
    f"coalesce(len(ks[4]) = {_found('$.event_attributes.position')}, true)",
])
#: The one JSON pass of :data:`GENERAL_EVENT_SQL`, run on its own: referenced from the checks, a
#: ``json_transform`` is set up again for every reference (about 1.5 ms each, whatever the rows), which
#: made the statement cost ~50 ms before its first row; read back from Arrow, its struct costs nothing to set up.
GENERAL_PARSE_SQL = f"""
SELECT _pos, _bid, ty, ks, s, xk, CASE WHEN len(xk) > 0 THEN {_x_values('line', 'xk')} END AS xv, oxk,
       CASE WHEN len(oxk) > 0 THEN {_x_values('ot', 'oxk')} END AS oxv
FROM (
    SELECT *, {_OXK} AS oxk, CASE WHEN {_OBJ_EXTRA} THEN json_extract(line, '{_OBJ_PATH}') END AS ot,
              CASE WHEN len(ks[1]) > {_found('$')} THEN list_filter(ks[1], lambda k: NOT list_contains(
                  {_sql_list(EVENT_KEYS)}, k)) ELSE []::VARCHAR[] END AS xk
    FROM (
        SELECT _pos, _bid, line, json_type(line, {_G_TYPE_PATHS}) AS ty, json_keys(line, {_G_PATHS}) AS ks,
               json_transform(line, '{_G_TYPE}') AS s
        FROM _ubi_fast_lines
        WHERE json_valid(line)
              AND NOT (contains(line, ',}}') OR contains(line, ',]')
                       OR (regexp_matches(line, ',\\s') AND regexp_matches(line, ',\\s+[\\]}}]')))
    )
)
"""

GENERAL_EVENT_SQL = f"""
WITH src AS (
    SELECT * FROM _ubi_fast_parsed
), checked AS (
    SELECT _pos, _bid, ty, ks, s, xk, xv, oxk, oxv, s.event_attributes.object AS o, s.event_attributes.position AS p,
           CASE WHEN {_is_str('s.timestamp')} THEN regexp_extract(s.timestamp->>'$', {_G_TS_RE}, {_G_TS_GROUPS})
           END AS m,
           CASE WHEN {_is_str('s.event_id')} THEN s.event_id->>'$' END AS ev
    FROM src
    WHERE {_G_KEYS_OK}
          AND {_is_str('s.action_name')} AND length(s.action_name->>'$') BETWEEN 1 AND 100
          AND {' AND '.join(_g_string(f's.{n}', lim) for n, lim in EVENT_STRINGS[2:])}
          AND {' AND '.join(_g_id(f's.event_attributes.object.{n}', lim) if n in _ID_NAMES
                            else _g_string(f's.event_attributes.object.{n}', lim) for n, lim in OBJECT_STRINGS)}
          AND (s.event_attributes.position.ordinal IS NULL
               OR (regexp_full_match(s.event_attributes.position.ordinal, '-?[0-9]{{1,10}}')
                   AND TRY_CAST(s.event_attributes.position.ordinal AS BIGINT) BETWEEN {-(2**31)} AND {2**31 - 1}))
), stamped AS (
    SELECT *,
           CASE WHEN m.y IS NULL THEN
                     CASE WHEN regexp_full_match(s.timestamp, {_INT_TEXT})
                               AND TRY_CAST(s.timestamp AS BIGINT) BETWEEN {EPOCH_MS_MIN} AND {EPOCH_MS_MAX}
                          THEN make_timestamp(TRY_CAST(s.timestamp AS BIGINT) * 1000) END
                WHEN m.y <> '' AND m.y <> '0000' AND (m.oh = '' OR (m.oh <= '23' AND (m.om = '' OR m.om <= '59')))
                THEN try_strptime(m.y || '-' || m.mo || '-' || m.d || ' ' || m.h || ':' || m.mi || ':' || m.s,
                                  '%Y-%m-%d %H:%M:%S')
                     + to_microseconds(CASE WHEN m.f = '' THEN 0 ELSE CAST(rpad(m.f, 6, '0') AS BIGINT) END)
                     - to_minutes(CASE WHEN m.sg = '' THEN 0 ELSE (CASE WHEN m.sg = '-' THEN -1 ELSE 1 END)
                                  * (CAST(m.oh AS BIGINT) * 60 + coalesce(TRY_CAST(nullif(m.om, '') AS BIGINT), 0))
                                  END)
           END AS ts, {_OX_PAIRS} AS oxp,
           CASE WHEN length(ev) BETWEEN 1 AND 100 AND (_bid IS NULL OR _bid = ev) THEN ev
                WHEN s.event_id IS NULL AND _bid <> '' THEN _bid END AS eid,
           {', '.join(f"{v} AS {n}" for n, v in _G_OBJ_VALUES.items())}
    FROM checked
), rows AS (
    SELECT 'id:' || eid AS event_key, eid AS event_id, s.action_name->>'$' AS action_name,
           {', '.join(f"s.{n}->>'$' AS {n}" for n in ('query_id', 'session_id', 'client_id', 'user_id', 'application'))},
           ts AS timestamp, s.message_type->>'$' AS message_type, s.message->>'$' AS message,
           s.user_query->>'$' AS user_query, {', '.join(n for n, _ in OBJECT_STRINGS)},
           CAST(p.ordinal AS INTEGER) AS position_ordinal, NULL::DOUBLE AS position_x, NULL::DOUBLE AS position_y,
           {_G_ATTRS_JSON} AS event_attributes,
           CASE WHEN len(xk) > 0 THEN '{{' || {_x_pairs('xk', 'xv')} || '}}' END AS extra,
           ?::TIMESTAMP AS received_at, _pos, s.event_id IS NOT NULL AS _doc_id, {_G_EXTRA} AS _x_any,
           ty, ks, xk, xv, oxk, oxv, oxp
    FROM stamped
    WHERE ts IS NOT NULL AND year(ts) BETWEEN 1 AND 9999
          AND (eid IS NOT NULL OR (s.event_id IS NULL AND _bid IS NULL))
          AND NOT regexp_matches(concat({', '.join(n for n, _ in OBJECT_STRINGS)}), {_NEEDS_ESCAPE})
), sized AS (
    SELECT * EXCLUDE (_x_any, ks),
           CASE WHEN NOT _x_any THEN false
                ELSE NOT ({_G_XPLAIN} AND coalesce(strlen(extra), 0) <= {JSON_FIELD_MAX_LENGTH}
                          AND coalesce(strlen(event_attributes), 0) <= {JSON_FIELD_MAX_LENGTH}) END AS _extra
    FROM rows
)
SELECT * EXCLUDE (ty, xk, xv, oxk, oxv, oxp) REPLACE (
    coalesce(event_key, CASE WHEN _extra IS NOT false
                                  OR regexp_matches(concat({', '.join(_HASHED_TEXT)}), {_HEX_CASE}) THEN NULL
                             WHEN len(xk) = 0 AND oxp IS NULL THEN 'h:' || left(sha256({_CANONICAL}), 32)
                             WHEN len(xk) = 0 THEN 'h:' || left(sha256({_CANONICAL_OBJECT_EXTRAS}), 32)
                             ELSE 'h:' || left(sha256({_CANONICAL_EXTRAS}), 32) END) AS event_key)
FROM sized
"""


def _finish(rows: pa.Table, lines: pa.Table) -> pa.Table:
    """:data:`GENERAL_EVENT_SQL`'s ``rows`` completed where SQL cannot say what the model would: the extra
    keys of records with more keys than the known ones, unless the statement wrote them itself
    (:data:`_G_XPLAIN`; ``_extra`` false) (orjson reads the line, as the exact path does; a
    repeated key, a legacy position, or extras too long or too deep to store leave the record to the exact
    path, which names the problem), kept as the model keeps them (``extra``; ``event_attributes`` with the
    extras of each of its objects after the declared fields), and the content-hash key of each event sent
    without an id (``event_key`` null): the hash of the canonical dump pydantic would give
    (``ubi_pipeline.store.rows.event_values``), built from the row (``event_attributes`` as stored is the
    dump of the model's attributes, in the same order).

    One pass over the rows that need either, with their columns read into Python once (the conversion from
    Arrow cost more than the loop's work when each step read its own columns)."""
    flag = rows.column("_extra").fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
    rows = rows.drop_columns(["_extra"])
    need = rows.column("event_key").is_null().to_numpy(zero_copy_only=False)
    todo = np.flatnonzero(flag | need)
    if not len(todo):
        return rows
    picked = pa.array(todo)
    sub = rows.select([n for n in _FINISH_COLUMNS if n != "timestamp"]).take(picked).to_pydict()
    # the timestamps as the canonical dump writes them (orjson: UTC "Z", microseconds only when there are
    # some); Arrow's datetime objects cost 2.6 us each, more than the rest of a row's hash
    stamps = rows.column("timestamp").take(picked).to_numpy().astype("datetime64[us]")
    whole = stamps.astype(np.int64) % 1_000_000 == 0
    sub["timestamp"] = np.where(whole, np.char.add(np.datetime_as_string(stamps, unit="s"), "Z"),
                                np.char.add(np.datetime_as_string(stamps, unit="us"), "Z")).tolist()
    columns = [sub[name] for name in _FINISH_COLUMNS]
    n_flagged = int(flag.sum())
    texts: list[str] = []
    if n_flagged:
        at = rows.column("_pos").to_numpy()[flag]
        line_of = dict(zip(lines.column("_pos").to_numpy().tolist(), range(lines.num_rows), strict=True))
        texts = lines.column("line").take(pa.array([line_of[int(p)] for p in at.tolist()])).to_pylist()
    extra_col, attrs_col, key_col = sub["extra"], sub["event_attributes"], sub["event_key"]
    keep = np.ones(len(todo), dtype=bool)
    loads, dumps, sha = orjson.loads, orjson.dumps, hashlib.sha256
    next_text = iter(texts).__next__
    for k, (flagged, hashed) in enumerate(zip(flag[todo].tolist(), need[todo].tolist(), strict=True)):
        row = dict(zip(_FINISH_COLUMNS, [col[k] for col in columns], strict=True))
        attrs: dict[str, Any] | None = None
        extras: dict[str, Any] | None = None
        if flagged:
            raw = next_text().encode()
            try:
                value = orjson.loads(raw)
                done = _with_extras(value, row)
            except (orjson.JSONDecodeError, orjson.JSONEncodeError):
                done = None
            if done is None or dropped_keys(raw, value):
                keep[k] = False
                continue
            extra_col[k], attrs_col[k], extras, attrs = done
        if hashed:
            dump = {name: row[name] for name in _HASHED_STRINGS if row[name] is not None}
            dump["timestamp"] = row["timestamp"]
            if attrs is not None:
                dump["event_attributes"] = attrs
            elif attrs_col[k] is not None:
                dump["event_attributes"] = loads(attrs_col[k])
            if extras is not None:
                dump.update(extras)
            elif extra_col[k] is not None:  # extras the statement wrote (plain ones: no nesting to clean)
                dump.update((key, v) for key, v in loads(extra_col[k]).items() if v is not None)
            key_col[k] = "h:" + sha(dumps(dump, option=CANONICAL_OPTIONS)).hexdigest()[:32]
    mask = np.zeros(rows.num_rows, dtype=bool)
    mask[todo] = True
    arrow_mask = pa.array(mask)
    for name, values in (("extra", extra_col), ("event_attributes", attrs_col), ("event_key", key_col)):
        i = rows.schema.get_field_index(name)
        column = pc.replace_with_mask(rows.column(i).combine_chunks(), arrow_mask, pa.array(values, pa.string()))
        rows = rows.set_column(i, name, column)
    if not keep.all():
        drop = np.zeros(rows.num_rows, dtype=bool)
        drop[todo[~keep]] = True
        rows = rows.filter(pa.array(~drop))
    return rows


_EVENT_FIELDS = frozenset(UbiEvent.model_fields)
_LEGACY_POSITION = frozenset(("x", "y", "xy"))
_OBJ_KNOWN = frozenset(_OBJ_NAMES)
_POSITION_KNOWN = frozenset(("ordinal",))
_ATTRS_KNOWN = frozenset(("object", "position"))


def _kept(value: dict[str, Any], known: Any) -> dict[str, Any]:
    """The extra keys of an object as the model's dump keeps them (nulls dropped)."""
    return {k: v for k, v in value.items() if k not in known and v is not None}


def _with_extras(
    value: Any, row: dict[str, Any]
) -> tuple[str | None, str | None, dict[str, Any], dict[str, Any] | None] | None:
    """(``extra``, ``event_attributes``, the top-level extras the dump holds, the attributes' dump when the
    record has an ``event_attributes`` object) of a record with extra keys whose known fields made ``row``;
    None: leave it to the exact path (a legacy position, a value over JSON_FIELD_MAX_LENGTH once stored).
    Raises orjson.JSONEncodeError for extras nested too deep."""
    extra = None if value.keys() <= _EVENT_FIELDS else {k: v for k, v in value.items() if k not in _EVENT_FIELDS}
    extra_json = orjson.dumps(extra) if extra else None
    attrs_text: str | None = row["event_attributes"]
    attrs_json = attrs_text.encode() if attrs_text is not None else None
    ea = value.get("event_attributes")
    dump: dict[str, Any] | None = None
    if type(ea) is dict:
        dump = {}
        obj, pos = ea.get("object"), ea.get("position")
        if type(obj) is dict:
            known = {n: row[n] for n in _OBJ_NAMES if row[n] is not None}
            dump["object"] = known if obj.keys() <= _OBJ_KNOWN else known | _kept(obj, _OBJ_KNOWN)
        if type(pos) is dict:
            if not _LEGACY_POSITION.isdisjoint(pos):
                return None
            ordinal = row["position_ordinal"]
            known = {"ordinal": ordinal} if ordinal is not None else {}
            dump["position"] = known if pos.keys() <= _POSITION_KNOWN else known | _kept(pos, _POSITION_KNOWN)
        if not ea.keys() <= _ATTRS_KNOWN:
            dump |= _kept(ea, _ATTRS_KNOWN)
        attrs_json = orjson.dumps(dump)
    for text in (extra_json, attrs_json):
        if text is not None and len(text) > JSON_FIELD_MAX_LENGTH:
            return None
    return (extra_json.decode() if extra_json is not None else None,
            attrs_json.decode() if attrs_json is not None else None,
            {k: v for k, v in extra.items() if v is not None} if extra else {}, dump)
_HASHED_STRINGS = ("action_name", "query_id", "session_id", "client_id", "user_id", "application", "message_type",
                   "message", "user_query")
_HASHED = (*_HASHED_STRINGS, "timestamp", "event_attributes")
#: The columns :func:`_finish` reads, once.
_FINISH_COLUMNS = ("event_key", "extra", *_HASHED, *_OBJ_NAMES, "position_ordinal")


# ---------------------------------------------------------------- plain query records, in Python

_QUERY_KEYS = frozenset(UbiQuery.model_fields)
#: Longest string each of these UbiQuery fields takes (checked against the models' JSON Schema in the tests).
QUERY_LIMITS = {"query_id": 100, "client_id": 100, "application": 100, "object_id_field": 100,
                "query_response_id": 100, "user_query": USER_QUERY_MAX_LENGTH}
HIT_ID_LIMIT = 256


def _hit_ids(hits: Any) -> list[str] | None:
    """``query_response_hit_ids`` as the model stores them (strings; integers of 64 bits as their digits), or
    None when any is something else (the exact path names it)."""
    out = []
    for h in hits:
        t = type(h)
        if t is str:
            if len(h) > HIT_ID_LIMIT:
                return None
            out.append(h)
        elif t is int and ID_INT_MIN <= h <= ID_INT_MAX:
            out.append(str(h))
        else:
            return None
    return out


#: Keys only events have: a record holding one is an event when the kind is guessed (``importer.guess_kind``).
_EVENT_ONLY_KEYS = frozenset(UbiEvent.model_fields) - frozenset(UbiQuery.model_fields)


def plain_query_row(text: bytes, received_at: datetime, *, guessed: bool = False) -> tuple[Any, ...] | None:
    """The stored row (``QUERY_SCHEMA`` order) of a query record the columnar path decides, or None: let
    pydantic decide (and explain).

    Every spelling ``UbiQuery`` accepts is decided here except what could make the model's output differ from
    the parsed value beyond the conversions made below (timestamps by the model's own
    :func:`ubi_pipeline.schemas.ubi.parse_timestamp`, integer hit ids to strings, nulls dropped): the row is
    what ``ubi_pipeline.store.rows.query_values`` builds from the validated model. ``guessed``: the record's
    kind was guessed from its text; one with an event's key is left to the exact path's guess.
    """
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if type(value) is not dict or (guessed and not _EVENT_ONLY_KEYS.isdisjoint(value)):
        return None
    user_query = value.get("user_query")
    if type(user_query) is not str:
        return None
    for name, limit in QUERY_LIMITS.items():
        s = value.get(name)
        if s is not None and (type(s) is not str or len(s) > limit):
            return None
    for name in ("query_id", "query_response_id"):  # ids the key is built from: the exact path names the problem
        s = value.get(name)
        if s is not None and (CONTROL_CHARACTER.search(s) or (name == "query_id" and RESERVED_QUERY_ID.fullmatch(s))):
            return None
    ts = value.get("timestamp")
    when: datetime | None = None
    if ts is not None:
        if type(ts) is not str and type(ts) is not int:
            return None
        try:
            when = parse_timestamp(ts)
        except ValueError:
            return None
    attrs = value.get("query_attributes")
    if attrs is not None and type(attrs) is not dict:
        return None
    try:
        attrs_json = orjson.dumps(attrs).decode() if attrs is not None else None
    except orjson.JSONEncodeError:
        return None
    if attrs_json is not None and len(attrs_json.encode()) > JSON_FIELD_MAX_LENGTH:
        return None  # the exact path refuses it, naming the limit
    hits = value.get("query_response_hit_ids")
    if hits is not None:
        if type(hits) is not list:
            return None
        hits = _hit_ids(hits)
        if hits is None:
            return None
    extra = {k: v for k, v in value.items() if k not in _QUERY_KEYS} if not value.keys() <= _QUERY_KEYS else None
    extra_json = None
    if extra:
        try:
            extra_json = orjson.dumps(extra).decode()
        except orjson.JSONEncodeError:
            return None
        if len(extra_json.encode()) > JSON_FIELD_MAX_LENGTH:
            return None
    if dropped_keys(text, value):  # a repeated key: the exact path names it
        return None
    dump = {k: v for k, v in value.items() if v is not None}
    if when is not None:
        dump["timestamp"] = when
    if hits is not None:
        dump["query_response_hit_ids"] = hits
    try:
        digest = hashlib.sha256(orjson.dumps(dump, option=CANONICAL_OPTIONS)).hexdigest()[:32]
    except orjson.JSONEncodeError:
        return None
    qid = value.get("query_id") or ("h:" + digest)
    qrid = value.get("query_response_id")
    return (
        qid + "\x1f" + (qrid or ""),
        qid,
        user_query,
        value.get("client_id"),
        value.get("application"),
        when.replace(tzinfo=None) if when is not None else None,
        attrs_json,
        value.get("object_id_field"),
        qrid,
        hits,
        extra_json,
        digest,
        received_at,
    )


# ---------------------------------------------------------------- a chunk of candidates


_Part = tuple[np.ndarray, np.ndarray, pa.Array, pa.Array, pa.Array, pa.Array]


class Candidates:
    """Records of one kind awaiting the fast path, column by column (what :func:`json_item` would be given).

    Filled a record at a time (:meth:`add`) or a block of records at once (:meth:`extend`, from the Arrow
    blocks of :mod:`ubi_pipeline.collector.blocks`: no Python per line); the columns are joined once, when first read.
    """

    def __init__(self) -> None:
        self._parts: list[_Part] = []
        self._rows: list[tuple[int, int, bytes, str | None, str | None, str | None]] = []
        self._n = 0
        self._cols: _Part | None = None

    def add(self, index: int, number: int, text: bytes, bulk_id: str | None = None, action: str | None = None,
            index_name: str | None = None) -> None:
        self._rows.append((index, number, text, bulk_id, action, index_name))
        self._n += 1
        self._cols = None

    def extend(self, index: np.ndarray, number: np.ndarray, text: pa.Array, bulk_id: pa.Array | None = None,
               action: pa.Array | None = None, index_name: pa.Array | None = None) -> None:
        """Append a block: positions in the file, lines, the texts (binary) and the ``_bulk`` metadata (None:
        all null, as NDJSON has none)."""
        n = len(index)
        if not n:
            return
        self._flush()
        none = pa.nulls(n, pa.string())
        self._parts.append((np.asarray(index, np.int64), np.asarray(number, np.int64), text.cast(pa.large_binary()),
                            none if bulk_id is None else bulk_id.cast(pa.string()),
                            none if action is None else action.cast(pa.string()),
                            none if index_name is None else index_name.cast(pa.string())))
        self._n += n
        self._cols = None

    def _flush(self) -> None:
        if self._rows:
            cols = list(zip(*self._rows, strict=True))
            self._parts.append((np.array(cols[0], np.int64), np.array(cols[1], np.int64),
                                pa.array(cols[2], pa.large_binary()), pa.array(cols[3], pa.string()),
                                pa.array(cols[4], pa.string()), pa.array(cols[5], pa.string())))
            self._rows = []

    def _columns(self) -> _Part:
        if self._cols is None:
            self._flush()
            if not self._parts:
                empty = pa.array([], pa.string())
                self._cols = (np.zeros(0, np.int64), np.zeros(0, np.int64), pa.array([], pa.large_binary()),
                              empty, empty, empty)
            elif len(self._parts) == 1:
                self._cols = self._parts[0]
            else:
                self._cols = (np.concatenate([p[0] for p in self._parts]),
                              np.concatenate([p[1] for p in self._parts]),
                              *(pa.concat_arrays([p[i] for p in self._parts]) for i in range(2, 6)))  # type: ignore[assignment]
                self._parts = [self._cols]
        return self._cols

    @property
    def index(self) -> np.ndarray:
        """Position in the file of each candidate (ascending)."""
        return self._columns()[0]

    @property
    def number(self) -> np.ndarray:
        """1-based line of each candidate's document."""
        return self._columns()[1]

    @property
    def text(self) -> pa.Array:
        """The candidates' JSON texts (large_binary)."""
        return self._columns()[2]

    @property
    def bulk_id(self) -> pa.Array:
        """The ``_bulk`` ``_id`` of each candidate (null: none)."""
        return self._columns()[3]

    def at(self, index: int) -> int:
        """The candidate position of the record at file position ``index`` (one of the candidates)."""
        return int(np.searchsorted(self.index, index))

    def text_at(self, pos: int) -> bytes:
        value: bytes = self.text[pos].as_py()
        return value

    def item(self, pos: int, kind: str | None, kind_of: Any) -> RawItem:
        """The exact path's item of candidate ``pos``: what the format's parser yields for it."""
        index, number, _, bulk_id, action, name = self._columns()
        return json_item(int(index[pos]), int(number[pos]), self.text_at(pos), kind,  # type: ignore[arg-type]
                         kind_of=kind_of, event_id=bulk_id[pos].as_py(), action=action[pos].as_py(),
                         index_name=name[pos].as_py())

    def __len__(self) -> int:
        return self._n


@dataclass
class Chunk:
    """One transaction's worth of a file: fast-path candidates of each kind and items for the exact path.

    ``given`` is the kind the exact path is told (``--kind``, the ``_bulk`` index), per candidate group;
    None: guessed from the keys, with ``kind_of``. ``nbytes``: the bytes of the lines it was read from
    (documents only for ``_bulk``; 0 where the reader does not count them).
    """

    events: Candidates = field(default_factory=Candidates)
    queries: Candidates = field(default_factory=Candidates)
    exact: list[RawItem] = field(default_factory=list)
    given: dict[str, str | None] = field(default_factory=lambda: {"event": None, "query": None})
    kind_of: Any = None
    nbytes: int = 0

    def __len__(self) -> int:
        return len(self.events) + len(self.queries) + len(self.exact)

    def item(self, kind: str, pos: int) -> RawItem:
        """The exact path's item of candidate ``pos`` of ``kind``: what the format's parser yields for it."""
        c = self.events if kind == "event" else self.queries
        given = self.given[kind]
        return c.item(pos, given, self.kind_of if given is None else None)


#: Rows per Arrow batch of the lines the statements read: DuckDB's scan hands each batch to a thread of
#: its own, so a parser of two threads (:func:`fast_parser`) runs a chunk on both cores.
LINE_BATCH_ROWS = 8192


def _lines_table(c: Candidates) -> tuple[pa.Table, list[int]]:
    """The candidates' lines as an Arrow table for the statements, in batches of :data:`LINE_BATCH_ROWS`;
    lines that are not UTF-8 are left out (their positions returned: the exact path says why)."""
    table, bad = _lines(c)
    return pa.Table.from_batches(table.to_batches(max_chunksize=LINE_BATCH_ROWS), table.schema), bad


def _lines(c: Candidates) -> tuple[pa.Table, list[int]]:
    raw = c.text
    ids = c.bulk_id
    try:
        text = raw.cast(pa.large_string())
    except pa.ArrowInvalid:
        bad: list[int] = []
        good = []
        for pos, t in enumerate(raw.to_pylist()):
            try:
                t.decode()
                good.append(pos)
            except UnicodeDecodeError:
                bad.append(pos)
        keep = pa.array(good, pa.int32())
        return pa.table({"_pos": keep, "_bid": ids.take(keep), "line": raw.take(keep).cast(pa.large_string())}), bad
    return pa.table({"_pos": pa.array(np.arange(len(c), dtype=np.int32)), "_bid": ids, "line": text}), []


def fast_parser(threads: int = 1) -> duckdb.DuckDBPyConnection:
    """The in-memory DuckDB connection the fast path parses with: one thread for the collector's request
    threads (CPU is the cost that counts there: other requests use the other cores), ``threads`` for
    ``ubi import``, where the chunk being parsed is the bottleneck and the writing thread leaves most of a
    second core idle (two threads: a 50,000-event chunk of ``json.dumps`` lines in 5.9 us of wall time per
    event instead of 9.9, for 5 % more CPU).

    Filter pushdown is off: it moves the statements' checks below the projections that compute the values
    they test, where those values are computed again for each check (the statement cost 18.2 us of CPU per
    event with it, 15.1 without, same rows: 50,000 generated events, best of 6 alternating runs). Turning
    an optimizer off changes the plan, not the result.
    """
    con = duckdb.connect()
    con.execute(f"SET threads = {int(threads)}")
    con.execute("SET disabled_optimizers = 'filter_pushdown'")
    return con


#: Lines :func:`plain_events` first tries :data:`LEAN_EVENT_SQL` on; when it takes fewer than half of them
#: the chunk is not of the simulator's shape and the rest goes straight to :data:`GENERAL_EVENT_SQL`.
LEAN_PROBE = 500
_EVENT_ID_STRING = r'"event_id"\s*:\s*"'


def plain_events(con: duckdb.DuckDBPyConnection, c: Candidates, received_at: datetime) -> pa.Table:
    """Stored rows of the events among ``c`` the columnar path decides (with ``_pos`` and ``_doc_id``), in
    candidate order: :data:`LEAN_EVENT_SQL`'s, then :data:`GENERAL_EVENT_SQL`'s of the lines it left. The
    others (invalid records, spellings it leaves) go to the exact path."""
    lines, _ = _lines_table(c)
    probe = lines.slice(0, LEAN_PROBE) if lines.num_rows > 2 * LEAN_PROBE else lines
    # LEAN_EVENT_SQL takes a line only with an id (an event_id string or a _bulk _id): where fewer than half
    # of the probe's lines have one, it would take fewer than half, and its ~20 ms of set-up is saved (the
    # rows it would have made are GENERAL_EVENT_SQL's: test_the_lean_statement_takes_only_...)
    with_id = pc.or_(pc.match_substring_regex(probe.column("line"), _EVENT_ID_STRING), pc.is_valid(probe.column("_bid")))
    if 2 * (pc.sum(with_id).as_py() or 0) < probe.num_rows:
        return _finish(_general_events(con, lines, received_at), lines)
    lean = _events_of(con, LEAN_EVENT_SQL, probe, received_at)
    if 2 * lean.num_rows >= probe.num_rows and probe.num_rows < lines.num_rows:
        lean = pa.concat_tables([lean, _events_of(con, LEAN_EVENT_SQL, lines.slice(probe.num_rows), received_at)])
    if lean.num_rows == lines.num_rows:
        return lean
    taken = np.zeros(len(c), dtype=bool)
    taken[lean.column("_pos").to_numpy()] = True
    rest = lines.filter(pa.array(~taken[lines.column("_pos").to_numpy()]))
    other = _finish(_general_events(con, rest, received_at), rest)
    if not lean.num_rows:
        return other
    both = pa.concat_tables([lean, other.cast(lean.schema)])
    return both.take(pc.sort_indices(both.column("_pos")))


def _general_events(con: duckdb.DuckDBPyConnection, lines: pa.Table, received_at: datetime) -> pa.Table:
    """:data:`GENERAL_EVENT_SQL`'s rows for ``lines`` (after :data:`GENERAL_PARSE_SQL`), in ``_pos`` order."""
    return _events_of(con, GENERAL_EVENT_SQL, general_parse(con, lines), received_at)


def _read_all(reader: Any, sql: str) -> pa.Table:
    """The rows of an ``execute`` result's Arrow reader; a typed error if the statement had no result set.

    The statement itself runs in the caller: DuckDB's replacement scan finds the Arrow tables it names among
    the variables of the frame that calls ``execute``."""
    if reader is None:  # a statement without a result set: never one of ours
        raise StoreError(f"the import's statement returned no rows to read: {sql[:80]}...")
    table: pa.Table = reader.read_all()
    return table


def general_parse(con: duckdb.DuckDBPyConnection, lines: pa.Table) -> pa.Table:
    """:data:`GENERAL_PARSE_SQL` over ``lines`` (read through ``execute``: see :func:`_events_of`)."""
    _ubi_fast_lines = lines  # noqa: F841 (read by name by DuckDB's replacement scan)
    return _read_all(con.execute(GENERAL_PARSE_SQL).to_arrow_reader(), GENERAL_PARSE_SQL)


def _events_of(con: duckdb.DuckDBPyConnection, sql: str, lines: pa.Table, received_at: datetime) -> pa.Table:
    """``sql``'s rows for ``lines``, in ``_pos`` order. The statements have no ORDER BY: on one thread
    DuckDB keeps the scan's order, so a sort of 50,000 rows (0.5 us of 4.8 per event) bought nothing; the
    order is checked here instead, and restored if it ever differs (with several threads DuckDB keeps it
    too: ``preserve_insertion_order``, on by default).

    The statement runs through ``execute``: ``con.sql(...)`` binds it once to build a relation and again to
    run it, 20 ms a call for :data:`GENERAL_EVENT_SQL`, more than a third of its fixed cost. Arrow output of
    an ``execute`` result copies the rows once more (DuckDB warns of it; the warning is filtered above), which
    costs less than that bind."""
    _ubi_fast_lines = _ubi_fast_parsed = lines  # noqa: F841 (read by name by DuckDB's replacement scan)
    rows = _read_all(con.execute(sql, [received_at]).to_arrow_reader(), sql)
    pos = rows.column("_pos").to_numpy()
    if len(pos) > 1 and not bool(np.all(pos[1:] > pos[:-1])):
        rows = rows.take(pa.array(np.argsort(pos, kind="stable")))
    return rows


# ---------------------------------------------------------------- one chunk, one transaction


@dataclass
class _Origin:
    """Where the rows of one table in a chunk's write came from, to name conflicts."""

    index: list[int]  # item index per row
    fast: list[bool]
    ids: list[tuple[str | None, str | None]]  # (event_id sent in the document, _bulk _id) or (query_id, response id)


@dataclass
class ParsedChunk:
    """A chunk validated and turned into rows (:func:`parse_chunk`), not yet written (:func:`store_chunk`)."""

    chunk: Chunk
    source: str
    received_at: datetime
    fast_events: pa.Table | None  # plain events' stored rows (:func:`plain_events`), None: no event candidates
    fast_q: list[tuple[Any, ...]]  # plain query records' stored rows
    fast_q_pos: list[int]  # their candidate positions
    exact: list[RawItem]  # every other item, in file order
    prepared: Prepared  # what the exact path made of them


def write_chunk(
    store: Store, con: duckdb.DuckDBPyConnection, chunk: Chunk, *, source: str, received_at: datetime
) -> tuple[IngestResult, dict[int, int | None]]:
    """Validate and write one chunk in ONE committed transaction; the result and the line of each item that
    was rejected (by index). Outcomes are those of the exact path for every record (see the module doc)."""
    return store_chunk(store, parse_chunk(con, chunk, source=source, received_at=received_at))


def parse_chunk(con: duckdb.DuckDBPyConnection, chunk: Chunk, *, source: str, received_at: datetime) -> ParsedChunk:
    """The validating half of :func:`write_chunk`: reads nothing of the store, so the importer runs it for
    the next chunk in a second thread while this one is written (DuckDB releases the GIL while it runs)."""
    ev = chunk.events
    fast_events = plain_events(con, ev, received_at) if len(ev) else None
    deferred: list[RawItem] = []
    if fast_events is not None:
        taken = np.zeros(len(ev), dtype=bool)
        taken[fast_events.column("_pos").to_numpy()] = True
        deferred.extend(chunk.item("event", int(p)) for p in np.flatnonzero(~taken))
    q = chunk.queries
    fast_q: list[tuple[Any, ...]] = []
    fast_q_pos: list[int] = []
    for pos, text in enumerate(q.text.to_pylist()):
        row = plain_query_row(text, received_at, guessed=chunk.given["query"] is None)
        if row is None:
            deferred.append(chunk.item("query", pos))
        else:
            fast_q.append(row)
            fast_q_pos.append(pos)
    exact = sorted([*chunk.exact, *deferred], key=lambda it: it.index)
    validated = validate_items(exact) if exact else Validated()
    prepared = prepare(validated, source=source, received_at=received_at)
    return ParsedChunk(chunk, source, received_at, fast_events, fast_q, fast_q_pos, exact, prepared)


def store_chunk(store: Store, parsed: ParsedChunk) -> tuple[IngestResult, dict[int, int | None]]:
    """The writing half of :func:`write_chunk`: one committed transaction with the chunk's rows, conflicts
    named; the result and the line of each rejected item (by index)."""
    chunk, source, received_at = parsed.chunk, parsed.source, parsed.received_at
    ev, q = chunk.events, chunk.queries
    fast_events, fast_q, fast_q_pos = parsed.fast_events, parsed.fast_q, parsed.fast_q_pos
    exact, prepared = parsed.exact, parsed.prepared

    # Events: the fast rows and the exact path's, in file order (the first occurrence of a key wins).
    e_index: list[int] = []
    e_parts: list[pa.Table] = []
    e_fast: list[bool] = []
    if fast_events is not None and fast_events.num_rows:
        idx = ev.index[fast_events.column("_pos").to_numpy()]
        e_parts.append(fast_events.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA))
        e_index.extend(idx.tolist())
        e_fast.extend([True] * len(idx))
    if prepared.event_rows:
        e_parts.append(rows_table(prepared.event_rows, EVENT_SCHEMA))
        e_index.extend(i for i, _, _ in prepared.validated.events)
        e_fast.extend([False] * len(prepared.event_rows))
    events_tbl, e_order = _in_file_order(e_parts, e_index)

    q_index = q.index[fast_q_pos].tolist() + [i for i, _ in prepared.validated.queries]
    q_rows = fast_q + list(prepared.query_rows)
    queries_tbl, q_order = _in_file_order([rows_table(q_rows, QUERY_SCHEMA)] if q_rows else [], q_index)
    q_fast = [True] * len(fast_q) + [False] * len(prepared.query_rows)

    models_e = {i: (e, b) for i, e, b in prepared.validated.events}
    raws = prepared.validated.raws
    conflict_errors: list[ItemError] = []
    conflict_lines: dict[int, int] = {}

    def text_of(kind: str, index: int, fast: bool) -> bytes:
        if not fast:
            return raws.get(index, b"")
        c = ev if kind == "event" else q
        return c.text_at(c.at(index))

    def event_conflicts(positions: Sequence[int]) -> pa.Table:
        start = len(conflict_errors)
        for pos in positions:
            src = e_order[pos]
            index, fast = e_index[src], e_fast[src]
            if fast and events_tbl is not None:  # a fast row is in the table by construction
                c_pos = ev.at(index)
                doc_id = events_tbl.column("event_id")[pos].as_py() if _doc_id(fast_events, c_pos) else None
                bulk = ev.bulk_id[c_pos].as_py()
                conflict_lines[index] = int(ev.number[c_pos])
            else:
                model, bulk = models_e[index]
                doc_id = model.event_id
            sent = f"event_id {doc_id!r}" if doc_id else f"_bulk _id {bulk!r}"
            message = (f"{sent} is already stored for an event with different content; first write wins, this "
                       "event is kept as a conflict (give each event its own id)")
            conflict_errors.append(ItemError(index, "event_id", message, "conflict", text_of("event", index, fast)))
        return _conflict_rows(conflict_errors[start:], source, received_at)

    def query_conflicts(positions: Sequence[int]) -> pa.Table:
        start = len(conflict_errors)
        for pos in positions:
            src = q_order[pos]
            index = q_index[src]
            row = q_rows[src]
            if q_fast[src]:
                conflict_lines[index] = int(q.number[q.at(index)])
            message = (f"query_id {row[1]!r} (query_response_id {row[8]!r}) is already stored with different "
                       "content; first write wins, this record is kept as a conflict")
            conflict_errors.append(ItemError(index, "query_id", message, "conflict",
                                             text_of("query", index, q_fast[src])))
        return _conflict_rows(conflict_errors[start:], source, received_at)

    outcome = store.write_rows(
        queries_tbl,
        events_tbl,
        failed_table(prepared.failed_rows) if prepared.failed_rows else None,
        conflicts=query_conflicts,
        event_conflicts=event_conflicts,
    )
    errors = sorted([*prepared.validated.errors, *conflict_errors], key=lambda e: e.index)
    counts = Counts.of(outcome.query_status, outcome.event_status, failed=len(prepared.validated.errors))
    lines: dict[int, int | None] = {it.index: it.line for it in exact}
    lines.update(conflict_lines)
    return IngestResult(counts=counts, rejected=len(errors), errors=tuple(errors)), lines


def _doc_id(fast_events: pa.Table | None, c_pos: int) -> bool:
    """Whether the fast event at candidate position ``c_pos`` carried its own event_id."""
    if fast_events is None:
        return False
    positions = fast_events.column("_pos").to_numpy()
    row = int(np.searchsorted(positions, c_pos))
    return bool(fast_events.column("_doc_id")[row].as_py())


def _conflict_rows(errors: Sequence[ItemError], source: str, received_at: datetime) -> pa.Table:
    return failed_table([
        failed_row(source=source, kind="conflict", reason=e.message, raw=e.raw, item_index=e.index, field=e.field,
                   received_at=received_at)
        for e in errors
    ])


def _in_file_order(parts: list[pa.Table], index: list[int]) -> tuple[pa.Table | None, list[int]]:
    """The parts as one table sorted by item index, and for each of its rows the row it was in ``parts``."""
    if not parts:
        return None, []
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    order = np.argsort(np.asarray(index, dtype=np.int64), kind="stable")
    if len(parts) > 1 or not bool(np.all(order[1:] > order[:-1])):
        table = table.take(pa.array(order))
        return table, order.tolist()
    return table, list(range(len(index)))


# ---------------------------------------------------------------- a request's body (HTTP)

#: Items a request needs before the columnar path serves it. Its statements cost a fixed ~50 ms per call
#: before their first row (expression set-up; 2 cores under a load average of 5, bench/import_speed.py's
#: machine note) and save ~3-8 us per record over the exact path (15 us), so they pay only for the largest
#: bodies: ``ubi import``'s 5,000-record chunks to a running collector. 500-event batches and single events
#: keep the exact path until that set-up cost comes down.
HTTP_MIN_ITEMS = 5000
_local = threading.local()


def thread_parser() -> duckdb.DuckDBPyConnection:
    """This thread's :func:`fast_parser` (the collector's request threads each keep one)."""
    con: duckdb.DuckDBPyConnection | None = getattr(_local, "con", None)
    if con is None:
        con = _local.con = fast_parser()
    return con


def prepare_items(items: list[RawItem], *, source: str, received_at: datetime | None = None) -> Prepared:
    """What :func:`ubi_pipeline.collector.ingest.prepare` makes of ``validate_items(items)``, the items the
    columnar path decides turned into rows there (:func:`plain_events`, :func:`plain_query_row`) and only the
    others validated by pydantic: the same rows, errors and order (``tests/collector/test_fastpath.py``)."""
    now = received_at or utcnow()
    events, queries = Candidates(), Candidates()
    by_index: dict[int, RawItem] = {}
    exact: list[RawItem] = []
    for item in items:
        if item.error is None and type(item.value) is dict and item.kind in ("event", "query"):
            try:
                text = item.raw if item.raw is not None else orjson.dumps(item.value)
            except orjson.JSONEncodeError:
                exact.append(item)
                continue
            (events if item.kind == "event" else queries).add(item.index, item.line or 0, text, item.event_id)
            by_index[item.index] = item
        else:
            exact.append(item)
    fast_events = plain_events(thread_parser(), events, now) if len(events) else None
    e_rows: list[tuple[int, tuple[Any, ...], tuple[int, str | None, str | None]]] = []
    if fast_events is not None:
        taken = np.zeros(len(events), dtype=bool)
        pos = fast_events.column("_pos").to_numpy()
        taken[pos] = True
        exact.extend(by_index[int(i)] for i in events.index[~taken])
        doc = fast_events.column("_doc_id").to_pylist()
        table = fast_events.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA)
        for p, row, from_doc in zip(pos.tolist(), zip(*(c.to_pylist() for c in table.columns), strict=True), doc,
                                    strict=True):
            index = int(events.index[p])
            e_rows.append((index, row, (index, row[1] if from_doc else None, by_index[index].event_id)))
    q_rows: list[tuple[int, tuple[Any, ...]]] = []
    for p, text in enumerate(queries.text.to_pylist()):
        index = int(queries.index[p])
        query_row = plain_query_row(text, now)
        if query_row is None:
            exact.append(by_index[index])
        else:
            q_rows.append((index, query_row))
    if not exact:
        validated = Validated(raws=ItemBytes(items))
        prepared = prepare(validated, source=source, received_at=now)
    else:
        exact.sort(key=lambda it: it.index)
        prepared = prepare(validate_items(exact), source=source, received_at=now)
        validated = Validated(errors=prepared.validated.errors, raws=ItemBytes(items))
    for index, row in zip(prepared.query_index, prepared.query_rows, strict=True):
        q_rows.append((index, row))
    for ids, row in zip(prepared.event_ids, prepared.event_rows, strict=True):
        e_rows.append((ids[0], row, ids))
    q_rows.sort(key=lambda r: r[0])
    e_rows.sort(key=lambda r: r[0])
    return Prepared(
        validated=validated,
        source=source,
        received_at=now,
        query_rows=[row for _, row in q_rows],
        event_rows=[row for _, row, _ in e_rows],
        failed_rows=prepared.failed_rows,
        query_index=[index for index, _ in q_rows],
        event_ids=[ids for _, _, ids in e_rows],
    )
