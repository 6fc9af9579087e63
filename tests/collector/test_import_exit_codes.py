"""``ubi import`` exit codes (issue 12): 0 all stored, 1 some rejected, 2 nothing accepted, with the likely command."""

from __future__ import annotations

import json

import orjson
import pytest
from tests_collector_support import count, run_ubi

from tests.conftest import ESCI_JUDGMENTS, shared_path
from ubi_pipeline.collector.import_hints import likely_command

QRELS_JSONL = b'{"query_id": "q01", "query": "red shoes", "relevant": {"d1": 2}}\n'


@pytest.mark.parametrize(("name", "body", "command"), [
    ("qrels.jsonl", QRELS_JSONL, "`ubi judgments import"),
    ("qrels.trec", b"q01 0 d1 2\nq01 0 d2 0\n", "`ubi judgments import"),
    ("run.trec", b"q01 Q0 d1 1 3.5 bm25\n", "`ubi report --run"),
    ("sheet.csv", b"query,doc_id,grade\nred shoes,d1,2\n", "`ubi review import"),
])
def test_a_wrong_file_exits_2_and_names_the_command(db, tmp_path, capsys, name, body, command):
    f = tmp_path / name
    f.write_bytes(body)
    assert run_ubi(["import", str(f), "--db", str(db)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "records rejected and none accepted; exit 2" in err
    assert f"hint: {f} looks like" in err and command in err
    assert count(db, "SELECT count(*) FROM ubi_events") == 0


def test_the_workbench_judgments_sample_is_not_ubi_data(db, capsys):
    wb = shared_path(ESCI_JUDGMENTS)
    assert run_ubi(["import", str(wb), "--db", str(db), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == 2 and out["accepted"] == 0 and out["rejected"] >= 1
    assert out["hints"] == [f"{wb} looks like a Search Relevance Workbench judgment file: load it with "
                            f"`ubi judgments import {wb}` (or give it to `ubi report --qrels`)"]


def test_some_rejected_exits_1_and_a_clean_or_repeated_import_0(db, tmp_path, make_event, capsys):
    f = tmp_path / "e.ndjson"
    f.write_bytes(orjson.dumps(make_event()) + b"\n" + orjson.dumps(make_event(action_name=...)) + b"\n")
    assert run_ubi(["import", str(f), "--db", str(db)]) == 1
    assert "1 records rejected (1 accepted); exit 1" in " ".join(capsys.readouterr().err.split())
    good = tmp_path / "g.ndjson"
    good.write_bytes(orjson.dumps(make_event()) + b"\n")
    assert run_ubi(["import", str(good), "--db", str(db)]) == 0
    assert run_ubi(["import", str(good), "--db", str(db)]) == 0  # all duplicates: stored already, not an error


def test_ubi_records_get_no_hint(tmp_path, make_event):
    f = tmp_path / "e.ndjson"
    f.write_bytes(orjson.dumps(make_event()) + b"\n")
    assert likely_command(f) is None
    a = tmp_path / "a.json"
    a.write_bytes(orjson.dumps([make_event()]))
    assert likely_command(a) is None


def _ubi_main(argv: list[str]) -> int:
    from ubi_pipeline.cli import main

    return main(argv)


def test_a_search_request_with_ext_ubi_is_named_and_nothing_is_imported(db, tmp_path, capsys):
    # the UBI samples' query-opensearch.json: a search request whose ext.ubi block OpenSearch's plugin logs
    sample = shared_path("ubi-samples/query-opensearch.json")
    assert _ubi_main(["import", str(sample), "--db", str(db)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: {sample} is an OpenSearch search request with an ext.ubi block, not UBI records" in err
    assert "/v1/queries" in err and err.endswith("Nothing was imported")
    assert not db.exists()  # was: one item rejected ("'action_name' is required") and kept in failed_records
    lines = tmp_path / "searches.ndjson"  # the same as NDJSON, one request a line
    lines.write_bytes(b'{"query": {"match_all": {}}, "ext": {"ubi": {"query_id": "q1", "user_query": "a"}}}\n' * 3)
    assert _ubi_main(["import", str(lines), "--db", str(db), "--json"]) == 2
    assert capsys.readouterr().out == ""  # no summary: nothing was read into the store


def test_a_dashboard_metrics_file_is_named_and_nothing_is_imported(db, tmp_path, make_event, capsys):
    # the dashboards' sample (3,360 lines: 1,680 rows, each rejected before as "no such index")
    sample = shared_path("ubi-samples/sample_search_quality_evaluation_data.ndjson")
    good = tmp_path / "e.ndjson"
    good.write_bytes(orjson.dumps(make_event()) + b"\n")
    assert _ubi_main(["import", str(good), str(sample), "--db", str(db)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: {sample} is a search-quality dashboard metrics file" in err
    assert f"--data-binary @{sample}` (it goes to sqe_metrics_sample_data)" in err
    assert not db.exists()  # refused before reading any file, the good one included


def test_records_that_merely_mention_ext_or_metrics_are_imported(db, tmp_path, make_event, make_query):
    from ubi_pipeline.collector.import_hints import not_ubi_records

    f = tmp_path / "r.ndjson"
    f.write_bytes(orjson.dumps(make_query(query_attributes={"ext": {"ubi": {}}})) + b"\n"
                  + orjson.dumps(make_event(event_attributes={"metric": "x", "value": 1})) + b"\n")
    assert not_ubi_records(f) is None
    assert not_ubi_records(shared_path("ubi-samples/ubi_queries_events.ndjson")) is None
    assert not_ubi_records(shared_path(ESCI_JUDGMENTS)) is None  # a likely_command hint after the import instead


def test_import_applies_the_privacy_settings_the_collector_applies(db, tmp_path, monkeypatch, make_event):
    """``ubi import`` runs the collector's record filters (``record_filters.py``, loaded without the web stack):
    with a pseudonymisation key set, client_id is stored as its keyed hash and a dropped field is gone.
    Expected value: :func:`ubi_pipeline.collector.record_filters.pseudonym` of the id sent, under the key set."""
    import duckdb

    from ubi_pipeline.collector.record_filters import pseudonym

    monkeypatch.setenv("UBI_PSEUDONYMISE_KEY", "pepper")
    monkeypatch.setenv("UBI_DROP_FIELDS", '["message"]')
    f = tmp_path / "events.ndjson"
    f.write_bytes(orjson.dumps({**make_event(), "client_id": "alice", "message": "secret"}) + b"\n")
    assert _ubi_main(["import", str(f), "--db", str(db), "--json"]) == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT client_id, message FROM ubi_events").fetchall() == [
            (pseudonym("alice", b"pepper"), None)]
    finally:
        con.close()
