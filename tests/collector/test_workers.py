"""Parse workers (``collector/workers.py``): large bodies parsed in other processes are answered and stored
exactly as in the collector's own process, and a worker that dies costs no request.

The same requests go to two collectors on real DuckDB files, one with two spawned parse workers that take
every body (``MIN_BODY_BYTES`` lowered to 1), one with none; their answers and stored tables are compared.
Expected numbers come from the requests themselves (items sent, invalid ones written here)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
from fastapi.testclient import TestClient

from ubi_pipeline.collector import workers
from ubi_pipeline.collector.app import create_app
from ubi_pipeline.collector.workers import BodyRaws, parse_body
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store import answer_log
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.keys import key_hashes

NDJSON = {"content-type": "application/x-ndjson"}
JSON = {"content-type": "application/json"}
_TABLES = {
    "ubi_queries": "* EXCLUDE (received_at)",
    "ubi_events": "* EXCLUDE (received_at)",
    "failed_records": "* EXCLUDE (failed_id, received_at)",
}


def _event(i: int, **over: Any) -> dict[str, Any]:
    e = {"application": "shop", "action_name": "click", "query_id": f"q{i % 7}", "session_id": "s1",
         "client_id": "c1", "timestamp": f"2024-05-16T12:34:{i % 60:02d}.{i % 1000:03d}Z",
         "event_attributes": {"object": {"object_id": f"doc-{i}", "object_id_field": "sku"},
                              "position": {"ordinal": i % 10}}}
    e.update(over)
    return e


def _requests() -> list[tuple[str, bytes, dict[str, str]]]:
    """Bodies of every kind the ingest routes take, each with something a worker must get right."""
    with_ids = [_event(i, event_id=f"e{i}") for i in range(40)]
    no_ids = [_event(i) for i in range(40, 80)]
    invalid = [*no_ids[:5], {"action_name": "click"}, {"action_name": "", "timestamp": "2024-05-16T12:00:00Z"},
               "not an object", _event(99, timestamp="yesterday")]
    conflict = [_event(1, event_id="e1", action_name="add_to_cart")]  # e1 stored above with other content
    bulk = "".join(f'{{"index":{{"_index":"ubi_events","_id":"b{i}"}}}}\n{json.dumps(_event(i))}\n'
                   for i in range(100, 120))
    bulk += '{"index":{"_index":"ubi_queries"}}\n{"query_id":"q1","user_query":"red shoes"}\n'
    queries = "\n".join(json.dumps({"query_id": f"q{i}", "user_query": f"query {i}", "client_id": "c1",
                                    "query_response_hit_ids": [f"doc-{i}", "doc-2"]}) for i in range(10))
    return [
        ("/v1/events", json.dumps(with_ids).encode(), JSON),
        ("/v1/events", json.dumps(with_ids).encode(), JSON),  # a retry: every event a duplicate
        ("/v1/events", "\n".join(json.dumps(e) for e in no_ids).encode(), NDJSON),
        ("/v1/events", json.dumps(invalid).encode(), JSON),
        ("/v1/events", json.dumps(conflict + with_ids[2:4]).encode(), JSON),
        ("/v1/bulk", bulk.encode(), NDJSON),
        ("/v1/queries", queries.encode(), NDJSON),
        ("/v1/events", b'[{"action_name": "click", "timestamp": ', JSON),  # cannot be parsed: 400
        ("/v1/events", json.dumps([_event(i) for i in range(200, 260)]).encode(), JSON),  # over max_items: 413
    ]


@pytest.fixture
def started_pool() -> Iterator[None]:
    with mock.patch.object(workers, "MIN_BODY_BYTES", 1):
        yield


def _client(db: Path, parse_workers: int) -> TestClient:
    app = create_app(Settings(db=db, parse_workers=parse_workers, max_items=50), extensions=False)
    return TestClient(app, base_url="http://localhost", raise_server_exceptions=False)


def _wait_ready(client: TestClient) -> workers.ParsePool:
    pool: workers.ParsePool = client.app.state.collector.parse_pool  # type: ignore[attr-defined]
    deadline = time.monotonic() + 120
    while not pool.ready():
        if time.monotonic() > deadline:
            raise TimeoutError("the parse workers did not start in 120 s")
        time.sleep(0.05)
    return pool


def _stored(client: TestClient) -> dict[str, list[tuple[Any, ...]]]:
    store = client.app.state.collector.sink.store  # type: ignore[attr-defined]
    return {t: sorted(store.read(f"SELECT {cols} FROM {t}"), key=repr) for t, cols in _TABLES.items()}


def _post(client: TestClient, requests: list[tuple[str, bytes, dict[str, str]]]) -> list[tuple[int, Any]]:
    return [(r.status_code, r.json()) for r in
            (client.post(path, content=body, headers=headers) for path, body, headers in requests)]


def test_workers_answer_and_store_what_the_process_does(tmp_path: Path, started_pool: None) -> None:
    requests = _requests()
    with _client(tmp_path / "workers.duckdb", 2) as client:
        pool = _wait_ready(client)
        with_workers = _post(client, requests)
        stored_workers = _stored(client)
        metrics = client.get("/metrics").text
    with _client(tmp_path / "process.duckdb", 0) as client:
        in_process = _post(client, requests)
        stored_process = _stored(client)
    assert with_workers == in_process
    assert stored_workers == stored_process
    # 7 bodies parsed by a worker; the unparseable one and the one over max_items came back (their answers above)
    assert (pool.handed, pool.fell_back) == (7, 2)
    assert "ubi_parse_bodies_total 7" in metrics and "ubi_parse_workers 2" in metrics
    statuses = [status for status, _ in with_workers]
    assert statuses == [202, 202, 202, 202, 202, 202, 202, 400, 413]
    assert with_workers[1][1]["duplicates"] == 40
    assert with_workers[3][1]["rejected"] == 4  # written above: four invalid items of nine
    conflict = with_workers[4][1]["errors"]
    assert [e["field"] for e in conflict] == ["event_id"]
    # conflicts' failed_records rows keep the items' raw bytes, which the worker did not send back: the event
    # re-using e1, and the query record q1 of the last body (the _bulk body stored q1 with another user_query)
    raws = {r[3]: r[5] for r in stored_workers["failed_records"] if r[1] == "conflict"}
    assert set(raws) == {"event_id", "query_id"}
    assert b'"add_to_cart"' in raws["event_id"] and b'"query 1"' in raws["query_id"]


def test_a_body_of_columnar_size_is_stored_as_the_process_stores_it(tmp_path: Path) -> None:
    """From fastpath.HTTP_MIN_ITEMS items a worker takes the columnar path, as the process does (``ubi import``'s
    chunks to a running collector): the same answer and rows, events with and without ids, one invalid."""
    from ubi_pipeline.collector.fastpath import HTTP_MIN_ITEMS

    events = [_event(i, **({"event_id": f"id{i}"} if i % 2 else {})) for i in range(HTTP_MIN_ITEMS)]
    events[7] = {"action_name": "click", "timestamp": "not a time"}
    body = "\n".join(json.dumps(e) for e in events).encode()
    out = []
    for name, n in (("workers", 2), ("process", 0)):
        app = create_app(Settings(db=tmp_path / f"{name}.duckdb", parse_workers=n), extensions=False)
        with TestClient(app, base_url="http://localhost") as client:
            if n:
                _wait_ready(client)
            answer = client.post("/v1/events", content=body, headers=NDJSON).json()
            out.append((answer, _stored(client), client.app.state.collector.parse_pool.handed))
    assert out[0][0] == out[1][0] and out[0][0]["accepted"] == HTTP_MIN_ITEMS - 1
    assert out[0][1] == out[1][1]
    assert (out[0][2], out[1][2]) == (1, 0)


def test_a_worker_that_dies_costs_no_request(tmp_path: Path, started_pool: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The request that meets the broken pool is parsed in process; no pool starts for RESTART_AFTER_SECONDS
    (shortened here), then one does."""
    monkeypatch.setattr(workers, "RESTART_AFTER_SECONDS", 1.0)
    body = json.dumps([_event(i) for i in range(30)]).encode()
    with _client(tmp_path / "w.duckdb", 2) as client:
        pool = _wait_ready(client)
        assert client.post("/v1/events", content=body, headers=JSON).json()["accepted"] == 30
        victim = next(iter(pool._pool._processes))  # type: ignore[union-attr]
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.5)
        answer = client.post("/v1/events", content=body.replace(b'"s1"', b'"s2"'), headers=JSON)
        assert (answer.status_code, answer.json()["accepted"]) == (202, 30)
        assert pool.fell_back == 1
        assert not pool.ready() and pool._pool is None  # within RESTART_AFTER_SECONDS: no new pool yet
        time.sleep(1.0)
        _wait_ready(client)  # a new pool started
        answer = client.post("/v1/events", content=body.replace(b'"s1"', b'"s3"'), headers=JSON)
        assert answer.json()["accepted"] == 30
        assert pool.handed == 2
        assert len(_stored(client)["ubi_events"]) == 90


