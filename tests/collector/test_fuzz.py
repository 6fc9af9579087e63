"""Fuzzing the collector: no input makes it answer 500 or crash, and every rejected item is kept.

Two generators: schemathesis, from the collector's own OpenAPI schema (every documented route and media
type), and hypothesis, with bodies the schema does not describe (arbitrary bytes, JSON of any shape, valid
records with one field broken, any content type) on every ingest route. The app runs with every security
feature on (API key, pseudonymisation, dropped fields), so the record filters see the same inputs.

"Kept" is checked by bookkeeping: each answer says how many rows ``failed_records`` must have gained
(202: ``rejected``; a refused body that the collector keeps: 1; a refusal it deliberately does not keep,
such as a body over the byte limit: 0), and at the end the table must hold exactly that many rows.

"Kept scrubbed" is checked on every kept row (:func:`assert_scrubbed`): the generated records carry
recognisable clear-text ids and a message, which must appear nowhere in a row (raw bytes, reason, field),
and every record-shaped object kept has pseudonyms (32 hex digits) for its ids and no dropped field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ubi_pipeline.collector.app import create_app
from ubi_pipeline.schemas.settings import Settings

KEY = "fuzz-key"
INGEST = ("/v1/queries", "/v1/events", "/ubi_queries", "/ubi_events", "/v1/bulk")
SETTINGS = dict(
    api_keys={"shop": KEY},
    pseudonymise_key="pepper",
    drop_fields=["message", "query_attributes.email"],
    admin_remote=True,  # the test client's peer is "testclient", not loopback: let it reach admin routes
    admin_hosts=["testserver"],  # ... and the test client's Host name, which is not a loopback one
    max_body_bytes=64 * 1024,
    max_items=50,  # small limits, so generated bodies also reach the 413 paths
)


@schemathesis.serializer("application/x-ndjson", "application/vnd.apache.arrow.stream")
def _as_bytes(ctx: Any, value: Any) -> bytes:
    """The schema describes NDJSON and Arrow bodies as strings: send their text (or bytes) as is."""
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else orjson.dumps(value)


@dataclass
class Ledger:
    """How many failed_records rows the answers so far promise, and what was seen."""

    expected: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    def record(self, method: str, path: str, status: int, body: bytes) -> None:
        assert status < 500, f"{method} {path} answered {status}: {body[:300]!r}"
        self.statuses[status] = self.statuses.get(status, 0) + 1
        route = path.split("?", 1)[0]
        if method in ("POST", "PUT") and _OPENSEARCH.match(route):
            self.expected += _opensearch_kept(status, body)
            return
        if method != "POST" or route not in INGEST:
            return
        if status == 415 and b"Content-Encoding" in body:
            return  # an encoding the collector does not read: refused before the body is read
        if status == 202:
            self.expected += orjson.loads(body)["rejected"]
        elif status == 422 and orjson.loads(body).get("error") == "AllRejected":
            self.expected += orjson.loads(body)["rejected"]  # every item rejected: each kept (issue 28)
        elif status in (400, 403, 415, 422):
            self.expected += 1  # malformed body, forbidden application, unknown type, unforeseen: kept
        elif status == 413:
            # Too many items is kept (the body is within the byte limit); too many bytes is not.
            self.expected += b"items in one request" in body


#: The OpenSearch-compatible routes (collector/opensearch.py), which answer in OpenSearch's shapes.
_OPENSEARCH = re.compile(r"^(/[^/]+)?/_bulk$|^/[^/]+/_doc(/[^/]+)?$|^/[^/]+/_create/[^/]+$")


def _kept_item(status: int, error: dict[str, Any]) -> bool:
    # A create whose id is stored already is OpenSearch's 409 but no failure of the record: not kept.
    return status >= 400 and "document already exists" not in str(error.get("reason", ""))


def _opensearch_kept(status: int, body: bytes) -> int:
    """failed_records rows an OpenSearch-shaped answer promises (collector/opensearch.py's docstring)."""
    answer = orjson.loads(body)
    if "items" in answer:  # _bulk: one per failed item
        return sum(_kept_item(i["status"], i.get("error") or {}) for item in answer["items"] for i in item.values())
    if status < 300:
        return 0
    error = answer.get("error")
    if not isinstance(error, dict):  # refused by the gate (the collector's own shape): not kept
        return 0
    reason = str(error.get("reason", ""))
    if status == 404:  # no such index in the path: refused before the body is read
        return 0
    if status == 413:
        return int("items in one request" in reason)
    if status == 415:
        return int("Content-Encoding" not in reason)
    return int(_kept_item(status, error))


#: Clear text the generated records carry in pseudonymised or dropped fields: never to be stored.
SECRETS = ("alice-0451", "secret message 0451", "4111111111111111", "alice@example.com")
_PSEUDONYM = re.compile(r"[0-9a-f]{32}")


def _check_unit(value: Any, where: str) -> None:
    """One JSON value kept in a row: records scrubbed, nothing that is not a record kept in clear."""
    if isinstance(value, list):
        for item in value:
            _check_unit(item, where)
    elif isinstance(value, dict):
        if "ubi_redacted" in value or (
            len(value) == 1 and next(iter(value)) in ("index", "create", "delete")
        ):
            return  # a redaction marker, or a _bulk action line
        for name in ("client_id", "user_id", "session_id"):
            kept = value.get(name)
            assert kept in (None, "") or (isinstance(kept, str) and _PSEUDONYM.fullmatch(kept)), (
                where,
                name,
                kept,
            )
        assert "message" not in value, where
        attributes = value.get("query_attributes")
        assert not (isinstance(attributes, dict) and "email" in attributes), where
    else:
        assert value is None or isinstance(value, bool), f"{where}: {value!r} kept outside any record"


def assert_scrubbed(db: Path) -> int:
    """Every kept row is scrubbed (see the module docstring); returns how many rows were checked."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        kept = con.execute("SELECT failed_id, kind, reason, field, raw FROM failed_records").fetchall()
    finally:
        con.close()
    for failed_id, kind, reason, fld, raw in kept:
        where = f"failed_records {failed_id} ({kind})"
        text = f"{reason} {fld}"
        for secret in SECRETS:
            assert secret not in text and secret.encode() not in (raw or b""), f"{where}: {secret!r} kept"
        raw = bytes(raw or b"")
        if "[raw truncated:" in reason:
            # cut at FAILED_RAW_MAX_BYTES (store/rows.py truncated_raw): no longer JSON, so only the clear-text
            # check above applies to it
            continue
        try:
            units = [json.loads(raw)] if raw.strip() else []
        except ValueError:  # NDJSON or _bulk: line by line, and each line must be JSON (or a marker)
            units = [json.loads(line) for line in raw.split(b"\n") if line.strip()]
        for unit in units:
            _check_unit(unit, where)
    return len(kept)


@dataclass
class Fuzzed:
    app: Any
    db: Path
    ledger: Ledger
    closed: bool = False

    def check_kept(self) -> None:
        if not self.closed:
            self.app.state.collector.sink.close()
        con = duckdb.connect(str(self.db), read_only=True)
        try:
            (kept,) = con.execute("SELECT count(*) FROM failed_records").fetchone() or (0,)
        finally:
            con.close()
        assert kept == self.ledger.expected, (
            f"failed_records has {kept} rows, answers promised {self.ledger.expected}"
        )
        assert assert_scrubbed(self.db) == kept


def test_schema_generated_requests_never_get_a_500(tmp_path: Path) -> None:
    db = tmp_path / "fuzz.duckdb"
    state = Fuzzed(create_app(Settings(db=db, **SETTINGS)), db, Ledger())
    api = schemathesis.openapi.from_asgi("/openapi.json", state.app)
    operations = [result.ok() for result in api.get_all_operations()]
    # Every route of the collector is in its schema, ingest and admin routes included.
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "POST /v1/queries",
        "POST /v1/events",
        "POST /ubi_queries",
        "POST /ubi_events",
        "POST /v1/bulk",
        "GET /v1/failed",
        "GET /healthz",
        "GET /metrics",
        "POST /v1/admin/seal",
        "POST /v1/admin/load/{table}",
    }
    for operation in operations:
        # Admin routes write to the store or its seal folder: a few suffice to show the route holds.
        examples = 5 if "admin" in operation.path else 25

        @settings(
            max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(case=operation.as_strategy())
        def call(case: Any) -> None:
            response = case.call(headers={"X-API-Key": KEY})
            state.ledger.record(case.method, case.formatted_path, response.status_code, response.content)

        call()
    assert 202 in state.ledger.statuses and 200 in state.ledger.statuses
    state.check_kept()


# ---------------------------------------------------------------- bodies outside the schema

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_EVENT = {
    "action_name": "click",
    "timestamp": "2024-05-16T12:34:56Z",
    "query_id": "q1",
    "session_id": "alice-0451-session",
    "client_id": "alice-0451-client",
    "user_id": "alice-0451",
    "message": "secret message 0451",
    "event_attributes": {"object": {"object_id": "d1"}, "position": {"ordinal": 0}},
}
_QUERY = {
    "user_query": "shoes",
    "query_id": "q1",
    "client_id": "alice-0451-client",
    "query_response_hit_ids": ["d1", "d2"],
    "query_attributes": {"email": "alice@example.com"},
}
#: Bad values that still carry the secrets: too long for an id, a card number where text belongs.
_SECRET_VALUES = st.sampled_from(
    ["alice-0451" * 11, "secret message 0451 " * 60, 4111111111111111, {"name": "alice-0451"}]
)


@st.composite
def _broken_record(draw: st.DrawFn) -> Any:
    """A valid event or query with one field (possibly nested) replaced by any JSON value, or removed."""
    record = dict(draw(st.sampled_from([_EVENT, _QUERY])))
    key = draw(
        st.sampled_from(
            sorted(record)
            + [
                "event_attributes.position",
                "event_attributes.object",
                "application",
                "message",
                "user_id",
                "extra_key",
                "query_attributes.email",
            ]
        )
    )
    # Secret values only where the settings promise to hide them (other fields are stored as sent).
    private = key in ("client_id", "user_id", "session_id", "message", "query_attributes.email")
    value = draw(_json | _SECRET_VALUES | st.just(...)) if private else draw(_json | st.just(...))
    if "." in key:
        outer, inner = key.split(".")
        nested = dict(record.get(outer) or {})
        if value is ...:
            nested.pop(inner, None)
        else:
            nested[inner] = value
        record[outer] = nested
    elif value is ...:
        record.pop(key, None)
    else:
        record[key] = value
    return record


def _dumps(value: Any) -> bytes:
    # The standard library, not orjson: it writes integers beyond 64 bits, which clients may send too.
    return json.dumps(value).encode()


def _ndjson(items: list[Any]) -> bytes:
    return b"\n".join(_dumps(i) for i in items)


_bodies = st.one_of(
    st.binary(max_size=300),
    _json.map(_dumps),
    st.lists(_broken_record(), min_size=1, max_size=5).map(_dumps),
    st.lists(_broken_record(), min_size=1, max_size=5).map(_ndjson),
    st.lists(_broken_record() | _json, min_size=1, max_size=5).map(
        lambda items: b"\n".join(b'{"index": {"_index": "ubi_events"}}\n' + _dumps(i) for i in items)
    ),
    st.lists(
        st.sampled_from(["shop", "blog", None]).map(lambda app: {**_EVENT, "application": app}),
        min_size=1,
        max_size=4,
    ).map(_dumps),  # the key's application, another, or none
    st.just(b"[" + b"{}," * 60 + b"{}]"),  # more items than max_items
    st.builds(lambda: b" " * (64 * 1024 + 1)),  # more bytes than max_body_bytes
)
_types = st.sampled_from(
    [
        "application/json",
        "application/x-ndjson",
        "text/plain;charset=UTF-8",
        "",
        "application/x-www-form-urlencoded",
        "image/png",
        "application/json; charset=latin-1",
    ]
)


def test_arbitrary_bodies_on_every_ingest_route_are_answered_and_kept(tmp_path: Path) -> None:
    db = tmp_path / "bodies.duckdb"
    app = create_app(Settings(db=db, **SETTINGS))
    state = Fuzzed(app, db, Ledger())
    with TestClient(app, client=("127.0.0.1", 50000), raise_server_exceptions=False) as client:
        # Explicit examples make sure each way of answering is met every run; the rest is generated.
        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(path=st.sampled_from(INGEST), body=_bodies, content_type=_types)
        @example("/v1/events", _dumps([_EVENT, {**_EVENT, "timestamp": "soon"}]), "application/json")  # 202
        @example("/v1/queries", b'[{"user_query": ', "application/json")  # 400
        @example("/ubi_events", _dumps([{**_EVENT, "application": "blog"}]), "text/plain")  # 403
        @example("/v1/events", b"[" + b"{}," * 60 + b"{}]", "application/json")  # 413, kept
        @example("/v1/bulk", b" " * (64 * 1024 + 1), "application/x-ndjson")  # 413, not kept
        @example("/v1/events", _dumps(_EVENT), "image/png")  # 415
        @example("/v1/events", _dumps([_EVENT, _QUERY])[:-9], "application/json")  # 400, records inside
        @example("/v1/events", _ndjson([_EVENT, {**_EVENT, "application": "blog"}]), "application/x-ndjson")
        @example(
            "/v1/bulk",
            b'{"index": {"_index": "ubi_events"}}\n' + _dumps({**_EVENT, "application": "blog"}),
            "application/x-ndjson",
        )  # 403 on a _bulk body
        @example(
            "/v1/events",
            _dumps([{**_EVENT, "client_id": "alice-0451" * 11, "message": 4111111111111111}]),
            "application/json",
        )  # quoted values
        def post(path: str, body: bytes, content_type: str) -> None:
            headers = {"X-API-Key": KEY, "content-type": content_type}
            r = client.post(path, content=body, headers=headers)
            state.ledger.record("POST", path, r.status_code, r.content)

        post()
        assert client.get("/healthz").status_code == 200  # still up
    state.closed = True  # the test client's shutdown closed the sink
    # Every class of answer was reached, so the bookkeeping covered each way of keeping (or not).
    assert {202, 400, 403, 413, 415} <= set(state.ledger.statuses), state.ledger.statuses
    state.check_kept()
