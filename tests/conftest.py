"""Fixtures shared by every test package: record factories for UBI queries and events, and the one way to
reach ``../shared`` (samples, spec, docs, reference client)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# No per-example deadline: on a loaded 2-core CI machine a 200 ms deadline fails property tests for time alone
# (seen on test_fitted_thresholds_are_ordered_and_never_worse_than_quantile_start), which says nothing about
# the property. Example counts stay hypothesis' defaults unless a test sets its own.
settings.register_profile("ubi", deadline=None)
settings.load_profile("ubi")

_serial = itertools.count()

Factory = Callable[..., dict[str, Any]]

#: ``../shared`` beside the repository (UBI spec, samples, reference JS client, docs): read there, never copied in.
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
#: The files under it that many tests read (docs/ubi.md describes the sample: 473 queries, 3,448 events).
SAMPLE_LOG = "ubi-samples/ubi_queries_events.ndjson"
ESCI_JUDGMENTS = "ubi-samples/esci_us_judgments.json"


def shared_path(relative: str) -> Path:
    """``../shared/<relative>`` (e.g. ``"ubi-samples/esci_us_judgments.json"``); when it is absent the calling
    test is skipped with the path as the reason. Call it inside a test or fixture, never at import time."""
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"shared data is absent: {path} (the tests read ../shared beside the repository)")
    return path


def _apply(record: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    for key, value in overrides.items():
        if value is ...:  # `...` removes the field
            record.pop(key, None)
        else:
            record[key] = value
    return record


def new_event(**overrides: Any) -> dict[str, Any]:
    """A valid UBI 1.3.0 click event as a client sends it; overrides replace fields (``...`` removes one)."""
    n = next(_serial)
    return _apply(
        {
            "action_name": "click",
            "query_id": f"q-{n}",
            "session_id": "s-1",
            "client_id": "c-1",
            "application": "shop",
            "timestamp": "2024-05-16T12:34:56.789Z",
            "user_query": "running shoes",
            "event_attributes": {
                "object": {"object_id": f"doc-{n}", "object_id_field": "sku"},
                "position": {"ordinal": 2},
            },
        },
        overrides,
    )


def new_query(**overrides: Any) -> dict[str, Any]:
    """A valid UBI 1.3.0 query record; overrides replace fields (``...`` removes one)."""
    n = next(_serial)
    return _apply(
        {
            "query_id": f"q-{n}",
            "user_query": "running shoes",
            "client_id": "c-1",
            "application": "shop",
            "timestamp": "2024-05-16T12:34:50Z",
            "query_attributes": {"ranker": "bm25"},
            "object_id_field": "sku",
            "query_response_hit_ids": ["doc-1", "doc-2", "doc-3"],
        },
        overrides,
    )


@pytest.fixture
def make_event() -> Factory:
    """``make_event(**overrides)``: a fresh valid event (distinct query_id and object_id per call)."""
    return new_event


@pytest.fixture
def make_query() -> Factory:
    """``make_query(**overrides)``: a fresh valid query record (distinct query_id per call)."""
    return new_query


@pytest.fixture
def shared() -> Callable[[str], Path]:
    """``shared("ubi-samples/x.json")``: a path under ``../shared``; skips the test when the file is absent."""
    return shared_path