def test_small_bodies_and_filtered_requests_stay_in_process(tmp_path: Path) -> None:
    with _client(tmp_path / "s.duckdb", 2) as client:
        pool: workers.ParsePool = client.app.state.collector.parse_pool  # type: ignore[attr-defined]
        client.post("/v1/events", content=json.dumps([_event(1)]).encode(), headers=JSON)
        assert pool._pool is None  # a body under MIN_BODY_BYTES never starts the pool
    big = json.dumps([_event(i) for i in range(400)]).encode()
    assert len(big) > workers.MIN_BODY_BYTES
    app = create_app(Settings(db=tmp_path / "f.duckdb", parse_workers=2), extensions=False,
                     record_filters=[lambda batch, ctx: batch])
    with TestClient(app, base_url="http://localhost") as client:
        assert client.post("/v1/events", content=big, headers=JSON).json()["accepted"] == 400
        assert client.app.state.collector.parse_pool._pool is None  # type: ignore[attr-defined]


def test_parse_body_gives_back_what_it_cannot_take() -> None:
    indices = {"ubi_events": "event", "ubi_queries": "query"}
    ok = parse_body(json.dumps([_event(1), {"action_name": "x"}]).encode(), "event", False, indices, 10, "/v1/events")
    assert ok is not None and [e.index for e in ok.errors] == [1]
    queries, events, failed = answer_log.decode(ok.payload)  # the frame the writer logs as it came
    assert queries is None and events is not None and failed is not None
    assert events.column("object_id").to_pylist() == ["doc-1"] and failed.column("item_index").to_pylist() == [1]
    # the key index's hashes come with the rows, as the writer's process would compute them
    assert len(ok.key_hashes[0]) == 0
    assert ok.key_hashes[1].tolist() == key_hashes(events.column("event_key").to_pylist()).tolist()
    assert parse_body(b"[1,", "event", False, indices, 10, "/v1/events") is None
    assert parse_body(json.dumps([_event(i) for i in range(3)]).encode(), "event", False, indices, 2, "x") is None


