"""collector/sinks/duckdb.py with its answer log (``UBI_ACK=log``, the default of ``ubi serve``): requests whose
keys are all surely new are answered once their rows are fsync'd to the log; every other request waits for its
commit, after the answered rows; a read sees every answered row; a killed collector loses none.

The expected answers are those of the commit path for the same requests (tests/collector/test_sink_duckdb.py).
"""

from __future__ import annotations

import signal
import time

import duckdb
import httpx
import orjson
import pytest
from tests_collector_support import start_server

from ubi_pipeline.collector.errors import SinkUnavailable
from ubi_pipeline.collector.ingest import Validated, parse_items, validate_items
from ubi_pipeline.collector.sinks.duckdb import DuckDBSink
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store import answer_log
from ubi_pipeline.store.client import open_reader
from ubi_pipeline.store.duckdb_store import Store


def batch(*records) -> Validated:
    return validate_items(parse_items(orjson.dumps(list(records)), "event"))


def logged_sink(db, **kwargs) -> DuckDBSink:
    """A sink with its answer log whose rows wait (up to 60 s) for a read, a close or a request that is not new."""
    return DuckDBSink(Store(db), log_dir=answer_log.answer_log_dir(db), log_commit_seconds=60.0, **kwargs)


@pytest.fixture
def sink(tmp_path):
    s = logged_sink(tmp_path / "s.duckdb")
    yield s
    s.close()


def warm(sink: DuckDBSink, make_event) -> None:
    """One committed write: the key index's filter is filled on the store's first write, and until then no key
    is surely new."""
    assert sink.write(batch(make_event()), source="t").accepted == 1
    assert sink.answered_from_log == 0


def test_new_events_are_answered_from_the_log_and_committed_before_a_read(sink, make_event):
    warm(sink, make_event)
    results = [sink.write(batch(make_event(), make_event()), source="t") for _ in range(3)]
    assert [(r.accepted, r.duplicates, r.rejected) for r in results] == [(2, 0, 0)] * 3
    assert sink.answered_from_log == 3
    assert sink.gauges()["answered_uncommitted_rows"] == 6  # in the log, not yet in DuckDB
    assert sink.store.read("SELECT count(*) FROM ubi_events") == [(7,)]  # the read committed them first
    assert sink.gauges()["answered_uncommitted_rows"] == 0
    assert sink._log is not None and sink._log.state()["entries"] == 0  # the log's cursor moved past them


def test_rejected_items_are_answered_and_kept_like_on_the_commit_path(sink, make_event):
    warm(sink, make_event)
    result = sink.write(batch(make_event(), {"action_name": "click"}), source="t")  # no timestamp
    assert (result.accepted, result.rejected) == (1, 1) and result.errors[0].field == "timestamp"
    assert sink.answered_from_log == 1
    assert sink.store.read("SELECT count(*) FROM failed_records WHERE kind = 'event'") == [(1,)]


def test_a_retry_waits_for_its_commit_and_is_counted_once(sink, make_event):
    warm(sink, make_event)
    event = make_event(event_id="retried")
    first = sink.write(batch(event), source="t")
    assert first.accepted == 1 and sink.answered_from_log == 1  # answered from the log, not committed yet
    again = sink.write(batch(event), source="t")  # its key is among the answered rows: not surely new
    assert (again.accepted, again.duplicates) == (0, 1) and sink.answered_from_log == 1
    late = sink.write(batch(event), source="t")  # committed by now: the filter says "maybe", the lookup finds it
    assert (late.accepted, late.duplicates) == (0, 1)
    assert sink.store.read("SELECT count(*) FROM ubi_events WHERE event_id = 'retried'") == [(1,)]


def test_a_conflict_with_an_answered_row_is_named_as_on_the_commit_path(sink, make_event):
    warm(sink, make_event)
    sink.write(batch(make_event(event_id="same", action_name="click")), source="t")
    other = sink.write(batch(make_event(event_id="same", action_name="purchase")), source="t")
    assert other.accepted == 0 and other.rejected == 1 and "same" in other.errors[0].message
    assert sink.store.read("SELECT action_name FROM ubi_events WHERE event_id = 'same'") == [("click",)]
    assert sink.store.read("SELECT count(*) FROM failed_records WHERE kind = 'conflict'") == [(1,)]


