"""``ubi demo --serve``: a search page over the simulator's catalog, instrumented with the UBI client.

One process serves the collector (``/v1/*``, ``/static/ubi-client.js``) and the demo site (``/demo/``), so
the page, the client and the collector share an origin and no CORS setting is needed. Each browser session
gets one of two rankers (``ranker-a``, ``ranker-b``): the simulator's protocol, grade plus Gaussian noise
(σ = 0.5 and 2.0), sorted. Everything a visitor does is stored in the DuckDB file like any other UBI data.

Run standalone: ``python -m ubi_pipeline.demo_serve --db demo.duckdb --port 8000``. ``/report`` renders the joint
report (``ubi report --format html``) of what visitors did against the catalog's graded human judgments,
when the reports stage is installed; otherwise the page shows no report link.
"""

from __future__ import annotations

import argparse
import html
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ubi_pipeline.collector.server import bind_socket, close_serving, make_server, server_config
from ubi_pipeline.demo_site import DemoCatalog, DemoDoc, install_demo
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.sealed import open_sealed

#: The two rankers of the demo, best first: name and noise σ (grade + N(0, σ²), as in the simulator).
RANKERS: tuple[tuple[str, float], ...] = (("ranker-a", 0.5), ("ranker-b", 2.0))


def _title(query: str, doc_id: str) -> str:
    number = doc_id.rsplit("-", 1)[-1]
    return f"{query[:1].upper()}{query[1:]}, model {number}"


def _simulated(seed: int, queries: int, docs_per_query: int) -> Any:
    from ubi_pipeline.processors.simulation.catalog import build_catalog

    return build_catalog(queries, docs_per_query, seed=seed)


def demo_catalog(seed: int = 0, *, queries: int = 40, docs_per_query: int = 20) -> DemoCatalog:
    """The simulator's catalog (same seed, same searches and grades) with the two demo rankers' orders."""
    cat = _simulated(seed, queries, docs_per_query)
    rng = np.random.default_rng([seed, 0xDE30])
    rankings: dict[str, tuple[tuple[int, ...], ...]] = {}
    for name, sigma in RANKERS:
        score = cat.grades + rng.normal(0.0, sigma, size=cat.grades.shape)
        order = np.argsort(-score, axis=1, kind="stable")
        rankings[name] = tuple(tuple(int(j) for j in row) for row in order)
    docs = tuple(
        tuple(DemoDoc(str(d), _title(text, str(d))) for d in cat.doc_ids[q])
        for q, text in enumerate(cat.query_texts)
    )
    return DemoCatalog(tuple(cat.query_texts), docs, rankings)


def write_qrels(path: Path, seed: int = 0, *, queries: int = 40, docs_per_query: int = 20) -> Path:
    """The catalog's graded human judgments as JSONL (``docs/metrics.md`` form), for the live report."""
    cat = _simulated(seed, queries, docs_per_query)
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in cat.qrels()))
    return path


