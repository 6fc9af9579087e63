"""The collector's HTTP contract through the ASGI client: statuses, partial acceptance, nothing lost."""

from __future__ import annotations

import base64
from concurrent.futures import Future
from typing import Any

import orjson
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from tests_collector_support import SAMPLE_EVENTS, SAMPLE_QUERIES

from tests.conftest import SAMPLE_LOG, shared_path
from ubi_pipeline.collector.app import create_app
from ubi_pipeline.collector.errors import RequestError, SinkUnavailable
from ubi_pipeline.collector.ingest import IngestContext, Validated
from ubi_pipeline.collector.sinks.base import Sink
from ubi_pipeline.schemas.settings import Settings

NDJSON = {"content-type": "application/x-ndjson"}


def failed(client: TestClient, where: str = "", params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """failed_records rows (kind, item_index, field, reason, raw), oldest first, read through the app's store."""
    store = client.app.state.collector.sink.store
    return store.read(
        f"SELECT kind, item_index, field, reason, raw FROM failed_records {where} "
        "ORDER BY received_at, item_index",
        params or [],
    )


def stored(client: TestClient, table: str) -> int:
    return client.app.state.collector.sink.store.read(f"SELECT count(*) FROM {table}")[0][0]


# ---------------------------------------------------------------- the real sample


def test_sample_bulk_export_is_accepted_then_deduplicated(client):
    body = shared_path(SAMPLE_LOG).read_bytes()
    first = client.post("/v1/bulk", content=body, headers=NDJSON)
    assert first.status_code == 202
    assert first.json() == {
        "accepted": SAMPLE_QUERIES + SAMPLE_EVENTS,
        "duplicates": 0,
        "rejected": 0,
        "errors": [],
    }
    assert (stored(client, "ubi_queries"), stored(client, "ubi_events")) == (SAMPLE_QUERIES, SAMPLE_EVENTS)
    again = client.post("/v1/bulk", content=body, headers=NDJSON)
    # 473 + 3,448 = 3,921 records, every one already stored
    assert again.json() == {"accepted": 0, "duplicates": 3921, "rejected": 0, "errors": []}
    assert (stored(client, "ubi_queries"), stored(client, "ubi_events")) == (SAMPLE_QUERIES, SAMPLE_EVENTS)
    assert failed(client) == []


def test_bulk_ids_become_event_ids(client):
    body = shared_path(SAMPLE_LOG).read_bytes()
    client.post("/v1/bulk", content=body, headers=NDJSON)
    lines = body.splitlines()
    first_event_action = next(orjson.loads(a) for a in lines[::2] if b'"ubi_events"' in a)
    event_id = first_event_action["index"]["_id"]
    rows = client.app.state.collector.sink.store.read(
        "SELECT event_key FROM ubi_events WHERE event_id = ?", [event_id]
    )
    assert rows == [("id:" + event_id,)]


# ---------------------------------------------------------------- body shapes and routes


@pytest.mark.parametrize("path", ["/v1/events", "/ubi_events"])
def test_one_object_an_array_and_ndjson(client, make_event, path):
    one = client.post(path, json=make_event())
    array = client.post(path, json=[make_event(), make_event()])
    nd = client.post(
        path, content=b"\n".join(orjson.dumps(make_event()) for _ in range(3)) + b"\n", headers=NDJSON
    )
    assert [r.status_code for r in (one, array, nd)] == [202, 202, 202]
    assert [r.json()["accepted"] for r in (one, array, nd)] == [1, 2, 3]
    assert stored(client, "ubi_events") == 6


@pytest.mark.parametrize("path", ["/v1/queries", "/ubi_queries"])
def test_queries_routes_take_the_reference_clients_one_element_arrays(client, make_query, path):
    r = client.post(path, json=[make_query()])
    assert r.status_code == 202 and r.json()["accepted"] == 1
    assert stored(client, "ubi_queries") == 1


def test_ndjson_without_its_content_type_is_still_read(client, make_event):
    body = orjson.dumps(make_event()) + b"\n" + orjson.dumps(make_event())
    assert client.post("/v1/events", content=body).json()["accepted"] == 2


def test_unknown_route_and_method(client):
    assert client.post("/v1/nothing", content=b"{}").status_code == 404
    assert client.get("/v1/events").status_code == 405


# ---------------------------------------------------------------- partial acceptance


def test_invalid_items_are_rejected_alone_and_kept(client, make_event):
    body = [make_event(), make_event(timestamp=...), make_event(client_id=7), make_event(), "not an object"]
    r = client.post("/v1/events", json=body)
    assert r.status_code == 202
    out = r.json()
    assert (out["accepted"], out["rejected"]) == (2, 3)
    assert [(e["index"], e["field"]) for e in out["errors"]] == [
        (1, "timestamp"),
        (2, "client_id"),
        (4, None),
    ]
    assert out["errors"][0]["message"] == "'timestamp' is required"
    assert "valid string" in out["errors"][1]["message"] and "(got 7)" in out["errors"][1]["message"]
    assert out["errors"][2]["message"] == "expected a JSON object, got a string"
    rows = failed(client)
    assert [(k, i, f) for k, i, f, _, _ in rows] == [
        ("event", 1, "timestamp"),
        ("event", 2, "client_id"),
        ("event", 4, None),
    ]
    assert orjson.loads(rows[1][4])["client_id"] == 7  # the raw item is kept as sent
    assert rows[0][3] == "'timestamp' is required"


def test_ndjson_bad_line_rejects_that_item_and_names_its_line(client, make_event):
    body = orjson.dumps(make_event()) + b"\n{not json\n" + orjson.dumps(make_event()) + b"\n"
    r = client.post("/v1/events", content=body, headers=NDJSON)
    assert r.status_code == 202
    assert (r.json()["accepted"], r.json()["rejected"]) == (2, 1)
    assert r.json()["errors"][0]["index"] == 1
    assert r.json()["errors"][0]["message"].startswith("line 2, column 2: malformed JSON")
    assert failed(client)[0][4] == b"{not json"


def test_query_conflict_first_write_wins_and_the_conflict_is_kept(client, make_query):
    first = make_query(query_id="q-c", user_query="shoes")
    assert client.post("/v1/queries", json=first).json()["accepted"] == 1
    retry = client.post("/v1/queries", json=first).json()
    assert (retry["accepted"], retry["duplicates"], retry["rejected"]) == (0, 1, 0)
    other = client.post("/v1/queries", json=make_query(query_id="q-c", user_query="boots")).json()
    assert (other["accepted"], other["rejected"]) == (0, 1)
    assert other["errors"][0]["field"] == "query_id" and "first write wins" in other["errors"][0]["message"]
    assert [(k, f) for k, _, f, _, _ in failed(client)] == [("conflict", "query_id")]
    assert client.app.state.collector.sink.store.read("SELECT user_query FROM ubi_queries") == [("shoes",)]


def test_multi_search_responses_under_one_query_id_are_not_conflicts(client, make_query):
    body = [
        make_query(query_id="q-m", query_response_id="r1"),
        make_query(query_id="q-m", query_response_id="r2"),
    ]
    assert client.post("/v1/queries", json=body).json()["accepted"] == 2


def test_retries_never_double_count(client, make_event):
    body = [make_event(), make_event(event_id="e-1")]
    assert client.post("/v1/events", json=body).json()["accepted"] == 2
    again = client.post("/v1/events", json=list(reversed(body))).json()
    assert (again["accepted"], again["duplicates"]) == (0, 2)
    same_in_one = client.post("/v1/events", json=[make_event(event_id="e-2")] * 3).json()
    assert (same_in_one["accepted"], same_in_one["duplicates"]) == (1, 2)
    assert stored(client, "ubi_events") == 3


# ---------------------------------------------------------------- refused bodies


def test_malformed_json_is_400_with_line_and_column_and_kept(client):
    body = b'[{"action_name": "click",\n  "timestamp": }]'
    r = client.post("/v1/events", content=body)
    assert r.status_code == 400
    # line 2 is `  "timestamp": }`; the "}" that breaks it is its 16th character
    assert (r.json()["line"], r.json()["column"]) == (2, 16)
    assert "line 2, column 16" in r.json()["message"]
    assert [(k, raw) for k, _, _, _, raw in failed(client)] == [("body", body)]


def test_empty_body_is_400_and_kept(client):
    assert client.post("/v1/events", content=b"").status_code == 400
    assert [k for k, *_ in failed(client)] == ["body"]


def test_body_over_the_byte_limit_is_413_and_not_stored(db):
    app = create_app(Settings(db=db, max_body_bytes=1000), extensions=False)
    with TestClient(app) as c:
        r = c.post("/v1/events", content=b"x" * 1001)
        assert r.status_code == 413 and "1000 bytes" in r.json()["message"]

        def chunks():  # no Content-Length: the limit is enforced while streaming
            for _ in range(20):
                yield b" " * 100

        r = c.post("/v1/events", content=chunks())
        assert r.status_code == 413
        assert failed(c) == []


def test_too_many_items_is_413_and_kept(db, make_event):
    app = create_app(Settings(db=db, max_items=3), extensions=False)
    with TestClient(app) as c:
        r = c.post("/v1/events", json=[make_event() for _ in range(4)])
        assert r.status_code == 413 and "4 items" in r.json()["message"]
        assert stored(c, "ubi_events") == 0
        assert [k for k, *_ in failed(c)] == ["too_large"]


def test_wrong_content_type_is_415_and_kept(client):
    r = client.post("/v1/events", content=b"<event/>", headers={"content-type": "application/xml"})
    assert r.status_code == 415
    assert [(k, raw) for k, _, _, _, raw in failed(client)] == [("body", b"<event/>")]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"\xff\xfe\x00", 400),  # invalid UTF-8
        (b"[" * 5000, 400),  # deeper than any JSON parser here nests
        (b'{"action_name": "c", "timestamp": 1e999}', 400),  # a number that is infinite
        (b'{"action_name": "c", "timestamp": NaN}', 400),  # NaN is not JSON
        # a request whose only item is rejected: 422 naming it (issue 28; was 202 {"accepted": 0})
        (b'{"action_name": "c", "timestamp": 123456789012345678901234567890}', 422),  # rejected item: a float
        (b'{"action_name": "c", "timestamp": 18446744073709551615}', 422),  # rejected item: out of range
        (
            b'{"action_name": "c", "timestamp": 1, "x": ' + b'{"a": ' * 300 + b"1" + b"}" * 301,
            422,
        ),  # too deep to store
        (b'{"action_name": "c", "timestamp": 1, "s": "\\ud800"}', 400),  # lone surrogate
        (b'{"action_name": "c", "timestamp": 1, "s": "nul \\u0000 inside"}', 202),  # accepted
        (b"null", 422),
        (b"[]", 202),  # no item at all: nothing rejected
        (b"[[]]", 422),
        (b"\n\n\n", 400),
        (b'"just a string"', 422),
        (b"\x00\x01\x02", 400),
    ],
)
def test_weird_inputs_never_500(client, body, status):
    r = client.post("/v1/events", content=body)
    assert r.status_code == status, r.text
    if status == 400:
        assert [raw for *_, raw in failed(client)] == [body]  # kept as received, bytes for bytes
    for ctype in ("application/x-ndjson", "text/plain", "application/json; charset=utf-8"):
        assert client.post("/v1/events", content=body, headers={"content-type": ctype}).status_code < 500
    assert client.post("/v1/bulk", content=body).status_code < 500
    assert client.post("/v1/queries", content=body).status_code < 500


