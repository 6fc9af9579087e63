"""``ubi process`` and ``ubi review export|import`` end to end, on the real sample in a DuckDB file."""

from __future__ import annotations

import csv
import shutil
from datetime import datetime
from pathlib import Path

import duckdb
import orjson
import pytest
from ubi_records import build_sample_store

from tests.store_support import only_store_files
from ubi_pipeline.cli import main
from ubi_pipeline.processors.labels.implicit import read_jsonl, read_trec, trec_query_id

# The sample's hand-checked counts (tests/processors/test_sessions.py) are those of base 0 everywhere; with
# the default, auto-detection, Chorus counts from 1 (test_process_names_the_base_in_use).
BASE0 = ("--position-base", "0")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sample_store(tmp_path_factory.mktemp("sample") / "ubi.duckdb")


@pytest.fixture()
def db(pristine: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "ubi.duckdb"
    shutil.copy(pristine, dest)
    return dest


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return orjson.loads(capsys.readouterr().out)


def err(capsys: pytest.CaptureFixture[str]) -> str:
    """stderr with rich's line wrapping undone."""
    return " ".join(capsys.readouterr().err.split())


def query(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_process_stores_and_writes_jsonl(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "j.jsonl"
    summary = run_json(capsys, "process", "--db", str(db), *BASE0, "--source", "coec", "--out", str(out), "--json")
    # one row per (query, doc) of the 278 fitted sessions: 1,003 pairs (tests/processors/test_sessions.py)
    assert (summary["source"], summary["pairs"], summary["stored"], summary["rows_written"]) == (
        "implicit:coec", 1003, 1003, 1003)
    assert summary["sessions"]["sessions"] == 278 and summary["quality"]["click_rank_disagreements"] == 115
    # at min support 10 no COEC interval is narrow enough (0.5 x 2.2 on the ratio scale) on this small sample
    assert summary["graded"] == 0
    back = read_jsonl(out)
    stored = query(db, "SELECT count(*), count(grade), min(source), max(source) FROM judgments")
    assert stored == [(1003, 0, "implicit:coec", "implicit:coec")]
    assert len(back) == 1003 and back[0].source == "implicit:coec" and back[0].query == "30 inch ceiling fan without light"


def test_process_trec_round_trips_the_graded_rows(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "j.qrels"
    summary = run_json(capsys, "process", "--db", str(db), *BASE0, "--model", "ctr", "--out", str(out), "--min-support", "3",
                       "--max-ci-width", "2", "--json")
    assert summary["out_format"] == "trec" and summary["rows_written"] == summary["graded"] > 0
    stored = query(db, "SELECT query, doc_id, grade FROM judgments WHERE grade IS NOT NULL ORDER BY 1, 2")
    assert sorted((q.query_id, q.doc_id, q.grade) for q in read_trec(out)) == sorted(stored)
    # a second run of the same source replaces, never duplicates
    run_json(capsys, "process", "--db", str(db), *BASE0, "--model", "ctr", "--no-store", "--json")
    run_json(capsys, "process", "--db", str(db), *BASE0, "--model", "ctr", "--json")
    assert query(db, "SELECT count(*) FROM judgments") == [(1003,)]


def test_process_errors_are_one_line(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["process", "--db", str(db), *BASE0, "--model", "gctr"]) == 2
    assert "no per-pair relevance" in err(capsys)
    assert main(["process", "--db", str(tmp_path / "missing.duckdb"), "--model", "ctr"]) == 2
    assert "no such database" in err(capsys)
    assert main(["process", "--db", str(db), *BASE0, "--model", "nosuch"]) == 2
    assert "unknown model 'nosuch'; choose one of ctr, coec, pbm, ubm, cascade, dcm, sdbn, dbn" in err(capsys)
    assert main(["process", "--db", str(db), *BASE0, "--min-support", "-1"]) == 2
    assert "minimum support must be a whole number of observations >= 0" in err(capsys)
    assert main(["process", "--db", str(db), *BASE0, "--max-ci-width", "-1"]) == 2
    assert "maximum interval width must be a number > 0" in err(capsys)
    assert main(["process", "--db", str(db), *BASE0, "--format", "trec"]) == 2
    assert "--format trec says how to write the --out file, but no --out FILE was given" in err(capsys)
    # none of the refused runs touched the store
    assert query(db, "SELECT count(*) FROM judgments") == [(0,)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query_id": "a", "query": "x", "relevant": {"d": "high"}}\n')
    assert main(["process", "--db", str(db), *BASE0, "--model", "ctr", "--calibrate", str(bad)]) == 2
    assert "bad.jsonl:1" in err(capsys)


def test_process_calibrates_on_the_fit_split_only(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # human grades for every sample pair the CTR model sees, from its clicks: 2 if clicked, else 0
    run_json(capsys, "process", "--db", str(db), *BASE0, "--model", "ctr", "--no-store", "--out", str(tmp_path / "all.jsonl"),
             "--json")
    graded = {}
    for j in read_jsonl(tmp_path / "all.jsonl"):
        graded.setdefault(j.query, {})[j.doc_id] = 2 if j.clicks else 0
    qrels = tmp_path / "human.jsonl"
    qrels.write_text("".join(orjson.dumps({"query_id": f"q{i}", "query": q, "relevant": rel}).decode() + "\n"
                             for i, (q, rel) in enumerate(sorted(graded.items()))))
    # raw CTR (--prior none): shrinkage would reorder a once-clicked pair seen often below an unclicked rare one
    summary = run_json(capsys, "process", "--db", str(db), *BASE0, "--model", "ctr", "--calibrate", str(qrels),
                       "--min-support", "1", "--max-ci-width", "100", "--prior", "none", "--json")
    cal = summary["calibration"]
    assert cal["human_pairs"] == cal["overlap"] == cal["overlap_eligible"] == 1003
    assert cal["fit"]["pairs"] + cal["holdout"]["pairs"] == 1003
    # clicked (CTR > 0) versus never clicked separates perfectly: the fitted cut agrees on held-out pairs
    assert cal["holdout"]["kappa"] == pytest.approx(1.0)
    marks = query(db, "SELECT json_extract_string(parameters, '$.calibration_split') AS s, count(*) FROM judgments "
                      "GROUP BY s ORDER BY s")
    assert marks == [("fit", cal["fit"]["pairs"]), ("holdout", cal["holdout"]["pairs"])]


def test_review_round_trip(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_json(capsys, "process", "--db", str(db), *BASE0, "--model", "ctr", "--min-support", "3", "--json")
    sheet = tmp_path / "review.csv"
    exp = run_json(capsys, "review", "export", "--db", str(db), "--top", "3", "--per-query", "4", "--out", str(sheet),
                   "--json")
    assert exp["source"] == "implicit:ctr" and exp["queries"] == 3 and exp["rows"] == 12
    with open(sheet, newline="") as f:
        table = list(csv.DictReader(f))
    assert table[0]["grade"] == "" and table[0]["source"] == "implicit:ctr" and table[0]["query_id"] == trec_query_id(
        table[0]["query"])
    # the assessor grades all but the last row; one row names a second assessor
    for i, row in enumerate(table[:-1]):
        row["grade"] = str(i % 4)
    table[1]["assessor"] = "bob"
    assert "judged_at" in table[0]  # the export leaves a column for the date
    table[2]["judged_at"] = "2025-03-01T14:30:00+01:00"  # stored as naive UTC: 13:30
    with open(sheet, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    imp = run_json(capsys, "review", "import", str(sheet), "--db", str(db), "--assessor", "alice", "--rubric", "r1",
                   "--date", "2025-02-10", "--json")
    assert (imp["rows"], imp["imported"], imp["reviewed"], imp["human"], imp["skipped_ungraded"]) == (12, 11, 11, 0, 1)
    # the row's own date wins; every other row takes --date (midnight UTC), not the import time
    dates = dict(((q, d), t) for q, d, t in query(db, "SELECT query, doc_id, judged_at FROM human_judgments"))
    assert dates.pop((table[2]["query"], table[2]["doc_id"])) == datetime(2025, 3, 1, 13, 30)
    assert set(dates.values()) == {datetime(2025, 2, 10)}
    got = query(db, "SELECT query, doc_id, grade, source, assessor, rubric FROM human_judgments ORDER BY judged_at, "
                    "query, doc_id")
    want = {(r["query"], r["doc_id"], int(r["grade"]), "reviewed:implicit:ctr", r["assessor"] or "alice", "r1")
            for r in table[:-1]}
    assert set(got) == want
    # importing again replaces the same rows
    run_json(capsys, "review", "import", str(sheet), "--db", str(db), "--assessor", "alice", "--json")
    assert query(db, "SELECT count(*) FROM human_judgments") == [(11,)]


def test_blind_review_becomes_human_and_bad_rows_name_the_line(db: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    run_json(capsys, "process", "--db", str(db), *BASE0, "--model", "ctr", "--json")
    queries = tmp_path / "queries.txt"
    queries.write_text("# two queries\nGAMING chair\nno such query\n")
    sheet = tmp_path / "blind.jsonl"
    exp = run_json(capsys, "review", "export", "--db", str(db), "--queries", str(queries), "--blind",
                   "--out", str(sheet), "--json")
    assert exp["queries_without_candidates"] == ["no such query"]
    rows = [orjson.loads(line) for line in sheet.read_text().splitlines()]
    assert rows and all(r["source"] is None and "score" not in r and r["query"] == "gaming chair" for r in rows)
    for r in rows:
        r["grade"] = 1
        r["date"] = "2024-12-24"  # a `date` column works as well as `judged_at`
    sheet.write_text("".join(orjson.dumps(r).decode() + "\n" for r in rows))
    imp = run_json(capsys, "review", "import", str(sheet), "--db", str(db), "--assessor", "carol", "--json")
    assert (imp["human"], imp["reviewed"]) == (len(rows), 0)
    assert query(db, "SELECT DISTINCT source, assessor, judged_at FROM human_judgments") == [
        ("human", "carol", datetime(2024, 12, 24))]
    rows[0]["date"] = "Christmas Eve"
    sheet.write_text("".join(orjson.dumps(r).decode() + "\n" for r in rows))
    assert main(["review", "import", str(sheet), "--db", str(db), "--assessor", "carol"]) == 2
    assert "blind.jsonl:1: 'date': expected an ISO 8601 date such as 2025-03-01" in err(capsys)
    rows[0]["date"] = None
    rows[1]["grade"] = 7
    sheet.write_text("".join(orjson.dumps(r).decode() + "\n" for r in rows))
    assert main(["review", "import", str(sheet), "--db", str(db), "--assessor", "carol"]) == 2
    assert "blind.jsonl:2: grade 7 is above the top grade 3" in err(capsys)


def test_help_texts_explain(capsys: pytest.CaptureFixture[str]) -> None:
    def help_of(*argv: str) -> str:
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--help"])
        assert exit_.value.code == 0
        return " ".join(capsys.readouterr().out.split())

    text = help_of("process")
    assert "a grade only when it has a confidence interval no wider than --max-ci-width AND at least --min-support " \
           "observations counted the model's way" in text
    assert "scores the model's prior, has no interval and gets no grade" in text
    assert "Write the candidate judgments of one implicit source" in help_of("review", "export")
    text = help_of("review", "import")
    assert "Load a review file graded by assessors" in text and "judged_at (or date) column, else --date" in text


def test_process_while_a_collector_holds_the_store(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real `ubi serve` process owns the file: sessions come from its sealed segments, judgments go through it."""
    from ubi_pipeline.demo import running_collector

    # A row of an earlier ctr run for a pair this run does not see: replacing the source must remove it.
    with duckdb.connect(str(db)) as con:
        con.execute("INSERT INTO judgments (query, doc_id, source, score, created_at) "
                    "VALUES ('stale query', 'gone-doc', 'implicit:ctr', 0.5, now())")
    with running_collector(db, log=tmp_path / "collector.log"):
        summary = run_json(capsys, "process", "--db", str(db), *BASE0, "--model", "ctr", "--json")
        assert (summary["sessions"]["sessions"], summary["stored"], summary["stale_rows_removed"]) == (278, 1003, True)
        exp = run_json(capsys, "review", "export", "--db", str(db), "--top", "1", "--out", str(tmp_path / "r.csv"),
                       "--json")
        assert exp["rows"] > 0
        assert only_store_files(db)  # read through sealed segments: no copy of the database, nothing left
    assert query(db, "SELECT count(*), min(source) FROM judgments") == [(1003, "implicit:ctr")]


def test_process_names_the_base_in_use(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 12: the evidence, the base in use, and a suggested setting when the data disagrees with it."""
    assert main(["process", "--db", str(db), "--model", "ctr", "--no-store"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    # test_sessions.py: Chorus ordinals 421 fit base 0 and 638 base 1; with base 1, 51 of 226 clicks disagree
    assert "51/226 click ordinals disagree" in text
    assert ("ordinals of Chorus: 421 fit base 0, 638 fit base 1 (of 1,060 checked against hit lists); "
            "base in use: 1 (detected)") in text
    assert "suggested setting" not in text
    assert main(["process", "--db", str(db), *BASE0, "--model", "ctr", "--no-store"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "115/226 click ordinals disagree" in text
    assert "base in use: 0 (UBI_POSITION_BASE / --position-base); the data fits base 1 better" in text
    assert """suggested setting: UBI_POSITION_BASE_BY_APPLICATION='{"Chorus": 1}'""" in text
    summary = run_json(capsys, "process", "--db", str(db), *BASE0, "--model", "ctr", "--no-store", "--json")
    assert summary["suggested_setting"] == """UBI_POSITION_BASE_BY_APPLICATION='{"Chorus": 1}'"""
    assert summary["quality"]["ordinal_bases"]["Chorus"]["base"] == 0