def test_body_raws_parse_the_body_once_on_first_look() -> None:
    body = b'{"action_name":"a"}\n{"action_name":"b"}'
    raws = BodyRaws(body, "event", True, {})
    assert raws._items is None
    assert raws[1] == b'{"action_name":"b"}' and len(raws) == 2 and list(raws) == [0, 1]


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out.update(int(c) for c in (task / "children").read_text().split())
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_of_a_collector_killed_with_sigkill_exit(tmp_path: Path) -> None:
    """A real ``ubi serve``: its workers start on the first large body, serve the next ones, and end within
    a few PARENT_CHECK_SECONDS of the collector's SIGKILL (which leaves it no chance to stop them). Every
    acknowledged event is then in the store: what DuckDB had not committed is in the answer log, in the
    frames the workers built, and opening the store writes it."""
    from tests_collector_support import start_server

    # answered rows wait for their DuckDB commit up to a minute: they are still only in the log at the kill
    server = start_server(tmp_path / "k.duckdb", "--parse-workers", "2", env={"UBI_LOG_COMMIT_MS": "60000"})
    try:
        body = json.dumps([_event(i) for i in range(400)]).encode()
        deadline = time.monotonic() + 120
        handed = 0.0
        k = 0
        while not handed:
            k += 1
            answer = httpx.post(server.url + "/v1/events", content=body.replace(b'"s1"', b'"s%d"' % k), headers=JSON)
            assert (answer.status_code, answer.json()["accepted"]) == (202, 400)
            metrics = httpx.get(server.url + "/metrics").text
            handed = next(float(line.split()[-1]) for line in metrics.splitlines()
                          if line.startswith("ubi_parse_bodies_total"))
            assert time.monotonic() < deadline, "no body reached a parse worker in 120 s"
            time.sleep(0.1)
        workers_pids = _children(server.proc.pid)
        assert len(workers_pids) >= 2  # two workers (and multiprocessing's resource tracker)
    finally:
        server.stop(signal.SIGKILL)
    deadline = time.monotonic() + 10 * workers.PARENT_CHECK_SECONDS + 5
    while any(_alive(p) for p in workers_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers_pids)
    assert answer_log.has_unapplied(tmp_path / "k.duckdb")
    with Store(tmp_path / "k.duckdb") as store:
        assert store.read("SELECT count(*) FROM ubi_events")[0][0] == 400 * k


