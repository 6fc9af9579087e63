"""The demo site's server side: matching a typed search, one ranker per session, the routes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ubi_pipeline.collector.app import create_app
from ubi_pipeline.demo_site import DemoCatalog, DemoCatalogError, DemoDoc, install_demo
from ubi_pipeline.schemas.settings import Settings


def tiny() -> DemoCatalog:
    docs = (
        (DemoDoc("shoe-1", "Red running shoes, model 1"), DemoDoc("shoe-2", "Red <b>running</b> shoes, model 2"),
         DemoDoc("shoe-3", "Red running shoes, model 3")),
        (DemoDoc("mat-1", "Yoga mat, model 1"), DemoDoc("mat-2", "Yoga mat, model 2")),
    )
    rankings = {"ranker-a": ((0, 1, 2), (1, 0)), "ranker-b": ((2, 1, 0), (0, 1))}
    return DemoCatalog(("red running shoes", "yoga mat"), docs, rankings)


def test_a_typed_search_finds_the_closest_catalog_search() -> None:
    cat = tiny()
    assert cat.match("red running shoes") == 0
    assert cat.match("Running  SHOE") == 0  # normalised, plural folded
    assert cat.match("mats for yoga") == 1  # {yoga, mat} shared: 2/4 against 0 for the shoes
    assert cat.match("teapot") is None and cat.match("") is None


def test_each_session_keeps_one_ranker_and_sessions_split_between_them() -> None:
    cat = tiny()
    assert {cat.ranker_for("session-7") for _ in range(5)} == {cat.ranker_for("session-7")}
    split = Counter(cat.ranker_for(f"session-{i}") for i in range(400))
    # A hash split is a fair coin per session: 400 sessions give 200 ± 10 (1 sd) each; 150 is 5 sd away.
    assert set(split) == {"ranker-a", "ranker-b"} and min(split.values()) > 150


def test_search_returns_the_sessions_ranking() -> None:
    cat = tiny()
    session = next(f"s{i}" for i in range(100) if cat.ranker_for(f"s{i}") == "ranker-b")
    out = cat.search("running shoes", session)
    assert out["ranker"] == "ranker-b" and out["matched_query"] == "red running shoes"
    assert [h["id"] for h in out["hits"]] == ["shoe-3", "shoe-2", "shoe-1"]  # ranker-b's order (2, 1, 0)
    none = cat.search("teapot", session)
    assert none["hits"] == [] and none["suggestions"] == ["red running shoes", "yoga mat"]


def test_catalog_parts_must_line_up() -> None:
    cat = tiny()
    with pytest.raises(DemoCatalogError, match="2 candidate lists for 1 queries"):
        DemoCatalog(("only one",), cat.docs, cat.rankings)
    with pytest.raises(DemoCatalogError, match=r"rankings\['ranker-a'\]\[1\] is not an order"):
        DemoCatalog(cat.queries, cat.docs, {"ranker-a": ((0, 1, 2), (1, 1))})
    with pytest.raises(DemoCatalogError, match="at least one ranker"):
        DemoCatalog(cat.queries, cat.docs, {})


def test_routes_serve_the_page_the_client_search_and_products(tmp_path: Path) -> None:
    app = create_app(Settings(db=tmp_path / "demo.duckdb"))
    install_demo(app, tiny())
    with TestClient(app, client=("127.0.0.1", 50000)) as c:
        page = c.get("/demo/")
        assert page.status_code == 200 and '<script src="/static/ubi-client.js">' in page.text
        script = c.get("/static/ubi-client.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        assert "navigator.sendBeacon" in script.text
        # a browser opening / lands on the demo; a client asking / for JSON gets the OpenSearch answer (issue 28)
        browser = c.get("/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}, follow_redirects=False)
        assert browser.headers["location"] == "/demo/"
        assert c.get("/", headers={"Accept": "application/json"}).json()["version"]["distribution"] == "opensearch"
        config = c.get("/demo/config").json()
        assert config["report_url"] is None and config["object_id_field"] == "product_id"
        hits = c.get("/demo/search", params={"q": "yoga mat", "session_id": "x"}).json()["hits"]
        assert {h["id"] for h in hits} == {"mat-1", "mat-2"}
        product = c.get("/demo/doc/shoe-2")
        assert product.status_code == 200 and "Red &lt;b&gt;running&lt;/b&gt; shoes" in product.text
        assert c.get("/demo/doc/nope").status_code == 404
        assert c.get("/demo/search", params={"q": "x" * 201}).status_code == 422
