"""Judgment and query-set loaders: every validation names file and line; every export loads back the same."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import ESCI_JUDGMENTS, shared_path
from ubi_pipeline.formats.qrels import (
    ESCI_RATINGS,
    INTEGER_RATINGS,
    Qrels,
    QrelsError,
    QuerySet,
    QuerySetQuery,
    RatingMap,
    format_qrels,
    load_corpus_ids,
    load_qrels,
    load_queryset,
    sniff_qrels_format,
    write_qrels,
    write_queryset,
)
from ubi_pipeline.schemas.errors import InputFileError


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jl(*rows: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def expect_error(path: Path, line: int | None, fragment: str, **options: object) -> QrelsError:
    with pytest.raises(QrelsError) as info:
        load_qrels(path, **options)  # type: ignore[arg-type]
    err = info.value
    assert isinstance(err, InputFileError)
    assert err.path == str(path)
    assert err.line == line, str(err)
    assert fragment in err.message, err.message
    assert str(err).startswith(f"{path}:{line}: " if line is not None else f"{path}: ")
    return err


# ---------------------------------------------------------------------------------------------- JSONL


def test_jsonl_loads_grades_text_and_provenance(tmp_path: Path) -> None:
    path = write(tmp_path, "q.jsonl", jl(
        {"query_id": "q01", "query": "space movie where the dad ages slowly", "relevant": {"interstellar-2014": 2}},
        {"query_id": "q02", "query": "Red  SHOES", "relevant": {"a": 0, "b": 3}, "assessor": "ann",
         "judged_at": "2024-05-16T12:00:00+02:00", "rubric": "esci-v1"},
        {"query_id": 7, "relevant": {"c": 1}},
    ))
    qrels = load_qrels(path)
    assert qrels.format == "jsonl"
    assert dict(qrels) == {"q01": {"interstellar-2014": 2}, "q02": {"a": 0, "b": 3}, "7": {"c": 1}}
    assert qrels.texts == {"q01": "space movie where the dad ages slowly", "q02": "Red  SHOES"}
    assert qrels.lines == {"q01": 1, "q02": 2, "7": 3}
    # 12:00 at +02:00 is 10:00 UTC, stored naive as every TIMESTAMP column is
    assert qrels.meta["q02"] == {"assessor": "ann", "rubric": "esci-v1", "judged_at": datetime(2024, 5, 16, 10, 0)}
    assert qrels.n_judgments() == 4


@pytest.mark.parametrize(
    ("lines", "line", "fragment"),
    [
        ([{"query_id": "q1", "relevant": {"a": 1}}, "", {"query_id": "q2", "relevant": {"a": 1}}], 2, "blank line"),
        ([{"query_id": "q1", "relevant": {"a": 1}}, "   "], 2, "blank line"),
        ([{"query_id": "q1", "relevant": {"a": 1}}, '{"query_id": "q2", "relevant": {"a": 1}'], 2, "malformed JSON"),
        ([{"query_id": "q1", "relevant": {"a": 1}}, {"query_id": "q2", "relevant": {}},
          {"query_id": "q1", "relevant": {"b": 1}}], 3, "duplicate query_id 'q1' (first on line 1)"),
        ([{"query_id": "q1", "query": "  ", "relevant": {"a": 1}}], 1, "non-empty text"),
        ([{"query_id": "q1", "query": 5, "relevant": {"a": 1}}], 1, "non-empty text"),
        ([{"query_id": "q1", "relevant": {"a": 1.5}}], 1, "grade 1.5 is not a non-negative integer"),
        ([{"query_id": "q1", "relevant": {"a": 2.0}}], 1, "grade 2.0 is not a non-negative integer"),
        ([{"query_id": "q1", "relevant": {"a": -1}}], 1, "grade -1 is not a non-negative integer"),
        ([{"query_id": "q1", "relevant": {"a": "2"}}], 1, "grade '2' is not a non-negative integer"),
        ([{"query_id": "q1", "relevant": {"a": True}}], 1, "grade True is not a non-negative integer"),
        ([{"query_id": "q1", "relevant": {"a": None}}], 1, "grade None is not a non-negative integer"),
        (['{"query_id": "q1", "relevant": {"a": 1, "a": 0}}'], 1, "key 'a' appears twice"),
        ([{"query_id": "q1", "relevance": {"a": 1}}], 1, "unknown key(s) 'relevance'"),
        ([{"query_id": "q1"}], 1, "\"relevant\" must be an object"),
        ([{"query_id": "", "relevant": {"a": 1}}], 1, "\"query_id\" is missing or empty"),
        ([{"relevant": {"a": 1}}], 1, "\"query_id\" is missing or empty"),
        ([[1, 2]], 1, "expected a JSON object"),
        ([{"query_id": "q1", "relevant": {" ": 1}}], 1, "empty doc id"),
        ([{"query_id": "q1", "relevant": {"a": 1}, "judged_at": "yesterday"}], 1, "unparseable timestamp"),
        ([{"query_id": "q1", "query": "Red Shoes", "relevant": {"a": 1}},
          {"query_id": "q2", "query": "red  shoes", "relevant": {"b": 1}}], 2, "already used by query 'q1' on line 1"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, lines: list[object], line: int, fragment: str) -> None:
    path = write(tmp_path, "bad.jsonl", jl(*lines))
    expect_error(path, line, fragment, format="jsonl")


def test_missing_and_undecodable_files(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope.jsonl", None, "no such file")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"query_id": "q1", "relevant": {"a": 1}}\n{"query_id": "caf\xe9", "relevant": {"a": 1}}\n')
    expect_error(path, 2, "not valid UTF-8")


def test_labelled_negatives_kept_unless_positives_required(tmp_path: Path) -> None:
    path = write(tmp_path, "q.jsonl", jl(
        {"query_id": "q1", "relevant": {"a": 1}},
        {"query_id": "q2", "relevant": {"a": 0, "b": 0}},  # judged, nothing relevant
        {"query_id": "q3", "relevant": {"a": 1, "b": 2}},
    ))
    qrels = load_qrels(path)
    assert qrels.labelled_negatives() == ["q2"]
    assert qrels.labelled_negatives(rel_threshold=2) == ["q1", "q2"]
    expect_error(path, 2, "query 'q2' has no judgment with grade >= 1", require_positive=True)
    expect_error(path, 1, "query 'q1' has no judgment with grade >= 2", require_positive=True, rel_threshold=2)


def test_unknown_corpus_doc_is_an_error_at_its_line(tmp_path: Path) -> None:
    corpus = write(tmp_path, "corpus.txt", "a\nb\n")
    ids = load_corpus_ids(corpus)
    assert ids == {"a", "b"}
    path = write(tmp_path, "q.jsonl", jl({"query_id": "q1", "relevant": {"a": 1}}, {"query_id": "q2", "relevant": {"zz": 1}}))
    expect_error(path, 2, "doc id 'zz' of query 'q2' is not in the corpus", corpus=ids)
    trec = write(tmp_path, "q.trec", "q1 0 a 1\nq1 0 b 0\nq2 0 c 2\n")
    expect_error(trec, 3, "doc id 'c'", corpus=ids)
    jsonl_corpus = write(tmp_path, "corpus.jsonl", jl({"doc_id": "x"}, {"id": "y"}))
    assert load_corpus_ids(jsonl_corpus) == {"x", "y"}
    with pytest.raises(QrelsError) as info:
        load_corpus_ids(write(tmp_path, "c2.txt", "a\n\nb\n"))
    assert info.value.line == 2


def test_require_text(tmp_path: Path) -> None:
    path = write(tmp_path, "q.jsonl", jl({"query_id": "q1", "query": "x", "relevant": {"a": 1}},
                                       {"query_id": "q2", "relevant": {"a": 1}}))
    expect_error(path, 2, "has no query text", require_text=True)


def test_human_judgments_are_keyed_by_normalised_text(tmp_path: Path) -> None:
    path = write(tmp_path, "q.jsonl", jl({"query_id": "q1", "query": "  Ｐrinter   TONER ", "relevant": {"a": 2, "b": 0},
                                        "assessor": "ann"}))
    rows = load_qrels(path).human_judgments()
    assert [(r.query, r.doc_id, r.grade, r.source, r.query_id, r.assessor, r.origin) for r in rows] == [
        ("printer toner", "a", 2, "human", "q1", "ann", str(path)),
        ("printer toner", "b", 0, "human", "q1", "ann", str(path)),
    ]
    trec = load_qrels(write(tmp_path, "q.trec", "q1 0 a 1\n"))
    with pytest.raises(QrelsError, match="has no query text"):
        trec.human_judgments()


# ----------------------------------------------------------------------------------------------- TREC


def test_trec_qrels_load(tmp_path: Path) -> None:
    path = write(tmp_path, "q.txt", "q1 0 a 2\nq1 0 b 0\r\nq2\t1\tc  1\nq1 0 z 3")
    qrels = load_qrels(path)
    assert qrels.format == "trec"
    assert dict(qrels) == {"q1": {"a": 2, "b": 0, "z": 3}, "q2": {"c": 1}}
    assert qrels.lines == {"q1": 1, "q2": 3}
    assert qrels.texts == {}


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("q1 0 a 1\n\nq1 0 b 1\n", 2, "blank line"),
        ("q1 0 a 1\nq1 0 b\n", 2, "expected 4 whitespace-separated fields"),
        ("q1 0 a 1\nq1 0 b 1 extra\n", 2, "got 5"),
        ("q1 0 a 1.0\n", 1, "grade '1.0' is not a non-negative integer"),
        ("q1 0 a -1\n", 1, "negative grades"),
        ("q1 0 a x\n", 1, "grade 'x'"),
        ("q1 0 a 1\nq2 0 a 1\nq1 0 a 0\n", 3, "judged twice (first on line 1)"),
    ],
)
def test_trec_errors_name_file_and_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path, "bad.qrels", text)
    expect_error(path, line, fragment, format="trec")


# ------------------------------------------------------------------------------------------ Workbench


def test_esci_workbench_file_loads_with_the_stated_mapping() -> None:
    qrels = load_qrels(shared_path(ESCI_JUDGMENTS))
    assert qrels.format == "workbench"
    # 150 "query" entries and 6,678 "docId"s (grep -c on the file); rating strings counted with
    # grep -c '"rating": "R.000"': 0 -> 1,086, 1 -> 305, 10 -> 1,898, 100 -> 3,389, mapped 0/1/2/3.
    assert len(qrels) == 150
    assert qrels.n_judgments() == 6678
    assert Counter(g for docs in qrels.values() for g in docs.values()) == {0: 1086, 1: 305, 2: 1898, 3: 3389}
    # first entry (file lines 6-): B07NCQWCQS "100.000", B0825VCHDG "1.000", B08JZ36B5B "0.000"
    towels = qrels["t towels kitchen"]
    assert (towels["B07NCQWCQS"], towels["B0825VCHDG"], towels["B08JZ36B5B"]) == (3, 1, 0)
    assert qrels.lines["t towels kitchen"] == 6
    assert qrels.lines["tan strappy heels for women"] == 336  # the entry's "{" (grep -n shows "query" on 337)
    assert qrels.texts["t towels kitchen"] == "t towels kitchen"
    assert qrels.labelled_negatives() == []  # every ESCI query here has at least one rating above 0


def test_esci_with_an_explicit_map_and_the_integer_map(tmp_path: Path) -> None:
    binary = load_qrels(shared_path(ESCI_JUDGMENTS), rating_map=RatingMap.parse("0:0,1:0,10:0,100:1"))
    assert Counter(g for docs in binary.values() for g in docs.values()) == {0: 1086 + 305 + 1898, 1: 3389}
    # the integer map reads 100.000 as grade 100: loud, not silently accepted, is the exponential-gain check
    raw = load_qrels(shared_path(ESCI_JUDGMENTS), rating_map=INTEGER_RATINGS)
    assert raw["t towels kitchen"]["B07NCQWCQS"] == 100


def wb(entries: list[dict[str, object]], **top: object) -> str:
    return json.dumps({"name": "x", "judgmentRatings": entries, **top}, indent=2)


def test_workbench_errors_name_file_and_line(tmp_path: Path) -> None:
    # json.dumps(indent=2): line 1 "{", 2 name, 3 judgmentRatings, 4 "{" of entry 0, 5 query, 6 ratings, 7 "{" of
    # rating 0, 8 docId, 9 rating, 10 "}", 11 "{" of rating 1 ...
    two = [{"query": "a b", "ratings": [{"docId": "d1", "rating": "1.000"}, {"docId": "d2", "rating": "5.000"}]}]
    err = expect_error(write(tmp_path, "r.json", wb(two)), 11, "rating '5.000' is not in the rating map esci")
    assert "0->0, 1->1, 10->2, 100->3" in err.message
    dup_doc = [{"query": "a b", "ratings": [{"docId": "d1", "rating": "1.000"}, {"docId": "d1", "rating": "0.000"}]}]
    expect_error(write(tmp_path, "d.json", wb(dup_doc)), 11, "docId 'd1' is rated twice (first on line 7)")
    dup_query = [{"query": "a b", "ratings": []}, {"query": "A  B", "ratings": []}]
    # entry 0 spans lines 4-7 ("ratings": [] on one line), entry 1 opens on line 8
    expect_error(write(tmp_path, "q.json", wb(dup_query)), 8, "already used by query 'a b' on line 4")
    expect_error(write(tmp_path, "e.json", wb([{"query": " ", "ratings": []}])), 4, "non-empty text")
    expect_error(write(tmp_path, "u.json", wb([{"query": "a", "ratings": [], "extra": 1}])), 4, "unknown key(s) 'extra'")
    bad_rating = [{"query": "a", "ratings": [{"docId": "d1", "rating": "high"}]}]
    expect_error(write(tmp_path, "h.json", wb(bad_rating)), 7, "not a finite non-negative number")
    expect_error(write(tmp_path, "k.json", '{"judgmentRatings": [\n{"query": "a", "query": "b", "ratings": []}]}'),
                 2, "key 'query' appears twice")
    expect_error(write(tmp_path, "m.json", '{"judgmentRatings": [\n  {"query": "a",\n   "ratings": [}\n]}'),
                 3, "malformed JSON")
    expect_error(write(tmp_path, "n.json", '{"ratings": []}'), 1, "\"judgmentRatings\" list", format="workbench")


def test_rating_maps() -> None:
    assert ESCI_RATINGS.describe() == "esci (0->0, 1->1, 10->2, 100->3)"
    # ratings are exact decimals: "10", "10.0" and "10.000" are one rating, "9.999" is not on the scale
    assert [ESCI_RATINGS.grade(r) for r in ("0.000", "1", "10.0", "100.000", 100)] == [0, 1, 2, 3, 3]
    for bad in ("9.999", "-1", "nan", "inf", True, None):
        with pytest.raises(ValueError):
            ESCI_RATINGS.grade(bad)
    assert [ESCI_RATINGS.rating(g) for g in range(4)] == ["0.000", "1.000", "10.000", "100.000"]
    with pytest.raises(ValueError, match="grade 4 has no rating"):
        ESCI_RATINGS.rating(4)
    assert INTEGER_RATINGS.grade("2.000") == 2
    with pytest.raises(ValueError, match="not a whole number"):
        INTEGER_RATINGS.grade("0.5")
    custom = RatingMap.parse("0:0, 0.5:1, 1:2")
    assert (custom.grade("0.50"), custom.rating(1)) == (1, "0.500")
    assert RatingMap.parse("ESCI") is ESCI_RATINGS
    for spec in ("0:0,1", "a:1", "1:-1", "1:1.5", "1:1,1.0:2"):
        with pytest.raises(ValueError):
            RatingMap.parse(spec)


# ------------------------------------------------------------------------------------------- exports


def test_exports_round_trip(tmp_path: Path) -> None:
    esci = load_qrels(shared_path(ESCI_JUDGMENTS))
    for fmt in ("workbench", "jsonl"):
        out = tmp_path / f"esci.{fmt}"
        write_qrels(esci, out, fmt)
        back = load_qrels(out)
        assert back.format == fmt
        assert back.grades == esci.grades
        assert back.texts == esci.texts
    # the Workbench export writes ratings back on the ESCI scale
    doc = json.loads((tmp_path / "esci.workbench").read_text())
    assert doc["judgmentRatings"][0]["ratings"][0] == {"docId": "B07NCQWCQS", "rating": "100.000"}
    with pytest.raises(QrelsError, match="whitespace"):
        format_qrels(esci, "trec")

    plain = Qrels(grades={"q1": {"a": 2, "b": 0}, "q2": {"c": 7}}, texts={"q1": "red shoes"})
    trec = tmp_path / "plain.trec"
    write_qrels(plain, trec, "trec")
    assert trec.read_text() == "q1 0 a 2\nq1 0 b 0\nq2 0 c 7\n"
    assert load_qrels(trec).grades == plain.grades
    with pytest.raises(QrelsError, match="grade 7 has no rating"):
        format_qrels(plain, "workbench")
    wb_out = tmp_path / "plain.json"
    write_qrels(plain, wb_out, "workbench", rating_map=INTEGER_RATINGS)
    assert load_qrels(wb_out, rating_map=INTEGER_RATINGS).grades == {"red shoes": {"a": 2, "b": 0}, "q2": {"c": 7}}
    with pytest.raises(QrelsError, match="not a non-negative integer"):
        format_qrels({"q": {"a": -1}}, "jsonl")


def test_format_sniffing(tmp_path: Path) -> None:
    assert sniff_qrels_format(shared_path(ESCI_JUDGMENTS)) == "workbench"
    assert sniff_qrels_format(write(tmp_path, "a", jl({"query_id": "q", "relevant": {}}))) == "jsonl"
    assert sniff_qrels_format(write(tmp_path, "b", "q1 0 a 1\n")) == "trec"
    assert sniff_qrels_format(write(tmp_path, "c", json.dumps({"judgmentRatings": []}))) == "workbench"


def test_a_malformed_jsonl_line_is_located_the_same_with_format_auto(tmp_path: Path) -> None:
    # one line, the closing brace missing: the JSON decoder stops at column 56, just past the last character
    # (len('{"query_id": "q1", "query": "a b", "relevant": {"d1": 1}') = 55). Format auto used to take it for a
    # multi-line Workbench document and report the end of the file, line 2 column 1.
    line = '{"query_id": "q1", "query": "a b", "relevant": {"d1": 1}'
    path = write(tmp_path, "badjson.jsonl", line + "\n")
    assert sniff_qrels_format(path) == "jsonl"
    auto = expect_error(path, 1, f"malformed JSON at column {len(line) + 1}")
    explicit = expect_error(path, 1, f"malformed JSON at column {len(line) + 1}", format="jsonl")
    assert str(auto) == str(explicit)
    # the bad line first of two: still line 1; the bad line second: line 2 (the first line sniffs as JSONL)
    good = jl({"query_id": "q2", "relevant": {"d": 1}})
    expect_error(write(tmp_path, "b1.jsonl", line + "\n" + good), 1, f"column {len(line) + 1}")
    expect_error(write(tmp_path, "b2.jsonl", good + line + "\n"), 2, f"column {len(line) + 1}")
    # a Workbench document over several lines, valid or broken, is still read as one document
    multi = '{\n  "judgmentRatings": [\n    {"query": "a", "ratings": [{"docId": "d", "rating": "1"}]}\n  ]\n}\n'
    assert sniff_qrels_format(write(tmp_path, "wb.json", multi)) == "workbench"
    broken = multi.replace('"rating": "1"}', '"rating": "1"')  # line 3 misses a brace
    assert sniff_qrels_format(write(tmp_path, "wb2.json", broken)) == "workbench"
    expect_error(tmp_path / "wb2.json", 3, "malformed JSON")


# ---------------------------------------------------------------------------------------- query sets


def test_esci_query_set_and_round_trips(tmp_path: Path) -> None:
    qs = load_queryset(shared_path("ubi-samples/esci_us_queryset.json"))
    # 150 "queryText" entries (grep -c), the same 150 queries as the ESCI judgments
    assert len(qs) == 150
    assert (qs.name, qs.sampling) == ("ESCI Queries", "manual")
    assert qs.queries[0] == QuerySetQuery("t towels kitchen", "t towels kitchen")
    assert qs.queries[-1].query == "swissqlip deep carry pocket clip"
    assert {q.query for q in qs} == set(load_qrels(shared_path(ESCI_JUDGMENTS)))
    for fmt in ("jsonl", "workbench"):
        out = tmp_path / f"qs.{fmt}"
        write_queryset(qs, out, fmt)
        assert [q.query for q in load_queryset(out)] == [q.query for q in qs]
    counted = QuerySet((QuerySetQuery("q1", "red shoes", 12), QuerySetQuery("q2", "blue shoes", 3, "b1")))
    write_queryset(counted, tmp_path / "c.jsonl", "jsonl")
    assert load_queryset(tmp_path / "c.jsonl").queries == counted.queries


def test_query_set_errors(tmp_path: Path) -> None:
    cases = [
        (jl({"query": "a"}, {"query": "A"}), 2, "already used by query 'a' on line 1"),
        (jl({"query_id": "1", "query": "a"}, {"query_id": "1", "query": "b"}), 2, "duplicate query_id '1'"),
        (jl({"query": ""}), 1, "non-empty text"),
        (jl({"query": "a", "frequency": -2}), 1, "\"frequency\" must be a non-negative integer"),
        (jl({"query": "a"}) + "\n" + jl({"query": "b"}), 2, "blank line"),
        ('{\n "querySetQueries": [\n  {"queryText": "a"},\n  {"queryText": ""}\n ]\n}', 4, "non-empty text"),
    ]
    for i, (text, line, fragment) in enumerate(cases):
        path = write(tmp_path, f"qs{i}", text)
        with pytest.raises(QrelsError) as info:
            load_queryset(path)
        assert (info.value.path, info.value.line) == (str(path), line)
        assert fragment in info.value.message


def test_a_plain_text_query_set_is_read_by_the_one_reader(tmp_path: Path) -> None:
    # one reader for every query-set file (issue 28): `ubi review export --queries` reads plain text through it
    path = tmp_path / "queries.txt"
    path.write_text("# one query a line\nRed Shoes\n\nred  shoes\nblue jeans\n", encoding="utf-8")
    qs = load_queryset(path)
    assert [(q.query_id, q.query) for q in qs.queries] == [("Red Shoes", "Red Shoes"), ("blue jeans", "blue jeans")]
    assert load_queryset(path, format="lines") == qs
    # a Workbench file pretty-printed over several lines is still told apart from plain text
    wb = tmp_path / "set.json"
    wb.write_text('{\n  "querySetQueries": [{"queryText": "boots"}]\n}\n', encoding="utf-8")
    assert [q.query for q in load_queryset(wb).queries] == ["boots"]
