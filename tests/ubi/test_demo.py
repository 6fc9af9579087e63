"""`ubi demo` end to end: a real collector process, HTTP, processing while it runs, the joint report.

The two runs compared here are made once per session (``demo_runs`` in ``conftest.py``), shared with the
tests of the README's commands after the demo."""

from __future__ import annotations

import re

import duckdb

from tests.ubi.demo_support import DEMO_SESSIONS, DemoRun


def test_demo_runs_the_whole_pipeline_and_is_deterministic(demo_runs: tuple[DemoRun, DemoRun]) -> None:
    a, b = demo_runs
    first, second = a.stdout, b.stdout

    # Every stage shows up: HTTP ingest, four click models, propensities, the joint report.
    assert "0 rejected" in first
    for source in ("implicit:ctr", "implicit:coec", "implicit:pbm", "implicit:dbn"):
        assert source in first
    assert "θ̂_k/θ̂_1" in first
    for section in ("Offline metrics against human labels", "Online metrics", "Agreement of implicit labels"):
        assert section in first
    html = (a.dir / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") or html.lower().startswith("<!doctype html>")
    assert (a.dir / "propensity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Same seed, same report: only the work folder, the port and the creation time may differ.
    def normalise(text: str) -> str:
        text = text.replace(str(a.dir), "W").replace(str(b.dir), "W")
        text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
        return re.sub(r"created \S+", "created T", text)

    assert normalise(first) == normalise(second)

    # The store holds what was sent: one query record per simulated search (the simulator's count), and
    # judgments of the four click models.
    with duckdb.connect(str(a.dir / "ubi.duckdb"), read_only=True) as con:
        (queries,) = con.execute("SELECT count(*) FROM ubi_queries").fetchone()
        (sources,) = con.execute("SELECT count(DISTINCT source) FROM judgments").fetchone()
    assert queries == DEMO_SESSIONS
    assert sources == 4
