"""The review page in Debian's chromium: two assessors grade, one by keyboard, one by mouse, with an undo, a skip
and a note; the rows of human_judgments afterwards are exactly what they did. Also while ``ubi serve`` holds
the store. The README's screenshot (docs/img/review.png) is test-artifacts/review.png of the first test."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import orjson
from playwright.sync_api import expect

from tests.collector.tests_collector_support import start_server as start_collector
from tests.review.review_store import review_store
from ubi_pipeline.store.client import reading

ROOT = Path(__file__).resolve().parents[2]
#: an untrusted title: the page must show it as text, never run it
EVIL = '<img src=x onerror="document.body.dataset.pwned=1">Tote'
CATALOG = [
    {"doc_id": "g1", "title": "Canvas tote bag, forest green", "description": "Heavy cotton canvas, 40 x 35 cm, "
     "inner pocket.", "url": "https://shop.example/p/g1"},
    {"doc_id": "r1", "title": "Trail running shoes, red", "description": "Breathable mesh, 8 mm drop."},
    {"doc_id": "b1", "title": EVIL, "description": "Wool beanie, navy blue."},
    {"doc_id": "r2", "title": "Leather loafers, burgundy"},
]


@contextmanager
def review_server(db: Path, catalog: Path) -> Iterator[str]:
    """``ubi review serve`` on a free loopback port (held-out sample off, so the order is tests/review's ORDER)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ubi_pipeline", "review", "serve", "--db", str(db), "--port", "0", "--held-out", "0",
         "--docs", str(catalog)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:\d+/review", line)
        if not match:
            proc.kill()
            raise AssertionError(f"ubi review serve did not start: {line!r}{proc.stdout.read() if proc.stdout else ''}")
        yield match.group(0)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def catalog_file(tmp_path: Path) -> Path:
    path = tmp_path / "catalog.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(d) for d in CATALOG) + b"\n")
    return path


def rows_of(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    return con.execute("SELECT assessor, query, doc_id, grade, source, note, origin, rubric LIKE 'builtin@%' "
                       "FROM human_judgments ORDER BY assessor, query, doc_id").fetchall()


def shows(page: Any, doc_id: str) -> None:
    expect(page.locator("#doc-id")).to_have_text(doc_id)


def test_two_assessors_keyboard_and_mouse(browser: Any, tmp_path: Path, artifacts: Path) -> None:
    db = review_store(tmp_path / "r.duckdb")
    with review_server(db, catalog_file(tmp_path)) as url:
        # kim grades by keyboard. Queue (tests/review/review_store.py ORDER): g1, r1, b1, r2, b2, g2
        kim = browser.new_page(viewport={"width": 1200, "height": 700})
        kim.goto(url + "?assessor=kim")
        shows(kim, "g1")
        expect(kim.locator("#name-form")).to_be_hidden()
        expect(kim.locator("#doc-title")).to_have_text("Canvas tote bag, forest green")
        expect(kim.locator("#doc-url")).to_have_attribute("href", "https://shop.example/p/g1")
        expect(kim.locator("#reason")).to_contain_text("grades differ by 3 (implicit:pbm 3, model:llm 0)")
        expect(kim.locator("#evidence tbody tr")).to_have_count(2)
        kim.screenshot(path=str(artifacts / "review.png"))  # docs/img/review.png
        kim.keyboard.press("3")
        shows(kim, "r1")
        kim.locator("#note").fill("close, but not red")
        kim.locator("#query").click()  # the keys act once the note field has lost the focus
        kim.keyboard.press("1")
        shows(kim, "b1")
        # the untrusted title is text: shown as typed, nothing it holds ran or became an element
        expect(kim.locator("#doc-title")).to_have_text(EVIL)
        assert kim.locator("#doc-title img").count() == 0 and kim.evaluate("document.body.dataset.pwned") is None
        kim.keyboard.press("s")
        shows(kim, "r2")
        kim.keyboard.press("2")
        shows(kim, "b2")
        kim.keyboard.press("u")  # takes back the 2 of r2
        shows(kim, "r2")
        kim.keyboard.press("0")
        shows(kim, "b2")
        expect(kim.locator("#progress")).to_have_text("graded 3, skipped 1, left 2 of 6 pairs")

        # mo names themselves in the form and grades by mouse. g1 wants a second grade; r1 has two (ann, kim)
        mo = browser.new_page()
        mo.goto(url)
        mo.locator("#name-input").fill("mo")
        mo.locator("#name-ok").click()
        shows(mo, "g1")
        expect(mo.locator("#name-form")).to_be_hidden()
        mo.locator("#grade-2").click()
        shows(mo, "b1")
        mo.locator("#skip").click()
        shows(mo, "r2")
        mo.locator("#note").fill("fine")
        mo.locator("#grade-1").click()
        shows(mo, "b2")
        mo.locator("#undo").click()  # deletes the 1 of r2, and its note
        shows(mo, "r2")
        mo.locator("#grade-3").click()
        shows(mo, "b2")

        # adjudication: r2 (kim 0, mo 3) first, then g1 (kim 3, mo 2) and r1 (ann 0, kim 1), spread 1 each
        mo.locator("#tab-disagreements").click()
        rows = mo.locator("#disagreements tbody tr")
        expect(rows).to_have_count(3)
        expect(rows.nth(0).locator("td").nth(1)).to_have_text("r2")
        expect(rows.nth(0).locator("td").nth(2)).to_have_text("3")
        mo.locator("#tab-progress").click()
        expect(mo.locator("#progress-table tbody tr")).to_have_count(3)  # ann, kim, mo

    con = duckdb.connect(str(db), read_only=True)
    try:
        assert rows_of(con) == [
            ("ann", "red shoes", "r1", 0, "human", None, "sheet.csv", False),
            ("kim", "green bag", "g1", 3, "reviewed:implicit:pbm", None, "review:page", True),
            ("kim", "red shoes", "r1", 1, "reviewed:implicit:pbm", "close, but not red", "review:page", True),
            ("kim", "red shoes", "r2", 0, "reviewed:implicit:pbm", None, "review:page", True),
            ("mo", "green bag", "g1", 2, "reviewed:implicit:pbm", None, "review:page", True),
            ("mo", "red shoes", "r2", 3, "reviewed:implicit:pbm", None, "review:page", True),
        ]
    finally:
        con.close()


def test_the_page_works_while_ubi_serve_holds_the_store(browser: Any, tmp_path: Path) -> None:
    db = review_store(tmp_path / "held.duckdb")
    collector = start_collector(db)
    try:
        with review_server(db, catalog_file(tmp_path)) as url:
            page = browser.new_page()
            page.goto(url + "?assessor=lee")
            shows(page, "g1")
            page.keyboard.press("2")
            shows(page, "r1")
            page.locator("#note").fill("runs small")
            page.locator("#grade-3").click()
            shows(page, "b1")
            page.keyboard.press("u")  # through the collector: POST /v1/admin/delete/human_judgments
            shows(page, "r1")
            page.keyboard.press("1")
            shows(page, "b1")
        with reading(db) as con:  # the collector still holds the file: its sealed segments
            assert [r for r in rows_of(con) if r[0] == "lee"] == [
                ("lee", "green bag", "g1", 2, "reviewed:implicit:pbm", None, "review:page", True),
                ("lee", "red shoes", "r1", 1, "reviewed:implicit:pbm", None, "review:page", True),
            ]
    finally:
        assert collector.stop() == 0
