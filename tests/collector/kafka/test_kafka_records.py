"""The record format on the topics: stored rows survive the JSON round trip exactly, keys never change,
and anything else is named as poison with a reason."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import SAMPLE_LOG, shared_path
from ubi_pipeline.collector.ingest import parse_bulk, parse_items, prepare, validate_items
from ubi_pipeline.collector.sinks.kafka import encode
from ubi_pipeline.loader.decode import InRecord, decode, poison_id
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.transport.wire import topics

NAMES = topics("ubi")


def _bag(table):
    """Rows as a sorted list (grouping by query_id reorders rows across searches, never within one)."""
    return sorted(repr(r) for r in table.to_pylist())


def _as_consumed(msgs, partition=0):
    return [InRecord(NAMES.of(m.kind), partition, i, m.value) for i, m in enumerate(msgs)]


def test_sample_export_round_trips_to_the_same_stored_rows():
    """Every record of the sample export (473 queries, 3,448 events; docs/ubi.md) decodes to exactly the
    Arrow rows the embedded store would write, keys included."""
    v = validate_items(parse_bulk(shared_path(SAMPLE_LOG).read_bytes()))
    enc = encode(v, source="/v1/bulk")
    assert (enc.queries, enc.events, len(enc.errors)) == (473, 3448, 0)
    p = prepare(v, source="/v1/bulk")
    received = p.queries.column("received_at")[0].as_py()
    enc = encode(v, source="/v1/bulk", received_at=received)
    # One message per search and request: far fewer messages than rows.
    assert len([m for m in enc.msgs if m.kind == "queries"]) <= 473 and len(enc.msgs) < 473 + 3448
    out = decode(_as_consumed(enc.msgs), NAMES)
    assert out.failed == []
    assert out.queries.schema == p.queries.schema and out.events.schema == p.events.schema
    assert _bag(out.queries) == _bag(p.queries) and _bag(out.events) == _bag(p.events)


def test_messages_are_keyed_by_query_id_and_rejected_items_keep_their_reason():
    body = (b'[{"action_name":"click","timestamp":"2024-05-16T12:00:00Z","query_id":"q7"},'
            b'{"action_name":"click"},'
            b'{"action_name":"view","timestamp":"2024-05-16T12:00:00Z"}]')
    enc = encode(validate_items(parse_items(body, "event")), source="/v1/events")
    kinds = [(m.kind, m.key) for m in enc.msgs]
    no_qid_key = orjson.loads(enc.msgs[1].value)["event_key"].encode()
    assert kinds == [("events", b"q7"), ("events", no_qid_key), ("failed", None)]
    failed = orjson.loads(enc.msgs[2].value)
    assert failed["item_index"] == 1 and failed["field"] == "timestamp" and "required" in failed["reason"]
    out = decode(_as_consumed(enc.msgs), NAMES)
    (row,) = out.failed
    assert row["kind"] == "event" and row["raw"] == b'{"action_name":"click"}'
    assert (row["kafka_topic"], row["kafka_partition"], row["kafka_offset"]) == ("ubi.failed", 0, 2)


@pytest.mark.parametrize(("value", "reason"), [
    (b"{oops", "malformed JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"event_key": "k", "colour": "red"}', "unexpected keys colour"),
    (b'{"action_name": "click"}', "'event_key' is required"),
    (b'{"event_key": "", "action_name": "click", "timestamp": "2024-01-01T00:00:00",'
     b' "received_at": "2024-01-01T00:00:00"}', "'event_key' is empty"),
    (b'{"event_key": "k", "action_name": "click", "timestamp": "yesterday", "received_at": "2024-01-01T00:00:00"}',
     "timestamp"),
    (b"", "empty message value"),
])
def test_poison_is_kept_with_where_and_why_and_the_good_records_survive(value, reason):
    good = encode(validate_items(parse_items(b'{"action_name":"click","timestamp":"2024-05-16T12:00:00Z"}', "event")),
                  source="t").msgs[0].value
    recs = [InRecord("ubi.events", 3, 10, good), InRecord("ubi.events", 3, 11, value), InRecord("ubi.events", 3, 12, good)]
    out = decode(recs, NAMES)
    assert out.events.num_rows == 2 and [o.record.offset for o in out.event_origin] == [10, 12]
    (row,) = out.failed
    assert row["kind"] == "poison" and reason in row["reason"], row["reason"]
    assert (row["kafka_topic"], row["kafka_partition"], row["kafka_offset"], row["raw"]) == ("ubi.events", 3, 11, value)
    line = None if value == b"" else 0  # an empty message has no line; otherwise its only line is bad
    assert row["item_index"] == line
    assert row["failed_id"] == poison_id(recs[1], line)  # the same record re-delivered gets the same id


def test_rows_of_one_search_share_a_message_and_a_bad_line_costs_only_itself():
    body = b"[" + b",".join(b'{"action_name":"click","timestamp":"2024-05-16T12:00:0%dZ","query_id":"q1"}' % i
                            for i in range(3)) + b"]"
    (msg,) = encode(validate_items(parse_items(body, "event")), source="t").msgs
    assert msg.key == b"q1" and msg.value.count(b"\n") == 2
    lines = msg.value.split(b"\n")
    spoiled = b"\n".join([lines[0], b'{"event_key": 7}', lines[2]])
    out = decode([InRecord("ubi.events", 0, 40, spoiled)], NAMES)
    assert out.events.num_rows == 2 and [(o.record.offset, o.line) for o in out.event_origin] == [(40, 0), (40, 2)]
    (row,) = out.failed
    assert (row["kafka_offset"], row["item_index"], row["raw"]) == (40, 1, b'{"event_key": 7}')
    assert row["reason"].startswith("line 2: ")


def test_a_big_search_is_split_into_messages_under_the_size_limit():
    from ubi_pipeline.transport.wire import MAX_VALUE_BYTES

    big = [{"action_name": "impression", "timestamp": "2024-05-16T12:00:00Z", "query_id": "q1", "message": "x" * 900,
            "event_id": f"e{i}"} for i in range(600)]
    msgs = encode(validate_items(parse_items(orjson.dumps(big), "event")), source="t").msgs
    assert len(msgs) > 1 and all(len(m.value) <= MAX_VALUE_BYTES and m.key == b"q1" for m in msgs)
    out = decode(_as_consumed(msgs), NAMES)
    assert out.events.column("event_id").to_pylist() == [f"e{i}" for i in range(600)]  # order kept


def test_records_on_an_unknown_topic_are_poison():
    out = decode([InRecord("other.events", 0, 5, b"{}")], NAMES)
    assert out.failed[0]["kind"] == "poison" and "not one of" in out.failed[0]["reason"]


def test_bad_topic_prefix_is_refused():
    with pytest.raises(UbiError, match="topic prefix"):
        topics("ubi events")


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
_event = st.fixed_dictionaries(
    {"action_name": st.sampled_from(["click", "impression", "add_to_cart", "my custom action"]),
     "timestamp": st.one_of(st.integers(0, 4_000_000_000_000),
                            st.just("2024-05-16T12:34:56.789+0200"), st.just("2024-05-16T12:34:56")),
     "query_id": st.one_of(st.none(), _text.filter(lambda s: 0 < len(s) <= 100)),
     "message": st.one_of(st.none(), _text)},
    optional={"event_attributes": st.fixed_dictionaries(
        {"position": st.fixed_dictionaries({"ordinal": st.integers(0, 1000)}),
         "object": st.fixed_dictionaries({"object_id": st.one_of(_text, st.integers(0, 10**9))})}),
        "extra_key": st.dictionaries(_text, st.one_of(st.integers(-10, 10), _text, st.none()), max_size=3),
        "event_id": _text.filter(lambda s: 0 < len(s) <= 100)})


@settings(max_examples=60, deadline=None)
@given(st.lists(_event, min_size=1, max_size=8))
def test_dedup_keys_and_rows_survive_the_topic_unchanged(events):
    """Law: decode(encode(x)) == the stored rows of x, so a replayed or re-delivered record keeps its key."""
    v = validate_items(parse_items(orjson.dumps(events), "event"))
    p = prepare(v, source="t")
    if p.events is None:
        return
    enc = encode(v, source="t", received_at=p.events.column("received_at")[0].as_py())
    out = decode(_as_consumed([m for m in enc.msgs if m.kind == "events"]), NAMES)
    assert out.failed == []
    assert out.events.schema == p.events.schema and _bag(out.events) == _bag(p.events)


def test_one_poison_line_in_a_big_batch_costs_a_few_parses_not_one_per_line(monkeypatch):
    """A batch of 2,000 good event rows with one poison line: the good rows kept in order, the poison named
    with its offset, in at most 2 log2(n) + 2 = 24 parses of Arrow's JSON reader. Parsing line by line took
    2,001 (about a millisecond each: a batch of 15,000 rows with one poison line took 14 s, past the loader's
    max.poll.interval, and its commit never succeeded; bench/faults.py --kafka found it)."""
    import math

    from ubi_pipeline.loader import decode as decode_module

    body = orjson.dumps([{"action_name": "click", "timestamp": "2024-05-16T12:00:00Z", "event_id": f"e{i}",
                          "query_id": f"q{i}"} for i in range(2000)])
    msgs = encode(validate_items(parse_items(body, "event")), source="test").msgs
    recs = _as_consumed(msgs)
    recs.insert(1234, InRecord("ubi.events", 0, 99_999, b"not json"))
    calls = []
    real = decode_module._read_rows
    monkeypatch.setattr(decode_module, "_read_rows", lambda kind, values: calls.append(len(values)) or real(kind, values))
    out = decode(recs, NAMES)
    assert out.events.column("event_id").to_pylist() == [f"e{i}" for i in range(2000)]
    assert [(f["kafka_offset"], f["kind"]) for f in out.failed] == [(99_999, "poison")]
    assert "malformed JSON" in out.failed[0]["reason"]
    assert len(calls) <= 2 * math.ceil(math.log2(len(recs))) + 2, len(calls)


def test_a_record_whose_row_no_message_can_hold_is_rejected_on_its_own():
    """A query record with 2,000 hit ids of 256 characters (a list has no item limit): its stored row is about
    520 KB, over the 256 KiB a message holds (transport.wire.MAX_VALUE_BYTES). It is rejected with its reason
    and kept as a .failed record; the record beside it goes on; no message is over the limit. Before, the row
    went out as a 520 KB message: a 4.9 MB one was refused by the producer, spooled, and stuck the spool."""
    from ubi_pipeline.transport.wire import MAX_VALUE_BYTES

    body = orjson.dumps([{"query_id": "big", "user_query": "q", "query_response_hit_ids": ["h" * 256] * 2000},
                         {"query_id": "ok", "user_query": "q", "query_response_hit_ids": ["d1", "d2"]}])
    enc = encode(validate_items(parse_items(body, "query")), source="/v1/queries")
    assert (enc.queries, [e.index for e in enc.errors]) == (1, [0])
    assert "cannot be stored: its stored row is" in enc.errors[0].message
    assert "a Kafka message holds at most 262,144" in enc.errors[0].message
    assert max(len(m.value) for m in enc.msgs) <= MAX_VALUE_BYTES
    out = decode(_as_consumed(enc.msgs), NAMES)
    assert out.queries.column("query_id").to_pylist() == ["ok"]
    assert [(f["kind"], f["item_index"]) for f in out.failed] == [("query", 0)]
