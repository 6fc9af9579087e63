"""Output fit for logs (issue 12, item 7): piped or redirected, nothing is cut or wrapped at 80 columns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ubi_pipeline.cli import main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "reports"))
from joint_fixtures import build_store, write_human  # noqa: E402


def _ubi(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # as a CI job or a pipe would run it
    return subprocess.run([sys.executable, "-m", "ubi_pipeline", *argv], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def test_piped_report_and_errors_are_not_wrapped(tmp_path: Path) -> None:
    db = build_store(tmp_path / "ubi.duckdb")
    human = write_human(tmp_path / "h.jsonl")
    proc = _ubi("report", "--db", str(db), "--qrels", str(human), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # the settings line is about 170 characters: one line, not three
    (settings,) = [line for line in lines if line.startswith("k=10, gain=linear")]
    assert settings.endswith("seed 0") and len(settings) > 120
    assert lines[0] == "== ubi report ==" and "─" * 81 not in proc.stdout  # no rule spanning the log width
    assert max(len(line) for line in lines) > 80  # tables keep their natural width
    bad = _ubi("report", "--db", str(db), "--qrels", str(tmp_path / "missing-judgments-file.jsonl"), cwd=tmp_path)
    assert bad.returncode == 2
    (message,) = [line for line in bad.stderr.splitlines() if line.strip()]
    assert message.startswith("error:") and "missing-judgments-file.jsonl" in message


def test_main_leaves_columns_as_it_found_them(tmp_path: Path, capsys) -> None:
    before = os.environ.get("COLUMNS")
    assert main(["schema", "--kind", "event"]) == 0
    assert os.environ.get("COLUMNS") == before
