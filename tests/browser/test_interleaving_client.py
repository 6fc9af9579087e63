"""Interleaving end to end through HTTP and the browser client (issue 13): `POST /v1/interleave` on a live
``ubi serve``, the page shows the interleaved hits, logs the search with OpenSearch's unmodified reference
client (``../shared/ubi-clients/opensearch-ubi-js/ubi.js``) and a visitor's click, and ``ubi report`` credits
the click to the team that contributed the clicked result.

How the reference client passes the block on (read from its code): ``new UbiQueryRequest(application,
client_id, query_id, user_query, object_id_field, query_attributes)`` keeps ``query_attributes`` as given and
``trackQuery`` sends ``JSON.stringify([query])``, which drops nothing but ``undefined`` values (the replacer
that drops nulls is only used by ``toJson``). So ``answer.query_attributes`` reaches the collector unchanged;
the test checks the stored block equals the route's answer key for key.

The project's own client (``collector/static/ubi-client.js``) takes the block as the third argument of
``ubi.search(query, hits, attributes)`` and sends it as ``query_attributes``; the second test drives that path.

The page is on its own loopback origin, the collector on another (``--allow-origin``), as in
``test_reference_client.py``; the route's preflight is covered by the same setting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.browser.test_reference_client import collector, shop_site
from ubi_pipeline.cli import main

pytestmark = pytest.mark.browser

# Two rankings of one search; the route interleaves them (team draft, seeded by the query id).
RANKINGS = {"baseline": ["d1", "d2", "d3", "d4"], "candidate": ["d3", "d5", "d1", "d6"]}

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>shop</title>
<script type="importmap">{"imports": {"axios": "/node_modules/axios/dist/esm/axios.js"}}</script>
</head><body><ol id="hits"></ol>
<script type="module">
import { UbiClient, UbiEvent, UbiEventAttributes, UbiQueryRequest } from "/ubi.js";
const base = new URLSearchParams(location.search).get("collector");
const rankings = RANKINGS_JSON;
// the search backend's step: ask the collector to interleave the two rankers' lists
const r = await fetch(base + "/v1/interleave", {method: "POST", headers: {"content-type": "application/json"},
                                                 body: JSON.stringify({query_id: "q-1", rankings})});
const answer = await r.json();
const list = document.getElementById("hits");
answer.hits.forEach((id, i) => {
  const li = document.createElement("li");
  li.textContent = "product " + id;
  li.dataset.id = id;
  li.addEventListener("click", async () => {
    const attributes = new UbiEventAttributes("sku", id, "product " + id, {}, {ordinal: i});
    window.clickAnswer = await client.trackEvent(
      new UbiEvent("shop", "click", "client-1", "session-1", "q-1", attributes));
  });
  list.appendChild(li);
});
const client = new UbiClient(base);
// the block the route returned, passed on unchanged as the query record's query_attributes
window.queryAnswer = await client.trackQuery(
  new UbiQueryRequest("shop", "client-1", "q-1", "laptop", "sku", answer.query_attributes));
window.answer = answer;
</script></body></html>
""".replace("RANKINGS_JSON", json.dumps(RANKINGS))


# The same search with the project's own client (collector/static/ubi-client.js, served by the collector):
# `ubi.search(query, answer.hits, answer.query_attributes)`, as the README says, then `ubi.click(id, i)`.
OWN_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>shop</title></head><body><ol id="hits"></ol>
<script>
const base = new URLSearchParams(location.search).get("collector");
const script = document.createElement("script");
script.src = base + "/static/ubi-client.js";
script.onload = async () => {
  const r = await fetch(base + "/v1/interleave", {method: "POST", headers: {"content-type": "application/json"},
                                                   body: JSON.stringify({query_id: "q-1", rankings: RANKINGS_JSON})});
  const answer = await r.json();
  const ubi = UbiClient.init({endpoint: base, application: "shop", objectIdField: "sku", flushInterval: 100000});
  const queryId = ubi.search("laptop", answer.hits, answer.query_attributes);
  const list = document.getElementById("hits");
  answer.hits.forEach((id, i) => {
    const li = document.createElement("li");
    li.textContent = "product " + id;
    li.dataset.id = id;
    li.addEventListener("click", async () => { ubi.click(id, i, queryId); await ubi.flush();
                                               window.clickAnswer = ubi.stats; });
    list.appendChild(li);
  });
  await ubi.flush();
  window.queryAnswer = {accepted: ubi.stats.sent};
  window.answer = answer;
};
document.head.appendChild(script);
</script></body></html>
""".replace("RANKINGS_JSON", json.dumps(RANKINGS))


def _visit(browser: Any, shop: str, url: str, team: str) -> tuple[dict[str, Any], list[str], Any, Any]:
    """Load the page, wait for the logged search, click the first shown result of ``team``."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{shop}/?collector={url}")
        page.wait_for_function("window.answer !== undefined", timeout=30_000)
        answer = page.evaluate("window.answer")
        shown = page.eval_on_selector_all("#hits li", "els => els.map(e => e.dataset.id)")
        doc = next(d for d in answer["hits"] if answer["teams"][d] == team)
        page.click(f"#hits li[data-id='{doc}']")
        page.wait_for_function("window.clickAnswer !== undefined", timeout=30_000)
        return answer, shown, page.evaluate("window.queryAnswer"), page.evaluate("window.clickAnswer")
    finally:
        context.close()


