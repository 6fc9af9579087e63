"""The failures the Kafka path must survive, each with real processes and exact counts.

Real parts only: Tansu on loopback, ``ubi serve --sink kafka`` and ``ubi consume`` as subprocesses, a load
generator over HTTP that retries each request until it gets a 202 (so "acknowledged" is exactly what the
clients were told was stored). Expected counts come from the generator's own record of 202s; the store
must hold each acknowledged record once: every query id, and every event's unique ``message`` (an event
stored under two keys would show its message twice).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer
from kafka_support import (
    Consume,
    Load,
    Serve,
    assert_exactly,
    first_occurrence_order,
    read_topic,
    store_contents,
    wait_for,
)

from tests.conftest import SAMPLE_LOG, shared_path
from ubi_pipeline.collector.ingest import parse_bulk, parse_items, validate_items
from ubi_pipeline.collector.sinks.kafka import KafkaSink, encode
from ubi_pipeline.schemas.errors import StoreLocked
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.tables import FAILED_RAW_MAX_BYTES
from ubi_pipeline.store.client import open_reader
from ubi_pipeline.store.parquet_store import open_parquet_reader

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

#: docs/ubi.md: the sample export holds 473 query records and 3,448 events.
SAMPLE_QUERIES, SAMPLE_EVENTS = 473, 3448


def _store_has(db: Path, tag: str, acked_queries: int, acked_events: int, *, starting: bool = False) -> bool:
    """Whether the store (read through the segments the running loader seals) holds as many rows as acked.

    ``starting``: a loader was just started; while it holds the file and has not yet (fully) written its
    sidecar, a reader is refused with StoreLocked ("run this command again once it has finished"): not yet.
    """
    try:
        n_queries, n_events = _store_counts(db, tag)
    except StoreLocked:
        if not starting:
            raise
        return False
    return n_queries >= acked_queries and n_events >= acked_events


def _store_counts(db: Path, tag: str) -> tuple[int, int]:
    con = open_reader(db)
    try:
        qids, msgs = store_contents(con, tag)
    finally:
        con.close()
    return len(qids), len(msgs)


def _state(db: Path, tag: str, load: Load, consume: Consume, serve: Serve) -> dict:
    """What a timed-out wait shows: store vs acknowledged counts, the loader's last line, the collector."""
    try:
        health = serve.health()
    except Exception as exc:  # the collector may be the problem
        health = repr(exc)
    proc, log = consume.proc, consume.log_path
    return {"store": _store_counts(db, tag), "acked": (len(load.acked.queries), load.acked.n_events),
            "loader": consume.last(), "loader_exit": None if proc is None else proc.poll(),
            "loader_log": log.read_text(errors="replace")[-1500:] if log is not None else None, "collector": health}


def _final(db: Path, tag: str) -> tuple[list[str], list[str]]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return store_contents(con, tag)
    finally:
        con.close()


def test_collector_sigkill_keeps_every_acknowledged_record(own_broker, prefix, tmp_path):
    """SIGKILL the collector twice under steady load: once producing directly, once while it spools (broker
    frozen). After each restart every acknowledged record reaches the store, once."""
    serve = Serve(own_broker.bootstrap, prefix, tmp_path / "spool", tmp_path).start()
    db = tmp_path / "ubi.duckdb"
    consume = Consume(own_broker.bootstrap, prefix, f"{prefix}-loader", tmp_path, db=db).start()
    tag = uuid.uuid4().hex[:8]
    load = Load(lambda: [serve.url], tag, threads=3).start()
    try:
        wait_for(lambda: load.acked.n_events >= 300, 60, "300 acknowledged events")
        serve.kill()  # direct mode: whatever was acked is on the broker already
        serve.start()
        at = load.acked.n_events
        wait_for(lambda: load.acked.n_events >= at + 300, 60, "300 more events after the restart")

        own_broker.freeze()  # the broker stops answering: the collector spools what it acknowledges
        wait_for(lambda: serve.health()["spool"]["records"] >= 100, 60, "100 records in the spool")
        spooled = serve.health()["spool"]["records"]
        serve.kill()  # dies with a full spool; the records in it were acknowledged
        serve.start()  # the broker is still frozen: the new process starts spooling at once
        restarted = serve.health()
        assert restarted["mode"] == "spooling" and restarted["spool"]["records"] >= spooled
        own_broker.thaw()
        wait_for(serve.spool_drained, 60, "the restarted collector to replay the dead one's spool")
        assert serve.health()["spool"]["replayed_records"] >= spooled

        at = load.acked.n_events
        wait_for(lambda: load.acked.n_events >= at + 150, 60, "load after the replay")
        acked = load.stop()
        wait_for(serve.spool_drained, 60, "spool drained")
        wait_for(lambda: _store_has(db, tag, len(acked.queries), acked.n_events, starting=True), 90,
                 "the store to catch up",
                 every=1.0, state=lambda: _state(db, tag, load, consume, serve))
    finally:
        load.stop()
        summary = consume.stop()
        serve.stop()
    qids, msgs = _final(db, tag)
    assert_exactly(acked, qids, msgs)
    assert acked.retries > 0  # the kills really interrupted requests in flight
    assert summary["rows"] >= len(acked.queries) + acked.n_events  # copies may be re-read, never fewer