def test_too_deep_to_store_is_an_item_error(client):
    body = b'[{"action_name": "c", "timestamp": 1, "x": ' + b'{"a": ' * 300 + b"1" + b"}" * 301 + b","
    body += orjson.dumps({"action_name": "c", "timestamp": 2}) + b"]"
    r = client.post("/v1/events", content=body).json()
    assert (r["accepted"], r["rejected"]) == (1, 1)
    assert "254 levels" in r["errors"][0]["message"]


def test_unforeseen_error_is_422_and_the_body_is_kept(client, monkeypatch):
    def broken(items):
        raise RuntimeError("boom")

    monkeypatch.setattr("ubi_pipeline.collector.deps.validate_items", broken)
    r = client.post("/v1/events", content=b'{"action_name": "c"}')
    assert r.status_code == 422 and "boom" in r.json()["message"]
    assert [(k, raw) for k, _, _, _, raw in failed(client)] == [("unprocessable", b'{"action_name": "c"}')]


# ---------------------------------------------------------------- bulk specifics


def test_bulk_bad_pairs_reject_that_record_only(client, make_event, make_query):
    body = b"\n".join(
        [
            b'{"index": {"_index": "ubi_events", "_id": "b1"}}',
            orjson.dumps(make_event()),
            b'{"delete": {"_index": "ubi_events", "_id": "x"}}',
            b'{"index": {"_index": "products"}}',
            b'{"name": "lamp"}',
            b'{"create": {"_index": "ubi_queries"}}',
            orjson.dumps(make_query()),
            b'{"index": {"_index": "ubi_events"}}',
            b'{"action_name": "click", "timestamp": "never"}',
            b'{"index": {"_index": "ubi_events"}}',
        ]
    )
    r = client.post("/v1/bulk", content=body, headers=NDJSON).json()
    assert (r["accepted"], r["rejected"]) == (2, 4)
    assert [(e["index"], e["field"]) for e in r["errors"]] == [
        (1, "action"),
        (2, "_index"),
        (4, "timestamp"),
        (5, None),
    ]
    # line 3 is the delete action; line 10, the last, an action line with nothing after it
    assert "line 3" in r["errors"][0]["message"] and "line 10" in r["errors"][3]["message"]
    assert len(failed(client)) == 4


