"""Issue 25's attack on the store, through the collector app and its DuckDB sink: no client can brick it.

Before the limits, about 53 malformed bodies of 4.9 MB (each kept whole in failed_records), or 55 query records
with a 4.9 MB ``user_query``, made DuckDB's checkpoint fail under the writer's 256 MB memory limit ("failed to
pin block"): the database was invalidated and every later write answered 503. The same happens at a quarter of
the volume under a quarter of the limit, which is what these tests use (64MB: the bodies below come to 2.3
times it).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import duckdb
import numpy as np
import orjson
from fastapi.testclient import TestClient

from tests.conftest import new_event
from ubi_pipeline.collector.app import create_app
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.tables import FAILED_RAW_MAX_BYTES
from ubi_pipeline.schemas.ubi import JSON_FIELD_MAX_LENGTH, USER_QUERY_MAX_LENGTH

BODY = 4_900_000  # bytes: the attack's bodies, just under max_body_bytes (5 MiB)
ROUNDS = 30  # 30 x 4.9 MB = 147 MB, 2.3 times the 64MB pool (today's code failed after about 13)


def _collector(db: Path, pool: str = "64MB") -> TestClient:
    app = create_app(Settings(db=db, writer_memory_limit=pool), extensions=False)
    return TestClient(app, base_url="http://localhost", raise_server_exceptions=False)


def _noise(n: int) -> str:
    """``n`` characters DuckDB cannot compress (hex of random bytes), as an attacker would send."""
    return os.urandom(n // 2 + 1).hex()[:n]


def _stored(db: Path, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_malformed_and_oversized_bodies_cannot_brick_the_store(tmp_path: Path) -> None:
    db = tmp_path / "ubi.duckdb"
    with _collector(db) as client:
        digests = _attack(client)
        # the store still takes writes, and /healthz says so
        r = client.post("/v1/events", json=[new_event() for _ in range(100)])
        assert r.status_code == 202 and r.json()["accepted"] == 100
        health = client.get("/healthz").json()
        assert (health["status"], health["ok"], health["recoveries"]) == ("ok", True, 0), health
    # exact counts: 30 bodies and 30 records refused and kept, 100 events stored, no query record
    assert _stored(db, "SELECT count(*) FROM ubi_events") == [(100,)]
    assert _stored(db, "SELECT count(*) FROM ubi_queries") == [(0,)]
    kept = _stored(db, "SELECT kind, octet_length(raw), reason FROM failed_records ORDER BY received_at")
    assert len(kept) == 2 * ROUNDS
    assert all(length == FAILED_RAW_MAX_BYTES for _, length, _ in kept)  # truncated, with length and hash
    bodies = [reason for kind, _, reason in kept if kind == "body"]
    assert len(bodies) == ROUNDS
    assert all(f"{BODY:,} bytes, sha256 " in reason for reason in bodies)
    assert sorted(reason.split("sha256 ")[1][:64] for reason in bodies) == sorted(digests)
    records = [reason for kind, _, reason in kept if kind == "query"]
    assert all(f"at most {USER_QUERY_MAX_LENGTH} characters" in reason for reason in records)
    # a restart under the same limit takes writes at once (issue 25: its first write failed)
    with _collector(db) as client:
        r = client.post("/v1/events", json=[new_event() for _ in range(10)])
        assert r.status_code == 202 and r.json()["accepted"] == 10
    assert _stored(db, "SELECT count(*) FROM ubi_events") == [(110,)]


def _attack(client: TestClient) -> list[str]:
    """ROUNDS malformed bodies, then ROUNDS query records with a user_query of nearly BODY bytes; the
    SHA-256 of each body."""
    digests = []
    for _ in range(ROUNDS):
        prefix = '[{"user_query": "'
        body = (prefix + _noise(BODY - len(prefix))).encode()  # malformed: the string never ends
        digests.append(hashlib.sha256(body).hexdigest())
        r = client.post("/v1/queries", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
    for _ in range(ROUNDS):
        record = {"query_id": os.urandom(8).hex(), "user_query": _noise(BODY - 200)}
        r = client.post("/v1/queries", content=orjson.dumps(record), headers={"content-type": "application/json"})
        assert r.status_code < 500, r.text
        assert r.json()["errors"][0]["field"] == "user_query"
    return digests


def _wide(n: int) -> str:
    """``n`` random characters outside the BMP: 4 bytes each in UTF-8, none alike (nothing to compress)."""
    points = np.frombuffer(os.urandom(4 * n), dtype="<u4") % 0xF0000 + 0x10000
    return points.astype("<u4").tobytes().decode("utf-32-le")


def test_records_at_every_limit_are_all_stored_once(tmp_path: Path) -> None:
    """The largest records the limits accept, three times the writer's pool of them (32MB here): every
    stored string at its longest in bytes (user_query 2,048 characters of 4 bytes, message 1,024, and
    event_attributes and the extra keys 8 KiB of JSON each). Every request is acknowledged and every record
    stored once. Under a pool this small DuckDB's checkpoint may still fail once (it did in this test, after
    about 60 MB); the writer reopens the store and carries on (Store._recover), which is what is checked."""
    db = tmp_path / "ubi.duckdb"
    attrs_overhead = len(orjson.dumps({"object": {"object_id": "d1"}, "k": ""}))
    extra_overhead = len(orjson.dumps({"k": ""}))
    record_bytes = 4 * (USER_QUERY_MAX_LENGTH + 1024) + 2 * JSON_FIELD_MAX_LENGTH
    per_request, sent = 120, 0
    with _collector(db, pool="32MB") as client:
        while sent * record_bytes < 3 * 32 * 1024 * 1024:
            batch = [new_event(user_query=_wide(USER_QUERY_MAX_LENGTH), message=_wide(1024),
                               k=_wide((JSON_FIELD_MAX_LENGTH - extra_overhead) // 4),
                               event_attributes={"object": {"object_id": "d1"},
                                                 "k": _wide((JSON_FIELD_MAX_LENGTH - attrs_overhead) // 4)})
                     for _ in range(per_request)]
            r = client.post("/v1/events", content=orjson.dumps(batch), headers={"content-type": "application/json"})
            assert r.status_code == 202 and r.json()["accepted"] == per_request, r.text[:500]
            sent += per_request
        health = client.get("/healthz").json()
        assert (health["status"], health["ok"], health["last_error"]) == ("ok", True, None), health
        assert health["recoveries"] <= 1, health  # a second failure would mean the recovery did not hold
    assert _stored(db, "SELECT count(*), max(strlen(extra)), max(strlen(event_attributes)), "
                       "max(strlen(user_query)) FROM ubi_events") == [
        (sent, JSON_FIELD_MAX_LENGTH, JSON_FIELD_MAX_LENGTH, 4 * USER_QUERY_MAX_LENGTH)]
