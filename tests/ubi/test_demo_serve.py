"""``ubi demo --serve``'s server: its catalog and rankers come from the simulator, its report from reports."""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from ubi_pipeline.demo_serve import build_demo_app, demo_catalog, demo_settings, report_available, write_qrels
from ubi_pipeline.processors.simulation.catalog import build_catalog
from ubi_pipeline.schemas.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_catalog_is_the_simulators_with_a_better_and_a_worse_ranker() -> None:
    cat, sim = demo_catalog(seed=3), build_catalog(40, 20, seed=3)
    assert cat.queries == sim.query_texts
    assert [d.doc_id for d in cat.docs[0]] == list(sim.doc_ids[0])
    assert demo_catalog(seed=3).rankings == cat.rankings  # same seed, same rankings
    # ranker-a sorts grade + N(0, 0.5²), ranker-b grade + N(0, 2²): a's first result has a higher grade on
    # average over the 40 searches. For seed 3 they are 2.98 and 2.30 (seeds 0 and 7: 3.00/2.42, 2.95/2.15).
    top = {
        name: np.mean([sim.grades[q, order[0]] for q, order in enumerate(per_query)])
        for name, per_query in cat.rankings.items()
    }
    assert top["ranker-a"] > top["ranker-b"] + 0.5, top


def test_qrels_are_the_catalogs_human_judgments(tmp_path: Path) -> None:
    path = write_qrels(tmp_path / "qrels.jsonl", seed=3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == build_catalog(40, 20, seed=3).qrels()


def test_settings_from_the_ubi_demo_arguments(tmp_path: Path) -> None:
    args = argparse.Namespace(dir=str(tmp_path / "out"), sessions=6000, seed=7, serve=True)
    settings = demo_settings(args)
    assert settings.db == tmp_path / "out" / "serve.duckdb" and settings.seed == 7
    assert demo_settings(argparse.Namespace(db=tmp_path / "x.duckdb", port=0)).port == 0


@pytest.mark.skipif(not report_available(), reason="the reports stage (ubi_pipeline.reports.render.html) is not installed")
def test_the_live_report_renders_what_was_stored(tmp_path: Path) -> None:
    app = build_demo_app(Settings(db=tmp_path / "demo.duckdb"))
    with TestClient(app, client=("127.0.0.1", 50000)) as c:
        assert c.get("/demo/config").json()["report_url"] == "/report"
        assert c.get("/report").status_code == 503  # nothing stored yet: says so instead of failing
        out = c.get("/demo/search", params={"q": "red running shoes", "session_id": "s"}).json()
        query = {
            "query_id": "q1",
            "user_query": "red running shoes",
            "application": "demo-search",
            "query_attributes": {"ranker": out["ranker"]},
            "query_response_hit_ids": [h["id"] for h in out["hits"]],
        }
        assert c.post("/v1/queries", json=query).status_code == 202
        page = c.get("/report")
        assert page.status_code == 200 and f"demo-search/ranker={out['ranker']}" in page.text


def _ubi_demo_serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ubi_pipeline", "demo", "--serve", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_ubi_demo_serve_listens_where_told_and_says_where(tmp_path: Path) -> None:
    db = tmp_path / "visitors.duckdb"
    proc = _ubi_demo_serve("--host", "127.0.0.1", "--port", "0", "--db", str(db))
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)/demo/", line)
        assert match, f"no URL printed: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        assert int(match.group(1)) != 0  # port 0 asked the OS for a free port; the real one is printed
        base = match.group(0).removesuffix("/demo/")
        assert httpx.get(base + "/healthz", timeout=10).status_code == 200
        assert "ubi-client.js" in httpx.get(base + "/demo/", timeout=10).text
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0 and db.exists()  # stopped cleanly, storing into the --db file


def test_ubi_demo_serve_on_a_taken_port_says_to_pick_another(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = _ubi_demo_serve("--port", str(port), "--db", str(tmp_path / "x.duckdb"))
        _, err = proc.communicate(timeout=60)
    err = " ".join(err.split())  # rich wraps the message at the terminal width
    assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in err and "another --port" in err


def test_serve_options_belong_to_serve() -> None:
    from ubi_pipeline.cli import main

    assert main(["demo", "--port", "0"]) == 2  # the batch demo picks its own port: refused, not ignored
