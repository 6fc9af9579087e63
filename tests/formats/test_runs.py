"""TREC run files: trec_eval ordering (score desc, doc id desc, rank column ignored) and strict validation."""

from __future__ import annotations

from pathlib import Path

import ir_measures
import pytest
from ir_measures import RR, P

from ubi_pipeline.formats.runs import (
    Run,
    RunError,
    format_trec_run,
    load_jsonl_run,
    load_run,
    load_trec_run,
    run_from_scored,
    trec_order,
    write_jsonl_run,
    write_trec_run,
)
from ubi_pipeline.schemas.judgments import ScoredDoc


def write(tmp_path: Path, text: str, name: str = "r.run") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_order_is_score_desc_then_doc_id_desc_and_rank_is_ignored(tmp_path: Path) -> None:
    # ranks in the file contradict the scores on purpose: trec_eval ignores the rank column.
    path = write(tmp_path, (
        "q1 Q0 a 1 1.0 sys\n"
        "q1 Q0 c 2 1.0 sys\n"
        "q1 Q0 b 3 1.0 sys\n"
        "q1 Q0 z 4 0.5 sys\n"
        "q1 Q0 y 5 2.5 sys\n"
        "q2 Q0 d10 1 -3 sys\n"
        "q2 Q0 d9 2 -3 sys\n"
        "q2 Q0 d2 9 1e-3 sys\n"
    ))
    run = load_trec_run(path)
    assert isinstance(run, Run)
    # q1: y (2.5) first; a, b, c tie at 1.0 -> doc id descending c, b, a; then z (0.5)
    assert run["q1"] == ["y", "c", "b", "a", "z"]
    assert run.scores["q1"] == [2.5, 1.0, 1.0, 1.0, 0.5]
    # q2: d2 (0.001) first; d10 and d9 tie at -3 -> "d9" > "d10" as strings (byte order, as strcmp)
    assert run["q2"] == ["d2", "d9", "d10"]
    assert (run.tag, run.lines, run.n_docs()) == ("sys", {"q1": 1, "q2": 6}, 8)


def test_tie_order_agrees_with_trec_eval(tmp_path: Path) -> None:
    # pytrec_eval (trec_eval's code) on all-tied scores: if it ordered c, b, a (doc id descending) the only
    # relevant doc "a" is at rank 3, so RR = 1/3 and P@1 = 0; our loaded order must give the same.
    qrels = {"q1": {"a": 1, "b": 0, "c": 0}}
    scores = {"q1": {"a": 1.0, "b": 1.0, "c": 1.0}}
    ref = ir_measures.pytrec_eval.calc_aggregate([RR, P @ 1], qrels, scores)
    assert ref[RR] == pytest.approx(1 / 3)
    assert ref[P @ 1] == 0.0
    run = load_trec_run(write(tmp_path, "q1 Q0 a 1 1 t\nq1 Q0 b 2 1 t\nq1 Q0 c 3 1 t\n"))
    assert run["q1"].index("a") + 1 == 3


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("q1 Q0 a 1 1.0 t\n\nq1 Q0 b 2 0.5 t\n", 2, "blank line"),
        ("q1 Q0 a 1 1.0 t\nq1 Q0 b 2 0.5\n", 2, "5 fields"),
        ("q1 Q0 a 1 1.0 t\nq1 Q0 b 2 0.5 t x\n", 2, "7 fields"),
        ("q1 Q0 a 1 high t\n", 1, "score 'high' is not a number"),
        ("q1 Q0 a 1 nan t\n", 1, "not finite"),
        ("q1 Q0 a 1 inf t\n", 1, "not finite"),
        ("q1 Q0 a one 1.0 t\n", 1, "rank 'one' is not an integer"),
        ("q1 Q0 a 1 1.0 t\nq2 Q0 a 1 1.0 t\nq1 Q0 a 3 0.2 t\n", 3, "doc 'a' is ranked twice for query 'q1' (first on line 1)"),
        ("q1 Q0 a 1 1.0 t\nq1 Q0 b 2 0.5 other\n", 2, "run tag 'other' differs from 't' on line 1"),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(RunError) as info:
        load_trec_run(path)
    assert (info.value.path, info.value.line) == (str(path), line)
    assert fragment in info.value.message
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_an_empty_run_is_an_error(tmp_path: Path) -> None:
    for loader, name in ((load_trec_run, "e.run"), (load_jsonl_run, "e.jsonl"), (load_run, "e2.run")):
        path = write(tmp_path, "", name)
        with pytest.raises(RunError) as info:
            loader(path)
        assert (info.value.path, info.value.line) == (str(path), None)
        assert str(info.value).startswith(f"{path}: no rankings: the file is empty")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="no such file"):
        load_trec_run(tmp_path / "absent.run")


