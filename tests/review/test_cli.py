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
