"""The demo search page's server side: a catalog, rankers chosen per session, ``/demo/search``.

The page itself is ``collector/static/demo.html``, instrumented with ``ubi-client.js`` exactly as a team would
instrument its own search page. This module only knows a :class:`DemoCatalog` (searches, their candidate
documents, and one ranking per ranker); ``ubi/demo_serve.py`` builds one from the simulator's catalog and
adds the site to a collector app with :func:`install_demo`, so page, client and collector share one origin.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse
from pydantic import BaseModel

from ubi_pipeline.collector.browser import STATIC_DIR
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.text import normalize_query

DEMO_PAGE = STATIC_DIR / "demo.html"


class DemoCatalogError(UbiError):
    """A demo catalog whose parts do not line up (names the part)."""


@dataclass(frozen=True)
class DemoDoc:
    """One product of the demo catalog."""

    doc_id: str
    title: str


def _tokens(text: str) -> frozenset[str]:
    # Plural "s" folded so "shoe" finds "running shoes"; enough for a demo, not a stemmer.
    return frozenset(t[:-1] if len(t) > 3 and t.endswith("s") else t for t in normalize_query(text).split())


@dataclass(frozen=True)
class DemoCatalog:
    """Searches the demo answers, their candidates, and each ranker's order of them (best first)."""

    queries: tuple[str, ...]
    docs: tuple[tuple[DemoDoc, ...], ...]
    rankings: Mapping[str, tuple[tuple[int, ...], ...]]  # ranker -> per query, candidate indices
    application: str = "demo-search"
    object_id_field: str = "product_id"
    _tokens: tuple[frozenset[str], ...] = field(init=False, repr=False, compare=False)
    _by_id: dict[str, DemoDoc] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.docs) != len(self.queries):
            raise DemoCatalogError(f"docs: {len(self.docs)} candidate lists for {len(self.queries)} queries")
        if not self.rankings:
            raise DemoCatalogError("rankings: at least one ranker is needed")
        for name, per_query in self.rankings.items():
            if len(per_query) != len(self.queries):
                raise DemoCatalogError(f"rankings[{name!r}]: {len(per_query)} rankings for {len(self.queries)} queries")
            for q, order in enumerate(per_query):
                if sorted(order) != list(range(len(self.docs[q]))):
                    raise DemoCatalogError(f"rankings[{name!r}][{q}] is not an order of the query's candidates")
        object.__setattr__(self, "_tokens", tuple(_tokens(q) for q in self.queries))
        object.__setattr__(self, "_by_id", {d.doc_id: d for docs in self.docs for d in docs})

    @property
    def rankers(self) -> tuple[str, ...]:
        return tuple(sorted(self.rankings))

    def match(self, text: str) -> int | None:
        """The catalog search closest to ``text`` (Jaccard overlap of words), or ``None`` if no word is shared."""
        words = _tokens(text)
        best, best_score = None, 0.0
        for q, toks in enumerate(self._tokens):
            score = len(words & toks) / len(words | toks) if words else 0.0
            if score > best_score:
                best, best_score = q, score
        return best

    def ranker_for(self, session_id: str) -> str:
        """One ranker per session (a stable hash), so a visitor sees one system throughout (an A/B split)."""
        digest = hashlib.sha256(session_id.encode()).digest()
        return self.rankers[int.from_bytes(digest[:4], "big") % len(self.rankers)]

    def search(self, text: str, session_id: str) -> dict[str, Any]:
        """The ranked results of ``text`` for this session's ranker."""
        ranker = self.ranker_for(session_id)
        q = self.match(text)
        if q is None:
            return {"query": text, "matched_query": None, "ranker": ranker, "hits": [],
                    "suggestions": list(self.queries[:8])}
        docs = self.docs[q]
        hits = [{"id": docs[j].doc_id, "title": docs[j].title, "url": f"/demo/doc/{docs[j].doc_id}"}
                for j in self.rankings[ranker][q]]
        return {"query": text, "matched_query": self.queries[q], "exact": self.is_exact(text, q), "ranker": ranker,
                "hits": hits, "suggestions": []}

    def is_exact(self, text: str, q: int) -> bool:
        """Every word typed is a word of catalog search ``q`` ("running shoes" in "red running shoes"); else the
        results are the closest search's (a fallback the page says, so "coffee maker" never silently shows
        "coffee grinder")."""
        words = _tokens(text)
        return bool(words) and words <= self._tokens[q]

    def doc(self, doc_id: str) -> DemoDoc | None:
        return self._by_id.get(doc_id)


class Hit(BaseModel):
    """One result: its id (the UBI object id), title and page."""

    id: str
    title: str
    url: str


class SearchOut(BaseModel):
    """Ranked results of one search, and which ranker produced them."""

    query: str
    matched_query: str | None
    exact: bool = False  # False with results: matched_query is only the closest catalog search (a fallback)
    ranker: str
    hits: list[Hit]
    suggestions: list[str]


def demo_router(catalog: DemoCatalog, *, report_url: str | None = None) -> APIRouter:
    """Routes of the demo site: the page (``/demo/``), its config, ``/demo/search`` and product pages."""
    router = APIRouter(tags=["demo"])

    @router.get("/demo/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(DEMO_PAGE, media_type="text/html")

    @router.get("/demo/config")
    async def config() -> dict[str, Any]:
        """What the demo page needs: the UBI application, the id field, example searches, the report link."""
        return {"application": catalog.application, "object_id_field": catalog.object_id_field,
                "examples": list(catalog.queries[:6]), "report_url": report_url, "rankers": list(catalog.rankers)}

    @router.get("/demo/search", response_model=SearchOut)
    async def search(
        q: Annotated[str, Query(max_length=200, description="what the user typed")],
        session_id: Annotated[str, Query(max_length=100, description="the client's session id: picks the ranker")] = "",
    ) -> dict[str, Any]:
        """Search the demo catalog with the ranker of this session."""
        return catalog.search(q, session_id)

    @router.get("/demo/doc/{doc_id}", response_class=HTMLResponse)
    async def product(doc_id: Annotated[str, PathParam(max_length=256)]) -> HTMLResponse:
        """A product page (deliberately not instrumented: the click was logged on the results page)."""
        doc = catalog.doc(doc_id)
        if doc is None:
            return HTMLResponse(_PRODUCT.format(title="No such product", doc_id=_esc(doc_id)), status_code=404)
        return HTMLResponse(_PRODUCT.format(title=_esc(doc.title), doc_id=_esc(doc.doc_id)))

    return router


def install_demo(app: Any, catalog: DemoCatalog, *, report_url: str | None = None) -> None:
    """Add the demo site to a collector app: its routes, and ``/demo/`` as the home page a browser opening ``/``
    is sent to (clients asking ``/`` for JSON get the collector's OpenSearch answer)."""
    app.include_router(demo_router(catalog, report_url=report_url))
    app.state.home_page = "/demo/"


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


_PRODUCT = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font:16px/1.5 system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem}}</style></head>
<body><p><a href="javascript:history.back()">&larr; back to the results</a></p><h1>{title}</h1>
<p>product_id <code>{doc_id}</code></p></body></html>"""
