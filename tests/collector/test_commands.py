"""``ubi import``, ``ubi failed`` and ``ubi schema`` on files, without a running collector."""

from __future__ import annotations

import json

import orjson
from tests_collector_support import SAMPLE_BULK, SAMPLE_EVENTS, SAMPLE_QUERIES, SAMPLES, count, run_ubi


def test_import_the_sample_then_again(db, capsys):
    assert run_ubi(["import", str(SAMPLE_BULK), "--db", str(db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["via"] == "direct"
    assert (out["queries"], out["events"], out["duplicates"], out["rejected"]) == (
        SAMPLE_QUERIES,
        SAMPLE_EVENTS,
        0,
        0,
    )
    assert count(db, "SELECT count(*) FROM ubi_queries") == SAMPLE_QUERIES
    assert count(db, "SELECT count(*) FROM ubi_events") == SAMPLE_EVENTS
    assert run_ubi(["import", str(SAMPLE_BULK), "--db", str(db), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["accepted"], again["duplicates"], again["rejected"]) == (0, 3921, 0)  # 473 + 3,448


def test_import_formats_and_rejections_name_file_and_line(db, tmp_path, make_event, make_query, capsys):
    nd = tmp_path / "events.ndjson"
    nd.write_bytes(
        b"\n".join(
            [
                orjson.dumps(make_event()),
                b"",
                orjson.dumps(make_event(timestamp="later")),
                b"{oops",
                orjson.dumps(make_query()),
            ]
        )
        + b"\n"
    )
    arr = tmp_path / "queries.json"
    arr.write_bytes(orjson.dumps([make_query(), make_query(user_query=...)]))
    spec = SAMPLES / "event-opensearch.json"  # one pretty-printed object
    assert run_ubi(["import", str(nd), str(arr), str(spec), "--db", str(db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    files = {f["path"]: f for f in out["files"]}
    # events.ndjson: line 1 event ok, line 3 bad timestamp, line 4 not JSON, line 5 a query record (by its keys)
    assert (files[str(nd)]["events"], files[str(nd)]["queries"], files[str(nd)]["rejected"]) == (1, 1, 2)
    assert [(e["line"], e["field"]) for e in files[str(nd)]["errors"]] == [(3, "timestamp"), (4, None)]
    assert files[str(nd)]["errors"][1]["message"].startswith("line 4, column 2: malformed JSON")
    # queries.json: the array's second record has no user_query; with no action_name either it counts as a
    # query record (the file's dominant kind) and is rejected for the missing user_query
    assert (files[str(arr)]["queries"], files[str(arr)]["rejected"]) == (1, 1)
    assert files[str(arr)]["errors"][0]["field"] == "user_query"
    assert files[str(spec)]["events"] == 1
    assert count(db, "SELECT count(*) FROM failed_records") == 3


def test_import_human_summary_and_missing_file(db, tmp_path, make_event, capsys):
    f = tmp_path / "e.ndjson"
    f.write_bytes(orjson.dumps(make_event(action_name=...)) + b"\n")
    assert run_ubi(["import", str(f), "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert "rejected" in text and f"{f}:1" in text and "action_name" in text
    assert run_ubi(["import", str(tmp_path / "nope.json"), "--db", str(db)]) == 2


def test_failed_lists_newest_first(db, tmp_path, make_event, capsys):
    f = tmp_path / "e.ndjson"
    f.write_bytes(orjson.dumps(make_event(timestamp=...)) + b"\n\xff\xfe\n")
    run_ubi(["import", str(f), "--db", str(db), "--json"])
    capsys.readouterr()
    assert run_ubi(["failed", "--db", str(db), "--json", "--limit", "1"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert page["total"] == 2 and page["next_offset"] == 1 and len(page["items"]) == 1
    assert run_ubi(["failed", "--db", str(db)]) == 0
    assert "timestamp" in capsys.readouterr().out
    assert run_ubi(["failed", "--db", str(tmp_path / "none.duckdb")]) == 2


def test_schema_prints_both_models(capsys):
    assert run_ubi(["schema"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["event"]["required"] == ["action_name", "timestamp"]
    assert both["query"]["required"] == ["user_query"]
    assert run_ubi(["schema", "--kind", "event"]) == 0
    event = json.loads(capsys.readouterr().out)
    assert event["title"] == "UbiEvent" and "event_id" in event["properties"]
