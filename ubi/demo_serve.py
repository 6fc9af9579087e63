"""``ubi demo --serve``: a search page over the simulator's catalog, instrumented with the UBI client.

One process serves the collector (``/v1/*``, ``/static/ubi-client.js``) and the demo site (``/demo/``), so
the page, the client and the collector share an origin and no CORS setting is needed. Each browser session
gets one of two rankers (``ranker-a``, ``ranker-b``): the simulator's protocol, grade plus Gaussian noise
(σ = 0.5 and 2.0), sorted. Everything a visitor does is stored in the DuckDB file like any other UBI data.

Run standalone: ``python -m ubi.demo_serve --db demo.duckdb --port 8000``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from collector.demo_site import DemoCatalog, DemoDoc, demo_router
from schemas.errors import UbiError
from schemas.settings import Settings

#: The two rankers of the demo, best first: name and noise σ (grade + N(0, σ²), as in the simulator).
RANKERS: tuple[tuple[str, float], ...] = (("ranker-a", 0.5), ("ranker-b", 2.0))


def _title(query: str, doc_id: str) -> str:
    number = doc_id.rsplit("-", 1)[-1]
    return f"{query[:1].upper()}{query[1:]}, model {number}"


def demo_catalog(seed: int = 0, *, queries: int = 40, docs_per_query: int = 20) -> DemoCatalog:
    """The simulator's catalog (same seed, same searches and grades) with the two demo rankers' orders."""
    from processors.simulation.catalog import build_catalog

    cat = build_catalog(queries, docs_per_query, seed=seed)
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


def report_renderer() -> Callable[..., str] | None:
    """``reports.render.html`` when the reports stage provides it, else ``None`` (the page shows no link)."""
    try:
        module = importlib.import_module("reports.render")
    except ModuleNotFoundError as exc:
        if exc.name in ("reports.render", "reports"):
            return None
        raise
    render = getattr(module, "html", None)
    return render if callable(render) else None


def build_demo_app(settings: Settings, *, catalog: DemoCatalog | None = None, sink: Any = None) -> Any:
    """The collector app for ``settings`` with the demo site (and ``/report`` when it can be rendered)."""
    from collector.app import create_app

    app = create_app(settings, sink)
    render = report_renderer()
    report_url = None
    if render is not None:
        report_url = "/report"
        _add_report_route(app, settings, render)
    app.include_router(demo_router(catalog or demo_catalog(settings.seed), report_url=report_url))
    return app


def _add_report_route(app: Any, settings: Settings, render: Callable[..., str]) -> None:
    import asyncio

    from fastapi.responses import HTMLResponse

    @app.get("/report", response_class=HTMLResponse, tags=["demo"])
    async def report() -> HTMLResponse:
        """The live report of everything stored so far, as HTML."""
        try:
            page = await asyncio.to_thread(render, settings)
        except UbiError as exc:
            return HTMLResponse(f"<p>No report yet: {exc}</p>", status_code=503)
        return HTMLResponse(page)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UbiError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port") from exc
    sock.listen(512)
    return sock


def serve_demo(settings: Settings, *, ready: Callable[[str], None] | None = None) -> int:
    """Serve the demo page and the collector on ``settings.host:settings.port`` (0: a free port) until stopped.

    ``ready(url)`` is called once the socket listens (the CLI prints the URL). Stops on SIGINT/SIGTERM after
    a graceful shutdown: pending writes are committed and the store is closed before this returns.
    """
    import uvicorn

    from collector.sinks import create_sink
    from collector.store import advertise

    sock = _bind(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    sink = create_sink(settings)
    side = None
    try:
        app = build_demo_app(settings, sink=sink)
        if sink.store is not None:
            side = advertise(sink.store.path, url)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=5)
        server = _server(config)
        if ready is not None:
            ready(url)
        server.run(sockets=[sock])
    finally:
        if side is not None:
            side.unlink(missing_ok=True)
        sink.close()
        sock.close()
    return 0


def _server(config: Any) -> Any:
    """uvicorn's server, without re-raising SIGTERM after shutdown (that would skip closing the store)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return Server(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ubi.demo_serve",
        description="Serve the instrumented demo search page and the collector on one port "
                    "(what `ubi demo --serve` runs). Settings also come from UBI_* variables.",
    )
    parser.add_argument("--db", help="DuckDB file to store what visitors do (default: UBI_DB or ubi.duckdb)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8000; 0 picks a free one)")
    args = parser.parse_args(argv)
    flags = {k: v for k, v in vars(args).items() if v is not None}
    try:
        return serve_demo(Settings(**flags), ready=lambda url: print(f"demo search page on {url}/demo/", flush=True))
    except UbiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
