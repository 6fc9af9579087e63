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
