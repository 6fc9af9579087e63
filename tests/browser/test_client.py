"""The UBI browser client in a real browser (Debian chromium + Playwright) against a real demo server.

Each test drives the demo page (``/demo/``) like a visitor, stops the server, reopens its DuckDB file and
checks what was stored. Layout facts the expected numbers rest on (``collector/static/demo.html``): the
header is 120 px, the status line 28 px, ``main`` has 12 px top padding, so the result list starts at
y = 160; each result is 88 px high with a 12 px gap, so result i spans [160 + 100 i, 248 + 100 i].
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest

pytestmark = pytest.mark.browser

VIEWPORT = {"width": 800, "height": 620}
# Share of each result on screen, measured from the DOM (independently of the IntersectionObserver).
VISIBLE_SHARES = """() => Array.from(document.querySelectorAll('#results li')).map(li => {
  const r = li.getBoundingClientRect();
  const shown = Math.max(0, Math.min(r.bottom, window.innerHeight) - Math.max(r.top, 0));
  return [li.getAttribute('data-ubi-id'), Number(li.getAttribute('data-ubi-position')), shown / r.height];
})"""


# Every body the client hands to fetch or navigator.sendBeacon, noted in localStorage as it is sent: beacons
# leave while the page unloads, where neither Playwright's request events nor its routes see them, and
# localStorage is written synchronously and outlives the page (read it back from the next page of the origin).
# A beacon's body is a Blob, unreadable synchronously, so Blob remembers the text it was made from.
RECORD_SENT = """(() => {
  const KEY = "ubi_test_sent";
  const note = (url, body) => {
    url = String(url);
    if (!/\\/v1\\/(queries|events)/.test(url)) return;
    const sent = JSON.parse(localStorage.getItem(KEY) || "[]");
    sent.push({url: url, body: String(body)});
    localStorage.setItem(KEY, JSON.stringify(sent));
  };
  const NativeBlob = window.Blob;
  window.Blob = function (parts, options) {
    const blob = new NativeBlob(parts, options);
    blob.ubiText = (parts || []).map(String).join("");
    return blob;
  };
  window.Blob.prototype = NativeBlob.prototype;
  const beacon = navigator.sendBeacon.bind(navigator);
  navigator.sendBeacon = (url, data) => { note(url, data && data.ubiText !== undefined ? data.ubiText : data);
                                          return beacon(url, data); };
  const nativeFetch = window.fetch.bind(window);
  window.fetch = (input, init) => {
    if (init && init.method === "POST") note(typeof input === "string" ? input : input.url, init.body);
    return nativeFetch(input, init);
  };
})();"""


def _sent(page: Any) -> list[tuple[str, dict[str, Any]]]:
    """(kind, record) of every record the client has sent from this page's origin (see RECORD_SENT)."""
    out = []
    for send in page.evaluate("JSON.parse(localStorage.getItem('ubi_test_sent') || '[]')"):
        kind = "query" if "/v1/queries" in send["url"] else "event"
        out.extend((kind, record) for record in json.loads(send["body"]))
    return out


def _assert_ubi_1_3_0(ubi_spec: Any, sent: list[tuple[str, dict[str, Any]]]) -> None:
    """Every record sent is valid under the UBI 1.3.0 JSON Schemas (read as conftest.UbiSpec explains)."""
    assert sent, "the client sent nothing"
    invalid = [(kind, record, ubi_spec.errors(kind, record)) for kind, record in sent]
    assert [bad for bad in invalid if bad[2]] == []


