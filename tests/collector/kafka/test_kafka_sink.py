"""The Kafka sink in-process against a real broker: topics, keys, acknowledgements, spooling and replay."""

from __future__ import annotations

import json
import re

import orjson
import pytest
from conftest import Broker
from fastapi.testclient import TestClient
from kafka_support import read_topic, rows_of, wait_for

from ubi_pipeline.collector.app import create_app
from ubi_pipeline.collector.errors import SinkUnavailable
from ubi_pipeline.collector.ingest import parse_items, validate_items
from ubi_pipeline.collector.sinks.kafka import KafkaSink
from ubi_pipeline.collector.spool import SpoolFull
from ubi_pipeline.schemas.settings import Settings

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


def _events(qid: str, seqs: range) -> bytes:
    return json.dumps([{"action_name": "click", "timestamp": "2024-05-16T12:00:00Z", "query_id": qid,
                        "event_id": f"{qid}:{s}", "message": f"{qid}#{s}"} for s in seqs]).encode()


def test_records_reach_their_topics_keyed_by_query_id_once_acknowledged(broker, prefix, tmp_path):
    sink = KafkaSink(Settings(kafka_bootstrap=broker.bootstrap, kafka_topic_prefix=prefix, spool_dir=tmp_path))
    try:
        assert sink.health()["mode"] == "direct" and sink.health()["broker"] == "up"
        q = validate_items(parse_items(b'{"query_id": "qa", "user_query": "shoes"}', "query"))
        assert sink.write(q, source="/v1/queries").public() == {"accepted": 1, "duplicates": 0, "rejected": 0,
                                                                "errors": []}
        body = _events("qa", range(3))[:-1] + b', {"action_name": "click"}]'  # 3 good events, 1 without timestamp
        result = sink.write(validate_items(parse_items(body, "event")), source="/v1/events")
        assert (result.accepted, result.events, result.rejected) == (3, 3, 1)
        sink.write(validate_items(parse_items(_events("qb", range(2)), "event")), source="/v1/events")
        sink.keep_unparseable(b"{not json", source="/v1/events", reason="malformed JSON").result()
        gauges = sink.gauges()
    finally:
        sink.close()
    # messages: 1 query, qa's events + 1 reject, qb's events, 1 kept body
    assert gauges["produced_records_total"] == 1 + 2 + 1 + 1 and gauges["spool_records"] == 0

    queries = read_topic(broker.bootstrap, f"{prefix}.queries")
    events = read_topic(broker.bootstrap, f"{prefix}.events")
    failed = read_topic(broker.bootstrap, f"{prefix}.failed")
    assert [row["query_key"] for _, _, row in rows_of(queries)] == ["qa\x1f"]
    # One message per search per request: qa's 3 events in one, qb's 2 in another; rejects one each.
    assert len(events) == 2 and len(rows_of(events)) == 5 and len(failed) == 2
    # Keyed by query_id: a search's query and events share a partition (same key, same partition count),
    # and its events keep their order there.
    part = {row["query_id"]: p for p, _, row in rows_of(events)}
    assert part["qa"] == queries[0][0]
    qa = [row["message"] for p, _, row in rows_of(events) if p == part["qa"]]
    assert [m for m in qa if m.startswith("qa")] == ["qa#0", "qa#1", "qa#2"]
    reasons = sorted((orjson.loads(v)["kind"], orjson.loads(v)["reason"]) for _, _, v in failed)
    assert reasons[0] == ("body", "malformed JSON")
    assert reasons[1][0] == "event" and "'timestamp' is required" in reasons[1][1]


def test_broker_down_spools_then_replays_in_order_and_metrics_show_it(tansu, prefix, tmp_path):
    """No broker at start: requests are acknowledged from the spool (fsync'd); /healthz and /metrics show
    the depth; when a broker comes up the spool is replayed in order, once, and production goes direct."""
    down = Broker(tansu, tmp_path)  # its port is free: nothing listens yet
    settings = Settings(kafka_bootstrap=down.bootstrap, kafka_topic_prefix=prefix, spool_dir=tmp_path / "spool",
                        kafka_ack_timeout=1.0)
    sink = KafkaSink(settings)
    app = create_app(settings, sink, extensions=False)
    try:
        with TestClient(app) as client:
            for i in range(3):
                r = client.post("/v1/events", content=_events("qs", range(3 * i, 3 * i + 3)))
                assert r.status_code == 202 and r.json()["accepted"] == 3
            health = client.get("/healthz").json()
            assert health["mode"] == "spooling" and health["broker"] == "unreachable"
            # 3 spool entries (one per request), each one message of 3 rows (one search)
            assert (health["spool"]["entries"], health["spool"]["records"]) == (3, 3)
            metrics = client.get("/metrics").text
            assert re.search(r'ubi_sink_spool_records\{sink="kafka"\} 3(\.0)?$', metrics, re.M)

            down.start()
            wait_for(lambda: client.get("/healthz").json()["mode"] == "direct", 60, "the spool to be replayed")
            r = client.post("/v1/events", content=_events("qs", range(9, 10)))
            assert r.status_code == 202
            metrics = client.get("/metrics").text
            assert re.search(r'ubi_sink_spool_replayed_records_total\{sink="kafka"\} 3(\.0)?$', metrics, re.M)
            assert re.search(r'ubi_sink_spool_records\{sink="kafka"\} 0(\.0)?$', metrics, re.M)
        events = read_topic(down.bootstrap, f"{prefix}.events")
    finally:
        sink.close()
        down.kill()
    assert [row["message"] for _, _, row in rows_of(events)] == [f"qs#{i}" for i in range(10)]


def test_a_full_spool_answers_503_with_retry_after(tansu, prefix, tmp_path):
    down = Broker(tansu, tmp_path)  # never started
    settings = Settings(kafka_bootstrap=down.bootstrap, kafka_topic_prefix=prefix, spool_dir=tmp_path / "spool",
                        kafka_ack_timeout=0.5, spool_max_bytes=2048)
    sink = KafkaSink(settings)
    app = create_app(settings, sink, extensions=False)
    try:
        with TestClient(app) as client:
            assert client.post("/v1/events", content=_events("qf", range(2))).status_code == 202
            r = client.post("/v1/events", content=_events("qf", range(2, 40)))
            assert r.status_code == 503 and r.headers["retry-after"] == "5"
            assert "spool is full" in r.json()["message"]
            spool = client.get("/healthz").json()["spool"]
            assert (spool["entries"], spool["records"]) == (1, 1)  # the first request only, one message
        with pytest.raises(SpoolFull):
            sink.write(validate_items(parse_items(_events("qf", range(2, 40)), "event")), source="t")
    finally:
        sink.close()
    assert issubclass(SpoolFull, SinkUnavailable)