def report_available() -> bool:
    """Whether the reports stage can render HTML here (``ubi_pipeline.reports.render.html`` and the joint report)."""
    for name in ("ubi_pipeline.reports.render.html", "ubi_pipeline.reports.joint", "ubi_pipeline.processors.labels.merge", "ubi_pipeline.formats.qrels"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                return False
            raise
    return True


def live_report_html(store: Store, qrels: Path, settings: Settings) -> str:
    """The joint report (``ubi report --format html``) of everything stored so far, from the sealed segments."""
    from ubi_pipeline.formats.qrels import load_qrels
    from ubi_pipeline.processors.labels.merge import LabelSet, labels_from_human, labels_from_store
    from ubi_pipeline.reports.joint import ReportConfig, build_report
    from ubi_pipeline.reports.render.html import render_html

    labels = LabelSet()
    labels.add(labels_from_human(load_qrels(qrels).human_judgments()))
    # A seal taken between two commits: the report reads a consistent store while visitors keep writing,
    # and only the rows stored since the last visit are copied out.
    con = open_sealed(store.seal())
    try:
        labels.add(labels_from_store(con))
        config = ReportConfig(position_base=settings.position_base, seed=settings.seed,
                              n_boot=200, n_perm=2_000)  # fewer resamples: the page renders on each visit
        report = build_report(con, labels, config, inputs={"db": str(store.path), "qrels": str(qrels)})
    finally:
        con.close()
    return str(render_html(report))


def build_demo_app(settings: Settings, *, catalog: DemoCatalog | None = None, sink: Any = None) -> Any:
    """The collector app for ``settings`` with the demo site, and ``/report`` when the reports stage is there."""
    from ubi_pipeline.collector.app import create_app

    app = create_app(settings, sink)
    store = app.state.collector.sink.store
    report_url = None
    if store is not None and report_available():
        qrels = write_qrels(Path(str(store.path) + ".qrels.jsonl"), settings.seed)
        report_url = "/report"
        _add_report_route(app, store, qrels, settings)
    install_demo(app, catalog or demo_catalog(settings.seed), report_url=report_url)
    return app


def _add_report_route(app: Any, store: Store, qrels: Path, settings: Settings) -> None:
    import asyncio

    from fastapi.responses import HTMLResponse

    @app.get("/report", response_class=HTMLResponse, tags=["demo"])
    async def report() -> HTMLResponse:
        """The live joint report of what visitors did, against the catalog's human judgments (HTML)."""
        try:
            page = await asyncio.to_thread(live_report_html, store, qrels, settings)
        except UbiError as exc:
            body = f"<p>No report yet: {html.escape(str(exc))}</p><p><a href='/demo/'>Search a little first.</a></p>"
            return HTMLResponse(body, status_code=503)
        return HTMLResponse(page)


def _print_ready(url: str) -> None:
    print(f"demo search page on {url}/demo/ (collector at {url}, Ctrl-C stops)", flush=True)


def demo_settings(args: argparse.Namespace) -> Settings:
    """Settings from ``ubi demo --serve`` arguments: ``--db``/``--host``/``--port``/``--seed`` when given,
    else the database ``<--dir>/serve.duckdb`` (``--dir`` defaults to ``demo-out``)."""
    db = getattr(args, "db", None)
    if db is None:
        folder = Path(getattr(args, "dir", None) or "demo-out")
        folder.mkdir(parents=True, exist_ok=True)
        db = folder / "serve.duckdb"
    return Settings.from_flags(args, only=("host", "port", "seed"), db=db)


def serve_demo(settings: Settings | argparse.Namespace, *,
               ready: Callable[[str], None] | None = _print_ready) -> int:
    """Serve the demo page and the collector on ``settings.host:settings.port`` (0: a free port) until stopped.

    ``settings`` may also be the parsed ``ubi demo --serve`` arguments (see :func:`demo_settings`).
    ``ready(url)`` is called once the socket listens. Stops on SIGINT/SIGTERM after a graceful shutdown:
    acknowledged writes are committed and the store is closed before this returns.
    """

    from ubi_pipeline.collector.sinks import create_sink
    from ubi_pipeline.store.client import advertise

    if not isinstance(settings, Settings):
        settings = demo_settings(settings)
    sock = bind_socket(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    sink = create_sink(settings)
    side = None
    try:
        app = build_demo_app(settings, sink=sink)
        if sink.store is not None:
            side = advertise(sink.store.path, url)
        config = server_config(app, settings, log_level="warning", timeout_graceful_shutdown=5)
        server = make_server(config)
        if ready is not None:
            ready(url)
        server.run(sockets=[sock])
    finally:
        close_serving(sock, sink, side)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ubi_pipeline.demo_serve",
        description="Serve the instrumented demo search page, the live report and the collector on one port "
                    "(what `ubi demo --serve` runs). Settings also come from UBI_* variables.",
    )
    parser.add_argument("--db", type=Path, help="DuckDB file for what visitors do (default demo-out/serve.duckdb)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--seed", type=int, help="catalog and ranker seed (default 0)")
    try:
        return serve_demo(parser.parse_args(argv))
    except UbiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
