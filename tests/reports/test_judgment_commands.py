"""`ubi judgments export` / `ubi judgments import` end to end, through `ubi_pipeline.cli.main` (real DuckDB files).

The small world is joint_fixtures': human JSONL q1 "red shoes" {d1: 3, d2: 1, d3: 0} (assessor ann), q2 "blue
hat" {h1: 2, h2: 0}, q3 "green bag" {b1: 0}; implicit:ctr rows red shoes d1 3, d2 2, d4 1, blue hat h1 1,
h2 0, green bag b2 (no grade). The real file is the ESCI Workbench sample: 150 queries, 6678 ratings
(grep -c: 1086 "0.000", 305 "1.000", 1898 "10.000", 3389 "100.000").
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import duckdb
import pytest
from joint_fixtures import HUMAN_JSONL, JUDGMENTS, build_store

from tests.conftest import ESCI_JUDGMENTS, shared_path
from tests.store_support import only_store_files
from ubi_pipeline.cli import main
from ubi_pipeline.formats.qrels import load_qrels


def rows(db: Path, sql: str = "SELECT query, doc_id, grade FROM human_judgments ORDER BY ALL") -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def ratings(path: Path) -> dict[tuple[str, str], str]:
    doc = json.loads(path.read_text())
    return {(e["query"], r["docId"]): r["rating"] for e in doc["judgmentRatings"] for r in e["ratings"]}


def test_esci_workbench_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = shared_path(ESCI_JUDGMENTS)
    db = tmp_path / "j.duckdb"
    got = run_json(capsys, "judgments", "import", str(sample), "--db", str(db), "--json")
    assert (got["format"], got["queries"], got["judgments"], got["replaced"], got["removed"]) == (
        "workbench", 150, 6678, 0, 0)
    assert got["rating_map"] == "esci (0->0, 1->1, 10->2, 100->3)" and got["unmatched_queries"] is None  # no logs
    # grades by the stated map: 0.000 -> 0, 1.000 -> 1, 10.000 -> 2, 100.000 -> 3, counted as in the file
    assert rows(db, "SELECT grade, count(*) FROM human_judgments GROUP BY 1 ORDER BY 1") == [
        (0, 1086), (1, 305), (2, 1898), (3, 3389)]
    assert rows(db, "SELECT DISTINCT source, origin FROM human_judgments") == [("human", str(sample.resolve()))]

    out = tmp_path / "export.json"
    assert main(["judgments", "export", "--db", str(db), "--format", "workbench", "--out", str(out)]) == 0
    # loads back equal to the original: the same (query, doc) -> rating strings, so the same grades
    assert ratings(out) == ratings(sample)
    assert len(ratings(out)) == 6678
    assert load_qrels(out).grades == load_qrels(sample).grades
    assert json.loads(out.read_text())["type"] == "IMPORT_JUDGMENT"
    assert "wrote 6678 judgments of 150 queries (human) as workbench" in " ".join(capsys.readouterr().err.split())
    # importing again replaces every pair, adds none
    again = run_json(capsys, "judgments", "import", str(sample), "--db", str(db), "--json")
    assert again["replaced"] == 6678 and rows(db, "SELECT count(*) FROM human_judgments") == [(6678,)]


def test_jsonl_and_trec_round_trips_keep_grades_texts_and_provenance(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    qrels = tmp_path / "human.jsonl"
    qrels.write_text(HUMAN_JSONL.replace('"assessor": "ann"}', '"assessor": "ann", "judged_at": '
                                         '"2025-03-01T12:00:00Z", "rubric": "esci-v1"}'))
    db = tmp_path / "a.duckdb"
    assert main(["judgments", "import", str(qrels), "--db", str(db), "--assessor", "bob"]) == 0
    # ann judged q1 (the file says so; judged_at stored as naive UTC); q2 and q3 name nobody, so the command
    # line's bob is kept for them
    assert rows(db, "SELECT query_id, query, doc_id, grade, assessor, rubric, judged_at FROM human_judgments "
                    "ORDER BY query, doc_id") == [
        ("q2", "blue hat", "h1", 2, "bob", None, None), ("q2", "blue hat", "h2", 0, "bob", None, None),
        ("q3", "green bag", "b1", 0, "bob", None, None),
        *[("q1", "red shoes", d, g, "ann", "esci-v1", datetime(2025, 3, 1, 12))
          for d, g in (("d1", 3), ("d2", 1), ("d3", 0))],
    ]
    jsonl = tmp_path / "out.jsonl"
    assert main(["judgments", "export", "--db", str(db), "--format", "jsonl", "--out", str(jsonl)]) == 0
    # one line per query, sorted by text; the stored query ids and the per-query provenance come back
    assert jsonl.read_text().splitlines() == [
        '{"query_id": "q2", "query": "blue hat", "relevant": {"h1": 2, "h2": 0}, "assessor": "bob"}',
        '{"query_id": "q3", "query": "green bag", "relevant": {"b1": 0}, "assessor": "bob"}',
        '{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 3, "d2": 1, "d3": 0}, "assessor": "ann", '
        '"rubric": "esci-v1", "judged_at": "2025-03-01T12:00:00Z"}',
    ]
    assert load_qrels(jsonl).grades == load_qrels(qrels).grades

    trec = tmp_path / "out.qrels"
    assert main(["judgments", "export", "--db", str(db), "--format", "trec", "--out", str(trec)]) == 0
    # the query text is the id, percent-escaped, so the import reads the text back without a query set
    assert trec.read_text() == ("blue%20hat 0 h1 2\nblue%20hat 0 h2 0\ngreen%20bag 0 b1 0\n"
                                "red%20shoes 0 d1 3\nred%20shoes 0 d2 1\nred%20shoes 0 d3 0\n")
    db2 = tmp_path / "b.duckdb"
    assert main(["judgments", "import", str(trec), "--db", str(db2)]) == 0
    assert rows(db2) == rows(db)


def test_trec_with_a_query_set_and_strict_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "j.duckdb"
    trec = tmp_path / "q.txt"
    trec.write_text("q1 0 d1 3\nq1 0 d2 1\nq2 0 h1 2\n")
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"query_id": "q1", "query": "Red  Shoes"}\n{"query_id": "q2", "query": "blue hat"}\n')
    got = run_json(capsys, "judgments", "import", str(trec), "--db", str(db), "--queries", str(queries), "--json")
    assert (got["format"], got["queries"], got["judgments"]) == ("trec", 2, 3)
    # texts come from the query set, normalised ("Red  Shoes" -> "red shoes"); the ids are kept
    assert rows(db, "SELECT query_id, query, doc_id, grade FROM human_judgments ORDER BY ALL") == [
        ("q1", "red shoes", "d1", 3), ("q1", "red shoes", "d2", 1), ("q2", "blue hat", "h1", 2)]

    def fails(argv: list[str], fragment: str) -> None:
        assert main(argv) == 2
        assert fragment in " ".join(capsys.readouterr().err.split())

    # an id the query set lacks: named with its line; nothing of the file is stored
    trec.write_text("q1 0 d9 1\nq7 0 x 1\n")
    fails(["judgments", "import", str(trec), "--db", str(db), "--queries", str(queries)],
          f"{trec}:2: query 'q7' is not in the query set")
    # two ids whose texts normalise alike would merge two queries
    trec.write_text("Red%20Shoes 0 d1 3\nred%20shoes 0 d2 1\n")
    fails(["judgments", "import", str(trec), "--db", str(db)],
          f"{trec}:2: query 'red%20shoes' has the text 'red shoes' of query 'Red%20Shoes' on line 1")
    # a Workbench rating outside the map
    wb = tmp_path / "wb.json"
    wb.write_text('{"judgmentRatings": [\n {"query": "a", "ratings": [\n  {"docId": "d", "rating": "5.000"}\n ]}\n]}\n')
    fails(["judgments", "import", str(wb), "--db", str(db)], f"{wb}:3: query 'a', docId 'd': rating '5.000' is not in")
    assert main(["judgments", "import", str(wb), "--db", str(db), "--rating-map", "0:0,5:4"]) == 0
    assert rows(db, "SELECT query, doc_id, grade FROM human_judgments WHERE query = 'a'") == [("a", "d", 4)]
    assert rows(db, "SELECT count(*) FROM human_judgments") == [(4,)]  # 3 + 1: the failed imports stored nothing
    # an empty file is no judgments, not a silent no-op
    (tmp_path / "empty.trec").write_text("")
    fails(["judgments", "import", str(tmp_path / "empty.trec"), "--db", str(db)], "empty.trec: no judgments")


def test_replace_and_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = build_store(tmp_path / "ubi.duckdb")  # logs and implicit:ctr rows
    first = tmp_path / "h.jsonl"
    first.write_text(HUMAN_JSONL)
    got = run_json(capsys, "judgments", "import", str(first), "--db", str(db), "--json")
    # the logs saw red shoes, blue hat and green bag: every imported text matches
    assert (got["judgments"], got["replaced"], got["unmatched_queries"]) == (6, 0, 0)
    second = tmp_path / "new.jsonl"
    second.write_text('{"query_id": "n1", "query": "red shoes", "relevant": {"d1": 2, "d7": 1}}\n'
                      '{"query_id": "n2", "query": "no such query", "relevant": {"z": 1}}\n')
    got = run_json(capsys, "judgments", "import", str(second), "--db", str(db), "--replace", "--json")
    # --replace is scoped to the file's assessor ('', unnamed): its 3 stored rows (blue hat, green bag) of pairs the
    # file lacks go; ann's red shoes rows stay, her d1 beside the new unnamed d1; 1 of 2 texts unlogged
    assert (got["judgments"], got["replaced"], got["removed"], got["unmatched_queries"]) == (3, 0, 3, 1)
    assert rows(db) == [("no such query", "z", 1), ("red shoes", "d1", 2), ("red shoes", "d1", 3),
                        ("red shoes", "d2", 1), ("red shoes", "d3", 0), ("red shoes", "d7", 1)]

    # implicit source (a bare model name means implicit:<name>): graded rows only, b2 has no grade
    trec = tmp_path / "ctr.qrels"
    assert main(["judgments", "export", "--db", str(db), "--source", "ctr", "--format", "trec", "--out",
                 str(trec)]) == 0
    assert trec.read_text() == ("blue%20hat 0 h1 1\nblue%20hat 0 h2 0\n"
                                "red%20shoes 0 d1 3\nred%20shoes 0 d2 2\nred%20shoes 0 d4 1\n")
    # merged, human first: red shoes d1 2 (the lower median of ann's 3 and the unnamed 2), d2 1, d3 0, d7 1
    # (human), d4 1 (implicit fills), blue hat from ctr
    assert main(["judgments", "export", "--db", str(db), "--source", "merged", "--format", "jsonl"]) == 0
    merged = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["query"], r["relevant"]) for r in merged] == [
        ("blue hat", {"h1": 1, "h2": 0}), ("no such query", {"z": 1}),
        ("red shoes", {"d1": 2, "d2": 1, "d3": 0, "d4": 1, "d7": 1})]
    assert main(["judgments", "export", "--db", str(db), "--source", "merged", "--precedence", "implicit,human",
                 "--format", "jsonl"]) == 0
    flipped = {r["query"]: r["relevant"] for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert flipped["red shoes"] == {"d1": 3, "d2": 2, "d3": 0, "d4": 1, "d7": 1}  # d1, d2 now from ctr
    assert main(["judgments", "export", "--db", str(db), "--source", "pbm", "--format", "trec"]) == 2
    assert "no graded judgment of source 'implicit:pbm'; sources present: human, implicit:ctr" in " ".join(
        capsys.readouterr().err.split())
    # a grade the Workbench map cannot express is an error, not a lossy file
    assert main(["judgments", "export", "--db", str(db), "--format", "workbench", "--rating-map", "0:0,1:1"]) == 2
    assert "grade 2 has no rating in the rating map" in " ".join(capsys.readouterr().err.split())


def test_export_implicit_names_the_one_model_and_refuses_to_mix_several(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # issue 28: with two models, `--source implicit` took per pair whichever graded model sorted first, a file
    # of no model at all, though the help said "every model"
    one = build_store(tmp_path / "one.duckdb")  # implicit:ctr only
    assert main(["judgments", "export", "--db", str(one), "--source", "implicit", "--format", "trec"]) == 0
    assert capsys.readouterr().out == ("blue%20hat 0 h1 1\nblue%20hat 0 h2 0\n"
                                       "red%20shoes 0 d1 3\nred%20shoes 0 d2 2\nred%20shoes 0 d4 1\n")  # as ctr
    # a second model, pbm, grading every pair 0: the old per-pair choice gave ctr's grades (c < p), pbm nowhere
    pbm = [{**row, "source": "implicit:pbm", "grade": None if row["grade"] is None else 0} for row in JUDGMENTS]
    two = build_store(tmp_path / "two.duckdb", judgments=JUDGMENTS + pbm)
    assert main(["judgments", "export", "--db", str(two), "--source", "implicit", "--format", "trec"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--source implicit is ambiguous: the store holds graded judgments of 2 click models (implicit:ctr, " \
           "implicit:pbm)" in err
    assert "--source ctr" in err and "--source merged --precedence implicit:ctr,implicit:pbm" in err
    assert main(["judgments", "export", "--db", str(two), "--source", "pbm", "--format", "trec"]) == 0
    assert {line.split()[-1] for line in capsys.readouterr().out.splitlines()} == {"0"}  # pbm's own grades


def test_import_and_export_while_a_collector_holds_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ubi_pipeline.demo import running_collector

    db = build_store(tmp_path / "ubi.duckdb")
    qrels = tmp_path / "h.jsonl"
    qrels.write_text(HUMAN_JSONL)
    with running_collector(db, log=tmp_path / "collector.log"):
        got = run_json(capsys, "judgments", "import", str(qrels), "--db", str(db), "--json")
        assert (got["judgments"], got["unmatched_queries"]) == (6, 0)
        assert main(["judgments", "export", "--db", str(db), "--format", "trec"]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 6
        assert only_store_files(db)  # read through sealed segments: no copy of the database, nothing left
    assert rows(db, "SELECT count(*) FROM human_judgments WHERE source = 'human'") == [(6,)]


def test_help_explains(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, fragments in (
        (["judgments", "export", "--help"], ("percent-escaped", "--precedence", "workbench", "implicit:<model>")),
        (["judgments", "import", "--help"], ("--queries", "--replace", "--rating-map", "nothing is stored")),
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0
        out = " ".join(capsys.readouterr().out.split())
        assert all(f in out for f in fragments), out
    assert main(["judgments"]) == 2