def test_interleaved_search_logged_by_the_reference_client_credits_the_click_to_its_team(
    browser: Any, axios_esm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ubi.duckdb"
    with shop_site(axios_esm, PAGE) as shop, collector(db, "--allow-origin", shop) as (url, _):
        answer, shown, query_answer, click_answer = _visit(browser, shop, url, "candidate")
    # The route's answer: as many results as the longer list (4, the route's default size), distinct docs of
    # the two lists, each with the team that contributed it; the page shows exactly that list in that order.
    hits = answer["hits"]
    assert len(hits) == len(set(hits)) == 4 and set(hits) <= set(RANKINGS["baseline"]) | set(RANKINGS["candidate"])
    assert shown == hits
    for team, ranking in RANKINGS.items():  # each ranker's picks keep that ranker's order
        picks = [d for d in hits if answer["teams"][d] == team]
        assert picks == sorted(picks, key=ranking.index)
    assert set(answer["teams"]) == set(answer["hits"]) and set(answer["teams"].values()) == {"baseline", "candidate"}
    block = answer["query_attributes"]["interleaving"]
    assert block["rankers"] == ["baseline", "candidate"] and block["teams"] == answer["teams"]
    assert query_answer["accepted"] == 1 and click_answer["accepted"] == 1

    # The stored query record keeps the teams exactly as the route gave them (passed through unchanged).
    con = duckdb.connect(str(db), read_only=True)
    try:
        (stored,) = con.execute("SELECT query_attributes FROM ubi_queries WHERE query_id = 'q-1'").fetchone()
        clicks = con.execute("SELECT object_id FROM ubi_events WHERE action_name = 'click'").fetchall()
    finally:
        con.close()
    assert json.loads(stored) == answer["query_attributes"]
    clicked = clicks[0][0]
    assert len(clicks) == 1 and answer["teams"][clicked] == "candidate"

    # `ubi report` credits the one click to the candidate: 1 win, 0 losses, 0 ties over one search.
    qrels = tmp_path / "qrels.jsonl"
    qrels.write_text(json.dumps({"query_id": "q-1", "query": "laptop", "relevant": {"d1": 2, "d3": 1}}) + "\n")
    assert main(["report", "--db", str(db), "--qrels", str(qrels), "--json", "--predict-replicates", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    (exp,) = report["interleaving"]
    assert (exp["reference"], exp["challenger"], exp["searches"]) == ("baseline", "candidate", 1)
    assert exp["credited_clicks"] == {"baseline": 0, "candidate": 1}
    s = exp["by_search"]
    assert (s["n"], s["wins"], s["losses"], s["ties"], s["win_rate"]) == (1, 1, 0, 0, 1.0)


def test_the_projects_own_client_passes_the_block_through_search_attributes(
    browser: Any, axios_esm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ubi.duckdb"
    with shop_site(axios_esm, OWN_PAGE) as shop, collector(db, "--allow-origin", shop) as (url, _):
        answer, shown, query_answer, stats = _visit(browser, shop, url, "baseline")
    assert shown == answer["hits"] and query_answer["accepted"] == 1
    assert stats["sent"] == 2 and stats["rejected"] == 0  # the query record, then the click
    con = duckdb.connect(str(db), read_only=True)
    try:
        (stored,) = con.execute("SELECT query_attributes FROM ubi_queries").fetchone()
        (clicked,) = con.execute("SELECT object_id FROM ubi_events WHERE action_name = 'click'").fetchone()
    finally:
        con.close()
    assert json.loads(stored) == answer["query_attributes"] and answer["teams"][clicked] == "baseline"
    qrels = tmp_path / "qrels.jsonl"
    qrels.write_text(json.dumps({"query_id": "q-1", "query": "laptop", "relevant": {"d1": 2, "d3": 1}}) + "\n")
    assert main(["report", "--db", str(db), "--qrels", str(qrels), "--json", "--predict-replicates", "0"]) == 0
    (exp,) = json.loads(capsys.readouterr().out)["interleaving"]
    # this time the visitor clicked a baseline result: a loss for the candidate
    assert exp["credited_clicks"] == {"baseline": 1, "candidate": 0}
    s = exp["by_search"]
    assert (s["n"], s["wins"], s["losses"], s["ties"], s["win_rate"]) == (1, 0, 1, 0, 0.0)
