"""One parser per format: the streamed JSON array splitter, and the same items from a request body and a file."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ubi_pipeline.collector.bodies as formats
from ubi_pipeline.collector.bodies import BodyError, bulk_verb, parse_bulk, parse_items, split_json
from ubi_pipeline.collector.importer import iter_items


def _split(text: str | bytes, block: int = 7) -> list[tuple[int, int, bytes]]:
    data = text.encode() if isinstance(text, str) else text
    return list(split_json(io.BytesIO(data), block=block))


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=st.sampled_from(['a', 'é', '"', '\\', ',', ']', '[', '{', '}', ':', ' ', '\n', '€', '𝄞'])),
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                              max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(st.lists(_values, max_size=6), st.integers(1, 40), st.sampled_from([None, 0, 2]), st.booleans())
def test_split_elements_equal_the_whole_parse(items, block, indent, ascii_only) -> None:
    """Whatever the block size (cuts inside strings, numbers, multi-byte characters and escapes), the elements'
    texts parse to the array's items; the reference is json.dumps of the same list."""
    text = json.dumps(items, indent=indent, ensure_ascii=ascii_only)
    parts = _split(text, block)
    assert [i for i, _, _ in parts] == list(range(len(items)))
    assert [orjson.loads(t) for _, _, t in parts] == [orjson.loads(orjson.dumps(v)) for v in items]


def test_split_names_the_line_each_element_starts_on() -> None:
    text = '[\n  {"a": 1},\n  {"b": [1,\n 2]},\n\n  3\n]\n'  # elements start on lines 2, 3 and 6 (counted by hand)
    assert [(i, line) for i, line, _ in _split(text, block=5)] == [(0, 2), (1, 3), (2, 6)]


def test_split_one_object_an_empty_array_and_a_byte_order_mark() -> None:
    assert [t for _, _, t in _split('\ufeff {"a": "[,]"}\n'.encode())] == [b'{"a": "[,]"}']
    assert _split("[ ]") == [] and _split("") == [] and _split("  \n") == []


@pytest.mark.parametrize(
    ("text", "expected", "where"),
    [
        ('[{"a": 1}, {"a": 2}, {"a": }]', "malformed JSON in item 2", (1, 28)),
        ('[{"a": 1}\n {"a": 2}]', "expected ',' or ']' after item 0", (2, 2)),
        ('[{"a": 1},\n]', "trailing commas", (2, 1)),
        ('[{"a": 1}] {"b": 2}', "data after the JSON value", (1, 12)),
        ('[{"a": 1}, {"a": 2', "malformed JSON in item 1", (1, 19)),  # the end, where ',' or '}' was due
        ('"just a string"', "expected a JSON array or object", (1, 1)),
    ],
)
def test_split_errors_name_item_line_and_column(text: str, expected: str, where: tuple[int, int]) -> None:
    """Line and column of each error counted by hand in the text; the items before it come out first."""
    got: list[bytes] = []
    with pytest.raises(BodyError) as err:
        for _, _, t in split_json(io.BytesIO(text.encode()), block=4):
            got.append(t)
    assert expected in err.value.reason
    assert (err.value.line, err.value.column) == where
    if "item 2" in expected:
        assert got == [b'{"a": 1}', b'{"a": 2}']


def test_split_refuses_an_element_longer_than_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(formats, "MAX_ELEMENT", 50)
    with pytest.raises(BodyError, match="item 1 is longer than 50 characters"):
        _split('[{"a": 1}, {"a": "' + "x" * 200 + '"}]', block=16)


def test_split_refuses_bytes_that_are_not_utf8() -> None:
    with pytest.raises(BodyError, match="not valid UTF-8"):
        _split(b'[{"a": "\xff"}]')


# ---------------------------------------------------------------- the same parser for bodies and files


def test_a_repeated_key_is_rejected_in_files_as_in_request_bodies(tmp_path: Path) -> None:
    """Before, ``ubi import`` parsed NDJSON with its own loop, which let orjson keep the last of two equal keys;
    now the file and the request body go through ``ndjson_items`` and both reject the record."""
    body = (b'{"action_name": "click", "timestamp": "2024-05-16T12:00:00Z"}\n'
            b'{"action_name": "click", "action_name": "view", "timestamp": "2024-05-16T12:00:00Z"}\n')
    path = tmp_path / "events.ndjson"
    path.write_bytes(body)
    from_body = parse_items(body, "event", ndjson=True)
    from_file = list(iter_items(path, "event"))
    assert [(i.index, i.line, i.field, i.error) for i in from_file] == [
        (i.index, i.line, i.field, i.error) for i in from_body
    ]
    assert from_file[1].field == "action_name" and "duplicate key" in (from_file[1].error or "")


def test_bulk_files_and_bodies_give_the_same_items(tmp_path: Path) -> None:
    body = b"\n".join([
        b'{"index": {"_index": "ubi_events", "_id": "e1"}}',
        b'{"action_name": "click", "timestamp": "2024-05-16T12:00:00Z"}',
        b'{"delete": {"_index": "ubi_events", "_id": "x"}}',
        b'{"update": {"_index": "ubi_events", "_id": "y"}}',
        b'{"doc": {}}',
        b'{"index": {"_index": "nope"}}',
        b'{"action_name": "click"}',
        b'{"index": {"_index": "ubi_queries"}}',
    ]) + b"\n"
    path = tmp_path / "export.ndjson.gz"
    path.write_bytes(gzip.compress(body))
    from_file = list(iter_items(path))
    from_body = parse_bulk(body)

    def key(items):  # noqa: ANN001, ANN202
        return [(i.index, i.kind, i.line, i.field, i.error, i.event_id, i.action) for i in items]

    assert key(from_file) == key(from_body)
    # by hand: record 0 stored as e1, 1 delete (no document), 2 update (its document skipped), 3 unknown
    # index, 4 an action line at the end without its document
    assert [(i.index, i.line, i.field) for i in from_file] == [
        (0, 2, None), (1, 3, "action"), (2, 4, "action"), (3, 7, "_index"), (4, 8, None),
    ]


def test_one_bulk_verb_check_for_the_privacy_scrubber_and_the_importer() -> None:
    assert [bulk_verb(v) for v in ({"index": {}}, {"delete": {"_id": "1"}}, {"index": 1}, {"a": {}, "b": {}}, [])] == [
        "index", "delete", None, None, None,
    ]


def test_a_big_streamed_array_keeps_records_lines_and_kinds(tmp_path: Path) -> None:
    """A gzip JSON array written pretty-printed (one key a line): every item's line is where it starts."""
    records = [{"user_query": f"q{i}", "query_id": f"id{i}"} if i % 3 == 0 else
               {"action_name": "click", "timestamp": "2024-05-16T12:00:00Z", "query_id": f"id{i}"} for i in range(3000)]
    path = tmp_path / "mixed.json.gz"
    path.write_bytes(gzip.compress(json.dumps(records, indent=1).encode()))
    items = list(iter_items(path))
    assert [i.value for i in items] == records
    # json.dumps(indent=1): "[" on line 1, then each record takes keys + 2 lines ({ and }); by hand
    lines, line = [], 2
    for r in records:
        lines.append(line)
        line += len(r) + 2
    assert [i.line for i in items] == lines
    assert [i.kind for i in items[:3]] == ["query", "event", "event"]
