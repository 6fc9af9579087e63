"""OpenSearch's reference UBI JavaScript client, unmodified, in Chromium, on a page of another origin (issue 12).

The client (``../shared/ubi-clients/opensearch-ubi-js/ubi.js``, loaded from there, never copied) always
sends ``Content-type: application/json``, so the browser preflights every record. The page is served from
one loopback port and the collector (a real ``ubi serve``) listens on another: two origins. With the
documented setting (``--allow-origin`` the page's origin) every record is stored; without it nothing is,
and the refusal is told where an operator looks: the server's log and ``/metrics``.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest

from tests.browser.conftest import REFERENCE_CLIENT, ROOT
from tests.conftest import shared_path

pytestmark = pytest.mark.browser

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>shop</title>
<script type="importmap">{"imports": {"axios": "/node_modules/axios/dist/esm/axios.js"}}</script>
</head><body><p>a shop page on its own origin</p>
<script type="module">
import { UbiClient, UbiEvent, UbiEventAttributes, UbiQueryRequest } from "/ubi.js";
const client = new UbiClient(new URLSearchParams(location.search).get("collector"));
const answers = [];
answers.push(await client.trackQuery(new UbiQueryRequest("shop", "client-1", "query-1", "laptop", "sku")));
for (const [i, action] of ["impression", "click", "add_to_cart"].entries()) {
  const attributes = new UbiEventAttributes("sku", "doc-" + i, "a product", {}, {ordinal: i});
  answers.push(await client.trackEvent(new UbiEvent("shop", action, "client-1", "session-1", "query-1", attributes)));
}
const xy = new UbiEventAttributes("sku", "doc-9", null, {}, {xy: {x: 10.5, y: 20}});
answers.push(await client.trackEvent(new UbiEvent("shop", "hover", "client-1", "session-1", "query-1", xy)));
window.ubiAnswers = answers;
</script></body></html>
"""


@contextmanager
def shop_site(axios: Path, page: str = PAGE) -> Iterator[str]:
    """``page`` (this module's by default), the reference client and axios on a loopback port of their own:
    the shop's origin. tests/browser/test_interleaving_client.py serves its pages through it too."""
    files = {
        "/ubi.js": shared_path(REFERENCE_CLIENT),
        "/node_modules/axios/dist/esm/axios.js": axios,
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/":
                body, media = page.encode(), "text/html"
            elif path in files:
                body, media = files[path].read_bytes(), "text/javascript"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("content-type", media)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def collector(db: Path, *flags: str) -> Iterator[tuple[str, list[str]]]:
    """A real ``ubi serve`` (subprocess, loopback); yields its URL and, once stopped, its log lines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ubi_pipeline", "serve", "--db", str(db), "--port", "0", *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log: list[str] = []
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        if not match:
            proc.kill()
            raise AssertionError(f"ubi serve did not start: {line!r}")
        httpx.get(match.group(0) + "/healthz", timeout=30).raise_for_status()
        yield match.group(0), log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        log.extend(out.splitlines())


def _drive(browser: Any, page_url: str, collector_url: str) -> list[Any]:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{page_url}/?collector={collector_url}")
        page.wait_for_function("window.ubiAnswers !== undefined", timeout=30_000)
        return page.evaluate("window.ubiAnswers")
    finally:
        context.close()


def _stored(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_the_reference_client_stores_everything_with_the_documented_setting(
    browser: Any, axios_esm: Path, tmp_path: Path
) -> None:
    db = tmp_path / "ubi.duckdb"
    with shop_site(axios_esm) as shop, collector(db, "--allow-origin", shop) as (url, _):
        answers = _drive(browser, shop, url)
    # One query record and four events, each posted alone as a one-element array; every answer a 202 body.
    assert [a["accepted"] for a in answers] == [1, 1, 1, 1, 1]
    assert _stored(db, "SELECT query_id, user_query, application FROM ubi_queries") == [
        ("query-1", "laptop", "shop")
    ]
    assert _stored(
        db,
        "SELECT action_name, object_id, position_ordinal, position_x, position_y FROM ubi_events "
        "ORDER BY timestamp, action_name",
    ) == [
        ("impression", "doc-0", 0, None, None),
        ("click", "doc-1", 1, None, None),
        ("add_to_cart", "doc-2", 2, None, None),
        ("hover", "doc-9", None, 10.5, 20.0),
    ]


def test_without_it_nothing_is_stored_and_the_refusal_is_told(
    browser: Any, axios_esm: Path, tmp_path: Path
) -> None:
    db = tmp_path / "ubi.duckdb"
    with shop_site(axios_esm) as shop, collector(db) as (url, log):
        answers = _drive(browser, shop, url)
        metrics = httpx.get(url + "/metrics", timeout=10).text
    # The client swallows network errors (console.error) and resolves to undefined: nothing was accepted.
    assert answers == [None] * 5
    assert _stored(db, "SELECT count(*) FROM ubi_queries") == [(0,)]
    assert _stored(db, "SELECT count(*) FROM ubi_events") == [(0,)]
    # /metrics: five refused preflights, counted by reason and under the routes they asked for.
    assert 'ubi_requests_refused_total{reason="cors_origin"} 5' in metrics
    assert 'ubi_requests_total{method="OPTIONS",route="/ubi_events",status="403"} 4' in metrics
    assert 'ubi_requests_total{method="OPTIONS",route="/ubi_queries",status="403"} 1' in metrics
    # The log: one line naming the origin and the flag that would let it in.
    told = [line for line in log if "refused a CORS preflight" in line]
    assert len(told) == 1 and repr(shop) in told[0] and f"--allow-origin {shop}" in told[0], log


# The reference client posting an event the collector must reject (no action_name: UbiEvent's second argument).
REJECTED_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>shop</title>
<script type="importmap">{"imports": {"axios": "/node_modules/axios/dist/esm/axios.js"}}</script>
</head><body><p>a shop page with a bug in its tracking</p>
<script type="module">
import { UbiClient, UbiEvent, UbiEventAttributes } from "/ubi.js";
const client = new UbiClient(new URLSearchParams(location.search).get("collector"));
const attributes = new UbiEventAttributes("sku", "doc-0", "a product", {}, {ordinal: 0});
window.ubiAnswers = [await client.trackEvent(new UbiEvent("shop", null, "client-1", "session-1", "q-1", attributes))];
</script></body></html>
"""


def test_an_event_the_collector_rejects_is_an_error_the_developer_sees(
    browser: Any, axios_esm: Path, tmp_path: Path
) -> None:
    # issue 28: the answer was 202 {"accepted": 0}, which the client resolves as success, and the collector's
    # log was silent at its default level
    db = tmp_path / "ubi.duckdb"
    with shop_site(axios_esm, REJECTED_PAGE) as shop, collector(db, "--allow-origin", shop) as (url, log):
        context = browser.new_context()
        try:
            page = context.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(f"{shop}/?collector={url}")
            page.wait_for_function("window.ubiAnswers !== undefined", timeout=30_000)
            answers = page.evaluate("window.ubiAnswers")
        finally:
            context.close()
    # axios rejects a 422; the client logs it (console.error) and resolves to undefined
    assert answers == [None]
    assert any("422" in text for text in errors), errors
    assert _stored(db, "SELECT count(*) FROM ubi_events") == [(0,)]
    assert _stored(db, "SELECT item_index, field FROM failed_records") == [(0, "action_name")]
    told = [line for line in log if "rejected 1 of 1 items on /ubi_events" in line]
    assert len(told) == 1 and "field action_name" in told[0], log
