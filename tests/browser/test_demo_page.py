"""The demo page says what it shows (issue 12, item 7): a fallback search is named as such, and the footer
counts the whole tab session, not one page. Real chromium against a real demo server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ubi_pipeline.demo_site import DemoCatalog, DemoDoc


def _footer_numbers(page: Any) -> tuple[int, int, int]:
    text = page.inner_text("#client")
    m = re.search(r"(\d+) queued · (\d+) stored \((\d+) of them", text)
    assert m, text
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def test_coffee_maker_says_it_shows_coffee_grinder(browser: Any, demo_server: Any) -> None:
    page = browser.new_page()
    page.goto(demo_server.url + "/demo/")
    page.fill("#q", "coffee maker")  # the catalog has "coffee grinder" (processors/simulation/catalog.py), no maker
    page.press("#q", "Enter")
    page.wait_for_function("document.querySelectorAll('#results li').length === 20")
    status = page.inner_text("#status")
    assert status == ("Nothing in the catalog matches “coffee maker”; showing 20 results for the closest search, "
                      "“coffee grinder”")
    page.fill("#q", "coffee grinder")
    page.press("#q", "Enter")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('20 results')")
    assert page.inner_text("#status") == "20 results for “coffee grinder”"
    page.close()


# Where the status text's last line ends (its glyphs, not its box), the status box ends, and the first card starts.
_BOXES = """() => { const status = document.getElementById('status'), range = document.createRange();
  range.selectNodeContents(status);
  return {textBottom: range.getBoundingClientRect().bottom, statusBottom: status.getBoundingClientRect().bottom,
          firstTop: document.querySelector('#results li').getBoundingClientRect().top}; }"""


@pytest.mark.parametrize("width", [800, 420])  # the browser tests' viewport, and a phone's
def test_the_nearest_query_notice_stays_above_the_first_result(browser: Any, demo_server: Any, artifacts: Path,
                                                                 width: int) -> None:
    # issue 28: the fallback notice wrapped onto a second line that ran over the first result card (the status
    # line had a fixed height of one line)
    page = browser.new_page(viewport={"width": width, "height": 620})
    page.goto(demo_server.url + "/demo/?q=coffee+maker")
    page.wait_for_function("document.querySelectorAll('#results li').length === 20")
    page.screenshot(path=str(artifacts / f"demo-nearest-query-{width}.png"))
    boxes = page.evaluate(_BOXES)
    page.close()
    assert boxes["textBottom"] + 4 <= boxes["statusBottom"] <= boxes["firstTop"], boxes  # a visible gap


def test_footer_counts_the_tab_session(browser: Any, demo_server: Any) -> None:
    page = browser.new_page()
    page.goto(demo_server.url + "/demo/?q=yoga+mat")
    page.wait_for_function("document.querySelectorAll('#results li').length === 20")
    page.evaluate("window.ubi.flush()")
    page.wait_for_function("/ 0 queued · [1-9]/.test(document.getElementById('client').textContent)")
    _, stored_first, _ = _footer_numbers(page)
    # a second page of the same tab (sessionStorage survives navigation): the first page's count is kept
    page.goto(demo_server.url + "/demo/?q=phone+case")
    page.wait_for_function("document.querySelectorAll('#results li').length === 20")
    page.evaluate("window.ubi.flush()")
    page.wait_for_function(f"(() => {{ const m = document.getElementById('client').textContent"
                           f".match(/ (\\d+) stored/); return m && +m[1] > {stored_first}; }})()")
    # The footer is redrawn every 250 ms (collector/static/demo.html), so it lags the client's live counters by up
    # to one redraw: read the footer only once the client has been quiet (nothing queued, the same counters) for
    # longer than two redraws, and take the footer text and the counters in one read.
    snap = "({text: document.getElementById('client').textContent, pending: window.ubi.pending(), " \
           "own: window.ubi.stats.sent + window.ubi.stats.duplicates})"
    before = page.evaluate(snap)
    for _ in range(40):
        page.wait_for_timeout(600)
        now = page.evaluate(snap)
        if now["pending"] == 0 and now["own"] == before["own"]:
            break
        before = now
    own = now["own"]  # this page's client alone
    m = re.search(r"(\d+) queued · (\d+) stored", now["text"])
    assert m, now["text"]
    queued, stored = int(m.group(1)), int(m.group(2))
    # the footer adds the first page's records to this page's (per page it showed `own` only)
    assert queued == 0 and own > 0 and stored >= stored_first + own
    page.close()


def test_exact_is_word_containment() -> None:
    cat = DemoCatalog(("coffee grinder", "red running shoes"),
                      ((DemoDoc("g1", "Grinder"),), (DemoDoc("s1", "Shoe"),)),
                      {"a": ((0,), (0,))})
    assert cat.search("coffee maker", "s")["exact"] is False
    assert cat.search("coffee grinder", "s")["exact"] is True
    assert cat.search("Running SHOE", "s")["exact"] is True  # normalised, plural folded, a subset of the words