def test_broker_stopped_during_load_records_spooled_and_replayed_in_order(own_broker, prefix, tmp_path):
    """The broker stops answering (frozen), then is killed and a new one started, under steady load.
    Everything acknowledged arrives once, and each query id's events reach the topic in acknowledged order.

    Tansu keeps records in memory, so a killed Tansu loses what it held; a real broker would not. Before the
    kill, the test pauses the collectors (SIGSTOP: clients wait) until the loader has everything the broker
    holds, and reads the topic for the order check; what remains at risk is the collectors' part.

    A restarted Tansu has also lost the consumer group. A loader that stays up re-joins it by itself
    (``Consumer._restart_on_new_topics``), but under a loaded full test run we saw the re-joined member never
    get partitions from Tansu, retry after retry; so, as an operator replacing a broker would, the test stops
    the loader before the kill and starts a new one after the restart. The in-process re-join is not what
    this test proves."""
    serve = Serve(own_broker.bootstrap, prefix, tmp_path / "spool", tmp_path).start()
    db = tmp_path / "ubi.duckdb"
    consume = Consume(own_broker.bootstrap, prefix, f"{prefix}-loader", tmp_path, db=db).start()
    tag = uuid.uuid4().hex[:8]
    load = Load(lambda: [serve.url], tag, threads=3).start()
    topic = f"{prefix}.events"
    try:
        wait_for(lambda: load.acked.n_events >= 200, 60, "200 acknowledged events")
        # 1. broker unreachable (frozen) for a while: spool, then replay when it answers again
        own_broker.freeze()
        wait_for(lambda: serve.health()["spool"]["records"] >= 100, 60, "records spooled while frozen")
        own_broker.thaw()
        wait_for(serve.spool_drained, 60, "replay after the freeze")

        # 2. broker killed and a new (empty) one started on the same port
        at = load.acked.n_events
        wait_for(lambda: load.acked.n_events >= at + 150, 60, "load after the freeze")
        serve.signal(signal.SIGSTOP)
        paused_at = time.time()
        time.sleep(0.5)
        acked_now = (len(load.acked.queries), load.acked.n_events)
        wait_for(lambda: consume.last().get("time", 0) > paused_at + 1.5 and consume.last().get("lag") == 0, 60,
                 "the loader to take everything the broker holds (lag 0)")
        assert _store_has(db, tag, *acked_now)
        before_kill = read_topic(own_broker.bootstrap, topic)
        consume.stop()
        own_broker.kill()
        serve.signal(signal.SIGCONT)
        wait_for(lambda: serve.health()["spool"]["records"] >= 100, 60, "records spooled while the broker is down")
        own_broker.start()
        wait_for(serve.spool_drained, 90, "replay into the new broker (topics re-created)")
        consume = Consume(own_broker.bootstrap, prefix, f"{prefix}-loader", tmp_path, db=db).start()
        at = load.acked.n_events
        wait_for(lambda: load.acked.n_events >= at + 100, 60, "load after the restart")
        acked = load.stop()
        wait_for(serve.spool_drained, 60, "spool drained")
        wait_for(lambda: _store_has(db, tag, len(acked.queries), acked.n_events, starting=True), 90,
                 "the store to catch up",
                 every=1.0, state=lambda: _state(db, tag, load, consume, serve))
        after_restart = read_topic(own_broker.bootstrap, topic)
    finally:
        load.stop()
        consume.stop()
        serve.stop()
    qids, msgs = _final(db, tag)
    assert_exactly(acked, qids, msgs)
    # Order: per query id, first copies appear in the order the collector acknowledged them (0, 1, 2, ...),
    # across both broker incarnations (what the first one held comes first).
    order_old = first_occurrence_order(before_kill)
    order_new = first_occurrence_order(after_restart)
    for qid, seqs in acked.events.items():
        seen = [s for s in order_old.get(qid, [])] + [s for s in order_new.get(qid, []) if s not in
                                                    set(order_old.get(qid, []))]
        assert seen == sorted(seqs), (qid, seen)


