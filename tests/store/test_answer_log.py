"""store/answer_log.py: frames of answered rows, and their replay by whoever opens the store next.

The frames here are written by hand (store.framelog.frame into a segment file), as the collector's
answer log would have left them when it was killed before DuckDB committed them.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from ubi_pipeline.store import answer_log, framelog
from ubi_pipeline.store.client import open_reader
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import EVENT_SCHEMA, QUERY_SCHEMA, failed_row, failed_table, rows_table

AT = datetime(2024, 5, 1, 12, 0, 0)


def event_row(event_id: str, action: str = "click") -> tuple:
    row = dict.fromkeys(EVENT_SCHEMA.names)
    row.update(event_key=f"id:{event_id}", event_id=event_id, action_name=action, query_id="q1",
               timestamp=AT, received_at=AT)
    return tuple(row[n] for n in EVENT_SCHEMA.names)


def query_row(query_id: str) -> tuple:
    row = dict.fromkeys(QUERY_SCHEMA.names)
    row.update(query_key=f"{query_id}\x1f", query_id=query_id, user_query="shoes", timestamp=AT,
               content_hash="c" * 32, received_at=AT)
    return tuple(row[n] for n in QUERY_SCHEMA.names)


def tables(events: list[tuple], queries: list[tuple] = (), failed: list[dict] = ()) -> answer_log.Tables:
    return (
        rows_table(list(queries), QUERY_SCHEMA) if queries else None,
        rows_table(events, EVENT_SCHEMA) if events else None,
        failed_table(list(failed)) if failed else None,
    )


def write_log(db, frames: list[answer_log.Tables], tail: bytes = b"") -> None:
    """The answer log of ``db`` holding ``frames`` (and ``tail`` after them), none of them applied."""
    d = answer_log.answer_log_dir(db)
    d.mkdir()
    body = b"".join(framelog.frame(sum(t.num_rows for t in f if t is not None), answer_log.encode(f))
                    for f in frames)
    framelog.segment_path(d, 1).write_bytes(body + tail)


def count(store: Store, table: str) -> int:
    return store.read(f"SELECT count(*) FROM {table}")[0][0]


def test_a_frame_reads_back_as_the_tables_it_was_made_of():
    rejected = failed_row(source="t", kind="event", reason="no action_name", raw=b"{}", received_at=AT)
    frame = tables([event_row("e1"), event_row("e2", "impression")], [query_row("q1")], [rejected])
    back = answer_log.decode(answer_log.encode(frame))
    assert [t.to_pylist() for t in back] == [t.to_pylist() for t in frame]  # type: ignore[union-attr]
    only_events = answer_log.decode(answer_log.encode(tables([event_row("e3")])))
    assert only_events[0] is None and only_events[2] is None and only_events[1].num_rows == 1


def test_a_payload_not_written_by_the_log_is_refused_with_where():
    with pytest.raises(answer_log.AnswerLogError, match="unknown part b'x' at byte 0"):
        answer_log.decode(b"x\x00\x00\x00\x00")
    cut = answer_log.encode(tables([event_row("e1")]))[:-10]
    with pytest.raises(answer_log.AnswerLogError, match="runs past the frame's end"):
        answer_log.decode(cut)


def test_opening_the_store_writes_the_answered_rows_once(tmp_path):
    db = tmp_path / "s.duckdb"
    Store(db).close()
    rejected = failed_row(source="t", kind="event", reason="no action_name", raw=b"{}", received_at=AT)
    write_log(db, [tables([event_row("e1"), event_row("e2")], [query_row("q1")]),
                   tables([event_row("e3")], failed=[rejected])])
    assert answer_log.has_unapplied(db)
    with Store(db) as store:
        assert store.replayed == 5  # 3 events, 1 query record, 1 failed record
        assert (count(store, "ubi_events"), count(store, "ubi_queries"), count(store, "failed_records")) == (3, 1, 1)
    assert not answer_log.has_unapplied(db)
    with Store(db) as store:  # the cursor moved past them: nothing is written twice
        assert store.replayed == 0
        assert (count(store, "ubi_events"), count(store, "failed_records")) == (3, 1)


def test_a_replay_of_rows_committed_already_counts_nothing_twice(tmp_path):
    # The collector committed the rows, then died before it could move the log's cursor past them.
    db = tmp_path / "s.duckdb"
    rejected = failed_row(source="t", kind="event", reason="no action_name", raw=b"{}", received_at=AT)
    frame = tables([event_row("e1"), event_row("e2")], failed=[rejected])
    with Store(db) as store:
        store.write_rows(*frame)
    write_log(db, [frame])
    with Store(db) as store:
        assert store.replayed == 3
        assert (count(store, "ubi_events"), count(store, "failed_records")) == (2, 1)  # same failed_id: ignored


def test_an_answered_row_found_taken_by_other_content_is_kept_not_dropped(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.write_rows(None, rows_table([event_row("e1", "click")], EVENT_SCHEMA))
    write_log(db, [tables([event_row("e1", "purchase")])])
    with Store(db) as store:
        assert count(store, "ubi_events") == 1
        ((kind, reason),) = store.read("SELECT kind, reason FROM failed_records")
        assert kind == "conflict" and "answered as accepted" in reason


def test_a_torn_frame_at_the_tail_was_never_answered_and_is_not_written(tmp_path):
    db = tmp_path / "s.duckdb"
    Store(db).close()
    whole = tables([event_row("e1")])
    torn = framelog.frame(1, answer_log.encode(tables([event_row("e2")])))[:-7]  # the process died mid-write
    write_log(db, [whole], tail=torn)
    with Store(db) as store:
        assert store.replayed == 1
        assert store.read("SELECT event_id FROM ubi_events") == [("e1",)]
    assert not answer_log.has_unapplied(db)  # the torn bytes were cut: readers do not reopen for them


def test_a_reader_of_a_store_left_by_a_killed_collector_sees_the_answered_rows(tmp_path):
    db = tmp_path / "s.duckdb"
    Store(db).close()
    write_log(db, [tables([event_row("e1"), event_row("e2")])])
    con = open_reader(db)  # the file is free: the reader has a writer write the log first
    try:
        assert con.execute("SELECT count(*) FROM ubi_events").fetchone() == (2,)
    finally:
        con.close()
    assert not answer_log.has_unapplied(db)


def test_the_log_lives_beside_the_store():
    assert answer_log.answer_log_dir("/data/ubi.duckdb").as_posix() == "/data/ubi.duckdb.answers"


def test_a_replay_writes_frames_in_transactions_of_bounded_size(tmp_path, monkeypatch):
    # As the collector commits them: a store under a tight memory limit takes them on open too.
    db = tmp_path / "s.duckdb"
    Store(db).close()
    write_log(db, [tables([event_row(f"e{i}-{j}") for j in range(3)]) for i in range(4)])
    sizes = []
    real = answer_log.write_frames

    def counted(store, frames, **kwargs):
        sizes.append(frames[1].num_rows)
        return real(store, frames, **kwargs)

    monkeypatch.setattr(answer_log, "REPLAY_BYTES", 1)  # every frame is over it: one transaction each
    monkeypatch.setattr(answer_log, "write_frames", counted)
    with Store(db) as store:
        assert store.replayed == 12 and count(store, "ubi_events") == 12
    assert sizes == [3, 3, 3, 3] and not answer_log.has_unapplied(db)
