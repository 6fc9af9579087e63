"""OpenSearch's own Python client (opensearch-py) against a real ``ubi serve`` on loopback (issue 12).

A sender built for OpenSearch must be able to point at the collector unchanged: ``helpers.bulk`` counts
success from each item's ``status`` and reports only the failed items, ``index`` and ``create`` read
``result`` and raise on 404/409. Expected counts come from the actions written out below.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests_collector_support import Served, count, start_server

opensearchpy = pytest.importorskip("opensearchpy")
from opensearchpy import OpenSearch, helpers  # noqa: E402
from opensearchpy.exceptions import ConflictError, NotFoundError  # noqa: E402


@pytest.fixture
def served(db: Path) -> Iterator[Served]:
    server = start_server(db)
    yield server
    server.stop()


def client_for(server: Served, **options: Any) -> OpenSearch:
    host, port = server.url.removeprefix("http://").split(":")
    return OpenSearch(hosts=[{"host": host, "port": int(port)}], use_ssl=False, timeout=30, **options)


def event(i: int, **fields: Any) -> dict[str, Any]:
    return {
        "action_name": "click",
        "query_id": f"q-{i}",
        "client_id": "c-1",
        "timestamp": f"2024-05-01T00:00:{i:02d}Z",
        "event_attributes": {"object": {"object_id": f"doc-{i}", "object_id_field": "sku"}},
        **fields,
    }


def test_helpers_bulk_counts_success_and_a_retry_does_not_double_count(served: Served, db: Path) -> None:
    client = client_for(served)
    actions = [{"_index": "ubi_events", "_id": f"e-{i}", "_source": event(i)} for i in range(5)]
    actions.append({"_index": "ubi_events", "_id": "e-bad", "_source": {**event(5), "timestamp": "yesterday"}})
    actions.append({"_index": "ubi_queries", "_id": "q-0", "_source": {
        "query_id": "q-0", "user_query": "laptop", "client_id": "c-1", "timestamp": "2024-05-01T00:00:00Z"}})
    actions.append({"_index": "products", "_source": event(6)})  # not a UBI index
    ok, errors = helpers.bulk(client, actions, raise_on_error=False)
    # 5 events and 1 query record stored; the event with a bad timestamp and the unknown index fail.
    assert ok == 6
    assert sorted((e["index"]["status"], e["index"]["_id"] or "") for e in errors) == [(400, "e-bad"), (404, "")]
    bad = next(e["index"] for e in errors if e["index"]["status"] == 400)
    assert bad["error"]["type"] == "mapper_parsing_exception" and bad["error"]["field"] == "timestamp"
    missing = next(e["index"] for e in errors if e["index"]["status"] == 404)
    assert missing["error"]["type"] == "index_not_found_exception" and missing["_index"] == "products"

    # The sender fixes the bad item and, as a cautious retry loop would, sends the whole batch again.
    actions[5] = {"_index": "ubi_events", "_id": "e-bad", "_source": event(5)}
    ok, errors = helpers.bulk(client, actions[:7], raise_on_error=False)
    assert (ok, errors) == (7, [])  # 6 already stored (200 noop) and the fixed one (201)
    # helpers.bulk's default raises on failures, naming only the failed items.
    with pytest.raises(helpers.BulkIndexError) as exc:
        helpers.bulk(client, [actions[0], actions[7]])
    assert [e["index"]["status"] for e in exc.value.errors] == [404]

    served.stop()
    assert count(db, "SELECT count(*) FROM ubi_events") == 6  # e-0..e-4 and e-bad, once each
    assert count(db, "SELECT count(*) FROM ubi_queries") == 1
    assert count(db, "SELECT list(event_id ORDER BY event_id) FROM ubi_events") == [
        "e-0", "e-1", "e-2", "e-3", "e-4", "e-bad"]
    assert count(db, "SELECT count(*) FROM failed_records WHERE kind = 'event'") == 1  # the bad timestamp


def test_connectivity_checks_of_opensearch_clients(served: Served) -> None:
    # issue 28: ping() was False (HEAD / 404), info() raised (GET / 404), indices.exists() raised (HEAD 405)
    client = client_for(served)
    assert client.ping() is True
    info = client.info()
    assert info["version"]["distribution"] == "opensearch" and info["version"]["number"] == "2.19.0"
    assert info["name"] == "ubi-pipeline-collector" and info["cluster_name"] == "ubi-pipeline"
    assert info["tagline"].startswith("The OpenSearch Project")
    assert client.indices.exists(index="ubi_events") is True
    assert client.indices.exists(index="ubi_queries") is True
    assert client.indices.exists(index="products") is False


def test_index_exists_follows_the_configured_index_names(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from ubi_pipeline.collector.app import create_app
    from ubi_pipeline.schemas.settings import Settings

    settings = Settings(db=tmp_path / "ubi.duckdb", event_index="shop-events", query_index="shop-queries")
    with TestClient(create_app(settings)) as c:
        assert [c.head(f"/{name}").status_code for name in ("shop-events", "shop-queries", "ubi_events")] == [
            200, 200, 404]
        assert c.head("/").status_code == 200
        assert c.get("/").json()["cluster_name"] == "ubi-pipeline"
        # the reference client's POST /ubi_events is still the ingest route beside HEAD /{index}
        assert c.post("/ubi_events", json=event(1)).status_code == 202


def test_index_and_create_answer_as_opensearch_does(served: Served, db: Path) -> None:
    client = client_for(served)
    created = client.index(index="ubi_events", body=event(1))  # POST /ubi_events/_doc
    assert created["result"] == "created" and created["_id"]
    assert client.index(index="ubi_events", body=event(2), id="x-2")["result"] == "created"  # PUT _doc/x-2
    assert client.index(index="ubi_events", body=event(2), id="x-2")["result"] == "noop"  # a retry
    assert client.create(index="ubi_events", id="x-3", body=event(3))["result"] == "created"
    with pytest.raises(ConflictError) as conflict:  # create never overwrites: the id is taken
        client.create(index="ubi_events", id="x-3", body=event(3))
    assert conflict.value.status_code == 409
    assert conflict.value.error == "version_conflict_engine_exception"
    with pytest.raises(NotFoundError) as missing:
        client.index(index="products", body=event(4))
    assert missing.value.error == "index_not_found_exception" and "ubi_events" in str(missing.value.info)
    query = {"query_id": "q-9", "user_query": "tent", "timestamp": "2024-05-01T00:00:00Z"}
    assert client.index(index="ubi_queries", body=query)["result"] == "created"
    served.stop()
    assert count(db, "SELECT count(*) FROM ubi_events") == 3
    assert count(db, "SELECT event_id FROM ubi_events WHERE query_id = 'q-3'") == "x-3"
    assert count(db, "SELECT count(*) FROM ubi_queries") == 1


def test_a_compressing_client_is_read(served: Served, db: Path) -> None:
    client = client_for(served, http_compress=True)  # Content-Encoding: gzip on every body
    ok, errors = helpers.bulk(client, [{"_index": "ubi_events", "_id": f"z-{i}", "_source": event(i)}
                                       for i in range(50)], raise_on_error=False)
    assert (ok, errors) == (50, [])
    served.stop()
    assert count(db, "SELECT count(*) FROM ubi_events") == 50


def test_index_names_come_from_settings_and_nothing_else_is_an_index(tmp_path: Path) -> None:
    import orjson
    from fastapi.testclient import TestClient

    from ubi_pipeline.collector.app import create_app
    from ubi_pipeline.schemas.settings import Settings

    settings = Settings(db=tmp_path / "ubi.duckdb", event_index="shop-events", query_index="shop-queries")
    with TestClient(create_app(settings)) as c:
        assert c.post("/shop-events/_doc", json=event(1)).status_code == 201
        assert c.post("/..%2F..%2Fetc/_bulk", json=event(2)).status_code == 404  # not even a route
        for path in ("/ubi_events/_doc", "/ubi_events%27%29%3B%20DROP%20TABLE%20ubi_events%3B--/_doc",
                     "/shop-queries2/_create/x"):
            r = c.post(path, json=event(2))
            assert r.status_code == 404, path
            assert r.json()["error"]["type"] == "index_not_found_exception"
            assert "shop-queries and shop-events" in r.json()["error"]["reason"]
        bulk = b"\n".join([orjson.dumps({"index": {"_index": "ubi_events"}}), orjson.dumps(event(3)),
                           orjson.dumps({"index": {"_index": "shop-events", "_id": "e-4"}}), orjson.dumps(event(4))])
        items = c.post("/_bulk", content=bulk + b"\n").json()["items"]
        assert [i["index"]["status"] for i in items] == [404, 201]
        # _id in the path is checked as event_id is; one document per _doc request.
        r = c.put("/shop-events/_doc/" + "x" * 101, json=event(5))
        assert r.status_code == 400 and r.json()["error"]["type"] == "illegal_argument_exception"
        r = c.post("/shop-events/_doc", json=[event(6), event(7)])
        assert r.status_code == 400 and "one JSON object" in r.json()["error"]["reason"]
        # Validation errors name the field, as OpenSearch's mapper_parsing_exception does.
        r = c.post("/shop-events/_doc", json={**event(8), "timestamp": "soon"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "mapper_parsing_exception"
        store = c.app.state.collector.sink.store
        assert store.read("SELECT count(*) FROM ubi_events") == [(2,)]  # the table names never changed