# ---------------------------------------------------------------- failed records


def test_failed_route_pages_newest_first_and_shows_raw_bytes(client, make_event):
    client.post("/v1/events", content=b"\xff not utf-8")
    client.post("/v1/events", json=[make_event(timestamp=...), make_event(action_name=...)])
    page = client.get("/v1/failed", params={"limit": 2}).json()
    assert page["total"] == 3 and page["next_offset"] == 2
    assert {i["field"] for i in page["items"]} == {"timestamp", "action_name"}  # the newest request
    assert all(i["raw_encoding"] == "utf-8" for i in page["items"])
    last = client.get("/v1/failed", params={"limit": 2, "offset": 2}).json()
    assert last["next_offset"] is None
    (body,) = last["items"]
    assert body["kind"] == "body" and body["raw_encoding"] == "base64"
    assert base64.b64decode(body["raw"]) == b"\xff not utf-8"
    only = client.get("/v1/failed", params={"kind": "body"}).json()
    assert only["total"] == 1
    assert client.get("/v1/failed", params={"limit": 0}).status_code == 422


# ---------------------------------------------------------------- health, metrics, docs


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["sink"] == "duckdb"


def test_metrics_count_what_happened(client, make_event, make_query):
    e1, e2 = make_event(), make_event()
    client.post("/v1/events", json=[e1, e2, make_event(timestamp=...)])  # 2 accepted, 1 rejected
    client.post("/v1/events", json=[e1])  # 1 duplicate
    client.post("/ubi_queries", json=[make_query()])  # 1 accepted query
    client.post("/v1/events", content=b"{")  # 400
    text = client.get("/metrics").text
    lines = set(text.splitlines())
    assert 'ubi_records_accepted_total{kind="event",route="/v1/events"} 2' in lines
    assert 'ubi_records_rejected_total{kind="event",route="/v1/events"} 1' in lines
    assert 'ubi_records_duplicate_total{kind="event",route="/v1/events"} 1' in lines
    assert 'ubi_records_accepted_total{kind="query",route="/ubi_queries"} 1' in lines
    assert 'ubi_requests_total{method="POST",route="/v1/events",status="202"} 2' in lines
    assert 'ubi_requests_total{method="POST",route="/v1/events",status="400"} 1' in lines
    assert 'ubi_bodies_kept_total{kind="body",route="/v1/events"} 1' in lines
    # 3 requests to /v1/events answered before this scrape: every one falls in the +Inf bucket
    assert 'ubi_request_duration_seconds_count{method="POST",route="/v1/events"} 3' in lines
    assert 'ubi_request_duration_seconds_bucket{method="POST",route="/v1/events",le="+Inf"} 3' in lines
    assert "# TYPE ubi_request_duration_seconds histogram" in lines
    assert any(line.startswith('ubi_sink_commits_total{sink="duckdb"}') for line in lines)


