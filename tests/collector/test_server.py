"""A real ``ubi serve`` (uvicorn on a free loopback port, in a subprocess): 202 means durable, and the
one-writer design lets readers, loaders and ``ubi import`` work while it runs."""

from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor

import duckdb
import httpx
import orjson
import pyarrow as pa
import pytest
from tests_collector_support import SAMPLE_EVENTS, SAMPLE_QUERIES, start_server
from tests_collector_support import run_ubi as ubi_main

from tests.conftest import SAMPLE_LOG, shared_path
from ubi_pipeline.store.client import load_derived, open_reader, sidecar_path


def stored_ids(db, table: str, column: str) -> set[str]:
    """The ids in ``table`` as a reader sees them (``open_reader``: it first writes what a collector that
    stopped had answered from its answer log but not committed)."""
    con = open_reader(db)
    try:
        return {r[0] for r in con.execute(f"SELECT {column} FROM {table}").fetchall()}
    finally:
        con.close()


def send_mixed_load(url: str, make_event, make_query, rounds: int = 6) -> tuple[set[str], set[str]]:
    """Post through every ingest route; return the event_ids and query_ids of acknowledged (202) records."""
    events: set[str] = set()
    queries: set[str] = set()
    with httpx.Client(base_url=url, timeout=30) as c:
        for r in range(rounds):
            batch = [make_event(event_id=f"e{r}-{i}") for i in range(50)]
            assert c.post("/v1/events", json=batch).status_code == 202
            events.update(e["event_id"] for e in batch)
            single = make_event(event_id=f"s{r}")
            assert c.post("/ubi_events", json=[single]).status_code == 202
            events.add(single["event_id"])
            nd = [make_event(event_id=f"n{r}-{i}") for i in range(5)]
            resp = c.post(
                "/v1/events",
                content=b"\n".join(orjson.dumps(e) for e in nd),
                headers={"content-type": "application/x-ndjson"},
            )
            assert resp.status_code == 202
            events.update(e["event_id"] for e in nd)
            q = make_query(query_id=f"q{r}")
            assert c.post("/ubi_queries", json=[q]).status_code == 202
            queries.add(q["query_id"])
    return events, queries


def test_acknowledged_records_survive_a_graceful_stop(db, make_event, make_query):
    server = start_server(db)
    assert json.loads(sidecar_path(db).read_text())["url"] == server.url
    events, queries = send_mixed_load(server.url, make_event, make_query)
    assert server.stop(signal.SIGTERM) == 0
    assert not sidecar_path(db).exists()  # the sidecar goes with the collector
    # 6 rounds x (50 + 1 + 5) events and 6 query records were acknowledged
    assert (len(events), len(queries)) == (336, 6)
    assert stored_ids(db, "ubi_events", "event_id") == events
    assert stored_ids(db, "ubi_queries", "query_id") == queries


def test_acknowledged_records_survive_sigkill(db, make_event, make_query):
    server = start_server(db)
    events, queries = send_mixed_load(server.url, make_event, make_query, rounds=3)
    server.stop(signal.SIGKILL)  # right after the last 202: no shutdown, no checkpoint
    assert server.proc.returncode == -signal.SIGKILL
    # Answered from the answer log or committed (replayed from DuckDB's WAL on open): the reader sees them all.
    assert stored_ids(db, "ubi_events", "event_id") == events
    assert stored_ids(db, "ubi_queries", "query_id") == queries
    # The stale sidecar does not stop readers: the file is no longer locked.
    con = open_reader(db)
    assert con.execute("SELECT count(*) FROM ubi_events").fetchone() == (len(events),)
    con.close()


