"""Safe to expose: origins, API keys, rate limits, admin routes, pseudonymisation and dropped fields.

The app is the real collector (``create_app`` with its extension modules) on a DuckDB file in ``tmp_path``,
driven through the ASGI test client; the store is reopened after the app has shut down.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ubi_pipeline.collector import record_filters, security
from ubi_pipeline.collector.app import create_app
from ubi_pipeline.collector.security import ApiKeys, RateLimiter, pseudonym
from ubi_pipeline.schemas.settings import Settings

LOCAL = ("127.0.0.1", 50000)
REMOTE = ("203.0.113.7", 50000)  # TEST-NET-3: a documentation address, never loopback


@contextmanager
def collector(db: Path, peer: tuple[str, int] = LOCAL, **overrides: Any) -> Iterator[TestClient]:
    app = create_app(Settings(db=db, **overrides))
    with TestClient(app, client=peer, base_url="http://localhost", raise_server_exceptions=False) as c:
        yield c


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# ---------------------------------------------------------------- API keys


def test_api_key_lookup_compares_every_key_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = ApiKeys({"shop": ["k-shop-1", "k-shop-2"], "blog": ["k-blog"]})
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(record_filters.hmac, "compare_digest", spy)
    assert keys.application_for("k-shop-2") == "shop"
    # No early exit: all three keys were compared, each as a 32-byte SHA-256 digest (length leaks nothing).
    assert len(calls) == 3 and all(len(a) == len(b) == 32 for a, b in calls)
    assert keys.application_for("k-blog") == "blog"
    assert keys.application_for("k-shop") is None
    assert keys.application_for("") is None and keys.application_for(None) is None
    assert not ApiKeys({}).enabled


def test_writes_need_the_applications_key_and_unauthorised_bodies_are_not_stored(
    db: Path, make_event: Callable[..., dict[str, Any]]
) -> None:
    with collector(db, api_keys={"shop": "k-shop"}) as c:
        assert c.post("/v1/events", json=[make_event()]).status_code == 401
        r = c.post("/v1/events", json=[make_event()], headers={"X-API-Key": "k-guess"})
        assert r.status_code == 401 and "unknown API key" in r.json()["message"]
        r = c.post(
            "/v1/events", json=[make_event(), make_event(application=...)], headers={"X-API-Key": "k-shop"}
        )
        assert r.status_code == 202 and r.json()["accepted"] == 2
        assert c.get("/healthz").status_code == 200  # reads need no key
    # A record without an application gets the key's; nothing from the refused requests was kept.
    assert rows(db, "SELECT application, count(*) FROM ubi_events GROUP BY 1") == [("shop", 2)]
    assert rows(db, "SELECT count(*) FROM failed_records") == [(0,)]


def test_records_of_another_application_are_refused_with_403_and_kept(
    db: Path, make_event: Callable[..., dict[str, Any]], make_query: Callable[..., dict[str, Any]]
) -> None:
    with collector(db, api_keys={"shop": ["k-shop"], "blog": ["k-blog"]}) as c:
        body = [make_event(), make_event(application="blog")]
        r = c.post("/v1/events", json=body, headers={"X-API-Key": "k-shop"})
        assert r.status_code == 403
        assert "item 1, field 'application': 'blog'" in r.json()["message"]
        r = c.post("/v1/queries", json=make_query(application="shop"), headers={"X-API-Key": "k-blog"})
        assert r.status_code == 403
    assert rows(db, "SELECT count(*) FROM ubi_events") == [(0,)]  # one key authorises the whole request
    kept = rows(db, "SELECT kind, source, raw FROM failed_records ORDER BY source")
    assert [(k, s) for k, s, _ in kept] == [("forbidden", "/v1/events"), ("forbidden", "/v1/queries")]
    assert b'"blog"' in kept[0][2]  # the body as sent


def test_a_beacon_carries_its_key_in_the_url_and_plain_text_json(
    db: Path, make_event: Callable[..., Any]
) -> None:
    import orjson

    body = orjson.dumps([make_event(), make_event()])
    with collector(db, api_keys={"shop": "k-shop"}) as c:
        # navigator.sendBeacon cannot set headers; text/plain is what a CORS-safelisted beacon sends.
        r = c.post(
            "/v1/events?api_key=k-shop", content=body, headers={"content-type": "text/plain;charset=UTF-8"}
        )
        assert r.status_code == 202 and r.json()["accepted"] == 2
        r = c.post("/v1/events?api_key=k-nope", content=body, headers={"content-type": "text/plain"})
        assert r.status_code == 401


def test_an_empty_key_header_cannot_lift_the_application_check(
    db: Path, make_event: Callable[..., Any]
) -> None:
    # The attack (issue 11): authenticate with ?api_key=k-shop and send an empty X-API-Key header, which the
    # application check used to read (and, finding no key, skip): blog's records went in under shop's key.
    with collector(db, api_keys={"shop": ["k-shop"], "blog": ["k-blog"]}) as c:
        r = c.post(
            "/v1/events?api_key=k-shop", json=[make_event(application="blog")], headers={"X-API-Key": ""}
        )
        assert r.status_code == 403 and "application 'shop'" in r.json()["message"]
        # The same request with shop's own records: the empty header is missing, the URL's key counts.
        r = c.post("/v1/events?api_key=k-shop", json=[make_event()], headers={"X-API-Key": " "})
        assert r.status_code == 202 and r.json()["accepted"] == 1
        # A key both ways (even the same key), or twice, is refused: one key, read in one place.
        for url, headers in [
            ("/v1/events?api_key=k-shop", {"X-API-Key": "k-shop"}),
            ("/v1/events?api_key=k-blog", {"X-API-Key": "k-shop"}),
            ("/v1/events?api_key=k-shop&api_key=k-blog", {}),
        ]:
            r = c.post(url, json=[make_event()], headers=headers)
            assert r.status_code == 401, (url, headers)
        assert "one way only" in c.post(
            "/v1/events?api_key=k-shop", json=[make_event()], headers={"X-API-Key": "k-shop"}
        ).json()["message"]
    assert rows(db, "SELECT application, count(*) FROM ubi_events GROUP BY 1") == [("shop", 1)]
    assert rows(db, "SELECT kind FROM failed_records") == [("forbidden",)]  # the blog record, kept


def test_presented_key_is_the_one_place_a_key_is_read() -> None:
    def scope(query: bytes = b"", *headers: bytes) -> dict[str, Any]:
        return {"query_string": query, "headers": [(b"x-api-key", h) for h in headers]}

    assert security.presented_key(scope(b"api_key=k1")) == "k1"
    assert security.presented_key(scope(b"", b"k2")) == "k2"
    assert security.presented_key(scope(b"api_key=k1", b"")) == "k1"  # empty header: missing
    assert security.presented_key(scope(b"api_key=", b"k2")) == "k2"  # empty parameter: missing
    assert security.presented_key(scope(b"api_key=&x=1", b"")) is None
    with pytest.raises(security.Unauthorized, match="one way only"):
        security.presented_key(scope(b"api_key=k1", b"k1"))
    with pytest.raises(security.Unauthorized, match="2 X-API-Key headers"):
        security.presented_key(scope(b"", b"k1", b"k2"))


# ---------------------------------------------------------------- rate limits


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_refills_at_the_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=2.0, burst=3.0, clock=clock)
    # Bucket of 3: three requests at t=0 pass, the fourth needs 1 token at 2 tokens/s: wait 0.5 s.
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(0.5)
    assert limiter.take("b") == 0.0  # buckets are per client
    clock.now += 0.25  # +0.5 token: still 0.5 short, so wait 0.25 s
    assert limiter.take("a") == pytest.approx(0.25)
    clock.now += 0.25  # 1 token now
    assert limiter.take("a") == 0.0
    clock.now += 60  # refills to the burst, never above it
    assert [limiter.take("a") for _ in range(4)][-1] == pytest.approx(0.5)


def test_token_bucket_forgets_least_recent_clients_beyond_its_cap() -> None:
    limiter = RateLimiter(rate=1.0, burst=1.0, max_clients=2, clock=FakeClock())
    limiter.take("a")
    limiter.take("b")
    limiter.take("c")  # "a" is forgotten: it starts again with a full bucket
    assert limiter.take("a") == 0.0
    assert limiter.take("c") > 0  # "c" is remembered (and empty)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 50),
    burst=st.integers(1, 20),
    gaps=st.lists(st.floats(0, 2, allow_nan=False), min_size=1, max_size=80),
)
def test_token_bucket_never_lets_more_through_than_burst_plus_rate_times_time(
    rate: float, burst: int, gaps: list[float]
) -> None:
    # The token bucket law: over any window from the first request, passed <= burst + rate * elapsed.
    clock = FakeClock()
    limiter = RateLimiter(rate=rate, burst=float(burst), clock=clock)
    start, passed = clock.now, 0
    for gap in gaps:
        clock.now += gap
        if limiter.take("x") == 0.0:
            passed += 1
        assert passed <= burst + rate * (clock.now - start) + 1e-9


def test_over_the_rate_is_429_with_retry_after(db: Path, make_event: Callable[..., Any]) -> None:
    with collector(db, rate_limit_per_second=0.5, rate_limit_burst=2, api_keys={"shop": "k"}) as c:
        ok = [
            c.post("/v1/events", json=make_event(), headers={"X-API-Key": "k"}).status_code for _ in range(2)
        ]
        r = c.post("/v1/events", json=make_event(), headers={"X-API-Key": "k"})
        assert ok == [202, 202] and r.status_code == 429
        # Empty bucket, 0.5 token/s: the next token comes in 2 s.
        assert r.headers["retry-after"] == "2"
        # Guessing keys is limited per IP like anything else (this IP's bucket is separate and full).
        guesses = [
            c.post("/v1/events", json=make_event(), headers={"X-API-Key": f"g{i}"}).status_code
            for i in range(3)
        ]
        assert guesses == [401, 401, 429]
        assert c.get("/healthz").status_code == 200  # health and metrics are never limited
    assert rows(db, "SELECT count(*) FROM ubi_events") == [(2,)]
    assert rows(db, "SELECT count(*) FROM failed_records") == [(0,)]


def test_the_client_ip_behind_trusted_proxies() -> None:
    # Two proxies in a row: 10.0.0.2 (the socket peer) forwarded for 10.0.0.1, which forwarded for the client.
    scope = {"client": ("10.0.0.2", 1), "headers": [(b"x-forwarded-for", b"192.0.2.66, 198.51.100.9, 10.0.0.1")]}
    nets = security.proxy_networks
    assert security.client_ip(scope, []) == "10.0.0.2"  # no proxy trusted: the socket peer
    assert security.client_ip(scope, nets(["10.0.0.2"])) == "10.0.0.1"  # the hop the peer appended
    # Both proxies trusted (as one network): the first hop from the right that is not a proxy. The hop left
    # of it (192.0.2.66) was written by the client itself and is never read.
    assert security.client_ip(scope, nets(["10.0.0.0/24"])) == "198.51.100.9"
    # A peer that is not a trusted proxy cannot name the client, whatever it sends.
    assert security.client_ip(scope, nets(["10.9.0.0/16"])) == "10.0.0.2"
    # Two header lines count as one list, in order (RFC 9110 section 5.3).
    split = {"client": ("10.0.0.2", 1), "headers": [(b"x-forwarded-for", b"198.51.100.9"),
                                                    (b"x-forwarded-for", b"10.0.0.1")]}
    assert security.client_ip(split, nets(["10.0.0.0/24"])) == "198.51.100.9"


def test_trusted_proxies_are_addresses_not_a_count() -> None:
    assert Settings(trusted_proxies="10.0.0.5, 10.1.0.0/16").trusted_proxies == ["10.0.0.5", "10.1.0.0/16"]
    assert Settings(trusted_proxies=0).trusted_proxies == []  # the old default still means "none"
    with pytest.raises(ValidationError, match="not a count"):
        Settings(trusted_proxies=1)
    with pytest.raises(ValidationError, match="not an IP address"):
        Settings(trusted_proxies=["proxy.internal"])


# ---------------------------------------------------------------- origins and admin routes


def test_browsers_may_write_from_the_collectors_own_page_only_by_default(
    db: Path, make_event: Callable[..., Any]
) -> None:
    with collector(db) as c:
        r = c.post("/v1/events", json=make_event(), headers={"Origin": "https://evil.example"})
        assert r.status_code == 403 and "UBI_CORS_ALLOW_ORIGINS" in r.json()["message"]
        assert "access-control-allow-origin" not in r.headers
        # The test client's own origin is http://localhost (base_url): the collector's page may write.
        assert (
            c.post("/v1/events", json=make_event(), headers={"Origin": "http://localhost"}).status_code
            == 202
        )
        assert c.post("/v1/events", json=make_event()).status_code == 202  # no Origin: not a browser page
        pre = c.options(
            "/v1/events", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
        )
        assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers
    assert rows(db, "SELECT count(*) FROM ubi_events") == [(2,)]
    assert rows(db, "SELECT count(*) FROM failed_records") == [(0,)]  # a refused origin's body is not kept


def test_allowed_origins_get_cors_headers(db: Path, make_event: Callable[..., Any]) -> None:
    shop = "https://shop.example"
    with collector(db, cors_allow_origins=[shop], api_keys={"shop": "k"}) as c:
        pre = c.options(
            "/v1/events",
            headers={
                "Origin": shop,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type, x-api-key",
            },
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == shop
        assert "x-api-key" in pre.headers["access-control-allow-headers"].lower()
        r = c.post("/v1/events", json=make_event(), headers={"Origin": shop, "X-API-Key": "k"})
        assert r.status_code == 202 and r.headers["access-control-allow-origin"] == shop
        # Refusals carry CORS headers too, so the page's client can read the status and Retry-After.
        r = c.post("/v1/events", json=make_event(), headers={"Origin": shop})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == shop
        assert (
            c.post(
                "/v1/events", json=make_event(), headers={"Origin": "https://other.example", "X-API-Key": "k"}
            ).status_code
            == 403
        )


def test_a_refused_preflight_says_which_origin_and_which_setting(
    db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shop = "http://127.0.0.1:5173"
    ask = {"Origin": shop, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    security._LOGGED_ORIGINS.clear()
    security.ORIGIN_LOG.reset()  # no line of an earlier test within the interval
    with caplog.at_level("WARNING", logger="ubi.collector.security"), collector(db) as c:
        for path in ("/ubi_events", "/ubi_events", "/ubi_queries"):
            pre = c.options(path, headers=ask)
            # Starlette's own answer was a bare 400 "Disallowed CORS origin"; the operator learned nothing.
            assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers
            message = pre.json()["message"]
            assert repr(shop) in message and f"--allow-origin {shop}" in message
            assert "UBI_CORS_ALLOW_ORIGINS" in message
        metrics = c.get("/metrics").text
    assert 'ubi_requests_refused_total{reason="cors_origin"} 3' in metrics
    assert 'ubi_requests_total{method="OPTIONS",route="/ubi_events",status="403"} 2' in metrics
    assert 'ubi_requests_total{method="OPTIONS",route="/ubi_queries",status="403"} 1' in metrics
    # Logged once per origin (then counted only), so a busy page cannot flood the log.
    told = [r.getMessage() for r in caplog.records if "refused a CORS preflight" in r.getMessage()]
    assert len(told) == 1 and f"--allow-origin {shop}" in told[0]
    # With the setting, the same preflight passes; a header the collector does not take is named.
    with collector(db, cors_allow_origins=[shop]) as c:
        assert c.options("/ubi_events", headers=ask).status_code == 200
        pre = c.options("/ubi_events", headers={**ask, "Access-Control-Request-Headers": "x-trace"})
        assert pre.status_code == 403 and "headers not allowed" in pre.json()["message"]
        assert 'ubi_requests_refused_total{reason="cors_headers"} 1' in c.get("/metrics").text


def test_refused_writes_are_counted_by_reason(db: Path, make_event: Callable[..., Any]) -> None:
    with collector(db, api_keys={"shop": "k"}) as c:
        c.post("/v1/events", json=make_event(), headers={"Origin": "https://evil.example", "X-API-Key": "k"})
        c.post("/v1/events", json=make_event())
        metrics = c.get("/metrics").text
    assert 'ubi_requests_refused_total{reason="origin"} 1' in metrics
    assert 'ubi_requests_refused_total{reason="unauthorized"} 1' in metrics


def test_allow_origin_is_a_flag_of_ubi_serve_and_origins_are_checked(tmp_path: Path) -> None:
    import argparse
    import subprocess
    import sys

    from ubi_pipeline.commands.collector import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--allow-origin", "https://shop.example", "--allow-origin", "http://localhost:3000"])
    assert Settings.from_flags(args).cors_allow_origins == ["https://shop.example", "http://localhost:3000"]
    # A trailing slash is the usual mistake (browsers send none): exit 2, naming the flag and the fix.
    done = subprocess.run(
        [sys.executable, "-m", "ubi_pipeline", "serve", "--db", str(tmp_path / "x.duckdb"), "--port", "0",
         "--allow-origin", "https://shop.example/"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2, done.stderr
    told = " ".join(done.stderr.split())
    assert "--allow-origin" in told and "is not an origin" in told and "did you mean 'https://shop.example'" in told


def test_admin_routes_are_for_loopback_clients(db: Path) -> None:
    with collector(db, peer=REMOTE) as c:
        r = c.get("/v1/failed")
        assert r.status_code == 403 and "loopback" in r.json()["message"]
        assert c.post("/v1/admin/seal").status_code == 403
        assert c.get("/healthz").status_code == 200
    with collector(db, peer=LOCAL) as c:
        assert c.get("/v1/failed").status_code == 200
    with collector(db, peer=REMOTE, admin_remote=True) as c:
        assert c.get("/v1/failed").status_code == 200


# ---------------------------------------------------------------- privacy


def _hmac(value: str, key: bytes = b"pepper") -> str:
    # Expected pseudonyms computed independently: HMAC-SHA256(key, value), hex, first 32 characters.
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:32]


def test_identifiers_are_pseudonymised_with_a_keyed_hash(
    db: Path, make_event: Callable[..., Any], make_query: Callable[..., Any]
) -> None:
    events = [
        make_event(client_id="alice-laptop", session_id="s-9", user_id="alice@example.com"),
        make_event(client_id="alice-laptop", session_id="s-9", user_id=""),
    ]
    with collector(db, pseudonymise_key="pepper") as c:
        assert c.post("/v1/events", json=events).json()["accepted"] == 2
        assert c.post("/v1/queries", json=make_query(client_id="alice-laptop")).json()["accepted"] == 1
    stored = rows(db, "SELECT client_id, session_id, user_id FROM ubi_events ORDER BY user_id DESC")
    assert stored == [
        (_hmac("alice-laptop"), _hmac("s-9"), _hmac("alice@example.com")),
        (_hmac("alice-laptop"), _hmac("s-9"), ""),
    ]  # empty stays empty
    # Queries and events of one client still link up.
    assert rows(db, "SELECT client_id FROM ubi_queries") == [(_hmac("alice-laptop"),)]
    raw = b"".join(r[0].encode() for r in rows(db, "SELECT ubi_events::VARCHAR FROM ubi_events"))
    assert b"alice" not in raw


def test_pseudonyms_are_stable_for_one_key_and_differ_across_keys() -> None:
    assert pseudonym("c-1", b"k1") == pseudonym("c-1", b"k1") == _hmac("c-1", b"k1")
    assert pseudonym("c-1", b"k1") != pseudonym("c-1", b"k2")
    assert len(pseudonym("x" * 100, b"k")) == 32  # fits the schema's 100-character limit


def test_named_fields_are_dropped_before_storage(
    db: Path, make_event: Callable[..., Any], make_query: Callable[..., Any]
) -> None:
    event = make_event(message="card 4111 1111 1111 1111", ip_address="198.51.100.4")
    query = make_query(query_attributes={"ranker": "bm25", "user_email": "a@example.com"})
    drop = ["message", "ip_address", "query_attributes.user_email"]
    with collector(db, drop_fields=drop) as c:
        assert c.post("/v1/events", json=event).json()["accepted"] == 1
        assert c.post("/v1/queries", json=query).json()["accepted"] == 1
    assert rows(db, "SELECT message, extra, action_name FROM ubi_events") == [(None, None, "click")]
    assert rows(db, "SELECT query_attributes FROM ubi_queries") == [('{"ranker":"bm25"}',)]


def test_required_fields_cannot_be_dropped() -> None:
    with pytest.raises(ValidationError, match="cannot drop required UBI fields"):
        Settings(drop_fields=["message", "timestamp"])


def test_without_security_settings_no_filter_runs() -> None:
    assert security.record_filters(Settings()) == []
    steps = security.record_filters(Settings(api_keys={"a": "k"}, pseudonymise_key="p"))
    assert [type(s).__name__ for s in steps] == ["ApplicationCheck", "Privacy"]


def test_rejected_items_are_kept_scrubbed_too(db: Path, make_event: Callable[..., Any]) -> None:
    bad = make_event(client_id="alice-laptop", timestamp="yesterday", message="card 4111")
    with collector(db, pseudonymise_key="pepper", drop_fields=["message"]) as c:
        r = c.post("/v1/events", json=[make_event(), bad])
        assert r.json()["rejected"] == 1 and r.json()["errors"][0]["field"] == "timestamp"
    ((raw,),) = rows(db, "SELECT raw FROM failed_records")
    kept = json.loads(raw)
    assert kept["client_id"] == _hmac("alice-laptop") and "message" not in kept
    assert kept["timestamp"] == "yesterday"  # the reason it was rejected is still there to see


def test_each_client_ip_of_a_key_has_its_own_bucket(db: Path, make_event: Callable[..., Any]) -> None:
    # One key serves every visitor of a shop's site: a bucket per key alone would let one visitor's burst
    # refuse all the others. Behind one trusted proxy the client IP is the last X-Forwarded-For hop.
    settings = dict(
        rate_limit_per_second=0.001, rate_limit_burst=2, api_keys={"shop": "k"}, trusted_proxies=["127.0.0.1"]
    )

    def post(c: TestClient, forwarded: str) -> int:
        headers = {"X-API-Key": "k", "X-Forwarded-For": forwarded}
        return c.post("/v1/events", json=make_event(), headers=headers).status_code

    with collector(db, **settings) as c:
        # Burst 2 and a refill of one token per 1000 s: each IP gets exactly two requests in this test.
        assert [post(c, "198.51.100.1") for _ in range(3)] == [202, 202, 429]
        assert [post(c, "198.51.100.2") for _ in range(3)] == [202, 202, 429]
        # A client cannot mint itself a fresh bucket by prepending hops: only the proxy's hop is read.
        assert post(c, "192.0.2.99, 198.51.100.1") == 429
    with collector(db, **{**settings, "trusted_proxies": []}) as c:
        # No trusted proxy: X-Forwarded-For is the client's own claim and is ignored (same peer, one bucket).
        assert [post(c, f"198.51.100.{i}") for i in range(3)] == [202, 202, 429]
    assert rows(db, "SELECT count(*) FROM ubi_events") == [(6,)]


# ---------------------------------------------------------------- what failed_records keeps under privacy settings

# The auditor's case: two applications, pseudonymisation and a dropped field on. Clear text that must never
# reach the database, and the pseudonyms that must stand in for it (HMAC computed by _hmac above).
CLEAR = ("alice-client", "alice-user", "alice-session", "secret msg")
PRIVATE = dict(
    api_keys={"shop": ["k-shop"], "other": ["k-other"]},
    pseudonymise_key="pepper",
    drop_fields=["message"],
    max_items=3,
)


def _alice(**overrides: Any) -> dict[str, Any]:
    return {
        "action_name": "click",
        "timestamp": "2024-05-16T12:34:56Z",
        "application": "shop",
        "client_id": "alice-client",
        "user_id": "alice-user",
        "session_id": "alice-session",
        "message": "secret msg",
        **overrides,
    }


def _scrubbed_alice(record: dict[str, Any]) -> None:
    assert record["client_id"] == _hmac("alice-client") and record["user_id"] == _hmac("alice-user")
    assert record["session_id"] == _hmac("alice-session") and "message" not in record
    assert record["action_name"] == "click"  # the rest is kept, to show why it was refused


def _kept(db: Path) -> list[tuple[str, str, bytes]]:
    return [(k, r, bytes(raw)) for k, r, raw in rows(db, "SELECT kind, reason, raw FROM failed_records")]


def _no_clear_text(kept: list[tuple[str, str, bytes]]) -> None:
    for kind, reason, raw in kept:
        for secret in CLEAR:
            assert secret not in reason and secret.encode() not in raw, (kind, reason, raw)


BULK = b'{"index": {"_index": "ubi_events", "_id": "e1"}}\n' + json.dumps(_alice()).encode()
NDJSON = json.dumps(_alice()).encode() + b"\n" + json.dumps(_alice(application="other")).encode()


@pytest.mark.parametrize(
    ("path", "body", "content_type", "key", "status"),
    [
        (
            "/v1/events",
            json.dumps(_alice()).encode(),
            "application/json",
            "k-other",
            403,
        ),  # another app's key
        (
            "/v1/events",
            json.dumps([_alice()] * 4).encode(),
            "application/json",
            "k-shop",
            413,
        ),  # 4 > max_items
        ("/v1/events", json.dumps(_alice()).encode(), "image/png", "k-shop", 415),
        ("/v1/events", NDJSON, "application/x-ndjson", "k-shop", 403),  # line 2 claims another application
        ("/v1/bulk", BULK, "application/x-ndjson", "k-other", 403),
    ],
    ids=["403-json", "413-items", "415-type", "403-ndjson", "403-bulk"],
)
def test_bodies_refused_as_a_whole_are_kept_scrubbed(
    db: Path, path: str, body: bytes, content_type: str, key: str, status: int
) -> None:
    with collector(db, **PRIVATE) as c:
        r = c.post(path, content=body, headers={"X-API-Key": key, "content-type": content_type})
        assert r.status_code == status, r.text
    ((kind, _, raw),) = kept = _kept(db)
    _no_clear_text(kept)
    # Still the same shape as sent, record by record, with the ids replaced and the message gone.
    lines = [json.loads(line) for line in raw.splitlines()]
    records = [
        item
        for line in lines
        for item in (line if isinstance(line, list) else [line])
        if "action_name" in item
    ]
    assert len(records) == {413: 4, 403: 2 if path == "/v1/events" and b"\n" in body else 1}.get(status, 1)
    for record in records:
        _scrubbed_alice(record)
    if path == "/v1/bulk":  # the action line is kept as it was
        assert lines[0] == {"index": {"_index": "ubi_events", "_id": "e1"}}


def test_a_body_that_is_not_json_is_kept_as_its_length_and_keyed_digest(db: Path) -> None:
    broken = json.dumps(_alice()).encode()[:-5]  # cut short: malformed JSON, 400
    with collector(db, **PRIVATE) as c:
        assert c.post("/v1/events", content=broken, headers={"X-API-Key": "k-shop"}).status_code == 400
    ((kind, reason, raw),) = kept = _kept(db)
    _no_clear_text(kept)
    assert kind == "body" and "malformed JSON" in reason  # the reason stays
    # Personal data in it cannot be located, so only its length and HMAC-SHA256 (under the pseudonymisation
    # key, computed here independently) are kept: the sender can match the body, nobody can read it.
    assert json.loads(raw) == {
        "ubi_redacted": "not JSON: not kept because privacy settings are on",
        "bytes": len(broken),
        "hmac_sha256": hmac.new(b"pepper", broken, hashlib.sha256).hexdigest(),
    }


def test_without_privacy_settings_refused_bodies_are_kept_as_received(db: Path) -> None:
    broken = json.dumps(_alice()).encode()[:-5]
    with collector(db, api_keys=PRIVATE["api_keys"]) as c:
        assert c.post("/v1/events", content=broken, headers={"X-API-Key": "k-shop"}).status_code == 400
        whole = json.dumps(_alice()).encode()
        assert c.post("/v1/events", content=whole, headers={"X-API-Key": "k-other"}).status_code == 403
    assert sorted(raw for _, _, raw in _kept(db)) == sorted([broken, whole])


def test_stored_reasons_do_not_quote_pseudonymised_or_dropped_values(db: Path) -> None:
    # The collector's messages quote a bad value, "(got ...)": for these fields that would store it in clear.
    bad = _alice(client_id="alice-client" * 10, message=4111111111111111)  # 120 characters; not a string
    with collector(db, **PRIVATE) as c:
        r = c.post("/v1/events", json=[bad], headers={"X-API-Key": "k-shop"})
    assert r.json()["rejected"] == 1
    ((_, reason, raw),) = kept = _kept(db)
    _no_clear_text(kept)
    assert "4111111111111111" not in reason and b"4111" not in raw
    assert reason == (
        "String should have at most 100 characters (value of 'client_id' not shown: privacy "
        "settings); also 'message': Input should be a valid string (value of 'message' not "
        "shown: privacy settings)"
    )
    assert json.loads(raw)["client_id"] == _hmac("alice-client" * 10)


def test_conflicting_query_records_are_kept_scrubbed(db: Path, make_query: Callable[..., Any]) -> None:
    query = make_query(query_id="q-1", client_id="alice-client")
    with collector(db, **PRIVATE) as c:
        assert c.post("/v1/queries", json=query, headers={"X-API-Key": "k-shop"}).json()["accepted"] == 1
        again = c.post("/v1/queries", json={**query, "user_query": "other"}, headers={"X-API-Key": "k-shop"})
        assert again.json()["rejected"] == 1
    ((kind, _, raw),) = kept = _kept(db)
    _no_clear_text(kept)
    assert kind == "conflict" and json.loads(raw)["client_id"] == _hmac("alice-client")


def test_conflicting_events_are_kept_scrubbed(db: Path) -> None:
    event = _alice(event_id="e-1")
    with collector(db, **PRIVATE) as c:
        assert c.post("/v1/events", json=event, headers={"X-API-Key": "k-shop"}).json()["accepted"] == 1
        again = c.post("/v1/events", json={**event, "action_name": "view"}, headers={"X-API-Key": "k-shop"})
        assert again.json()["rejected"] == 1  # the same event_id with other content
    ((kind, _, raw),) = kept = _kept(db)
    _no_clear_text(kept)
    assert kind == "conflict"
    _scrubbed_alice({**json.loads(raw), "action_name": "click"})


def test_scrub_finds_records_in_every_shape_and_redacts_what_is_not_one() -> None:
    privacy = security.Privacy(b"pepper", ["client_id", "user_id", "session_id"], ["message"])
    one = json.dumps(_alice()).encode()
    # Arrays (nested too), NDJSON with a malformed line, a string or number where a record should be.
    out = privacy.scrub(b"[" + one + b", [" + one + b'], "alice-user", 7, null]')
    first, (second,), text, number, null = json.loads(out)
    _scrubbed_alice(first)
    _scrubbed_alice(second)
    assert text["bytes"] == len(b'"alice-user"') - 2 and "hmac_sha256" in text and number["bytes"] == 1
    assert null is None
    good, bad = privacy.scrub(one + b"\n" + one[:-3]).split(b"\n")
    _scrubbed_alice(json.loads(good))
    assert json.loads(bad)["ubi_redacted"].startswith("a line that is not JSON")
    # A non-string id is hashed as its JSON text; integers beyond 64 bits are kept exactly elsewhere.
    odd = json.loads(privacy.scrub(b'{"client_id": 12345, "n": 123456789012345678901234567890}'))
    assert odd == {"client_id": _hmac("12345"), "n": 123456789012345678901234567890}
    # Without any privacy setting the bytes are kept as they came.
    assert security.Privacy(None, ["client_id"], []).scrub(one[:-3]) == one[:-3]


def test_browser_and_server_requests_of_one_client_share_its_rate_bucket(
    db: Path, make_event: Callable[..., Any]
) -> None:
    # Server-side senders are checked outside the middleware (ubi_pipeline.collector.app.IngestFrontDoor), browsers inside
    # it: one Gate, so one bucket per client. Two buckets would let this client send 4 at once, not 2.
    own_page = {"origin": "http://localhost"}
    with collector(db, rate_limit_per_second=0.001, rate_limit_burst=2) as c:
        codes = [
            c.post("/v1/events", json=make_event()).status_code,
            c.post("/v1/events", json=make_event(), headers=own_page).status_code,
            c.post("/v1/events", json=make_event()).status_code,
            c.post("/v1/events", json=make_event(), headers=own_page).status_code,
        ]
    assert codes == [202, 202, 429, 429]
    assert rows(db, "SELECT count(*) FROM ubi_events") == [(2,)]


def test_refused_origins_cannot_flood_the_log(caplog: pytest.LogCaptureFixture) -> None:
    # issue 25: 1,000 refused preflights from distinct, long origins in 0.5 s wrote 2.3 MB of log
    security._LOGGED_ORIGINS.clear()
    security.ORIGIN_LOG.reset()
    now = [0.0]
    with caplog.at_level("WARNING", logger="ubi.collector.security"):
        for i in range(1000):
            security.log_refused_origin(f"https://{'x' * 5000}{i}.example\x1b[2J", "a CORS preflight",
                                        clock=lambda: now[0])
        now[0] = security.REFUSED_ORIGIN_LOG_EVERY_S + 1  # the next interval: one line, counting the quiet ones
        security.log_refused_origin("https://late.example", "a CORS preflight", clock=lambda: now[0])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert all(len(line) < 4 * (security.MAX_ORIGIN_LENGTH + 3) + 600 and "\x1b" not in line for line in lines)
    assert "999 other refused origins not logged" in lines[1]
    # an origin longer than any real one is never taken as the collector's own or a listed one
    long_origin = "http://" + "a" * 400 + ".example"
    assert not security.origin_allowed(long_origin, "a" * 400 + ".example", [long_origin])


def test_a_dns_rebinding_page_cannot_write(db: Path, make_event) -> None:
    # issue 25: a page whose Origin host:port equals the Host header was taken for the collector's own page, which
    # is what a DNS-rebinding page sends (its own name, resolved to this loopback collector): it could write
    ev = make_event()
    with collector(db) as c:
        evil = {"Host": "evil.example:8000", "Origin": "http://evil.example:8000"}
        assert c.post("/v1/events", json=[ev], headers=evil).status_code == 403
        assert c.post("/v1/interleave", json={"query_id": "q", "rankings": {"A": ["a"], "B": ["b"]}},
                      headers=evil).status_code == 403
        # the collector's own page, reached by a loopback name or an IP address, still writes
        for host in ("localhost:8000", "127.0.0.1:8000", "192.168.1.5:8000"):
            own = {"Host": host, "Origin": f"http://{host}"}
            assert c.post("/v1/events", json=[make_event()], headers=own).status_code == 202, host
    # a name the operator gives (UBI_ADMIN_HOSTS) is the collector's own too
    with collector(db, admin_hosts=["collector.internal"]) as c:
        named = {"Host": "collector.internal:8000", "Origin": "http://collector.internal:8000"}
        assert c.post("/v1/events", json=[make_event()], headers=named).status_code == 202


def test_preflights_are_rate_limited_like_writes(db: Path) -> None:
    # issue 25: preflights bypassed the rate limit (1,000 refused preflights in 0.5 s were all answered and logged)
    ask = {"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"}
    with collector(db, rate_limit_per_second=0.5, rate_limit_burst=3) as c:
        answers = [c.options("/v1/events", headers=ask).status_code for _ in range(6)]
        # a burst of 3, then 429 with Retry-After until the bucket refills (2 s a token)
        assert answers == [403, 403, 403, 429, 429, 429]
        late = c.options("/v1/events", headers=ask)
        assert late.status_code == 429 and int(late.headers["retry-after"]) >= 1
        assert 'ubi_requests_refused_total{reason="rate_limited"} 4' in c.get("/metrics").text
    with collector(db) as c:  # no limit by default: preflights answered as before
        assert [c.options("/v1/events", headers=ask).status_code for _ in range(6)] == [403] * 6