def test_openapi_documents_the_record_schemas(client):
    spec = client.get("/openapi.json").json()
    assert {"UbiEvent", "UbiQuery", "Position", "EventAttributes"} <= set(spec["components"]["schemas"])
    body = spec["paths"]["/v1/events"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"]["oneOf"][0] == {"$ref": "#/components/schemas/UbiEvent"}
    assert spec["paths"]["/v1/events"]["post"]["description"].startswith("Store UBI events")


# ---------------------------------------------------------------- admin (one writer, many readers)


def test_admin_seal_lists_the_segments_and_a_second_seal_adds_only_new_rows(client, make_event, tmp_path):
    from ubi_pipeline.store.sealed import MEDIA_TYPE, decode_seal, open_sealed

    client.post("/v1/events", json=[make_event() for _ in range(5)])
    r = client.post("/v1/admin/seal")
    assert r.status_code == 200 and r.headers["content-type"] == MEDIA_TYPE
    assert decode_seal(r.content).new_rows["ubi_events"] == 5
    client.post("/v1/events", json=[make_event() for _ in range(2)])
    sealed = decode_seal(client.post("/v1/admin/seal").content)
    assert sealed.new_rows["ubi_events"] == 2  # only what came since the first seal
    con = open_sealed(sealed)
    assert con.execute("SELECT count(*), count(DISTINCT event_key) FROM ubi_events").fetchone() == (7, 7)
    con.close()


def test_admin_load_takes_an_arrow_stream(client):
    table = pa.table(
        {
            "query": ["shoes"],
            "doc_id": ["d1"],
            "source": ["implicit:ctr"],
            "score": [0.5],
            "created_at": pa.array([0], pa.timestamp("us")),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    r = client.post("/v1/admin/load/judgments", content=sink.getvalue().to_pybytes())
    assert r.status_code == 200 and r.json() == {"table": "judgments", "rows": 1}
    assert stored(client, "judgments") == 1
    assert client.post("/v1/admin/load/judgments", content=b"not arrow").status_code == 400
    assert client.post("/v1/admin/load/ubi_events", content=sink.getvalue().to_pybytes()).status_code == 422


# ---------------------------------------------------------------- extension points


def test_record_filters_run_before_the_sink(db, make_event):
    def no_bots(batch: Validated, ctx: IngestContext) -> Validated:
        for index, event, _ in list(batch.events):
            if event.client_id == "bot":
                batch.reject(index, field="client_id", message="bots are not stored", kind="forbidden")
        return batch

    app = create_app(Settings(db=db), extensions=False, record_filters=[no_bots])
    with TestClient(app) as c:
        r = c.post("/v1/events", json=[make_event(), make_event(client_id="bot")]).json()
        assert (r["accepted"], r["rejected"]) == (1, 1)
        assert r["errors"] == [{"index": 1, "field": "client_id", "message": "bots are not stored"}]
        assert [(k, f) for k, _, f, _, _ in failed(c)] == [("forbidden", "client_id")]


class Refused(RequestError):
    status_code = 403
    kind = "forbidden"


def test_a_filter_can_refuse_the_whole_request(db, make_event):
    def refuse(batch: Validated, ctx: IngestContext) -> Validated:
        if ctx.headers.get("x-api-key") != "k":
            raise Refused("unknown API key", headers={"WWW-Authenticate": "ApiKey"})
        return batch

    app = create_app(Settings(db=db), extensions=False, record_filters=[refuse])
    with TestClient(app) as c:
        r = c.post("/v1/events", json=make_event())
        assert r.status_code == 403 and r.json()["message"] == "unknown API key"
        assert r.headers["www-authenticate"] == "ApiKey"
        assert [k for k, *_ in failed(c)] == ["forbidden"]
        assert c.post("/v1/events", json=make_event(), headers={"x-api-key": "k"}).status_code == 202


class BrokenSink(Sink):
    name = "broken"

    def __init__(self, error: Exception) -> None:
        self.kept: list[bytes] = []
        self.error = error

    def submit(self, batch, *, source):
        fut: Future = Future()
        fut.set_exception(self.error)
        return fut

    def keep_unparseable(self, body, *, source, reason, kind="body"):
        self.kept.append(body)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def health(self):
        return {"sink": self.name, "ok": False}

    def close(self):
        pass


def test_a_failing_sink_acknowledges_nothing(make_event):
    sink = BrokenSink(SinkUnavailable("disk full", retry_after=1))
    with TestClient(create_app(Settings(), sink, extensions=False), base_url="http://localhost") as c:
        r = c.post("/v1/events", json=make_event())
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and "disk full" in r.json()["message"]
        assert c.get("/healthz").status_code == 503
        assert c.get("/v1/failed").status_code == 501  # no local store behind this sink
        assert c.post("/v1/events", content=b"{").status_code == 400
        assert sink.kept == [b"{"]


def test_an_unexpected_sink_error_is_422_and_the_body_is_kept(make_event):
    sink = BrokenSink(KeyError("boom"))
    with TestClient(create_app(Settings(), sink, extensions=False)) as c:
        body = orjson.dumps(make_event())
        r = c.post("/v1/events", content=body)
        assert r.status_code == 422 and "KeyError" in r.json()["message"]
        assert sink.kept == [body]


# ---------------------------------------------------------------- the two ways into an ingest route
# Requests without an Origin header are served by ubi_pipeline.collector.app.IngestFrontDoor, outside the middleware;
# browser requests (Origin) go through the whole stack. Both must answer and count alike.


@pytest.mark.parametrize(
    "body",
    [
        b'[{"action_name": "click", "timestamp": "2024-05-01T00:00:00Z"}, {"timestamp": "nope"}]',
        b'{"action_name": ',  # malformed: 400 with line and column
        b"",
    ],
)
def test_browser_and_server_requests_get_the_same_answer(db, body):
    app = create_app(Settings(db=db), extensions=False)
    with TestClient(app) as c:
        plain = c.post("/v1/events", content=body, headers={"content-type": "application/json"})
        browser = c.post(
            "/v1/events", content=body, headers={"content-type": "application/json", "origin": "http://testserver"}
        )
    assert plain.status_code == browser.status_code
    answer = plain.json()
    if plain.status_code == 202:  # the second was the first's retry: its event is a duplicate
        assert (answer["accepted"], answer["duplicates"]) == (1, 0)
        assert browser.json() == {**answer, "accepted": 0, "duplicates": 1}
    else:
        assert browser.json() == answer and answer["error"] == "BodyError"


def test_an_unforeseen_error_outside_the_middleware_is_a_json_500_and_counted(db, make_event, monkeypatch):
    from ubi_pipeline.collector.deps import Collector

    async def broken(self, *args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(Collector, "accept", broken)
    app = create_app(Settings(db=db), extensions=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/events", json=make_event())
        assert r.status_code == 500
        assert r.json() == {"error": "InternalError", "message": "internal error; the collector logged it"}
        lines = set(c.get("/metrics").text.splitlines())
    assert 'ubi_requests_total{method="POST",route="/v1/events",status="500"} 1' in lines


# ---------------------------------------------------------------- issue 11: what ingest no longer takes at face value


def test_gzip_bodies_are_read_and_the_limit_applies_after_decompression(db, make_event):
    import gzip

    app = create_app(Settings(db=db, max_body_bytes=100_000), extensions=False)
    events = [make_event(event_id=f"gz-{i}") for i in range(20)]
    with TestClient(app) as c:
        r = c.post("/v1/events", content=gzip.compress(orjson.dumps(events)),
                   headers={"content-encoding": "gzip", "content-type": "application/json"})
        assert r.status_code == 202 and r.json()["accepted"] == 20
        # A zip bomb: 10 MB of spaces compress to ~10 kB, under the 100 kB limit; decompressed it is 100x over.
        bomb = gzip.compress(b"[" + b" " * 10_000_000 + b"]")
        assert len(bomb) < 100_000
        r = c.post("/v1/events", content=bomb, headers={"content-encoding": "gzip"})
        assert r.status_code == 413 and "once decompressed" in r.json()["message"]
        # A plain body claiming gzip is refused, not read as it is (and kept, as a malformed body is).
        plain = orjson.dumps(make_event(event_id="not-gzip"))
        r = c.post("/v1/events", content=plain, headers={"content-encoding": "gzip"})
        assert r.status_code == 400 and "not gzip" in r.json()["message"]
        truncated = gzip.compress(orjson.dumps(make_event(event_id="cut")))[:-12]
        assert c.post("/v1/events", content=truncated, headers={"content-encoding": "gzip"}).status_code == 400
        # Other encodings: 415, whatever the body.
        for coding in ("br", "deflate", "gzip, br"):
            r = c.post("/v1/events", content=plain, headers={"content-encoding": coding})
            assert r.status_code == 415 and coding in r.json()["message"], coding
        assert c.post("/v1/events", content=plain, headers={"content-encoding": "identity"}).status_code == 202
        assert stored(c, "ubi_events") == 21
        kept = [(k, raw) for k, _, _, _, raw in failed(c)]
    # Kept: the two bodies that said gzip and were not (as sent); not the bomb, not the 415s.
    assert [k for k, _ in kept] == ["body", "body"] and kept[0][1] == plain


def test_duplicate_json_keys_are_an_item_error_naming_the_key(client, make_event):
    one = orjson.dumps(make_event(event_id="dup-0"))[:-1] + b',"action_name":"purchase"}'
    nested = (b'{"action_name":"click","timestamp":"2024-05-01T00:00:00Z","event_id":"dup-1",'
              b'"event_attributes":{"object":{"object_id":"a","object_id":"b"}}}')
    spaced = b'{"action_name" : "click", "timestamp":"2024-05-01T00:00:00Z", "action_name": "view"}'
    good = orjson.dumps(make_event(event_id="dup-ok"))
    r = client.post("/v1/events", content=b"[" + b",".join([one, nested, spaced, good]) + b"]")
    assert r.status_code == 202
    body = r.json()
    assert (body["accepted"], body["rejected"]) == (1, 3)
    assert [(e["index"], e["field"]) for e in body["errors"]] == [
        (0, "action_name"),
        (1, "event_attributes.object.object_id"),
        (2, "action_name"),
    ]
    assert "duplicate key 'action_name'" in body["errors"][0]["message"]
    # NDJSON and _bulk documents too, by line.
    r = client.post("/v1/events", content=good + b"\n" + one, headers=NDJSON)
    assert r.json()["errors"][0]["message"].startswith("line 2: duplicate key 'action_name'")
    bulk = b'{"index":{"_index":"ubi_events","_id":"b1"}}\n' + one + b"\n"
    r = client.post("/v1/bulk", content=bulk)
    assert r.json()["rejected"] == 1 and r.json()["errors"][0]["field"] == "action_name"
    # One object alone (not an array): rejected as item 0, kept with its bytes.
    r = client.post("/v1/events", content=one)
    assert r.json()["rejected"] == 1
    assert stored(client, "ubi_events") == 1
    kept = {raw for kind, _, _, _, raw in failed(client) if kind == "event"}
    # Kept with every key, the repeated ones too (an array item is written back compactly).
    assert one in kept
    assert b'{"action_name":"click","timestamp":"2024-05-01T00:00:00Z","action_name":"view"}' in kept


def test_bulk_ids_are_validated_like_event_ids(client, make_event):
    doc = orjson.dumps(make_event(event_id=None))
    huge = "x" * 4_900_000
    lines = [
        orjson.dumps({"index": {"_index": "ubi_events", "_id": huge}}), doc,
        orjson.dumps({"index": {"_index": "ubi_events", "_id": {"a": 1}}}), doc,
        orjson.dumps({"index": {"_index": "ubi_events", "_id": ""}}), doc,
        orjson.dumps({"index": {"_index": "ubi_events", "_id": 42}}), doc,
    ]
    r = client.post("/v1/bulk", content=b"\n".join(lines) + b"\n")
    body = r.json()
    assert r.status_code == 202 and (body["accepted"], body["rejected"]) == (1, 3)
    assert [(e["index"], e["field"]) for e in body["errors"]] == [(0, "_id"), (1, "_id"), (2, "_id")]
    assert "at most 100 characters" in body["errors"][0]["message"]
    assert "got an object" in body["errors"][1]["message"]
    store = client.app.state.collector.sink.store
    # Only the numeric id went in, as its decimal text; no 4.9 MB key, no Python repr of a dict.
    assert store.read("SELECT event_id FROM ubi_events") == [("42",)]
    assert store.read("SELECT max(length(event_key)) FROM ubi_events")[0][0] < 200


# ---------------------------------------------------------------- every item rejected (issue 28)


@pytest.mark.parametrize("path", ["/v1/events", "/ubi_events"])
def test_a_request_whose_every_item_is_rejected_gets_422_naming_the_first_errors(client, make_event, path):
    body = [make_event(timestamp=...), make_event(client_id=7), "not an object", make_event(action_name=...)]
    r = client.post(path, json=body)
    assert r.status_code == 422  # was 202 {"accepted": 0}: success to fetch's response.ok and to axios
    out = r.json()
    assert out["error"] == "AllRejected"
    assert out["message"].startswith("every item was rejected (4), nothing was stored: "
                                     "item 0 field timestamp: 'timestamp' is required; item 1 field client_id: ")
    assert "item 2: expected a JSON object, got a string; and 1 more (see errors)" in out["message"]
    assert (out["accepted"], out["duplicates"], out["rejected"]) == (0, 0, 4)
    assert [(e["index"], e["field"]) for e in out["errors"]] == [
        (0, "timestamp"), (1, "client_id"), (2, None), (3, "action_name")]
    assert [(k, i, f) for k, i, f, _, _ in failed(client)] == [  # each item kept, as before
        ("event", 0, "timestamp"), ("event", 1, "client_id"), ("event", 2, None), ("event", 3, "action_name")]


def test_all_rejected_query_records_get_422_too(client, make_query):
    r = client.post("/v1/queries", json=[make_query(timestamp="yesterday")])
    assert r.status_code == 422 and r.json()["rejected"] == 1
    assert r.json()["message"].startswith("every item was rejected (1), nothing was stored: item 0 field timestamp: ")


def test_partly_rejected_duplicates_and_bulk_keep_their_202(client, make_event):
    good = make_event()
    assert client.post("/v1/events", json=[good, make_event(timestamp=...)]).status_code == 202  # partly rejected
    assert client.post("/v1/events", json=[good]).json() == {  # a retry: nothing new, nothing rejected
        "accepted": 0, "duplicates": 1, "rejected": 0, "errors": []}
    retry = client.post("/v1/events", json=[good, make_event(timestamp=...)])  # a duplicate and a rejection
    assert retry.status_code == 202 and (retry.json()["duplicates"], retry.json()["rejected"]) == (1, 1)
    bulk = orjson.dumps({"index": {"_index": "ubi_events"}}) + b"\n" + orjson.dumps(make_event(timestamp=...)) + b"\n"
    r = client.post("/v1/bulk", content=bulk)  # `ubi import` through a collector reads these counts per chunk
    assert r.status_code == 202 and r.json()["rejected"] == 1


def test_rejections_are_logged_at_most_once_per_interval_with_a_count_of_the_rest(client, make_event, caplog):
    now = [1000.0]
    rejections = client.app.state.collector.rejections
    rejections.clock = lambda: now[0]
    caplog.set_level("WARNING", logger="ubi.collector")
    bad = make_event(timestamp="\x1b[31mnot a time\nforged line")
    client.post("/v1/events", json=[make_event(), bad])  # logged: the first in the interval
    for _ in range(3):  # within the interval: counted, not logged
        now[0] += 1
        client.post("/v1/events", json=[bad, bad])
    now[0] += 10  # 13 s after the first line
    client.post("/v1/events", json=[bad])
    lines = [r.getMessage() for r in caplog.records if r.name == "ubi.collector"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("rejected 1 of 2 items on /v1/events: item 1 field timestamp: ")
    assert "\x1b" not in lines[0] and "\n" not in lines[0] and "\\nforged line" in lines[0]
    assert lines[1].startswith("rejected 1 of 1 items on /v1/events: item 0 field timestamp: ")
    # 3 requests of 2 rejected items each went unlogged; 13 s since the last line
    assert lines[1].endswith("(and 6 rejected items in 3 requests not logged in the last 13 s); "
                             "`ubi failed` lists them with their reasons")