def _visible(page: Any) -> dict[str, int]:
    """Results at least half on screen now, id -> position; refuses a layout too close to the threshold."""
    shares = page.evaluate(VISIBLE_SHARES)
    borderline = [(i, round(s, 2)) for i, _, s in shares if 0.35 < s < 0.65]
    assert not borderline, f"results too close to the 50% impression threshold to test reliably: {borderline}"
    return {doc: pos for doc, pos, share in shares if share >= 0.5}


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _accepted(server: Any) -> dict[str, int]:
    """Records the collector has committed so far, by kind, from its Prometheus counters."""
    counts = {"query": 0, "event": 0}
    for line in httpx.get(server.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("ubi_records_accepted_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            counts[kind] = counts.get(kind, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def _wait_accepted(server: Any, queries: int, events: int, timeout: float = 10.0) -> None:
    """Wait until the collector has committed this many records (beacons arrive after the page is gone)."""
    deadline = time.monotonic() + timeout
    while (got := _accepted(server)) != {"query": queries, "event": events}:
        assert time.monotonic() < deadline, (
            f"collector committed {got}, expected {queries} queries, {events} events"
        )
        time.sleep(0.1)


def _search(page: Any, server: Any, text: str) -> list[str]:
    page.goto(server.url + "/demo/")
    page.fill("#q", text)
    page.press("#q", "Enter")
    page.wait_for_function("document.querySelectorAll('#results li').length === 20")
    return page.eval_on_selector_all("#results li", "els => els.map(e => e.getAttribute('data-ubi-id'))")


def test_search_scroll_click_and_leave_stores_exactly_what_happened(
    browser: Any, demo_server: Any, artifacts: Path, ubi_spec: Any
) -> None:
    context = browser.new_context(viewport=VIEWPORT)
    # Nothing leaves the page by the timer or batch size: every record must travel in the beacon sent when
    # the visitor navigates away. That is the "nothing lost on navigation" claim under test.
    context.add_init_script("window.UBI_DEMO_OPTIONS = {flushInterval: 600000, batchSize: 10000};")
    context.add_init_script(RECORD_SENT)
    page = context.new_page()
    posts: list[tuple[str, str, str]] = []
    page.on(
        "request",
        lambda r: posts.append((r.url, r.resource_type, r.post_data or "")) if r.method == "POST" else None,
    )

    hits = _search(page, demo_server, "red running shoes")
    ranker = page.text_content("#ranker") or ""
    # Initially on screen (viewport 620 px): results 0-4; result 4 spans 560-648, so 60/88 = 68% visible.
    seen = _visible(page)
    assert sorted(seen.values()) == [0, 1, 2, 3, 4]
    page.wait_for_function("window.ubi.pending() === 6")  # 1 query + 5 impressions, waiting in the queue
    page.screenshot(path=str(artifacts / "demo-search.png"))

    page.mouse.wheel(0, 420)
    page.wait_for_function("window.scrollY === 420")
    # Viewport now 420-1040: result 8 (960-1048) is 80/88 on screen, result 9 (from 1060) is not.
    now = _visible(page)
    assert sorted(now.values()) == [3, 4, 5, 6, 7, 8]
    seen.update(now)
    page.wait_for_function("window.ubi.pending() === 10")  # + impressions of results 5, 6, 7, 8
    page.screenshot(path=str(artifacts / "demo-search-scrolled.png"))

    clicked = hits[6]
    page.click("#results li[data-ubi-position='6'] a")  # navigates to the (uninstrumented) product page
    page.wait_for_url(f"**/demo/doc/{clicked}")
    sent = _sent(page)  # the product page shares the search page's origin, so its localStorage
    page.goto("about:blank")
    _wait_accepted(demo_server, queries=1, events=10)  # the beacon outlives the page, not the browser
    context.close()
    demo_server.stop()

    db = demo_server.db
    queries = _rows(
        db,
        "SELECT query_id, user_query, application, query_response_hit_ids, query_attributes, "
        "client_id FROM ubi_queries",
    )
    assert len(queries) == 1
    query_id, user_query, application, hit_ids, attributes, client_id = queries[0]
    assert (user_query, application) == ("red running shoes", "demo-search")
    assert hit_ids == hits  # the ranking as shown, in order
    assert json.loads(attributes)["ranker"] == ranker.rsplit(": ", 1)[1]

    events = _rows(
        db,
        "SELECT action_name, object_id, position_ordinal, query_id, event_id, session_id, client_id "
        "FROM ubi_events ORDER BY timestamp, position_ordinal",
    )
    impressions = {(e[1], e[2]) for e in events if e[0] == "impression"}
    assert impressions == {(doc, pos) for doc, pos in seen.items()}  # results 0-8, never 9-19
    assert len([e for e in events if e[0] == "impression"]) == 9  # each once
    clicks = [e for e in events if e[0] == "click"]
    assert [(c[1], c[2]) for c in clicks] == [(clicked, 6)]  # 0-based ordinal, as OpenSearch counts
    assert len(events) == 10
    # What the beacon carried: exactly these 11 records, each a valid UBI 1.3.0 record.
    assert sorted(kind for kind, _ in sent) == ["event"] * 10 + ["query"]
    _assert_ubi_1_3_0(ubi_spec, sent)
    assert {e[3] for e in events} == {query_id}
    assert len({e[4] for e in events}) == 10  # one event_id per action, none reused
    assert len({e[5] for e in events}) == 1 and {e[6] for e in events} == {client_id}
    assert _rows(db, "SELECT count(*) FROM failed_records") == [(0,)]
    # Nothing was sent before the visitor left (Playwright does not report beacons sent while a page
    # unloads, so the proof is this: no fetch of records, yet everything above was stored).
    assert [url for url, _, _ in posts if "/v1/" in url] == []


def test_failed_sends_retry_with_backoff_and_survive_in_local_storage(
    browser: Any, demo_server: Any, ubi_spec: Any
) -> None:
    context = browser.new_context(viewport=VIEWPORT)
    context.add_init_script("window.UBI_DEMO_OPTIONS = {flushInterval: 100, retryBase: 200, retryMax: 400};")
    context.add_init_script(RECORD_SENT)
    page = context.new_page()
    attempts: list[int] = []

    def flaky(route: Any) -> None:
        # The collector refuses the first three requests (503, 429, 503) and then answers.
        attempts.append(1)
        if len(attempts) <= 3:
            route.fulfill(
                status=503 if len(attempts) != 2 else 429,
                body="{}",
                headers={"content-type": "application/json"},
            )
        else:
            route.continue_()

    page.route("**/v1/**", flaky)
    hits = _search(page, demo_server, "wireless headphones")
    page.wait_for_function("window.ubi.stats.retries >= 1")
    queued = page.evaluate("""() => Object.keys(localStorage).filter(k => k.startsWith('ubi_queue:'))
                                    .map(k => JSON.parse(localStorage.getItem(k)).length)""")
    assert sum(queued) >= 1  # while the collector fails, the records wait in localStorage
    page.wait_for_function("window.ubi.pending() === 0 && window.ubi.stats.sent > 0", timeout=15000)
    stats = page.evaluate("window.ubi.stats")
    # Three refused requests: a flush sends queries and events as two requests, so at least two rounds.
    assert len(attempts) > 3 and stats["retries"] >= 2
    left = page.evaluate("Object.keys(localStorage).filter(k => k.startsWith('ubi_queue:')).length")
    assert left == 0  # acknowledged records leave localStorage
    _assert_ubi_1_3_0(ubi_spec, _sent(page))  # the retried copies included
    context.close()
    demo_server.stop()
    stored = _rows(demo_server.db, "SELECT query_response_hit_ids FROM ubi_queries")
    assert stored == [(hits,)]
    (impressions,) = _rows(
        demo_server.db, "SELECT count(*) FROM ubi_events WHERE action_name = 'impression'"
    )[0]
    assert impressions == stats["sent"] - 1  # everything sent was stored once: the query and its impressions


def test_offline_queue_is_capped_and_sent_by_the_next_page(
    browser: Any, start_server: Any, tmp_path: Path, ubi_spec: Any
) -> None:
    db = tmp_path / "offline.duckdb"
    server = start_server(db)
    context = browser.new_context(viewport=VIEWPORT)
    context.add_init_script(
        "window.UBI_DEMO_OPTIONS = {flushInterval: 100, retryBase: 100, retryMax: 200, maxQueue: 4};"
    )
    context.add_init_script(RECORD_SENT)
    page = context.new_page()
    page.route("**/v1/**", lambda route: route.abort("internetdisconnected"))  # every fetch fails
    hits = _search(page, server, "yoga mat")
    # 1 query + 5 impressions queued while offline; the cap keeps the newest 4 (the query and the first
    # impression are dropped, oldest first).
    page.wait_for_function("window.ubi.stats.dropped === 2 && window.ubi.stats.retries >= 1")
    kept = page.evaluate("""() => Object.keys(localStorage).filter(k => k.startsWith('ubi_queue:'))
                                   .flatMap(k => JSON.parse(localStorage.getItem(k)))
                                   .map(e => e.r.event_attributes.position.ordinal)""")
    assert sorted(kept) == [1, 2, 3, 4]
    # The collector goes away, so the beacon of the closing page fails too (routes do not see beacons).
    port = int(server.url.rsplit(":", 1)[1])
    server.stop()
    page.close()

    server = start_server(db, port)  # back, on the same origin: localStorage is per origin
    later = context.new_page()  # a later visit with the same browser profile
    later.goto(server.url + "/demo/")
    later.wait_for_function("window.ubi && window.ubi.stats.sent === 4", timeout=15000)
    assert later.evaluate("window.ubi.stats.duplicates") == 0  # nothing had got through before
    assert later.evaluate("Object.keys(localStorage).filter(k => k.startsWith('ubi_queue:')).length") == 0
    _assert_ubi_1_3_0(ubi_spec, _sent(later))  # the failed attempts, the beacon and the later page's send
    context.close()
    server.stop()
    rows = _rows(db, "SELECT object_id, position_ordinal FROM ubi_events ORDER BY position_ordinal")
    assert rows == [(hits[i], i) for i in (1, 2, 3, 4)]
    assert _rows(db, "SELECT count(*) FROM ubi_queries") == [(0,)]


SHOP_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>shop</title></head><body>
<ol id="results">
  <li data-ubi-id="boot-1"><a href="/p/boot-1">Boot 1</a></li>
  <li data-ubi-id="boot-2"><a href="/p/boot-2">Boot 2</a></li>
  <li data-ubi-id="boot-3"><a href="/p/boot-3">Boot 3</a></li>
</ol>
<script src="COLLECTOR/static/ubi-client.js"></script>
<script>
  // The lines a team adds to its own page, on another origin than the collector:
  const ubi = UbiClient.init({endpoint: "COLLECTOR", application: "shop", apiKey: "k-shop", flushInterval: 200});
  const queryId = ubi.search("hiking boots", ["boot-1", "boot-2", "boot-3"], {ranker: "bm25"});
  ubi.trackResults(document.getElementById("results"), queryId);
  window.ubi = ubi;
</script></body></html>"""


def _requests_with_status(server: Any, status: str) -> int:
    total = 0
    for line in httpx.get(server.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("ubi_requests_total{") and f'status="{status}"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


@contextmanager
def shop_site(pages: dict[str, str]) -> Iterator[str]:
    """A team's own site on another loopback port: ``pages["search"]`` at /search, product pages at /p/<id>."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = (pages["search"] if self.path == "/search" else "<p>product</p>").encode()
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_page_on_another_origin_sends_through_cors_with_its_api_key(
    browser: Any, start_server: Any, tmp_path: Path, ubi_spec: Any
) -> None:
    # Both sites are on loopback like the collector (Chrome refuses public pages access to loopback), on
    # their own ports, so they are other origins. Only the shop's is allowed.
    pages: dict[str, str] = {}
    with shop_site(pages) as shop, shop_site(pages) as evil:
        server = start_server(
            tmp_path / "shop.duckdb",
            env={
                "UBI_CORS_ALLOW_ORIGINS": json.dumps([shop]),
                "UBI_API_KEYS": json.dumps({"shop": "k-shop"}),
            },
        )
        pages["search"] = SHOP_PAGE.replace("COLLECTOR", server.url)
        sent = _cross_origin_visits(browser, server, shop, evil)
    server.stop()
    _assert_ubi_1_3_0(ubi_spec, sent)

    events = _rows(
        server.db,
        "SELECT action_name, object_id, position_ordinal, application FROM ubi_events "
        "ORDER BY action_name, position_ordinal",
    )
    assert events == [
        ("click", "boot-2", 1, "shop"),
        ("impression", "boot-1", 0, "shop"),
        ("impression", "boot-2", 1, "shop"),
        ("impression", "boot-3", 2, "shop"),
    ]
    assert _rows(server.db, "SELECT user_query, application FROM ubi_queries") == [("hiking boots", "shop")]
    assert _rows(server.db, "SELECT count(*) FROM failed_records") == [(0,)]  # refused origins are not stored


def _cross_origin_visits(browser: Any, server: Any, shop: str, evil: str) -> list[tuple[str, dict[str, Any]]]:
    """Visit the shop (allowed) and the other site (refused); return what the client sent from both."""
    context = browser.new_context(viewport=VIEWPORT)
    context.add_init_script(RECORD_SENT)
    page = context.new_page()
    page.goto(shop + "/search")
    # Fetch with JSON and X-API-Key: a preflighted cross-origin request the collector allows for this origin.
    page.wait_for_function("window.ubi.stats.sent === 4")  # the query and 3 impressions
    page.click("li[data-ubi-id='boot-2'] a")  # the click leaves in a text/plain beacon with ?api_key=
    page.wait_for_url(f"{shop}/p/boot-2")
    _wait_accepted(server, queries=1, events=4)
    sent = _sent(page)

    refused_before = _requests_with_status(server, "403")
    other = context.new_page()
    other.goto(evil + "/search")  # same key, origin not allowed: preflights fail, the beacon is refused
    other.wait_for_function("window.ubi.stats.retries >= 1")
    sent += _sent(other)
    other.close()
    deadline = time.monotonic() + 10
    while _requests_with_status(server, "403") == refused_before:
        assert time.monotonic() < deadline, "the other origin's beacon never reached the collector"
        time.sleep(0.1)
    context.close()
    return sent


# Each way of calling the client, on the demo page's origin (a client of its own, nothing sent: its queue is
# what it would send). Before any search; a search; an object found in the search's hits without a
# position; a click; an impression; coordinates; an action with nothing else; an object never shown.
CLIENT_CALLS = """() => {
  const c = UbiClient.init({application: "shop", storagePrefix: "spec_", flushInterval: 1e9, batchSize: 1e9});
  c.event("page_view");
  const q = c.search("hiking boots", ["boot-1", "boot-2", "boot-3"], {ranker: "bm25"});
  c.event("add_to_cart", {objectId: "boot-3"});
  c.click("boot-2", 1, q);
  c.impression("boot-1", 0, q);
  c.event("hover", {position: {x: 12, y: 340.5}, message: "tooltip", messageType: "UI"});
  c.event("scroll");
  c.event("add_to_cart", {objectId: "sock-9"});
  return c.queue.map(e => e.r);
}"""


def test_every_record_the_client_builds_is_a_ubi_1_3_0_record(
    browser: Any, demo_server: Any, ubi_spec: Any
) -> None:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.goto(demo_server.url + "/demo/")
    page.wait_for_function("window.UbiClient !== undefined")
    view, query, cart, click, impression, hover, scroll, unplaced = page.evaluate(CLIENT_CALLS)
    context.close()

    # Nothing is null: before the first search there is no query_id or user_query to send, and no
    # event_attributes (its schema requires a position) when the event has nothing to put in it.
    assert not {"query_id", "user_query", "event_attributes"} & view.keys()
    assert "event_attributes" not in scroll  # after the search: its query_id and text, still no attributes
    assert scroll["query_id"] == query["query_id"] and scroll["user_query"] == "hiking boots"
    # The position comes from the caller, else from the object's place in its search's hits (0-based).
    assert cart["event_attributes"]["position"] == {"ordinal": 2}
    assert click["event_attributes"]["position"] == {"ordinal": 1}
    assert impression["event_attributes"]["position"] == {"ordinal": 0}
    assert hover["event_attributes"] == {"position": {"xy": {"x": 12, "y": 340.5}}}
    records = [view, cart, click, impression, hover, scroll]
    _assert_ubi_1_3_0(ubi_spec, [("query", query), *(("event", r) for r in records)])
    # The documented exception (client header): an object never shown has no position to give, and its id
    # is kept rather than the record made schema-valid by dropping it. Its one error is exactly that.
    assert unplaced["event_attributes"] == {"object": {"object_id": "sock-9", "object_id_field": "_id"}}
    assert ubi_spec.errors("event", unplaced) == ["event_attributes: 'position' is a required property"]


# A batch whose every event is rejected (no action_name), then one with a good event and a bad one.
REJECTED_SENDS = """async () => {
  const c = UbiClient.init({application: "shop", storagePrefix: "rej_", flushInterval: 1e9, batchSize: 1e9});
  const bad = {timestamp: c.now(), client_id: "c-1"};
  c.add("events", bad);
  await c.flush();
  const first = Object.assign({}, c.stats);
  c.event("page_view");
  c.add("events", bad);
  await c.flush();
  return [first, Object.assign({}, c.stats), c.pending()];
}"""


def test_rejected_records_are_counted_and_told_on_the_console(browser: Any, demo_server: Any) -> None:
    # issue 28: a batch whose every record is rejected is a 422 now (was 202 {"accepted": 0}); the client still
    # drops it (the collector kept the records; sending them again cannot help) and says so on the console
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    warnings: list[str] = []
    page.on("console", lambda m: warnings.append(m.text) if m.type == "warning" else None)
    page.goto(demo_server.url + "/demo/")
    page.wait_for_function("window.UbiClient !== undefined")
    first, second, pending = page.evaluate(REJECTED_SENDS)
    context.close()
    assert (first["sent"], first["rejected"], first["retries"]) == (0, 1, 0)
    assert (second["sent"], second["rejected"], second["retries"], pending) == (1, 2, 0, 0)
    told = [w for w in warnings if w.startswith("ubi-client: ")]
    assert told[0].startswith("ubi-client: 1 records refused by the collector (HTTP 422): every item was "
                              "rejected (1), nothing was stored: item 0 field action_name: "), told
    assert told[1].startswith("ubi-client: 1 of 2 records rejected by the collector: item 1 field action_name: ")
    assert len(told) == 2