def test_readers_loaders_and_import_work_while_the_collector_runs(db, make_event, capsys):
    server = start_server(db)
    try:
        # A second collector on the same file is refused (DuckDB allows one writing process): exit code 2.
        assert ubi_main(["serve", "--db", str(db), "--port", "0"]) == 2

        # Concurrent single-event requests share commits (group commit) and are all acknowledged.
        singles = [make_event(event_id=f"c{i}") for i in range(200)]
        with httpx.Client(base_url=server.url, timeout=30) as c, ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(lambda e: c.post("/v1/events", json=e).status_code, singles))
            assert codes == [202] * 200
            metrics = c.get("/metrics").text
        commits = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith('ubi_sink_commits_total{sink="duckdb"}')
        )
        assert commits <= 200

        # A reader reads the sealed segments the collector writes for it.
        con = open_reader(db)
        assert con.execute("SELECT count(*) FROM ubi_events").fetchone() == (200,)
        con.close()

        # A processor's derived table goes in through the collector.
        table = pa.table(
            {
                "query": ["shoes"],
                "doc_id": ["d1"],
                "source": ["implicit:ctr"],
                "created_at": pa.array([0], pa.timestamp("us")),
            }
        )
        assert load_derived(db, "judgments", table) == 1

        # `ubi import` sends the sample through the collector's /v1/bulk, in chunks.
        assert ubi_main(["import", str(shared_path(SAMPLE_LOG)), "--db", str(db), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["via"] == server.url
        assert (out["queries"], out["events"], out["duplicates"], out["rejected"]) == (
            SAMPLE_QUERIES,
            SAMPLE_EVENTS,
            0,
            0,
        )
        assert ubi_main(["import", str(shared_path(SAMPLE_LOG)), "--db", str(db), "--json"]) == 0
        again = json.loads(capsys.readouterr().out)
        assert (again["accepted"], again["duplicates"]) == (0, 3921)

        # `ubi failed` asks the collector too.
        httpx.post(server.url + "/v1/events", content=b"{broken", timeout=30)
        assert ubi_main(["failed", "--db", str(db), "--json"]) == 0
        page = json.loads(capsys.readouterr().out)
        assert page["total"] == 1 and page["items"][0]["raw"] == "{broken"
    finally:
        assert server.stop() == 0
    assert len(stored_ids(db, "ubi_events", "event_key")) == 200 + SAMPLE_EVENTS
    assert stored_ids(db, "judgments", "doc_id") == {"d1"}


@pytest.mark.parametrize("flag", ["--help"])
def test_serve_help_explains(flag, capsys):
    with pytest.raises(SystemExit):
        ubi_main(["serve", flag])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "A 202 is sent only once the records are durable" in text and "--ack {log,commit}" in text
    assert "keep working while it runs" in text


def test_bad_items_are_rejected_one_by_one_over_http(db):
    """Inputs that used to fail a whole request (422) or be refused as malformed JSON (400)."""
    server = start_server(db)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            # The second item's offset takes it to year 0 in UTC (an OverflowError in Python's datetime)
            r = c.post(
                "/v1/events",
                json=[
                    {"action_name": "good1", "timestamp": "2024-01-01T00:00:00Z"},
                    {"action_name": "click", "timestamp": "0001-01-01T00:00:00+05:00"},
                ],
            )
            assert r.status_code == 202
            body = r.json()
            assert (body["accepted"], body["rejected"]) == (1, 1)
            assert (body["errors"][0]["index"], body["errors"][0]["field"]) == (1, "timestamp")
            # orjson reads 12345678901234567890123 as 1.2345678901234568e+22: refused, asking for a string
            r = c.post(
                "/v1/events",
                content=b'[{"action_name": "good2", "timestamp": 1}, {"action_name": "c", "timestamp": 1, '
                b'"event_attributes": {"object": {"object_id": 12345678901234567890123}}}]',
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 202
            (err,) = r.json()["errors"]
            assert (err["index"], err["field"]) == (1, "event_attributes.object.object_id")
            assert "send ids this long as strings" in err["message"]
            # A UTF-8 byte order mark before JSON, NDJSON and _bulk bodies
            bom = b"\xef\xbb\xbf"
            ev = orjson.dumps({"action_name": "good3", "timestamp": 2})
            for path, content, ctype in (
                ("/v1/events", bom + b"[" + ev + b"]", "application/json"),
                ("/v1/events", bom + ev + b"\n", "application/x-ndjson"),
                (
                    "/v1/bulk",
                    bom + b'{"index": {"_index": "ubi_events", "_id": "b"}}\n' + ev + b"\n",
                    "application/x-ndjson",
                ),
            ):
                r = c.post(path, content=content, headers={"content-type": ctype})
                assert (r.status_code, r.json()["rejected"]) == (202, 0), (path, r.text)
    finally:
        assert server.stop() == 0
    # good1, good2, good3 (the first two good3 bodies are the same event: one hash key) and bulk id b
    assert stored_ids(db, "ubi_events", "action_name") == {"good1", "good2", "good3"}
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM ubi_events").fetchone() == (4,)
        assert con.execute("SELECT field FROM failed_records ORDER BY field").fetchall() == [
            ("event_attributes.object.object_id",),
            ("timestamp",),
        ]
    finally:
        con.close()


def test_import_through_a_collector_keeps_going_past_a_record_over_its_body_limit(tmp_path, make_event, capsys):
    # issue 25: one record larger than the running collector's body limit (413) aborted the whole `ubi import`,
    # and the records after it were never sent. Now the chunk is sent again in halves: the big record is that
    # record's error, every other record is stored.
    db = tmp_path / "held.duckdb"
    server = start_server(db, env={"UBI_MAX_BODY_BYTES": "4096"})
    try:
        small = [make_event(event_id=f"e{i}") for i in range(40)]
        big = make_event(event_id="big", event_attributes={"note": "v" * 6000})  # ~6 KB of JSON, under 8 KiB
        path = tmp_path / "events.ndjson"
        path.write_text("\n".join(json.dumps(e) for e in [*small[:20], big, *small[20:]]) + "\n")
        assert ubi_main(["import", "--db", str(db), str(path), "--json"]) == 1  # some rejected
        out = json.loads(capsys.readouterr().out)
    finally:
        server.stop()
    assert stored_ids(db, "ubi_events", "event_id") == {f"e{i}" for i in range(40)}
    (report,) = out["files"]
    assert (report["accepted"], report["rejected"]) == (40, 1)
    assert "too large" in json.dumps(report["errors"])
