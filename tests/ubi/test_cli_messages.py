"""What ``ubi report --out`` and ``ubi queryset --name`` tell the user (issue 28, item 4, first-hour bugs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ubi_pipeline.cli import main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "reports"))
from joint_fixtures import build_store, write_human  # noqa: E402


@pytest.mark.parametrize("fmt", ["text", "json", "md"])
def test_report_out_says_where_it_wrote_on_stderr_and_keeps_stdout_empty(tmp_path: Path, capsys, fmt: str) -> None:
    db = build_store(tmp_path / "ubi.duckdb")
    human = write_human(tmp_path / "h.jsonl")
    out, html = tmp_path / f"report.{fmt}", tmp_path / "report.html"
    assert main(["report", "--db", str(db), "--qrels", str(human), "--format", fmt, "--out", str(out),
                 "--html", str(html)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout is the report's; with --out it has nothing to say
    name = {"text": "text", "json": "JSON", "md": "Markdown"}[fmt]
    assert captured.err.splitlines() == [f"wrote the {name} report to {out}", f"wrote the HTML report to {html}"]
    assert out.stat().st_size > 0 and html.stat().st_size > 0
    if fmt == "json":
        assert json.loads(out.read_text())["inputs"]["db"] == str(db)


def test_report_json_to_stdout_is_only_json(tmp_path: Path, capsys) -> None:
    db = build_store(tmp_path / "ubi.duckdb")
    assert main(["report", "--db", str(db), "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # nothing but the document
    assert "wrote" not in captured.err


def test_queryset_name_over_the_workbench_limit_exits_2_naming_flag_limit_and_length(tmp_path: Path,
                                                                                      capsys) -> None:
    db = build_store(tmp_path / "ubi.duckdb")
    out = tmp_path / "qs.json"
    name = "weekly sample of the most frequent queries, shop eu"  # 51 characters: one over the Workbench's 50
    assert len(name) == 51
    assert main(["queryset", "--db", str(db), "--size", "2", "--format", "workbench", "--name", name,
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--name" in err and "is 51 characters long; at most 50" in err
    assert not out.exists()  # refused before anything was written
    fifty = name[:50]
    assert main(["queryset", "--db", str(db), "--size", "2", "--format", "workbench", "--name", fifty,
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["name"] == fifty