def test_the_same_key_twice_in_one_request_waits_for_the_commit(sink, make_event):
    warm(sink, make_event)
    twice = make_event(event_id="twice")
    result = sink.write(batch(twice, twice), source="t")
    assert (result.accepted, result.duplicates) == (1, 1) and sink.answered_from_log == 0


def test_a_full_log_answers_503_and_keeps_nothing_it_did_not_answer(tmp_path, make_event):
    sink = logged_sink(tmp_path / "s.duckdb", log_max_bytes=20_000)
    try:
        warm(sink, make_event)
        answered = 0
        with pytest.raises(SinkUnavailable, match="answer log is full"):
            for _ in range(100):  # each frame is a few kB: the log fills long before 100
                sink.write(batch(*[make_event() for _ in range(5)]), source="t")
                answered += 5
        assert answered > 0
        # a read commits what was answered, which empties the log: requests are answered again
        assert sink.store.read("SELECT count(*) FROM ubi_events") == [(1 + answered,)]
        assert sink.write(batch(make_event()), source="t").accepted == 1
    finally:
        sink.close()


def test_a_failed_commit_keeps_the_answered_rows_and_a_later_one_stores_them(sink, make_event, monkeypatch):
    warm(sink, make_event)
    sink.write(batch(make_event(), make_event()), source="t")
    real = answer_log.write_frames
    calls = []

    def fail_once(store, tables, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("disk full")
        return real(store, tables, **kwargs)

    monkeypatch.setattr(answer_log, "write_frames", fail_once)
    sink.commit_answered()
    assert sink.last_error == "OSError: disk full" and sink.gauges()["answered_uncommitted_rows"] == 2
    assert not sink.health()["ok"]
    # while the store fails, nothing more is answered before its commit
    assert sink.write(batch(make_event()), source="t").accepted == 1
    assert sink.answered_from_log == 1 and len(calls) == 2 and sink.last_error is None
    assert sink.store.read("SELECT count(*) FROM ubi_events") == [(4,)]


def test_closing_commits_what_was_answered(tmp_path, make_event):
    db = tmp_path / "s.duckdb"
    sink = logged_sink(db)
    warm(sink, make_event)
    sink.write(batch(make_event(), make_event()), source="t")
    assert sink.answered_from_log == 1
    sink.close()
    con = duckdb.connect(str(db), read_only=True)  # the file itself, no replay: the close committed them
    assert con.execute("SELECT count(*) FROM ubi_events").fetchone() == (3,)
    con.close()
    assert not answer_log.has_unapplied(db)
    assert not answer_log.answer_log_dir(db).exists()  # a clean stop leaves nothing beside the store


def test_commit_mode_never_answers_before_the_commit(tmp_path, make_event):
    settings = Settings(db=tmp_path / "s.duckdb", ack="commit")
    sink = DuckDBSink.from_settings(settings)
    try:
        for _ in range(3):
            sink.write(batch(make_event()), source="t")
        assert sink.answered_from_log == 0 and "answer_log" not in sink.health()
    finally:
        sink.close()


def test_a_killed_collector_loses_no_answered_row(tmp_path):
    # A real `ubi serve` whose answered rows wait a minute for their commit, killed with SIGKILL after the
    # last 202: the rows are in the answer log only, and the next open of the store writes them.
    db = tmp_path / "s.duckdb"
    server = start_server(db, env={"UBI_LOG_COMMIT_MS": "60000"})
    sent = []
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for i in range(20):
            events = [{"action_name": "click", "query_id": f"q{i}", "event_id": f"k{i}-{j}",
                       "timestamp": "2024-05-01T12:00:00Z"} for j in range(5)]
            r = c.post("/v1/events", json=events)
            assert r.status_code == 202 and r.json()["accepted"] == 5
            sent += [e["event_id"] for e in events]
        metrics = c.get("/metrics").text
    server.stop(signal.SIGKILL)
    answered = next(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("ubi_sink_answered_from_log_total"))
    assert answered >= 18  # the first request fills the key filter; the others are answered from the log
    con = duckdb.connect(str(db), read_only=True)  # DuckDB's own file: only what it committed
    committed = con.execute("SELECT count(*) FROM ubi_events").fetchone()[0]
    con.close()
    assert committed < len(sent)
    assert answer_log.has_unapplied(db)
    con = open_reader(db)
    try:
        assert sorted(r[0] for r in con.execute("SELECT event_id FROM ubi_events").fetchall()) == sorted(sent)
    finally:
        con.close()
    with Store(db) as store:  # a second open writes nothing again
        assert store.replayed == 0 and store.read("SELECT count(*) FROM ubi_events") == [(len(sent),)]


def test_a_group_that_cannot_be_framed_is_written_the_usual_way(sink, make_event, monkeypatch):
    warm(sink, make_event)

    def broken(tables):
        raise ValueError("cannot frame")

    monkeypatch.setattr(answer_log, "encode", broken)
    result = sink.write(batch(make_event(), make_event()), source="t")  # the writer did not die on it
    assert result.accepted == 2 and sink.answered_from_log == 0
    assert sink.store.read("SELECT count(*) FROM ubi_events") == [(3,)]


def test_while_answered_rows_cannot_be_committed_a_retry_of_one_gets_503(sink, make_event, monkeypatch):
    # Writing the retry first would store it as new, and the answered original would then be the duplicate.
    warm(sink, make_event)
    event = make_event(event_id="first")
    assert sink.write(batch(event), source="t").accepted == 1  # answered from the log
    real = answer_log.write_frames

    def down(store, tables, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(answer_log, "write_frames", down)
    with pytest.raises(SinkUnavailable, match="could not commit earlier requests: OSError: disk full"):
        sink.write(batch(event), source="t")
    monkeypatch.setattr(answer_log, "write_frames", real)
    again = sink.write(batch(event), source="t")  # the store is back: the original first, then the retry
    assert (again.accepted, again.duplicates) == (0, 1)
    assert sink.store.read("SELECT count(*) FROM ubi_events WHERE event_id = 'first'") == [(1,)]


def test_rows_a_transaction_cannot_hold_together_are_committed_group_by_group(sink, make_event, monkeypatch):
    # A store under a tight memory limit refuses a large transaction ("failed to pin block") but takes the
    # same rows in the smaller transactions of the commit path: one per answered group.
    warm(sink, make_event)
    for _ in range(3):
        sink.write(batch(make_event(), make_event()), source="t")
    real = answer_log.write_frames
    sizes = []

    def small_only(store, tables, **kwargs):
        sizes.append(tables[1].num_rows)
        if tables[1].num_rows > 2:
            raise OSError("failed to pin block")
        return real(store, tables, **kwargs)

    monkeypatch.setattr(answer_log, "write_frames", small_only)
    assert sink.store.read("SELECT count(*) FROM ubi_events") == [(7,)]  # the read's commit, group by group
    assert sizes == [6, 2, 2, 2] and sink.last_error is None
    assert sink._log is not None and sink._log.state()["entries"] == 0


def test_answered_rows_are_committed_once_their_frames_reach_the_size_bound(tmp_path, make_event):
    sink = logged_sink(tmp_path / "s.duckdb", log_commit_bytes=1)  # every frame is over it
    try:
        warm(sink, make_event)
        sink.write(batch(make_event(), make_event()), source="t")
        assert sink.answered_from_log == 1
        deadline = time.monotonic() + 10  # the writer answers first, then commits
        while (sink.commits < 2 or sink.gauges()["answered_uncommitted_rows"]) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert sink.commits == 2  # the warm-up's and this group's, without a read, a timeout or another request
        assert sink.gauges()["answered_uncommitted_rows"] == 0
    finally:
        sink.close()