def test_consumer_killed_between_write_and_commit_loses_and_doubles_nothing(broker, prefix, tmp_path):
    """The loader is SIGKILLed after writing a batch and before committing its offsets, then restarted:
    the re-delivered batch is counted as duplicates and the store holds the sample exactly once."""
    settings = Settings(kafka_bootstrap=broker.bootstrap, kafka_topic_prefix=prefix, spool_dir=tmp_path / "spool")
    sink = KafkaSink(settings)
    try:
        result = sink.write(validate_items(parse_bulk(shared_path(SAMPLE_LOG).read_bytes())), source="/v1/bulk")
        total = int(sink.gauges()["produced_records_total"])  # Kafka records (a search's rows share one)
    finally:
        sink.close()
    assert (result.queries, result.events) == (SAMPLE_QUERIES, SAMPLE_EVENTS)
    assert sink.gauges()["spooled_records_total"] == 0 and total < SAMPLE_QUERIES + SAMPLE_EVENTS

    db = tmp_path / "ubi.duckdb"
    # The loader prints one JSON line per written batch *before* committing it. Through a 4 KiB pipe
    # nobody reads, the 12th or so line blocks: the process is then stuck between a durable write and its
    # commit, which is where the test kills it.
    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ
    first = Consume(broker.bootstrap, prefix, f"{prefix}-loader", tmp_path, db=db,
                    extra=("--batch-records", "20", "--progress-every", "3600"))
    first.start(stdout=w)
    os.close(w)
    pid = first.proc.pid

    def blocked_on_pipe() -> bool:
        with open(f"/proc/{pid}/wchan") as fh:
            return "pipe_write" in fh.read()

    try:
        wait_for(blocked_on_pipe, 60, "the loader to block printing a written batch")
    finally:
        first.kill()  # also when the wait failed: a loader blocked on a pipe nobody reads never ends
    with os.fdopen(r, "rb") as fh:
        lines = [json.loads(x) for x in fh.read().splitlines() if x.strip()]
    written = [x for x in lines if x["event"] == "written"]
    committed_records = written[-1]["records"]  # every batch before the blocked one was committed
    assert 0 < committed_records < total

    second = Consume(broker.bootstrap, prefix, f"{prefix}-loader", tmp_path, db=db, extra=("--exit-idle", "2"))
    second.start()
    try:
        second.proc.wait(timeout=120)
    finally:
        summary = second.stop()
    # It re-read everything after the last commit, including the batch written before the kill.
    assert summary["records"] == total - committed_records
    duplicates = summary["query_duplicates"] + summary["event_duplicates"]
    assert duplicates >= 1  # the blocked batch: written, never committed, delivered again
    assert summary["queries"] + summary["events"] + duplicates == summary["rows"]
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    counts = con.execute("SELECT (SELECT count(*) FROM ubi_queries), (SELECT count(*) FROM ubi_events), "
                         "(SELECT count(*) FROM failed_records)").fetchone()
    con.close()
    assert counts == (SAMPLE_QUERIES, SAMPLE_EVENTS, 0)


