"""`ubi demo` end to end: a real collector process, HTTP, processing while it runs, the joint report."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import duckdb


def _demo(workdir: Path, sessions: int) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "ubi", "demo", "--dir", str(workdir), "--sessions", str(sessions), "--seed", "3"],
        capture_output=True, text=True, timeout=300, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_demo_runs_the_whole_pipeline_and_is_deterministic(tmp_path: Path) -> None:
    first = _demo(tmp_path / "a", 800)
    second = _demo(tmp_path / "b", 800)

    # Every stage shows up: HTTP ingest, four click models, propensities, the joint report.
    assert "0 rejected" in first
    for source in ("implicit:ctr", "implicit:coec", "implicit:pbm", "implicit:dbn"):
        assert source in first
    assert "θ̂_k/θ̂_1" in first
    for section in ("Offline metrics against human labels", "Online metrics", "Agreement of implicit labels"):
        assert section in first
    html = (tmp_path / "a" / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") or html.lower().startswith("<!doctype html>")
    assert (tmp_path / "a" / "propensity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Same seed, same report: only the work folder, the port and the creation time may differ.
    def normalise(text: str) -> str:
        text = text.replace(str(tmp_path / "a"), "W").replace(str(tmp_path / "b"), "W")
        text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
        return re.sub(r"created \S+", "created T", text)

    assert normalise(first) == normalise(second)

    # The store holds what was sent: 800 searches, each with one query record (the simulator's count).
    with duckdb.connect(str(tmp_path / "a" / "ubi.duckdb"), read_only=True) as con:
        (queries,) = con.execute("SELECT count(*) FROM ubi_queries").fetchone()
        (sources,) = con.execute("SELECT count(DISTINCT source) FROM judgments").fetchone()
    assert queries == 800
    assert sources == 4
