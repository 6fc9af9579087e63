"""collector/sinks/duckdb.py: group commit (many requests, one transaction, each its own result), failure isolation.

(Not in tests/collector/sinks/: pytest would register that folder as a namespace package `ubi_pipeline.collector.sinks`,
shadowing the real one.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import wait

import orjson
import pytest

from ubi_pipeline.collector.errors import SinkUnavailable
from ubi_pipeline.collector.ingest import Prepared, Validated, parse_items, prepare, validate_items
from ubi_pipeline.collector.sinks.duckdb import DuckDBSink, _Job
from ubi_pipeline.store.duckdb_store import Store


def batch(*records) -> Validated:
    return validate_items(parse_items(orjson.dumps(list(records)), "event"))


@pytest.fixture
def sink(tmp_path):
    s = DuckDBSink(Store(tmp_path / "s.duckdb"))
    yield s
    s.close()


def test_requests_waiting_together_share_one_commit_and_keep_their_own_results(sink, make_event):
    shared = make_event(event_id="shared")
    with sink.store.lock:  # hold the writer back so that the requests queue up
        first = sink.submit(batch(make_event()), source="t")
        rest = [sink.submit(batch(make_event(), shared), source="t") for _ in range(10)]
        assert not first.done()
    wait([first, *rest], timeout=30)
    # 11 requests, at most 2 commits: the first may be written alone (the writer may have taken it before
    # the others arrived), the other 10 together
    assert sink.grouped_requests == 11 and sink.commits <= 2
    assert first.result().accepted == 1
    results = [f.result() for f in rest]
    # each of the 10 carries a new event plus `shared`: the first request of the group stores it, the
    # nine after it count it as a duplicate, exactly as if they had been written one by one
    assert [(r.accepted, r.duplicates) for r in results] == [(2, 0)] + [(1, 1)] * 9
    assert sink.store.read("SELECT count(*) FROM ubi_events") == [(1 + 10 + 1,)]


def test_the_writer_counts_the_seconds_it_spends_writing(sink, make_event):
    # bench/ingest.py divides this by wall time to say how busy the writer was; a write held back by the
    # store's lock for 0.2 s must count those 0.2 s (the write starts when the writer takes the request)
    assert sink.gauges()["write_seconds_total"] == 0.0
    with sink.store.lock:
        fut = sink.submit(batch(make_event()), source="t")
        deadline = time.monotonic() + 10
        while sink._queue.qsize() and time.monotonic() < deadline:  # the writer has taken it
            time.sleep(0.005)
        time.sleep(0.2)
    assert fut.result(timeout=30).accepted == 1
    assert 0.2 <= sink.gauges()["write_seconds_total"] < 30


def test_concurrent_submitters_all_get_durable_results(sink, make_event):
    results = []

    def worker() -> None:
        for _ in range(25):
            results.append(sink.write(batch(make_event()), source="t"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.accepted for r in results] == [1] * 200
    assert sink.store.read("SELECT count(*) FROM ubi_events") == [(200,)]
    assert sink.commits <= 200


def test_a_request_that_spoils_the_group_fails_alone(sink, make_event):
    good = prepare(batch(make_event()), source="t")
    row = list(prepare(batch(make_event()), source="t").event_rows[0])
    row[16] = "not an int"  # position_ordinal: the Arrow conversion of the group fails on it
    bad = Prepared(Validated(), "t", good.received_at, [], [tuple(row)], [])
    from concurrent.futures import Future

    jobs = [
        _Job(good, Future()),
        _Job(bad, Future()),
        _Job(prepare(batch(make_event()), source="t"), Future()),
    ]
    with sink.store.lock:
        for job in jobs:
            sink._queue.put(job)
    wait([j.future for j in jobs], timeout=30)
    assert jobs[0].future.result().accepted == 1 and jobs[2].future.result().accepted == 1
    with pytest.raises(SinkUnavailable, match="could not commit"):
        jobs[1].future.result()
    assert sink.gauges()["failed_writes_total"] == 1  # the group failed, then only the bad job alone
    assert sink.store.read("SELECT count(*) FROM ubi_events") == [(2,)]
    assert sink.health()["ok"] is True  # the good commit after it cleared the error


def test_keep_unparseable_and_submit_after_close(tmp_path):
    s = DuckDBSink(Store(tmp_path / "k.duckdb"))
    s.keep_unparseable(b"\x00junk", source="/v1/events", reason="malformed").result(timeout=30)
    assert s.store.read("SELECT kind, raw FROM failed_records") == [("body", b"\x00junk")]
    s.close()
    with pytest.raises(SinkUnavailable):
        s.submit(Validated(), source="t").result()
    s.close()  # idempotent


def test_overload_is_refused_not_queued_without_bound(tmp_path, make_event):
    s = DuckDBSink(Store(tmp_path / "o.duckdb"), max_pending=2)
    with s.store.lock:
        futures = [s.submit(batch(make_event()), source="t") for _ in range(5)]
        refused = [f for f in futures if f.done() and f.exception() is not None]
        # blocked on the lock, the writer holds the jobs it took before blocking (0 to 2 of them, a race) and
        # at most 2 more wait in the queue: 1 to 3 of the 5 are refused, never none
        assert 1 <= len(refused) <= 3
        assert all(isinstance(f.exception(), SinkUnavailable) for f in refused)
    wait(futures, timeout=30)
    assert sum(1 for f in futures if f.exception() is None) == 5 - len(refused)
    s.close()


def test_commit_delay_never_holds_back_a_lone_request(tmp_path, make_event):
    # A 30 s delay would time the waits out: requests that come one at a time are written at once.
    s = DuckDBSink(Store(tmp_path / "d.duckdb"), commit_delay=30.0)
    try:
        for _ in range(3):
            assert s.submit(batch(make_event()), source="t").result(timeout=10).accepted == 1
        assert s.commits == 3
    finally:
        s.close()


def test_commit_delay_lets_a_loaded_writer_gather_a_bigger_group(tmp_path, make_event):
    s = DuckDBSink(Store(tmp_path / "g.duckdb"), commit_delay=1.0)
    try:
        with s.store.lock:  # four requests queue up: the writer's last group will have had more than one
            held = [s.submit(batch(make_event()), source="t") for _ in range(4)]
        wait(held, timeout=30)
        before = s.commits
        first = s.submit(batch(make_event()), source="t")  # the writer now waits 1 s before taking its group
        threading.Event().wait(0.2)
        assert not first.done()
        second = s.submit(batch(make_event()), source="t")
        assert first.result(timeout=30).accepted == 1 and second.result(timeout=30).accepted == 1
        assert s.commits == before + 1  # both in one commit: without the delay, two
    finally:
        s.close()


def test_requests_from_an_event_loop_are_answered_by_the_commit_even_if_one_gave_up(sink, make_event):
    async def main() -> list:
        sink.store.lock.acquire()  # hold the writer back so that the requests queue up
        try:
            tasks = [asyncio.ensure_future(sink.submit_async(batch(make_event()), source="t")) for _ in range(5)]
            await asyncio.sleep(0)  # each task runs up to its await: five requests are queued
            tasks[1].cancel()  # a client that went away
        finally:
            sink.store.lock.release()
        out = await asyncio.gather(*tasks, return_exceptions=True)
        out.append(await sink.submit_async(batch(make_event()), source="t"))  # the writer carries on
        return out

    results = asyncio.run(main())
    assert isinstance(results[1], asyncio.CancelledError)
    assert [r.accepted for i, r in enumerate(results) if i != 1] == [1, 1, 1, 1, 1]
    # the cancelled request's event was committed all the same (202 was simply never sent for it)
    assert sink.store.read("SELECT count(*) FROM ubi_events") == [(6,)]


def test_large_groups_commit_with_a_short_gil_switch_interval_and_restore_it(sink, make_event, monkeypatch):
    import sys

    import ubi_pipeline.collector.sinks.duckdb as duckdb_sink

    seen = []
    real = duckdb_sink.ingest_many

    def spy(store, batches):
        seen.append(sys.getswitchinterval())
        return real(store, batches)

    monkeypatch.setattr(duckdb_sink, "ingest_many", spy)
    before = sys.getswitchinterval()
    big = batch(*[make_event() for _ in range(duckdb_sink.BIG_GROUP_ROWS)])
    assert sink.write(big, source="t").accepted == duckdb_sink.BIG_GROUP_ROWS
    assert sink.write(batch(make_event()), source="t").accepted == 1
    assert seen == [duckdb_sink.SHORT_SWITCH_INTERVAL, before]  # single-event groups keep the default
    assert sys.getswitchinterval() == before


def test_the_short_switch_interval_lasts_until_the_last_user_leaves():
    import sys

    from ubi_pipeline.collector.sinks.duckdb import SHORT_SWITCH_INTERVAL, _gil_handover

    before = sys.getswitchinterval()
    with _gil_handover():
        with _gil_handover():  # a second sink's writer, overlapping
            assert sys.getswitchinterval() == SHORT_SWITCH_INTERVAL
        assert sys.getswitchinterval() == SHORT_SWITCH_INTERVAL
    assert sys.getswitchinterval() == before
