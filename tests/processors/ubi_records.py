"""Record factories and store builders for the processors tests (sessions, judgments, commands)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from tests.conftest import SAMPLE_LOG, shared_path
from ubi_pipeline.collector.ingest import ingest as ingest_validated
from ubi_pipeline.collector.ingest import parse_bulk, parse_items, validate_items
from ubi_pipeline.store.duckdb_store import Store

#: ``../shared`` next to the repository (see the foundation issue)
T0 = datetime(2025, 1, 1, tzinfo=UTC)
_ids = itertools.count()


def ts(seconds: float) -> str:
    """ISO timestamp ``seconds`` after T0."""
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def make_query(query_id: str, user_query: str, hits: list[str] | None = None, *, at: float = 0.0,
               client_id: str | None = "c1", application: str = "shop", response_id: str | None = None,
               **extra: Any) -> dict[str, Any]:
    q: dict[str, Any] = {"query_id": query_id, "user_query": user_query, "timestamp": ts(at),
                         "client_id": client_id, "application": application, **extra}
    if hits is not None:
        q["query_response_hit_ids"] = hits
    if response_id is not None:
        q["query_response_id"] = response_id
    return q


def make_event(action: str, query_id: str | None, object_id: str | None = None, ordinal: int | None = None, *,
               at: float = 1.0, client_id: str | None = "c1", application: str = "shop",
               **extra: Any) -> dict[str, Any]:
    """An event with a unique ``event_id`` (identical events would otherwise be deduplicated as retries)."""
    attrs: dict[str, Any] = {}
    if object_id is not None:
        attrs["object"] = {"object_id": object_id}
    if ordinal is not None:
        attrs["position"] = {"ordinal": ordinal}
    e: dict[str, Any] = {"action_name": action, "query_id": query_id, "timestamp": ts(at), "client_id": client_id,
                         "application": application, "event_id": f"ev-{next(_ids)}", **extra}
    if attrs:
        e["event_attributes"] = attrs
    return e


def _ndjson(records: list[dict[str, Any]]) -> bytes:
    return b"\n".join(orjson.dumps(r) for r in records)


def build_store(path: Path, queries: list[dict[str, Any]], events: list[dict[str, Any]]) -> Path:
    """A DuckDB store holding these records, written through the real ingest stage; nothing may be rejected."""
    with Store(path) as store:
        for kind, records in (("query", queries), ("event", events)):
            if records:
                result = ingest_validated(store, validate_items(parse_items(_ndjson(records), kind, ndjson=True)),
                                          source="test")
                if result.rejected:
                    raise ValueError(f"test records rejected: {result.public()['errors']}")
    return path


def build_sample_store(path: Path) -> Path:
    """The real ESCI/Chorus/ubi-demo sample (473 queries, 3,448 events) ingested through ``/v1/bulk``'s stage."""
    with Store(path) as store:
        sample = shared_path(SAMPLE_LOG)
        result = ingest_validated(store, validate_items(parse_bulk(sample.read_bytes())), source=str(sample))
    if result.rejected or result.accepted != 473 + 3448:
        raise ValueError(f"sample ingest changed: {result.public(5)}")
    return path
