"""``ubi review serve`` refuses what it cannot serve before it listens: exit 2 with one line naming the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.review.review_store import review_store
from ubi_pipeline.cli import main


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    return review_store(tmp_path / "r.duckdb")


def test_bad_catalog_line(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog = tmp_path / "c.jsonl"
    catalog.write_text('{"doc_id": "g1"}\n{"title": "no id"}\n')
    assert main(["review", "serve", "--db", str(db), "--docs", str(catalog), "--port", "0"]) == 2
    assert "c.jsonl:2: 'doc_id' must be a non-empty string" in capsys.readouterr().err


def test_exposed_without_token(db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UBI_REVIEW_TOKEN", raising=False)
    assert main(["review", "serve", "--db", str(db), "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "set UBI_REVIEW_TOKEN" in capsys.readouterr().err


def test_empty_store_and_bad_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ubi_pipeline.store.duckdb_store import Store

    with Store(tmp_path / "empty.duckdb"):
        pass
    assert main(["review", "serve", "--db", str(tmp_path / "empty.duckdb"), "--port", "0"]) == 2
    assert "no candidate judgments to review; run `ubi process`" in capsys.readouterr().err
    assert main(["review", "serve", "--db", str(tmp_path / "empty.duckdb"), "--assessors-per-pair", "0"]) == 2
    assert "--assessors-per-pair must be >= 1" in capsys.readouterr().err


def test_the_printed_address_asks_for_the_token_when_one_is_set(db: Path) -> None:
    """With UBI_REVIEW_TOKEN set, the address `ubi review serve` printed (?assessor=YOUR_NAME) answered every data
    request 403 'missing or wrong review token': the line now shows where the token goes, never the token."""
    import os
    import re
    import signal
    import subprocess
    import sys

    env = {**os.environ, "UBI_REVIEW_TOKEN": "s3cret-token-value"}
    proc = subprocess.Popen([sys.executable, "-m", "ubi_pipeline", "review", "serve", "--db", str(db), "--port", "0",
                             "--held-out", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert re.search(r"http://127\.0\.0\.1:\d+/review\?token=<UBI_REVIEW_TOKEN>&assessor=YOUR_NAME", line), line
    assert "s3cret-token-value" not in line


def test_ubi_help_names_the_review_page(capsys: pytest.CaptureFixture[str]) -> None:
    """`ubi --help` and `ubi review --help` described only the CSV round trip: nothing led to `ubi review serve`."""
    for argv in (["--help"], ["review", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert "in the browser" in text, argv
    with pytest.raises(SystemExit):
        main(["review", "--help"])
    assert "`serve` puts them on a page at /review" in " ".join(capsys.readouterr().out.split())
