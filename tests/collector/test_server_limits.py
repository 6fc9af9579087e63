"""What a real ``ubi serve`` does to clients that hold connections or lie about who they are (issue 11).

Raw sockets on loopback against a subprocess server with short limits (``UBI_IDLE_TIMEOUT_S`` and
``UBI_HEADER_TIMEOUT_S`` of 1-1.5 s, ``UBI_MAX_CONNECTIONS``), so every wait here is bounded: a socket
the server should have closed fails the test after a few seconds instead of hanging it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests_collector_support import Served, start_server

IDLE, HEADERS, BODY, CAP = 1.0, 1.5, 1.5, 12
HEAD_BYTES, HEAD_LINES = 4096, 20
LIMITS = {
    "UBI_IDLE_TIMEOUT_S": str(IDLE),
    "UBI_HEADER_TIMEOUT_S": str(HEADERS),
    "UBI_BODY_TIMEOUT_S": str(BODY),
    "UBI_MAX_HEADER_BYTES": str(HEAD_BYTES),
    "UBI_MAX_HEADERS": str(HEAD_LINES),
    "UBI_MAX_CONNECTIONS": str(CAP),
}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    server = start_server(tmp_path / "ubi.duckdb", env=LIMITS)
    yield server
    assert server.stop() == 0


def _address(server: Served) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def _connect(server: Served) -> socket.socket:
    sock = socket.create_connection(_address(server), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed ``sock`` within ``seconds`` (reading what it sent before closing)."""
    sock.settimeout(seconds)
    got = b""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            chunk = sock.recv(4096)
            if not chunk:
                return True, got
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got
    return False, got


def test_idle_connections_are_closed(served: Served) -> None:
    # Today's failure: 200 connections that never send a byte were held for as long as the client liked.
    socks = [_connect(served) for _ in range(CAP - 2)]
    started = time.monotonic()
    try:
        closed = [_closed_within(s, IDLE + 4)[0] for s in socks]
        assert all(closed), f"{closed.count(False)} of {len(socks)} idle connections still open"
        assert time.monotonic() - started < IDLE + 4
    finally:
        for s in socks:
            s.close()
    # A kept-alive connection is closed once idle too, after its response.
    sock = _connect(served)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    closed, got = _closed_within(sock, IDLE + 4)
    sock.close()
    assert got.startswith(b"HTTP/1.1 200") and closed


def test_a_slowloris_client_is_disconnected(served: Served) -> None:
    sock = _connect(served)
    sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    closed_after = None
    try:
        # One header byte every 0.2 s: each byte is activity, but the headers never complete.
        while time.monotonic() - started < HEADERS + 5:
            try:
                sock.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            closed, _ = _closed_within(sock, 0.2)
            if closed:
                closed_after = time.monotonic() - started
                break
    finally:
        sock.close()
    assert closed_after is not None, "the server kept a client that never finished its headers"
    assert HEADERS - 0.2 <= closed_after < HEADERS + 3  # closed by the header timeout, not the idle one
    # Someone who sends a whole request meanwhile is served as usual.
    assert httpx.get(served.url + "/healthz", timeout=5).status_code == 200


def test_a_slow_body_is_disconnected(served: Served) -> None:
    """Issue 25: 100 connections sending one body byte every 2 s held every slot for 60 s. Headers complete,
    then one body byte every 0.2 s: the server closes the connection once BODY seconds have passed since
    the headers, and nothing of the body is stored."""
    sock = _connect(served)
    sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n[")
    started = time.monotonic()
    closed_after = None
    try:
        while time.monotonic() - started < BODY + 5:
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            closed, _ = _closed_within(sock, 0.2)
            if closed:
                closed_after = time.monotonic() - started
                break
    finally:
        sock.close()
    assert closed_after is not None, "the server kept a client that never finished its body"
    assert BODY - 0.2 <= closed_after < BODY + 3  # the body deadline, not the idle or header one
    assert httpx.get(served.url + "/healthz", timeout=5).status_code == 200
    failed = httpx.get(served.url + "/v1/failed", timeout=5).json()
    assert failed["total"] == 0  # a body cut short is not kept: the client still has it and retries


def test_request_headers_over_the_size_or_count_limit_get_431(served: Served) -> None:
    """Issue 25: 8 connections x 100 MB of headers took the collector from 483 to 1,091 MB."""
    big = b"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * HEAD_BYTES) + b"\r\n\r\n"
    many = (b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-H%d: 1\r\n" % i for i in range(HEAD_LINES + 5)) + b"\r\n")
    for request in (big, many):
        sock = _connect(served)
        try:
            sock.sendall(request)
            closed, got = _closed_within(sock, 5)
        finally:
            sock.close()
        assert closed and got.startswith(b"HTTP/1.1 431"), got[:200]
    # an endless header is cut at the limit too, not held: the server closes while it is still being sent
    sock = _connect(served)
    sent = 0
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while sent < 50 * HEAD_BYTES:
                sock.sendall(b"a" * 1024)
                sent += 1024
                time.sleep(0.001)
    finally:
        sock.close()
    # within the limits: served
    ok = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(HEAD_LINES - 2))
    sock = _connect(served)
    try:
        sock.sendall(ok + b"Connection: close\r\n\r\n")
        _, got = _closed_within(sock, 5)
    finally:
        sock.close()
    assert got.startswith(b"HTTP/1.1 200"), got[:200]


def test_connections_over_the_cap_get_503_and_the_server_recovers(served: Served) -> None:
    socks = [_connect(served) for _ in range(CAP)]
    try:
        time.sleep(0.2)  # let the server accept all of them
        extra = _connect(served)
        closed, got = _closed_within(extra, 3)
        extra.close()
        assert closed and got.startswith(b"HTTP/1.1 503"), got
        assert b"TooManyConnections" in got
    finally:
        for s in socks:
            s.close()
    time.sleep(0.3)
    assert httpx.get(served.url + "/healthz", timeout=5).status_code == 200


def _codes_with_forwarded_for(db: Path, env: dict[str, str], make_event, clients: list[str]) -> list[int]:
    """Status codes of one POST /v1/events per entry of ``clients``, each claiming that X-Forwarded-For."""
    server = start_server(db, env=env)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            return [c.post("/v1/events", json=make_event(), headers={"X-Forwarded-For": ip}).status_code
                    for ip in clients]
    finally:
        assert server.stop() == 0


def test_x_forwarded_for_does_not_buy_a_fresh_rate_limit_bucket(tmp_path: Path, make_event) -> None:
    # Today's failure: uvicorn's proxy_headers trusted 127.0.0.1, so each X-Forwarded-For value was a new
    # client with a full bucket. No proxy is configured here: the header is the client's own claim.
    env = {"UBI_RATE_LIMIT_PER_SECOND": "0.001", "UBI_RATE_LIMIT_BURST": "2"}
    rotating = [f"198.51.100.{i}" for i in range(4)]
    assert _codes_with_forwarded_for(tmp_path / "ubi.duckdb", env, make_event, rotating) == [202, 202, 429, 429]
    # Behind a configured proxy (loopback is the proxy here) the hop it appends does name the client.
    env["UBI_TRUSTED_PROXIES"] = '["127.0.0.1"]'
    two = [f"198.51.100.{i // 2}" for i in range(4)]
    # two clients, two requests each, burst 2
    assert _codes_with_forwarded_for(tmp_path / "ubi2.duckdb", env, make_event, two) == [202, 202, 202, 202]
