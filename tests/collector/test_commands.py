"""``ubi import``, ``ubi failed`` and ``ubi schema`` on files, without a running collector."""

from __future__ import annotations

import json

import orjson
from tests_collector_support import SAMPLE_EVENTS, SAMPLE_QUERIES, count, run_ubi

from tests.conftest import SAMPLE_LOG, shared_path


def test_import_the_sample_then_again(db, capsys):
    assert run_ubi(["import", str(shared_path(SAMPLE_LOG)), "--db", str(db), "--json"]) == 0
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
    assert run_ubi(["import", str(shared_path(SAMPLE_LOG)), "--db", str(db), "--json"]) == 0
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
    spec = shared_path("ubi-samples/event-opensearch.json")  # one pretty-printed object
    # some records rejected, others accepted: exit 1 (issue 12: a CI script must notice)
    assert run_ubi(["import", str(nd), str(arr), str(spec), "--db", str(db), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    files = {f["path"]: f for f in out["files"]}
    # events.ndjson: line 1 event ok, line 3 bad timestamp, line 4 not JSON, line 5 a query record (by its keys)
    assert (files[str(nd)]["events"], files[str(nd)]["queries"], files[str(nd)]["rejected"]) == (1, 1, 2)
    # index: position among the file's records (blank line 2 is none); line: where the record is
    assert [(e["index"], e["line"], e["field"]) for e in files[str(nd)]["errors"]] == [
        (1, 3, "timestamp"),
        (2, 4, None),
    ]
    assert files[str(nd)]["errors"][1]["message"].startswith("line 4, column 2: malformed JSON")
    # queries.json: the array's second record has no user_query; with no action_name either it counts as a
    # query record (the file's dominant kind) and is rejected for the missing user_query
    assert (files[str(arr)]["queries"], files[str(arr)]["rejected"]) == (1, 1)
    # a JSON array has no line per item: the item's index says which one
    assert {k: files[str(arr)]["errors"][0][k] for k in ("index", "line", "field")} == {
        "index": 1,
        "line": 1,  # a streamed array's item names the line it starts on (orjson wrote the array on one)
        "field": "user_query",
    }
    assert files[str(spec)]["events"] == 1
    assert count(db, "SELECT count(*) FROM failed_records") == 3


def test_import_human_summary_and_missing_file(db, tmp_path, make_event, capsys):
    f = tmp_path / "e.ndjson"
    f.write_bytes(orjson.dumps(make_event(action_name=...)) + b"\n")
    assert run_ubi(["import", str(f), "--db", str(db)]) == 2  # everything rejected, nothing accepted
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
    assert (
        both["event"]["$schema"] == both["query"]["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    )
    assert both["event"]["required"] == ["action_name", "timestamp"]
    assert both["query"]["required"] == ["user_query"]
    assert run_ubi(["schema", "--kind", "event"]) == 0
    event = json.loads(capsys.readouterr().out)
    assert event["title"] == "UbiEvent" and "event_id" in event["properties"]


def test_import_names_the_item_of_an_array_and_keeps_its_file_position(db, tmp_path, make_event, capsys):
    """Rejected items of a JSON array are named by index in both outputs; past the first 5,000-record
    chunk the index is still the file's (and is what failed_records keeps)."""
    from ubi_pipeline.collector.importer import CHUNK_ITEMS

    events = [make_event() for _ in range(CHUNK_ITEMS + 3)]
    events[2]["action_name"] = ""
    events[CHUNK_ITEMS + 1]["timestamp"] = "0001-01-01T00:00:00+05:00"  # year 0 in UTC: used to crash import
    f = tmp_path / "events.json"
    f.write_bytes(orjson.dumps(events, option=orjson.OPT_INDENT_2))
    assert run_ubi(["import", str(f), "--db", str(db), "--json"]) == 1  # 2 rejected, the rest accepted
    out = json.loads(capsys.readouterr().out)["files"][0]
    assert (out["events"], out["rejected"]) == (CHUNK_ITEMS + 1, 2)
    # a streamed array names the line each item starts on: "[" is line 1, and every event takes the same
    # number of lines in orjson's indented output
    per = orjson.dumps(events[0], option=orjson.OPT_INDENT_2).count(b"\n") + 1
    assert [(e["index"], e["line"], e["field"]) for e in out["errors"]] == [
        (2, 2 + 2 * per, "action_name"),
        (CHUNK_ITEMS + 1, 2 + (CHUNK_ITEMS + 1) * per, "timestamp"),
    ]
    assert "outside 0001-01-01..9999-12-31" in out["errors"][1]["message"]
    assert count(db, "SELECT list(item_index ORDER BY item_index) FROM failed_records") == [
        2,
        CHUNK_ITEMS + 1,
    ]

    bad = tmp_path / "bad.json"
    bad.write_bytes(orjson.dumps([make_event(), make_event(action_name=...)]))
    assert run_ubi(["import", str(bad), "--db", str(db)]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert f"rejected {bad}:1 item 1 field action_name: 'action_name' is required" in text


def test_import_accepts_a_leading_byte_order_mark(db, tmp_path, make_event, make_query):
    """Windows tools start UTF-8 files with EF BB BF; orjson calls that malformed JSON."""
    bom = b"\xef\xbb\xbf"
    arr, nd, bulk = tmp_path / "a.json", tmp_path / "b.ndjson", tmp_path / "c.ndjson"
    arr.write_bytes(bom + orjson.dumps([make_event(), make_event()]))
    nd.write_bytes(bom + orjson.dumps(make_query()) + b"\n" + orjson.dumps(make_query()) + b"\n")
    bulk.write_bytes(
        bom + b'{"index": {"_index": "ubi_events", "_id": "b1"}}\n' + orjson.dumps(make_event()) + b"\n"
    )
    assert run_ubi(["import", str(arr), str(nd), str(bulk), "--db", str(db), "--json"]) == 0
    assert count(db, "SELECT count(*) FROM ubi_events") == 3
    assert count(db, "SELECT count(*) FROM ubi_queries") == 2
    assert count(db, "SELECT count(*) FROM failed_records") == 0


def _validator(schema: dict):
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_schema_output_accepts_every_sample_record_and_rejects_malformed_ones(capsys):
    """`ubi schema` describes what the collector accepts: every record of the real sample validates against
    it (473 queries, 3,448 events: counted in tests_collector_support), with a JSON Schema validator."""
    assert run_ubi(["schema"]) == 0
    both = json.loads(capsys.readouterr().out)
    validators = {"ubi_queries": _validator(both["query"]), "ubi_events": _validator(both["event"])}
    lines = [line for line in shared_path(SAMPLE_LOG).read_bytes().splitlines() if line.strip()]
    seen = {"ubi_queries": 0, "ubi_events": 0}
    for action, doc in zip(lines[::2], lines[1::2], strict=True):
        index = orjson.loads(action)["index"]["_index"]
        errors = [e.message for e in validators[index].iter_errors(orjson.loads(doc))]
        assert errors == [], (index, doc[:200])
        seen[index] += 1
    assert (seen["ubi_queries"], seen["ubi_events"]) == (SAMPLE_QUERIES, SAMPLE_EVENTS)
    spec_sample = json.loads(shared_path("ubi-samples/event-opensearch.json").read_text())  # position {}, no object_id
    assert validators["ubi_events"].is_valid(spec_sample)
    for bad in (
        {"action_name": "click"},  # no timestamp
        {"action_name": "click", "timestamp": "later"},
        {"action_name": "click", "timestamp": 1, "event_attributes": {"position": {"ordinal": "3"}}},
        {"action_name": "click", "timestamp": 1, "event_attributes": {"object": {"object_id": "o" * 257}}},
    ):
        assert not validators["ubi_events"].is_valid(bad), bad
    assert not validators["ubi_queries"].is_valid({"query_id": "q"})  # no user_query


def test_import_progress_every_takes_non_negative_seconds(db, tmp_path, make_event, capsys):
    f = tmp_path / "e.ndjson"
    f.write_bytes(orjson.dumps(make_event()) + b"\n")
    for bad, why in (("-1", "expected seconds >= 0, got '-1'"), ("soon", "expected a number of seconds, got 'soon'"),
                     ("nan", "expected seconds >= 0, got 'nan'")):
        try:
            run_ubi(["import", str(f), "--db", str(db), "--progress-every", bad])
        except SystemExit as exc:  # argparse's usage error
            assert exc.code == 2
        else:
            raise AssertionError(f"--progress-every {bad} was accepted")
        assert why in capsys.readouterr().err
    # what 0 does (a line after every chunk) is what test_import_stream's killed-import test relies on
    assert run_ubi(["import", str(f), "--db", str(db), "--progress-every", "0"]) == 0


def test_failed_table_shows_stored_text_as_is_and_drops_escape_sequences(db, tmp_path, make_event, capsys):
    # issue 28: "no such index [my_logs]" lost its "[my_logs]" (rich read it as markup), and a raw line with
    # escape sequences was written to the terminal as is (here: clear the screen, set the window title)
    f = tmp_path / "bulk.ndjson"
    f.write_bytes(b'{"index": {"_index": "my_logs"}}\n{"action_name": "click"}\n')
    g = tmp_path / "bad.ndjson"
    g.write_bytes(orjson.dumps(make_event()) + b'\n{"action_name": "\x1b[2J\x1b]0;pwned\x07[bold]x"}\n')
    run_ubi(["import", str(f), "--db", str(db), "--json"])
    run_ubi(["import", str(g), "--db", str(db), "--json"])
    capsys.readouterr()
    assert run_ubi(["failed", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "no such index [my_logs]" in out
    assert '{"action_name": "[bold]x"}' in out  # the raw line without its sequences, its brackets kept
    assert "\x1b" not in out and "pwned" not in out and "\x07" not in out
    assert run_ubi(["failed", "--db", str(db), "--json"]) == 0
    raws = [item["raw"] for item in json.loads(capsys.readouterr().out)["items"]]
    assert '{"action_name": "\x1b[2J\x1b]0;pwned\x07[bold]x"}' in raws  # --json keeps the text as stored


def test_import_table_keeps_brackets_in_file_names(db, tmp_path, make_event, capsys):
    f = tmp_path / "[day1]events.ndjson"
    f.write_bytes(orjson.dumps(make_event()) + b"\n")
    assert run_ubi(["import", str(f), "--db", str(db)]) == 0
    assert "[day1]events.ndjson" in capsys.readouterr().out