def test_two_collectors_two_consumers_store_exactly_what_was_acknowledged(broker, prefix, tmp_path):
    """Two collectors (one spool folder, a slot each) and two loaders in one group writing one Parquet folder."""
    spool = tmp_path / "spool"
    a = Serve(broker.bootstrap, prefix, spool, tmp_path).start()
    b = Serve(broker.bootstrap, prefix, spool, tmp_path).start()
    assert a.health()["spool"]["dir"] != b.health()["spool"]["dir"]
    out = tmp_path / "parquet"
    c1 = Consume(broker.bootstrap, prefix, f"{prefix}-loaders", tmp_path, parquet=out).start()
    c2 = Consume(broker.bootstrap, prefix, f"{prefix}-loaders", tmp_path, parquet=out).start()
    tag = uuid.uuid4().hex[:8]
    try:
        wait_for(lambda: c1.last().get("partitions") and c2.last().get("partitions")
                 and c1.last()["partitions"] + c2.last()["partitions"] == 18, 60,
                 "both loaders to share the 18 partitions (3 topics x 6)")
        load = Load(lambda: [a.url, b.url], tag, threads=4, max_searches=40, pause=0.0).start()
        acked = load.join(timeout=120)

        def loaded() -> bool:
            con = open_parquet_reader(out)
            try:
                qids, msgs = store_contents(con, tag)
            finally:
                con.close()
            return len(set(qids)) >= len(acked.queries) and len(set(msgs)) >= acked.n_events

        wait_for(loaded, 60, "the Parquet store to catch up", every=0.5)
    finally:
        s1, s2 = c1.stop(), c2.stop()
        a.stop()
        b.stop()
    # 4 threads x 40 searches, each a query record and 6 events.
    assert len(acked.queries) == 160 and acked.n_events == 960
    con = open_parquet_reader(out)
    qids, msgs = store_contents(con, tag)
    con.close()
    assert_exactly(acked, qids, msgs)
    assert s1["records"] > 0 and s2["records"] > 0  # both loaders did part of the work


def test_poison_records_go_to_failed_records_and_the_loader_keeps_going(broker, prefix, tmp_path):
    """Unreadable records (not JSON, wrong schema, empty, a malformed .failed row) are kept with their
    topic, partition and offset; the good records around them are loaded."""
    v = validate_items(parse_items(b'[{"action_name":"click","timestamp":"2024-05-16T12:00:00Z","event_id":"e1",'
                                   b'"query_id":"q1"},{"action_name":"view","timestamp":"2024-05-16T12:00:01Z",'
                                   b'"event_id":"e2","query_id":"q2"}]', "event"))
    good = [m.value for m in encode(v, source="test").msgs]  # two searches: two messages
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    from ubi_pipeline.transport.kafka_client import ensure_topics

    ensure_topics(Settings(kafka_bootstrap=broker.bootstrap, kafka_topic_prefix=prefix), [f"{prefix}.events",
                                                                                          f"{prefix}.failed"])
    sent = []
    for topic, value in [(f"{prefix}.events", good[0]), (f"{prefix}.events", b"not json at all"),
                         (f"{prefix}.events", b'{"action_name": "click"}'), (f"{prefix}.events", b""),
                         (f"{prefix}.failed", b"[1, 2]"), (f"{prefix}.events", good[1])]:
        md = producer.send(topic, value=value, partition=0).get(timeout=10)
        sent.append((topic, md.partition, md.offset, value))
    producer.close()

    db = tmp_path / "ubi.duckdb"
    consume = Consume(broker.bootstrap, prefix, f"{prefix}-loader", tmp_path, db=db, extra=("--exit-idle", "2")).start()
    try:
        assert consume.proc.wait(timeout=90) == 0
    finally:
        summary = consume.stop()
    assert summary["poison"] == 4 and summary["events"] == 2
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT kafka_topic, kafka_partition, kafka_offset, raw, kind, reason FROM failed_records "
                       "ORDER BY kafka_topic, kafka_offset").fetchall()
    events = con.execute("SELECT event_id FROM ubi_events ORDER BY event_id").fetchall()
    con.close()
    assert events == [("e1",), ("e2",)]  # the good record after the poison ones was loaded too
    expected = sorted((t, p, o, v) for t, p, o, v in sent[1:5])
    assert [(t, p, o, bytes(raw) if raw is not None else b"") for t, p, o, raw, _, _ in rows] == expected
    assert all(kind == "poison" for *_, kind, _ in rows)
    reasons = [r[5] for r in rows]
    assert any("malformed JSON" in r for r in reasons)
    assert any("'event_key' is required" in r for r in reasons)  # a client-shaped event is not a stored row
    assert any("empty message value" in r for r in reasons)


