"""The UBI 1.3.0 JSON Schemas the browser tests validate the client's payloads against, and their quirk.

No browser here: this checks the validator (``conftest.UbiSpec``) itself, so that a payload passing it in
``test_client.py`` means what it should.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import UbiSpec, enum_one_of_as_any_of, is_rfc3339

CLICK: dict[str, Any] = {
    "action_name": "click",
    "timestamp": "2024-05-16T12:34:56.789Z",
    "query_id": "q-1",
    "event_attributes": {"object": {"object_id": "doc-1"}, "position": {"ordinal": 0}},
}


def test_the_spec_as_written_refuses_its_own_well_known_action_names(ubi_spec: UbiSpec) -> None:
    # oneOf [enum branch, any-string branch]: "click" matches both, so "exactly one" fails. This is why the
    # validators read that oneOf as anyOf (enum_one_of_as_any_of).
    errors = [e.message for e in ubi_spec.as_written["event"].iter_errors(CLICK)]
    assert len(errors) == 1 and "is valid under each of" in errors[0]
    assert ubi_spec.errors("event", CLICK) == []
    assert ubi_spec.errors("event", {**CLICK, "action_name": "wishlist"}) == []  # custom names stay valid


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"action_name": "x" * 101}, "action_name"),  # the 100-character limit holds in both branches
        ({"query_id": None}, "query_id"),  # the schemas have no nulls: unknown fields are left out
        ({"user_query": None}, "user_query"),
        ({"event_attributes": {"object": {"object_id": "doc-1"}}}, "event_attributes"),  # position required
        ({"event_attributes": {"position": {}}}, "event_attributes/position"),  # neither ordinal nor xy
        ({"event_attributes": {"position": {"ordinal": 1.5}}}, "event_attributes/position"),
        ({"timestamp": "2024-05-16T12:34:56"}, "timestamp"),  # RFC 3339 needs a zone (OpenSearch too)
        ({"timestamp": "yesterday"}, "timestamp"),
    ],
)
def test_what_the_validators_still_refuse(ubi_spec: UbiSpec, change: dict[str, Any], where: str) -> None:
    errors = ubi_spec.errors("event", {**CLICK, **change})
    assert errors and all(e.startswith(where) for e in errors), errors


def test_query_records(ubi_spec: UbiSpec) -> None:
    query = {
        "query_id": "q-1",
        "user_query": "boots",
        "query_response_hit_ids": ["a", "b"],
        "timestamp": "2024-05-16T12:34:56Z",
        "query_attributes": {},
    }
    assert ubi_spec.errors("query", query) == []
    assert ubi_spec.errors("query", {**query, "query_response_hit_ids": [1]})  # ids are strings
    assert ubi_spec.errors("query", {k: v for k, v in query.items() if k != "user_query"})


def test_only_enum_one_ofs_are_rewritten() -> None:
    enum_branch = {"type": "string", "maxLength": 100, "enum": ["a"]}
    plain = {"type": "string", "maxLength": 100}
    assert enum_one_of_as_any_of({"oneOf": [enum_branch, plain]}) == {"anyOf": [enum_branch, plain]}
    distinct = {"oneOf": [{"required": ["ordinal"]}, {"required": ["xy"]}]}
    assert enum_one_of_as_any_of(distinct) == distinct


def test_rfc3339_date_times() -> None:
    assert is_rfc3339("2024-05-16T12:34:56.789Z") and is_rfc3339("2024-05-16T12:34:56+02:00")
    assert not is_rfc3339("2024-05-16T12:34:56") and not is_rfc3339("2024-02-30T12:34:56Z")