def test_write_round_trip_keeps_the_order(tmp_path: Path) -> None:
    # "b" before "a" with no scores: the writer's strictly decreasing scores keep that order on reload
    rankings = {"q1": ["b", "a", "c"], "q2": ["x"]}
    assert format_trec_run(rankings, tag="mine") == (
        "q1 Q0 b 1 3 mine\nq1 Q0 a 2 2 mine\nq1 Q0 c 3 1 mine\nq2 Q0 x 1 1 mine\n"
    )
    path = tmp_path / "out.run"
    write_trec_run(rankings, path)
    assert dict(load_trec_run(path)) == rankings
    for bad in ({"q 1": ["a"]}, {"q1": ["a b"]}, {"q1": ["a", "a"]}):
        with pytest.raises(RunError):
            format_trec_run(bad)


def test_run_from_scored_docs() -> None:
    docs = [ScoredDoc("q1", "a", 1.0), ScoredDoc("q1", "c", 1.0), ScoredDoc("q1", "b", 3.0), ScoredDoc("q2", "x", 0.0)]
    run = run_from_scored(docs, tag="logs")
    assert dict(run) == {"q1": ["b", "c", "a"], "q2": ["x"]}
    assert trec_order([("a", 1.0), ("b", 1.0)]) == [("b", 1.0), ("a", 1.0)]
    with pytest.raises(RunError, match="item 1: doc 'a' is ranked twice"):
        run_from_scored([ScoredDoc("q", "a", 1.0), ScoredDoc("q", "a", 2.0)])


def test_jsonl_runs_hold_ids_with_spaces(tmp_path: Path) -> None:
    rankings = {"red shoes": ["d3", "d1"], "t towels kitchen": []}
    path = tmp_path / "r.jsonl"
    write_jsonl_run(rankings, path)
    assert path.read_text() == (
        '{"query_id": "red shoes", "doc_ids": ["d3", "d1"]}\n{"query_id": "t towels kitchen", "doc_ids": []}\n'
    )
    run = load_run(path)  # sniffed as JSONL: starts with "{"
    assert dict(run) == rankings and run.lines == {"red shoes": 1, "t towels kitchen": 2}
    trec = load_run(write(tmp_path, "q1 Q0 a 1 1 t\n"))
    assert dict(trec) == {"q1": ["a"]}  # sniffed as TREC
    # the format travels with the run: a TREC query id is percent-escaped text, a JSONL one is the text itself
    assert (run.format, trec.format, run_from_scored([]).format) == ("jsonl", "trec", None)
    with pytest.raises(RunError, match="unknown run format"):
        load_run(path, format="csv")


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ('{"query_id": "a", "doc_ids": ["x"]}\n\n', 2, "blank line"),
        ('{"query_id": "a", "doc_ids": ["x", "y", "x"]}\n', 1, "doc 'x' is ranked twice (ranks 1 and 3)"),
        ('{"query_id": "a", "doc_ids": []}\n{"query_id": "a", "doc_ids": []}\n', 2, "duplicate query_id 'a' (first on line 1)"),
        ('{"query_id": "a", "docs": []}\n', 1, "expected exactly"),
        ('{"query_id": "a", "doc_ids": [1]}\n', 1, "list of non-empty strings"),
        ('{"query_id": "", "doc_ids": []}\n', 1, "non-empty string"),
        ('{"query_id": "a", "doc_ids": [}\n', 1, "malformed JSON"),
    ],
)
def test_jsonl_run_errors_name_file_and_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path, text, "bad.jsonl")
    with pytest.raises(RunError) as info:
        load_jsonl_run(path)
    assert (info.value.path, info.value.line) == (str(path), line)
    assert fragment in info.value.message
