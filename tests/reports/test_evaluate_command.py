"""``ubi evaluate`` end to end: files in, tables or JSON out, typed errors naming file and line.

The command is driven through its own ``register`` on a fresh parser (the way ``ubi_pipeline.cli`` mounts it), so
these tests do not depend on every other stage importing cleanly; ``ubi_pipeline.cli`` turns the typed errors
asserted here into exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from tests.conftest import ESCI_JUDGMENTS, shared_path
from ubi_pipeline.commands.evaluate import register
from ubi_pipeline.formats.qrels import load_qrels
from ubi_pipeline.formats.runs import write_jsonl_run
from ubi_pipeline.schemas.errors import UbiError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ubi")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


QRELS = "q1 0 a 2\nq1 0 b 0\nq1 0 c 1\nq1 0 z 3\nq2 0 a 0\nq4 0 m 1\n"
RUN = "q1 Q0 a 1 4.0 sys\nq1 Q0 b 2 3.0 sys\nq1 Q0 c 3 2.0 sys\nq1 Q0 x 4 1.0 sys\nq2 Q0 a 1 1 sys\nq2 Q0 y 2 0.5 sys\nq3 Q0 a 1 1 sys\n"
# q1 by hand (positives a, c, z; x unjudged):
#   nDCG@10 = (2/1 + 0 + 1/log2(4)) / (3/1 + 2/log2(3) + 1/log2(4)) = 2.5 / 4.761859507142915
#   recall@10 = 2/3, RR = 1, AP = (1 + 2/3 + 0)/3 = 5/9, P@5 = 2/5, judged@10 = 3/4 (x unjudged, 4 ranked)
Q1 = {
    "ndcg@10": 2.5 / (3 + 2 / math.log2(3) + 0.5), "recall@10": 2 / 3, "mrr": 1.0, "map": 5 / 9, "p@5": 0.4,
    "judged@10": 0.75,
}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    qrels, run = tmp_path / "qrels.txt", tmp_path / "sys.run"
    qrels.write_text(QRELS)
    run.write_text(RUN)
    return qrels, run


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["evaluate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_output_by_hand(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    qrels, run = files
    doc = run_json(capsys, "--qrels", str(qrels), "--run", str(run), "--per-query")
    assert doc["inputs"]["qrels"] == {"path": str(qrels), "format": "trec", "queries": 3, "judgments": 6}
    assert doc["inputs"]["run"] == {"path": str(run), "tag": "sys", "queries": 3, "docs": 7}
    assert list(doc["aggregate"]) == list(Q1)
    for name, value in Q1.items():
        assert doc["aggregate"][name]["mean"] == pytest.approx(value, abs=1e-12)
        assert doc["aggregate"][name]["n"] == 1
    assert doc["per_query"] == [{"query_id": "q1", **{k: pytest.approx(v, abs=1e-12) for k, v in Q1.items()}}]
    # q2 is judged with nothing relevant: reported apart (2 docs retrieved, judged@10 = 1/2), not averaged
    assert doc["labelled_negatives"]["query_ids"] == ["q2"]
    assert doc["labelled_negatives"]["per_query"] == [{"query_id": "q2", "retrieved": 2, "judged@10": 0.5}]
    assert doc["unjudged_run_queries"] == {"count": 1, "query_ids": ["q3"]}
    assert doc["judged_queries_missing_from_run"]["query_ids"] == ["q4"]


def test_complete_gain_and_threshold_flags(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    qrels, run = files
    doc = run_json(capsys, "--qrels", str(qrels), "--run", str(run), "--metrics", "mrr,ndcg@3", "--complete",
                   "--gain", "exponential", "--rel-threshold", "2")
    # threshold 2: q1 positives a, z; q4 (grade 1 only) becomes a labelled negative, scored as empty (-c)
    assert doc["queries_evaluated"] == 1
    assert doc["labelled_negatives"]["query_ids"] == ["q2", "q4"]
    # exponential nDCG@3 of q1: (3 + 0 + 1/2) / (7 + 3/log2(3) + 1/2)
    assert doc["aggregate"]["ndcg@3"]["mean"] == pytest.approx(3.5 / (7.5 + 3 / math.log2(3)), abs=1e-12)
    assert doc["metrics"]["ndcg@3"]["gain"] == "exponential"


def test_text_tables(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    qrels, run = files
    assert main(["evaluate", "--qrels", str(qrels), "--run", str(run), "--per-query"]) == 0
    out = capsys.readouterr().out
    assert "0.5250" in out and "0.5556" in out and "0.4000" in out  # nDCG@10, AP, P@5 of q1
    assert "labelled negatives" in out and "1 queries" in out
    assert "run queries without judgments: 1" in out
    assert "judged queries missing from the run: 1" in out
    assert "q2" in out  # the per-query negatives table


def test_esci_workbench_judgments_with_a_jsonl_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    qrels = load_qrels(shared_path(ESCI_JUDGMENTS))
    in_file_order = tmp_path / "file_order.jsonl"
    write_jsonl_run({q: list(docs) for q, docs in qrels.items()}, in_file_order)
    ideal = tmp_path / "ideal.jsonl"
    write_jsonl_run({q: sorted(docs, key=lambda d: -docs[d]) for q, docs in qrels.items()}, ideal)

    doc = run_json(capsys, "--qrels", str(shared_path(ESCI_JUDGMENTS)), "--run", str(ideal), "--metrics", "ndcg@10,ndcg_exp@10,mrr,map")
    assert doc["inputs"]["qrels"]["rating_map"] == "esci (0->0, 1->1, 10->2, 100->3)"
    assert doc["queries_evaluated"] == 150 and doc["labelled_negatives"]["count"] == 0
    for name in ("ndcg@10", "ndcg_exp@10", "mrr", "map"):  # the ideal ordering scores 1 on every query
        assert doc["aggregate"][name]["mean"] == pytest.approx(1.0, abs=1e-12)

    # "t towels kitchen" in file order: ratings 100,100,100,10,100,100,100,1,1,0 -> grades 3,3,3,2,3,3,3,1,1,0
    doc = run_json(capsys, "--qrels", str(shared_path(ESCI_JUDGMENTS)), "--run", str(in_file_order), "--metrics", "p@5,p@10",
                   "--per-query")
    towels = next(r for r in doc["per_query"] if r["query_id"] == "t towels kitchen")
    assert towels == {"query_id": "t towels kitchen", "p@5": 1.0, "p@10": 0.9}  # 5/5 and 9/10 have grade >= 1
    doc = run_json(capsys, "--qrels", str(shared_path(ESCI_JUDGMENTS)), "--run", str(in_file_order), "--metrics", "p@5,p@10",
                   "--per-query", "--rel-threshold", "3")
    towels = next(r for r in doc["per_query"] if r["query_id"] == "t towels kitchen")
    assert towels == {"query_id": "t towels kitchen", "p@5": 0.8, "p@10": 0.6}  # exact only: 4/5 and 6/10


def test_errors_name_file_and_line(files: tuple[Path, Path], tmp_path: Path) -> None:
    qrels, run = files
    bad_qrels = tmp_path / "bad.txt"
    bad_qrels.write_text("q1 0 a 1\nq1 0 b 1.5\n")
    bad_run = tmp_path / "bad.run"
    bad_run.write_text("q1 Q0 a 1 1 t\nq1 Q0 a 2 0.5 t\n")
    cases = [
        (["--qrels", str(bad_qrels), "--run", str(run)], f"{bad_qrels}:2: grade '1.5'"),
        (["--qrels", str(qrels), "--run", str(bad_run)], f"{bad_run}:2: doc 'a' is ranked twice"),
        (["--qrels", str(qrels), "--run", str(run), "--metrics", "ndcg@0"], "k must be >= 1"),
        (["--qrels", str(qrels), "--run", str(run), "--rating-map", "x"], "--rating-map"),
        (["--qrels", str(qrels), "--run", str(run), "--require-positive"], f"{qrels}:5: query 'q2'"),  # q2 on line 5
        (["--qrels", str(tmp_path / "none.txt"), "--run", str(run)], "none.txt: no such file"),
    ]
    for argv, fragment in cases:
        with pytest.raises(UbiError) as info:
            main(["evaluate", *argv])
        assert fragment in str(info.value)


def test_empty_files_are_errors_naming_the_file(files: tuple[Path, Path], tmp_path: Path) -> None:
    # `: > empty.trec` used to give "means over 0 queries" and exit 0
    qrels, run = files
    empty = tmp_path / "empty.trec"
    empty.write_text("")
    for argv, fragment in (
        (["--qrels", str(empty), "--run", str(run)], f"{empty}: no judgments: the file is empty"),
        (["--qrels", str(qrels), "--run", str(empty)], f"{empty}: no rankings: the file is empty"),
        (["--qrels", str(empty), "--qrels-format", "workbench", "--run", str(run)], f"{empty}:"),
    ):
        with pytest.raises(UbiError) as info:
            main(["evaluate", *argv])
        assert fragment in str(info.value)
    no_ratings = tmp_path / "none.json"
    no_ratings.write_text('{"judgmentRatings": []}')
    with pytest.raises(UbiError, match=r"none\.json: no judgments: no query in this workbench file"):
        main(["evaluate", "--qrels", str(no_ratings), "--run", str(run)])
    empty_jsonl_run = tmp_path / "empty.jsonl"
    empty_jsonl_run.write_text("")
    with pytest.raises(UbiError, match="no rankings"):
        main(["evaluate", "--qrels", str(qrels), "--run", str(empty_jsonl_run), "--run-format", "jsonl"])


def test_help_explains(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["evaluate", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "labelled negatives" in out.lower() and "--per-query" in out and "ndcg_burges" in out
