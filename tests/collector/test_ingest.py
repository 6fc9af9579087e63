"""The ingest stage: parsing every body shape, per-item validation, and group writes with per-body results."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ubi_pipeline.collector.ingest import (
    BodyError,
    dropped_keys,
    ingest,
    ingest_many,
    parse_bulk,
    parse_items,
    prepare,
    validate_items,
)
from ubi_pipeline.schemas.ubi import UbiEvent, event_key
from ubi_pipeline.store.duckdb_store import Store


def test_parse_one_object_array_and_ndjson(make_event):
    e = make_event()
    assert [i.value for i in parse_items(orjson.dumps(e), "event")] == [e]
    assert len(parse_items(orjson.dumps([e, e]), "event")) == 2
    nd = parse_items(b"\n" + orjson.dumps(e) + b"\n\n" + orjson.dumps(e) + b"\n", "event", ndjson=True)
    assert [(i.index, i.line) for i in nd] == [(0, 2), (1, 4)]  # blank lines skipped, numbers kept


def test_malformed_json_names_line_and_column():
    with pytest.raises(BodyError) as exc:
        parse_items(b'{\n "a": 1,\n "b": ]\n}', "event")
    # line 3 is ` "b": ]`: the "]" is its 7th character
    assert (exc.value.line, exc.value.column) == (3, 7)
    assert exc.value.status_code == 400


def test_bulk_pairs_and_ids():
    body = (
        b'{"index": {"_index": "ubi_events", "_id": "x1"}}\n{"action_name": "a", "timestamp": 1}\n'
        b'{"create": {"_index": "ubi_queries"}}\n{"user_query": "q"}\n'
    )
    items = parse_bulk(body)
    assert [(i.kind, i.event_id) for i in items] == [("event", "x1"), ("query", None)]
    v = validate_items(items)
    assert (len(v.events), len(v.queries), v.errors) == (1, 1, [])


def test_validation_messages(make_event):
    v = validate_items(parse_items(orjson.dumps([make_event(timestamp="soon", client_id=5), 3]), "event"))
    first, second = v.errors
    # pydantic reports in field order: timestamp is declared before client_id
    assert (first.index, first.field) == (0, "timestamp")
    assert "unparseable timestamp 'soon'" in first.message and "also 'client_id'" in first.message
    assert (second.index, second.message) == (1, "expected a JSON object, got a number")


def test_group_write_attributes_results_and_conflicts_to_their_own_body(tmp_path, make_event, make_query):
    q = make_query(query_id="q1")
    with Store(tmp_path / "g.duckdb") as store:
        ingest(store, validate_items(parse_items(orjson.dumps(q), "query")), source="s")
        bodies = [
            validate_items(parse_items(orjson.dumps([make_event()]), "event")),
            validate_items(parse_items(orjson.dumps([make_query(), dict(q, user_query="other")]), "query")),
            validate_items(parse_items(orjson.dumps([q]), "query")),
        ]
        r = ingest_many(store, [prepare(b, source=f"b{i}") for i, b in enumerate(bodies)])
        assert [(x.accepted, x.duplicates, x.rejected) for x in r] == [(1, 0, 0), (1, 0, 1), (0, 1, 0)]
        assert (r[1].errors[0].index, r[1].errors[0].kind) == (1, "conflict")
        assert store.read("SELECT source, kind, item_index FROM failed_records") == [("b1", "conflict", 1)]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["click", "impression", "watch"]), st.integers(0, 3), st.integers(0, 10**12)
        ),
        min_size=1,
        max_size=12,
    )
)
def test_ingest_is_idempotent(records):
    """Law: writing a body twice stores it once; the second write reports every record as a duplicate."""
    events = [
        {"action_name": a, "timestamp": ts, "event_attributes": {"position": {"ordinal": o}}}
        for a, o, ts in records
    ]
    distinct = len({event_key(UbiEvent.model_validate(e)) for e in events})
    with Store(":memory:") as store:
        body = orjson.dumps(events)
        first = ingest(store, validate_items(parse_items(body, "event")), source="t")
        second = ingest(store, validate_items(parse_items(body, "event")), source="t")
        assert (first.accepted, first.duplicates) == (distinct, len(events) - distinct)
        assert (second.accepted, second.duplicates) == (0, len(events))
        assert store.read("SELECT count(*) FROM ubi_events") == [(distinct,)]


def test_a_reused_event_id_is_rejected_as_a_conflict_naming_item_and_field(tmp_path, make_event):
    """Before, a different event under a taken event_id counted as a duplicate: it was lost without a trace."""
    first = make_event(event_id="e1")
    with Store(tmp_path / "c.duckdb") as store:
        ingest(store, validate_items(parse_items(orjson.dumps(first), "event")), source="a")
        body = orjson.dumps([make_event(), first, dict(first, action_name="purchase")])
        r = ingest(store, validate_items(parse_items(body, "event")), source="b")
        # item 0 new, item 1 a retry of the stored e1, item 2 another event under e1
        assert (r.accepted, r.duplicates, r.rejected) == (1, 1, 1)
        (err,) = r.errors
        assert (err.index, err.field, err.kind) == (2, "event_id", "conflict")
        assert "event_id 'e1' is already stored" in err.message
        rows = store.read("SELECT source, kind, item_index, field, raw FROM failed_records")
        assert [(s, k, i, f) for s, k, i, f, _ in rows] == [("b", "conflict", 2, "event_id")]
        assert orjson.loads(rows[0][4])["action_name"] == "purchase"  # the conflicting event, kept whole


def test_bulk_ids_reused_across_requests_and_documents(tmp_path, make_event):
    """A replayed _bulk export is all duplicates; another document under a replayed _id is a conflict."""
    doc = make_event()
    pair = b'{"index": {"_index": "ubi_events", "_id": "x1"}}\n' + orjson.dumps(doc) + b"\n"
    other = (
        b'{"index": {"_index": "ubi_events", "_id": "x1"}}\n'
        + orjson.dumps(dict(doc, action_name="view"))
        + b"\n"
    )
    with Store(tmp_path / "b.duckdb") as store:
        a = ingest(store, validate_items(parse_bulk(pair)), source="s")
        b = ingest(store, validate_items(parse_bulk(pair + other)), source="s")
        assert [(x.accepted, x.duplicates, x.rejected) for x in (a, b)] == [(1, 0, 0), (0, 1, 1)]
        assert "_bulk _id 'x1'" in b.errors[0].message and b.errors[0].index == 1


def test_a_leading_byte_order_mark_is_dropped(make_event):
    e = make_event()
    bom = b"\xef\xbb\xbf"
    assert [i.value for i in parse_items(bom + orjson.dumps([e]), "event")] == [e]
    assert [i.value for i in parse_items(bom + orjson.dumps(e) + b"\n", "event", ndjson=True)] == [e]
    bulk = bom + b'{"index": {"_index": "ubi_events"}}\n' + orjson.dumps(e) + b"\n"
    assert [(i.kind, i.value, i.error) for i in parse_bulk(bulk)] == [("event", e, None)]
    with pytest.raises(BodyError, match="malformed JSON"):
        parse_items(b"\xef\xbb", "event")  # a broken mark is still malformed


def test_a_timestamp_out_of_range_rejects_its_item_only(tmp_path):
    body = orjson.dumps(
        [
            {"action_name": "good1", "timestamp": "2024-01-01T00:00:00Z"},
            {"action_name": "click", "timestamp": "0001-01-01T00:00:00+05:00"},
        ]
    )
    v = validate_items(parse_items(body, "event"))
    assert (len(v.events), [(e.index, e.field) for e in v.errors]) == (1, [(1, "timestamp")])


def test_array_items_are_serialised_again_only_when_rejected(make_event, monkeypatch):
    import ubi_pipeline.collector.bodies as formats

    calls = []
    real = formats._item_bytes
    monkeypatch.setattr(formats, "_item_bytes", lambda value, body: calls.append(value) or real(value, body))
    bad = {"action_name": "click"}  # no timestamp
    last = make_event()
    out = validate_items(parse_items(orjson.dumps([make_event(), bad, last]), "event"))
    assert len(out.events) == 2 and [e.index for e in out.errors] == [1]
    assert calls == [bad]  # the rejected item's bytes, for failed_records; the valid ones are never copied
    assert orjson.loads(out.errors[0].raw) == bad
    assert orjson.loads(out.raws[2]) == last  # a record filter may still ask for a valid item's bytes


# ---------------------------------------------------------------- duplicate keys (issue 11)

_keys = st.sampled_from(["a", "b", 'q"', "c:", "\\", "é"])
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.text(alphabet='ab":\\ é', max_size=4))


def _string(draw, value: str) -> str:
    """``value`` as a JSON string, each quote, colon and non-ASCII character escaped one way or another."""
    out = []
    for ch in value:
        if ch == '"':
            out.append(draw(st.sampled_from(['\\"', "\\u0022"])))
        elif ch == "\\":
            out.append("\\\\")
        elif ch == ":":
            out.append(draw(st.sampled_from([":", "\\u003a", "\\u003A"])))
        elif ord(ch) > 127:
            out.append(draw(st.sampled_from([ch, f"\\u{ord(ch):04x}"])))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _json_text(draw, depth: int) -> str:
    """JSON text of an object or array that may repeat keys, with the spacing and escapes senders use."""
    if depth > 2 or draw(st.booleans()):
        value = draw(_scalars)
        return _string(draw, value) if isinstance(value, str) else json.dumps(value)
    if draw(st.booleans()):
        return "[" + ",".join(_json_text(draw, depth + 1) for _ in range(draw(st.integers(0, 3)))) + "]"
    colon = draw(st.sampled_from([":", ": ", " :", ":\n"]))
    pairs = [
        _string(draw, draw(_keys)) + colon + _json_text(draw, depth + 1)
        for _ in range(draw(st.integers(0, 4)))
    ]
    return "{" + ",".join(pairs) + "}"


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_the_fast_duplicate_key_check_agrees_with_an_exact_parse(data):
    # The exact answer: the standard library's parser, reporting every object's pairs before they become a dict.
    text = _json_text(data.draw, 0)
    raw = text.encode()
    repeated = False

    def pairs(items):
        nonlocal repeated
        keys = [k for k, _ in items]
        repeated |= len(keys) != len(set(keys))
        return dict(items)

    json.loads(raw, object_pairs_hook=pairs)
    assert dropped_keys(raw, orjson.loads(raw)) == repeated, text


def test_item_status_is_the_row_status_of_each_written_item(tmp_path, make_event, make_query):
    """Items are reported by the store's RowStatus (one enum, ubi_pipeline.store.rows), not by words: the second body
    holds a retry of e1 (DUPLICATE), a new event (INSERTED), and a conflict on e1 (no status: an error)."""
    from ubi_pipeline.store.rows import RowStatus

    first = make_event(event_id="e1")
    with Store(tmp_path / "s.duckdb") as store:
        a = ingest(store, validate_items(parse_items(orjson.dumps([first, make_event(event_id="e0")]), "event")),
                   source="s")
        assert dict(a.item_status) == {0: (RowStatus.INSERTED, "e1"), 1: (RowStatus.INSERTED, "e0")}
        body = orjson.dumps([first, make_event(event_id="e2"), dict(first, action_name="purchase")])
        b = ingest(store, validate_items(parse_items(body, "event")), source="s")
        assert dict(b.item_status) == {0: (RowStatus.DUPLICATE, "e1"), 1: (RowStatus.INSERTED, "e2")}
        assert all(type(st) is RowStatus for st, _ in b.item_status.values())
        assert (b.counts.events, b.counts.event_duplicates, b.counts.conflicts) == (1, 1, 1)
