"""Fixtures shared by every test package. Record factories for UBI queries and events."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

_serial = itertools.count()

Factory = Callable[..., dict[str, Any]]


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
