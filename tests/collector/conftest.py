"""Fixtures for the collector tests: an app on a DuckDB file, Record factories
(``make_event``, ``make_query``) are in ``tests/conftest.py``; helpers in ``tests_collector_support``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ubi_pipeline.collector.app import create_app
from ubi_pipeline.schemas.settings import Settings


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ubi.duckdb"


@pytest.fixture
def client(db: Path) -> Iterator[TestClient]:
    """The collector app (no extension modules) on a fresh DuckDB file, through the ASGI test client."""
    app = create_app(Settings(db=db), extensions=False)
    # base_url: admin routes answer only to loopback host names (ubi_pipeline.transport.admin.refused_host), not "testserver"
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as c:
        yield c
