"""Renderers: text, Markdown, JSON and one self-contained HTML file, looked at in headless Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from joint_fixtures import hand_world_report

from ubi_pipeline.reports.gates import Threshold
from ubi_pipeline.reports.joint import ReportConfig
from ubi_pipeline.reports.render.html import render_html
from ubi_pipeline.reports.render.json_out import render_json
from ubi_pipeline.reports.render.markdown import render_markdown
from ubi_pipeline.reports.render.text import render_text

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
# what `ubi propensity` writes (PropensityEstimate.to_json): θ_k/θ_1 with its interval per rank
PROPENSITY = {"method": "em", "level": 0.95, "ranks": [
    {"rank": 1, "ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0},
    {"rank": 2, "ratio": 0.62, "ci_low": 0.55, "ci_high": 0.70},
    {"rank": 3, "ratio": 0.45, "ci_low": 0.37, "ci_high": 0.52},
    {"rank": 4, "ratio": None, "ci_low": None, "ci_high": None},
]}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return hand_world_report(
        tmp_path_factory.mktemp("render"), ReportConfig(baseline="shop/ranker=a", n_boot=300, n_perm=500),
        thresholds=[Threshold("human/ndcg@10", "min", 0.82), Threshold("online/ctr", "min", 0.1)],
        propensity=PROPENSITY,
    )


def test_text_and_markdown_carry_every_section(report):
    text = render_text(report)
    for title in ("Systems in the logs", "Offline metrics against human labels", "Online metrics",
                  "Agreement of implicit labels", "shop/ranker=b − shop/ranker=a", "Gates"):
        assert title in text
    assert "FAIL" in text and "PASS" in text  # ranker a misses nDCG@10 >= 0.82 (0.8155), b passes (0.8295)
    md = render_markdown(report)
    assert "## Offline metrics: implicit:ctr labels" in md
    # each ranker is evaluated on 2 queries (n=2 in the gate row): too few for a bootstrap interval, said so
    assert ("| ndcg@10 | 0.815 (no interval: n = 2 < 5 for a bootstrap) | 0.830 (no interval: n = 2 < 5 for a "
            "bootstrap) |") in md
    assert not re.search(r"\| ndcg@10 \| 0\.815 \[", md)
    assert "| shop/ranker=a | human/ndcg@10 | >= 0.82 | 0.8155 | FAIL (fell short, n=2) |" in md


def test_json_has_everything_per_query(report):
    doc = json.loads(render_json(report))
    assert doc["gates"]["passed"] is False and len(doc["gates"]["failed"]) == 1
    human_a = next(r for r in doc["offline"] if r["system"] == "shop/ranker=a" and r["source"] == "human")
    assert {r["query"] for r in human_a["per_query"]} == {"red shoes", "blue hat"}
    assert doc["online"]["shop/ranker=a"]["ctr_by_rank"]["shown"][:3] == [5, 4, 3]
    assert doc["propensity"]["ranks"][3]["ratio"] is None
    assert doc["agreement"]["implicit:ctr"]["confusion"][3][3] == 1


def test_html_is_self_contained(report):
    page = render_html(report)
    assert page.startswith("<!DOCTYPE html>")
    # no script, stylesheet, image or font fetched from anywhere: only inline SVG and CSS
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\((?!#)", page)  # url(#id): in-page clip paths
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    # 3 metric-bar plots (human, implicit:ctr, merged), CTR by rank, propensity, 1 confusion matrix, and the
    # joint view's forest plot of the one pair (shop/ranker=a, shop/ranker=b)
    assert page.count("<svg") == 7


@pytest.mark.browser
def test_html_renders_in_headless_chromium(report):
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing: run `make browser` (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    html_path = ARTIFACTS / "report.html"
    html_path.write_text(render_html(report), encoding="utf-8")
    shot = ARTIFACTS / "report.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(html_path.as_uri())
            boxes = page.eval_on_selector_all("svg", "els => els.map(e => e.getBoundingClientRect().height)")
            headings = page.eval_on_selector_all("h2", "els => els.map(e => e.textContent)")
            failed = page.inner_text("p.fail")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert requests == [html_path.as_uri()]  # the page asked for nothing else
    # every plot drawn at a readable size: the six of test_html_is_self_contained and the pair's forest plot
    assert len(boxes) == 7 and all(h > 100 for h in boxes)
    assert "Joint view: each pair of systems" in headings
    assert "Online metrics" in headings and "Agreement of implicit labels with human grades" in headings
    assert failed == "1 gate(s) failed"
    assert shot.stat().st_size > 50_000


def test_propensity_title_names_level_and_bootstrap_unit():
    from ubi_pipeline.processors.propensity.bootstrap import QUERY_SCHEME, SCHEME
    from ubi_pipeline.reports.render.html import propensity_interval_label

    assert propensity_interval_label(PROPENSITY) == " (95% interval)"
    assert propensity_interval_label({**PROPENSITY, "bootstrap": {"replicates": 200, "scheme": QUERY_SCHEME}}) == (
        " (95% interval, queries resampled)")
    assert propensity_interval_label({**PROPENSITY, "bootstrap": {"replicates": 200, "scheme": SCHEME}}) == (
        " (95% interval, sessions resampled)")
    assert propensity_interval_label({"bootstrap": {"scheme": SCHEME}}) == ""
    assert propensity_interval_label({**PROPENSITY, "bootstrap": "200 replicates"}) == " (95% interval)"


def test_producers_text_cannot_break_the_html_or_drive_the_terminal(tmp_path: Path) -> None:
    # issue 25: a ranker named "$\foo{$" made `ubi report --format html` exit 3 (matplotlib read it as mathtext),
    # and stored escape sequences reached the terminal through the text report ("\x1b[2J" clears the screen)
    from joint_fixtures import QUERIES, build_store

    from ubi_pipeline.cli import main

    weird = "$\\foo{$\x1b[2J"
    queries = [dict(q, query_attributes={"ranker": weird}) if (q.get("query_attributes") or {}).get("ranker") == "b"
               else q for q in QUERIES]
    db = build_store(tmp_path / "weird.duckdb", queries=queries)
    html = tmp_path / "r.html"
    assert main(["report", "--db", str(db), "--format", "html", "--out", str(html)]) == 0
    assert "shop/ranker=$\\foo{$" in html.read_text(encoding="utf-8")
    text = tmp_path / "r.txt"
    assert main(["report", "--db", str(db), "--out", str(text)]) == 0
    shown = text.read_text(encoding="utf-8")
    assert "shop/ranker=$\\foo{$" in shown and "\x1b" not in shown
