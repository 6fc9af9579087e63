"""The ingest routes' columnar path (``fastpath.prepare_items``, taken by bodies of at least
``HTTP_MIN_ITEMS`` items on the DuckDB sink with no record filter) answers and stores exactly what the
exact path (pydantic, record by record) does: the same bodies are posted to two collectors, one with the
columnar path turned off, and their answers and stored tables compared."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.collector.test_columnar_property import EVENTS, QUERIES, record_line
from ubi_pipeline.collector import deps, fastpath
from ubi_pipeline.collector.app import create_app
from ubi_pipeline.schemas.settings import Settings

NDJSON = {"content-type": "application/x-ndjson"}
_TABLES = {
    "ubi_queries": "* EXCLUDE (received_at)",
    "ubi_events": "* EXCLUDE (received_at)",
    "failed_records": "* EXCLUDE (failed_id, received_at)",
}


def _client(db: Path) -> Iterator[TestClient]:
    # no parse workers: they would take the large bodies before the columnar path (tests/collector/test_workers.py)
    app = create_app(Settings(db=db, parse_workers=0), extensions=False)
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as c:
        yield c


def _stored(client: TestClient) -> dict[str, list[tuple[Any, ...]]]:
    store = client.app.state.collector.sink.store  # type: ignore[attr-defined]
    return {t: sorted(store.read(f"SELECT {cols} FROM {t}"), key=repr) for t, cols in _TABLES.items()}


def _post_both(tmp: Path, requests: list[tuple[str, bytes, dict[str, str]]]) -> list[Any]:
    """The answers and stored rows of ``requests`` on a collector with the columnar path (every body of one
    item or more takes it) and on one without; asserts they are the same and returns the answers."""
    out = []
    for name, least in (("columnar", 1), ("exact", 10**9)):
        gen = _client(tmp / f"{name}.duckdb")
        client = next(gen)
        try:
            with mock.patch.object(deps, "HTTP_MIN_ITEMS", least):
                answers = [(r.status_code, r.json()) for r in
                           (client.post(path, content=body, headers=headers) for path, body, headers in requests)]
            out.append((answers, _stored(client)))
        finally:
            gen.close()
    assert out[0][0] == out[1][0]
    for table in _TABLES:
        assert out[0][1][table] == out[1][1][table], table
    return out[0][0]


def _issue_lines() -> list[str]:
    from tests.collector.test_fastpath import ISSUE_SHAPES, QUERY_SHAPES

    return [line for _, line, _ in ISSUE_SHAPES] + QUERY_SHAPES


def test_every_spelling_over_each_route_agrees(tmp_path: Path) -> None:
    """The issue's spellings (and one invalid event, one repeated key) as NDJSON, a JSON array and a _bulk
    body, each posted twice (the second time: duplicates, so the content-hash keys match)."""
    events = [line for line in _issue_lines() if '"action_name"' in line]
    events += ['{"action_name":"","timestamp":"2024-05-16T12:34:56Z"}',
               '{"action_name":"click","action_name":"view","timestamp":"2024-05-16T12:34:56Z"}']
    queries = [line for line in _issue_lines() if '"action_name"' not in line]
    bulk = "".join(f'{{"index":{{"_index":"ubi_events","_id":"b{i}"}}}}\n{line}\n' for i, line in enumerate(events))
    bulk += "".join(f'{{"index":{{"_index":"ubi_queries"}}}}\n{line}\n' for line in queries)
    requests = [
        ("/v1/events", "\n".join(events).encode(), NDJSON),
        ("/ubi_events", ("[" + ",".join(events) + "]").encode(), {"content-type": "application/json"}),
        ("/v1/queries", "\n".join(queries).encode(), NDJSON),
        ("/v1/bulk", bulk.encode(), NDJSON),
    ]
    answers = _post_both(tmp_path, requests * 2)
    assert answers[0][1]["rejected"] == 2
    assert answers[4][1]["duplicates"] == len(events) - 2


def test_bodies_above_the_threshold_take_the_columnar_path(tmp_path: Path) -> None:
    """A body of HTTP_MIN_ITEMS events reaches prepare_items, a single event does not; the rows are those of
    the exact path (above)."""
    line = '{"action_name":"click","timestamp":"2024-05-16T12:34:56Z","query_id":"q%d"}'
    body = "\n".join(line % i for i in range(fastpath.HTTP_MIN_ITEMS)).encode()
    gen = _client(tmp_path / "t.duckdb")
    client = next(gen)
    try:
        with mock.patch.object(deps, "prepare_items", wraps=fastpath.prepare_items) as spy:
            answer = client.post("/v1/events", content=body, headers=NDJSON).json()
            client.post("/v1/events", content=line.encode() % 1, headers=NDJSON)  # one event: the exact path
        assert spy.call_count == 1
        assert answer["accepted"] == fastpath.HTTP_MIN_ITEMS
    finally:
        gen.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(events=st.lists(st.tuples(EVENTS, st.integers(0, 2), st.integers(0, 19).map(lambda n: n == 0)),
                       min_size=1, max_size=20),
       queries=st.lists(st.tuples(QUERIES, st.integers(0, 2), st.just(False)), min_size=1, max_size=5))
def test_spec_records_over_http_agree(tmp_path_factory: pytest.TempPathFactory,
                                      events: list[tuple[dict[str, Any], int, bool]],
                                      queries: list[tuple[dict[str, Any], int, bool]]) -> None:
    """Records generated from the UBI JSON Schema (test_columnar_property), as NDJSON and as JSON arrays."""
    tmp = tmp_path_factory.mktemp("http")
    ev_lines = [record_line(*e) for e in events]
    requests = [
        ("/v1/events", "\n".join(ev_lines).encode(), NDJSON),
        ("/v1/events", json.dumps([e for e, _, _ in events]).encode(), {"content-type": "application/json"}),
        ("/v1/queries", "\n".join(record_line(*q) for q in queries).encode(), NDJSON),
    ]
    _post_both(tmp, requests)