def _no_start() -> int:
    """A worker's first task that fails, as when the workers cannot import the ingest code."""
    raise RuntimeError("this worker cannot start")


def test_workers_that_cannot_start_leave_the_bodies_in_process(tmp_path: Path, started_pool: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "_warm", _no_start)
    monkeypatch.setattr(workers, "RESTART_AFTER_SECONDS", 600.0)
    body = json.dumps([_event(i) for i in range(30)]).encode()
    with _client(tmp_path / "n.duckdb", 2) as client:
        pool: workers.ParsePool = client.app.state.collector.parse_pool  # type: ignore[attr-defined]
        assert client.post("/v1/events", content=body, headers=JSON).json()["accepted"] == 30  # starts the pool
        deadline = time.monotonic() + 120
        while pool._broken_at is None:
            assert time.monotonic() < deadline, "the failed start was not noticed in 120 s"
            time.sleep(0.05)
        answer = client.post("/v1/events", content=body.replace(b'"s1"', b'"s2"'), headers=JSON)
        assert (answer.status_code, answer.json()["accepted"]) == (202, 30)
        assert pool._pool is None and pool.handed == 0  # no second start within RESTART_AFTER_SECONDS


def test_a_cancelled_warm_up_drops_the_pool_rather_than_leaving_it_never_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool closed while its workers start cancels their first tasks: the pool is dropped (and started again
    after RESTART_AFTER_SECONDS), where the done-callback used to raise on the cancelled future."""
    from concurrent.futures import Future

    made: list[Future[int]] = []

    class Pool:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def submit(self, fn: Any) -> Future[int]:
            made.append(Future())
            return made[-1]

        def shutdown(self, **kwargs: Any) -> None:
            pass

    monkeypatch.setattr(workers, "ProcessPoolExecutor", Pool)
    pool = workers.ParsePool(2)
    assert not pool.ready()
    made[0].set_result(0)
    made[1].cancel()
    assert pool._pool is None and pool._broken_at is not None and not pool.ready()


def test_a_group_of_framed_and_own_bodies_commits_with_each_rows_own_key_hashes(tmp_path: Path) -> None:
    # The writer logs a parse worker's bodies first and frames the others after them; the key hashes it took
    # for surely_new go to the commit in that same row order. Expected: the hashes of the committed frame's
    # key column, whatever the order of the group; and a retry of the whole group found as duplicates.
    from ubi_pipeline.collector.ingest import prepare, validate_items
    from ubi_pipeline.collector.sinks.duckdb import DuckDBSink, _Job
    from ubi_pipeline.collector.workers import body_items, prepared_of

    def bodies(offset: int) -> list[bytes]:
        return [json.dumps([_event(offset + 10 * b + i, event_id=f"g{offset + 10 * b + i}") for i in range(10)]).encode()
                for b in range(3)]

    def jobs(offset: int) -> list[_Job]:
        a, b, c = bodies(offset)
        own = prepare(validate_items(body_items(b, "event", False, {})), source="/v1/events")
        framed = [prepared_of(p, BodyRaws(body, "event", False, {}), "/v1/events") for body in (a, c)
                  if (p := parse_body(body, "event", False, {}, 100, "/v1/events")) is not None]
        return [_Job(framed[0], mock.Mock()), _Job(own, mock.Mock()), _Job(framed[1], mock.Mock())]

    sink = DuckDBSink(Store(tmp_path / "g.duckdb"), log_dir=tmp_path / "g.duckdb.answers")
    try:
        sink._write(jobs(1000))  # fills the key filter, so the next group can be answered from the log
        group = jobs(0)
        keys = sink._answerable(group)
        assert keys is not None and sink._answer_from_log(group, keys)
        (frame,) = sink._answered.frames
        assert frame.hashes is not None
        logged = frame.tables[1].column("event_key").to_pylist()
        assert logged[10:20] == group[2].prepared.event_keys()  # framed bodies first, the own one last
        assert frame.hashes[1].tolist() == key_hashes(logged).tolist()
        assert sink._commit_answered_now()
        retry = jobs(0)
        assert sink._answerable(retry) is None  # every key is stored now: the commit took the right hashes
        sink._write(retry)
        assert sink.store.read("SELECT count(*) FROM ubi_events") == [(60,)]
    finally:
        sink.close()