def _issue25_pills(prefix: str) -> tuple[list[tuple[str, bytes]], list[bytes]]:
    """Issue 25's poison pills, each between good records: (topic, value) in sending order, and the good
    event ids. A row line is the collector's own good row with one field spoiled."""
    v = validate_items(parse_items(b'[{"action_name":"click","timestamp":"2024-05-16T12:00:00Z","event_id":"g1",'
                                   b'"query_id":"q1","event_attributes":{"object":{"object_id":"d1"}}},'
                                   b'{"action_name":"view","timestamp":"2024-05-16T12:00:01Z","event_id":"g2",'
                                   b'"query_id":"q2"}]', "event"))
    good = [m.value for m in encode(v, source="test").msgs]
    row = json.loads(good[0])

    def spoiled(eid: str, **change: object) -> bytes:
        return json.dumps({**row, "event_key": "id:" + eid, "event_id": eid, **change}).encode()

    q = validate_items(parse_items(b'{"query_id":"q9","user_query":"shoes","query_attributes":{"a":1}}', "query"))
    qrow = json.loads(encode(q, source="test").msgs[0].value)
    failed = {"failed_id": "f-big-index", "source": "/v1/events", "kind": "event", "reason": "r", "raw_b64": None,
              "item_index": 2**40, "received_at": "2024-05-16T12:00:00"}
    pills = [
        (f"{prefix}.events", good[0]),
        (f"{prefix}.failed", json.dumps(failed).encode()),  # item_index 2^40: not an INTEGER
        (f"{prefix}.events", spoiled("p1", event_attributes='{"object": {')),  # not valid JSON
        (f"{prefix}.events", spoiled("p2", extra="not json")),
        (f"{prefix}.queries", json.dumps({**qrow, "query_attributes": "{oops"}).encode()),
        (f"{prefix}.events", spoiled("p3", action_name="a" * 1_000_000)),  # 1 MB action_name
        (f"{prefix}.events", good[1]),
    ]
    return pills, [b"g1", b"g2"]


@pytest.mark.parametrize("target", ["db", "parquet"])
def test_issue25_poison_pills_are_set_aside_and_loading_goes_on(broker, prefix, tmp_path, target):
    """A .failed row whose item_index is 2^40, rows whose query_attributes / event_attributes / extra are not
    JSON, a 1 MB action_name: each kept as poison with its reason, topic, partition and offset; the loader
    commits past them, exits 0, and the good records around them are loaded (issue 25: it exited 3, and
    every restart crashed on the same batch)."""
    from ubi_pipeline.transport.kafka_client import ensure_topics

    pills, good_ids = _issue25_pills(prefix)
    ensure_topics(Settings(kafka_bootstrap=broker.bootstrap, kafka_topic_prefix=prefix),
                  [f"{prefix}.events", f"{prefix}.failed", f"{prefix}.queries"])
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=4 * 1024 * 1024)
    sent = []
    for topic, value in pills:
        md = producer.send(topic, value=value, partition=0).get(timeout=10)
        sent.append((topic, md.partition, md.offset))
    producer.close()

    out = {"db": tmp_path / "ubi.duckdb", "parquet": tmp_path / "pq"}[target]
    kw = {"db": out} if target == "db" else {"parquet": out}
    consume = Consume(broker.bootstrap, prefix, f"{prefix}-loader", tmp_path, extra=("--exit-idle", "2"), **kw).start()
    try:
        assert consume.proc.wait(timeout=90) == 0
    finally:
        summary = consume.stop()
    assert (summary["poison"], summary["events"]) == (5, 2), summary  # 5 pills (hand count), g1 and g2
    if target == "db":
        import duckdb

        con = duckdb.connect(str(out), read_only=True)
    else:
        con = open_parquet_reader(out)
    rows = con.execute("SELECT kafka_topic, kafka_partition, kafka_offset, kind, reason, octet_length(raw) "
                       "FROM failed_records ORDER BY kafka_topic, kafka_offset").fetchall()
    events = con.execute("SELECT event_id FROM ubi_events ORDER BY event_id").fetchall()
    queries = con.execute("SELECT count(*) FROM ubi_queries").fetchall()
    con.close()
    assert [e for (e,) in events] == [g.decode() for g in good_ids]
    assert queries == [(0,)]
    assert sorted((t, p, o) for t, p, o, *_ in rows) == sorted(sent[1:6])
    assert all(kind == "poison" for _, _, _, kind, _, _ in rows)
    reasons = " | ".join(r for *_, r, _ in rows)
    assert "'item_index' must be an integer of 32 bits" in reasons
    assert "'event_attributes' is not valid JSON" in reasons
    assert "'extra' is not valid JSON" in reasons
    assert "'query_attributes' is not valid JSON" in reasons
    assert "'action_name' is 1,000,000 characters; at most 100" in reasons
    assert max(size for *_, size in rows) <= FAILED_RAW_MAX_BYTES  # the 1 MB record kept truncated
