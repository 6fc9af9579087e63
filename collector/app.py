"""The collector's FastAPI application: :func:`create_app` wires settings, the sink, record filters and routes.

Extension points (used by the security and Kafka work, and by tests):

* ``create_app(settings, sink=None)``: any :class:`~collector.sinks.base.Sink`; default from ``settings.sink``.
* ``app.state.collector.record_filters``: :data:`~collector.ingest.RecordFilter` steps run on every validated
  batch before the sink.
* Modules in :data:`EXTENSION_MODULES` that exist are loaded: ``record_filters(settings) -> list`` (also used
  by ``ubi import``), ``body_filters(settings) -> list`` (:data:`BodyFilter` steps run on a body refused as a
  whole before it is kept) and ``install(app, settings)`` (middleware, extra routes), called in that order.
* ``app.state.collector.request_checks``: checks run on every request before its body is read. Middleware
  that refuses requests must register its check here too: ingest POSTs of server-side senders are served
  by :class:`IngestFrontDoor` ahead of all middleware (``collector.security`` registers its ``Gate``).
* Typed errors: raise a :class:`~collector.errors.RequestError` subclass; its ``status_code``, ``headers`` and
  ``kind`` become the response and the ``failed_records`` row.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from collector.errors import RequestError, TooLarge, Unprocessable
from collector.ingest import (
    BodyError,
    IngestContext,
    IngestResult,
    Kind,
    RawItem,
    RecordFilter,
    apply_filters,
    parse_bulk,
    parse_items,
    validate_items,
)
from collector.metrics import Metrics
from collector.sinks import create_sink
from collector.sinks.base import Sink
from schemas.settings import Settings
from schemas.ubi import UbiEvent, UbiQuery

log = logging.getLogger("ubi.collector")

#: A step run on a body refused as a whole before ``failed_records`` keeps it (e.g. the privacy scrub).
BodyFilter = Callable[[bytes], bytes]

#: Optional modules that extend the collector (each may define ``record_filters``, ``body_filters``, ``install``).
EXTENSION_MODULES: tuple[str, ...] = ("collector.security", "collector.browser")


class TooManyItems(TooLarge):
    """More items in one body than ``max_items`` (413); the body is within the byte limit, so it is kept."""

    keep = True


def tune_gc() -> None:
    """Collect garbage less often: the collector allocates many short-lived, acyclic objects per request.

    With CPython's default gen-0 threshold (700 allocations) a 500-event batch triggers dozens of
    collections that each walk the batch's still-live models; measured in ``bench/ingest.py`` this halves
    validation throughput. Objects alive at start-up are frozen out of collection altogether.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def extension_modules() -> list[ModuleType]:
    """The extension modules that are present."""
    found = []
    for name in EXTENSION_MODULES:
        try:
            found.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return found


def extension_filters(settings: Settings) -> list[RecordFilter]:
    """Record filters contributed by the extension modules, in order."""
    steps: list[RecordFilter] = []
    for module in extension_modules():
        if hasattr(module, "record_filters"):
            steps.extend(module.record_filters(settings))
    return steps


@dataclass
class Collector:
    """What routes use: settings, the sink, the record filters and the metrics of one app."""

    settings: Settings
    sink: Sink
    record_filters: list[RecordFilter] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)
    body_filters: list[BodyFilter] = field(default_factory=list)
    #: Checks run on a request before its body is read; one returning an error refuses the request with it.
    request_checks: list[Callable[[Scope], RequestError | None]] = field(default_factory=list)

    @property
    def indices(self) -> dict[str, Kind]:
        """The OpenSearch index names this collector takes (``query_index``, ``event_index``) -> kind."""
        return {self.settings.query_index: "query", self.settings.event_index: "event"}

    @property
    def bulk_indices(self) -> dict[str, Kind]:
        """``_index`` names ``/v1/bulk`` takes: the configured ones and the UBI plugin's (exports)."""
        return {"ubi_queries": "query", "ubi_events": "event", **self.indices}

    async def accept(
        self,
        body: bytes,
        *,
        kind: Kind | None,
        ndjson: bool,
        ctx: IngestContext,
        parse: Callable[[bytes], list[RawItem]] | None = None,
    ) -> IngestResult:
        """Parse, validate, filter and durably write one body (``kind`` None: an OpenSearch ``_bulk`` body;
        ``parse``: how to split the body into items instead, for the OpenSearch-compatible routes)."""
        try:
            if parse is not None:
                items = parse(body)
            elif kind is None:
                items = parse_bulk(body, indices=self.bulk_indices)
            else:
                items = parse_items(body, kind, ndjson=ndjson)
            if len(items) > self.settings.max_items:
                raise TooManyItems(
                    f"{len(items)} items in one request; at most {self.settings.max_items} "
                    "(UBI_MAX_ITEMS): split the batch"
                )
            validated = apply_filters(validate_items(items), self.record_filters, ctx)
        except RequestError as exc:
            if exc.keep:
                await self.keep_body(body, ctx, reason=exc.message, kind=exc.kind)
            raise
        except Exception as exc:  # a bug met by some input: keep the input, answer with a typed error
            log.exception("unexpected error on %s", ctx.source)
            reason = f"unexpected {type(exc).__name__} while reading the body: {exc}"
            await self.keep_body(body, ctx, reason=reason, kind="unprocessable")
            raise Unprocessable(reason + " (kept in failed_records)") from exc
        try:
            result = await self.sink.submit_async(validated, source=ctx.source)
        except RequestError:
            raise
        except Exception as exc:  # not SinkUnavailable: something in this input broke the sink's row building
            log.exception("sink %s failed on %s", self.sink.name, ctx.source)
            reason = f"unexpected {type(exc).__name__} while storing the body: {exc}"
            await self.keep_body(body, ctx, reason=reason, kind="unprocessable")
            raise Unprocessable(reason + " (kept in failed_records)") from exc
        self.count(result, ctx.source)
        return result

    async def keep_body(self, body: bytes, ctx: IngestContext, *, reason: str, kind: str) -> None:
        """Keep a refused body in ``failed_records``; a sink failure here is logged, not raised over the cause."""
        for scrub in self.body_filters:
            try:
                body = await asyncio.to_thread(scrub, body)  # up to max_body_bytes of JSON: off the loop
            except Exception:  # never keep a body a filter could not scrub: its length says it came
                log.exception("could not scrub a refused body from %s", ctx.source)
                body, reason = b"", f"{reason} (body not kept: scrubbing it failed, {len(body)} bytes)"
        try:
            await asyncio.wrap_future(
                self.sink.keep_unparseable(body, source=ctx.source, reason=reason, kind=kind)
            )
        except Exception:
            log.exception("could not keep a refused body from %s", ctx.source)
            return
        self.metrics.inc("ubi_bodies_kept_total", route=ctx.source, kind=kind)

    def count(self, result: IngestResult, route: str) -> None:
        m = self.metrics
        m.inc("ubi_records_accepted_total", result.queries, kind="query", route=route)
        m.inc("ubi_records_accepted_total", result.events, kind="event", route=route)
        m.inc("ubi_records_duplicate_total", result.query_duplicates, kind="query", route=route)
        m.inc("ubi_records_duplicate_total", result.event_duplicates, kind="event", route=route)
        for err in result.errors:
            if err.kind == "conflict":  # a re-used key: event_id for events, query_id for query records
                kind = "event" if err.field == "event_id" else "query"
            else:
                kind = err.kind
            m.inc("ubi_records_rejected_total", 1, kind=kind, route=route)


class ORJSONResponse(JSONResponse):
    """JSON responses rendered by orjson (several times faster than ``json.dumps`` on long error lists)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


async def get_collector(request: Request) -> Collector:
    """The :class:`Collector` of the app serving ``request`` (async: sync dependencies cost a thread hop)."""
    collector: Collector = request.app.state.collector
    return collector


# ---------------------------------------------------------------- errors and metrics


def error_body(exc: RequestError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": type(exc).__name__, "message": exc.message}
    if isinstance(exc, BodyError) and exc.line is not None:
        body["line"], body["column"] = exc.line, exc.column
    return body


async def _request_error(request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, RequestError):  # registered for RequestError only
        raise exc
    return JSONResponse(error_body(exc), status_code=exc.status_code, headers=exc.headers)


class MetricsMiddleware:
    """Pure ASGI middleware: request count and latency by route template (not raw path: bounded labels)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.request_done(time.perf_counter() - started, route=route, method=method, status=status)


#: Serves one ingest request: (collector, scope, receive, kind, route) -> (status, headers, body).
IngestServer = Callable[
    [Collector, Scope, Receive, Kind | None, str], Awaitable[tuple[int, list[tuple[bytes, bytes]], bytes]]
]


async def _answer(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class IngestFastLane:
    """Pure ASGI middleware, innermost: serves POSTs to the ingest routes without FastAPI's router.

    Measured in-process on a single-event request: 167 us of CPU through FastAPI, 90 us through plain
    Starlette routing with the same endpoint. It serves what the front door leaves to the full stack
    (browser requests, which CORS must see); extension middleware and the metrics see them as usual.
    """

    def __init__(
        self,
        app: ASGIApp,
        collector: Collector,
        kinds: dict[str, Kind | None],
        routes: dict[str, Any],
        serve: IngestServer,
    ) -> None:
        self.app, self.collector, self.kinds, self.routes, self.serve = app, collector, kinds, routes, serve

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" and scope["method"] == "POST" else None
        if path not in self.kinds:
            await self.app(scope, receive, send)
            return
        scope["route"] = self.routes[path]  # what FastAPI would set (metrics label by route template)
        await _answer(send, *await self.serve(self.collector, scope, receive, self.kinds[path], path))


class IngestFrontDoor:
    """The ingest POSTs of non-browser senders, served before FastAPI sees the request.

    A single-event request through FastAPI (its OpenTelemetry provider lookups on every request, its error,
    telemetry and body-limit middleware) and our middleware (metrics, CORS, security) cost about 30 us more
    CPU than the endpoint itself, a fifth of the server's work per request. :class:`CollectorAPI` hands
    these requests here first, and this does for them what the stack would: the extension checks
    (``Collector.request_checks``: origin, API key, rate limit), the request metrics, and an answer to any
    unexpected error (500, logged). Requests carrying an ``Origin`` header (browsers) take the full stack,
    so CORS stays Starlette's. FastAPI's OpenTelemetry spans therefore never cover these requests; the
    collector's own Prometheus metrics do.
    """

    def __init__(self, collector: Collector, kinds: dict[str, Kind | None], serve: IngestServer) -> None:
        self.collector, self.kinds, self.serve = collector, kinds, serve

    def takes(self, scope: Scope) -> bool:
        """Whether this request is an ingest POST without an ``Origin`` header."""
        return (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in self.kinds
            and not any(name == b"origin" for name, _ in scope["headers"])
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        started = time.perf_counter()
        status = 500
        try:
            for check in self.collector.request_checks:
                refusal = check(scope)
                if refusal is not None:
                    status, headers, body = error_answer(refusal)
                    break
            else:
                status, headers, body = await self.serve(
                    self.collector, scope, receive, self.kinds[path], path
                )
            await _answer(send, status, headers, body)
        except Exception:  # what ServerErrorMiddleware would do for the full stack
            log.exception("unexpected error serving %s", path)
            status, headers, body = error_answer(InternalError("internal error; the collector logged it"))
            await _answer(send, status, headers, body)
        finally:
            seconds = time.perf_counter() - started
            self.collector.metrics.request_done(seconds, route=path, method="POST", status=status)


class InternalError(RequestError):
    """A bug met while serving a request (500); the request's body was kept by ``Collector.accept``."""

    status_code = 500
    keep = False


def error_answer(exc: RequestError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, body) of the JSON answer to a refused request."""
    body = orjson.dumps(error_body(exc))
    headers = [(b"content-type", b"application/json")]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()]
    headers.append((b"content-length", str(len(body)).encode()))
    return exc.status_code, headers, body


class CollectorAPI(FastAPI):
    """FastAPI that lets :class:`IngestFrontDoor` serve the requests it takes before anything else runs."""

    ingest_door: IngestFrontDoor | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        door = self.ingest_door
        if door is not None and door.takes(scope):
            scope["app"] = self  # as Starlette sets it
            await door(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


# ---------------------------------------------------------------- the app


def create_app(
    settings: Settings | None = None,
    sink: Sink | None = None,
    *,
    record_filters: Sequence[RecordFilter] | None = None,
    extensions: bool = True,
) -> FastAPI:
    """The collector app. Without ``sink``, the sink named by ``settings.sink`` is created (and closed at
    shutdown); a given sink is left open for its owner. ``extensions=False`` skips the extension modules."""
    from collector.opensearch import router as opensearch_router
    from collector.routes import INGEST_ROUTES, ingest, router  # routes import this module

    settings = settings or Settings()
    own_sink = sink is None
    the_sink = sink if sink is not None else create_sink(settings)
    metrics = Metrics()
    collector = Collector(settings, the_sink, list(record_filters or []), metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if own_sink:
            await asyncio.to_thread(the_sink.close)

    app = CollectorAPI(
        title="ubi-pipeline collector",
        version="0.1.0",
        summary="Collects User Behavior Insights (UBI 1.3.0) query records and events; 202 means committed.",
        lifespan=lifespan,
        default_response_class=ORJSONResponse,
    )
    app.state.collector = collector
    app.state.settings = settings
    app.add_exception_handler(RequestError, _request_error)
    app.include_router(router)
    app.include_router(opensearch_router)
    routes = {r.path: r for r in router.routes if isinstance(r, APIRoute) and r.path in INGEST_ROUTES}
    app.ingest_door = IngestFrontDoor(collector, INGEST_ROUTES, ingest)
    # first added: innermost
    app.add_middleware(IngestFastLane, collector=collector, kinds=INGEST_ROUTES, routes=routes, serve=ingest)
    if extensions:
        for module in extension_modules():
            if hasattr(module, "record_filters"):
                collector.record_filters.extend(module.record_filters(settings))
            if hasattr(module, "body_filters"):
                collector.body_filters.extend(module.body_filters(settings))
            if hasattr(module, "install"):
                module.install(app, settings)
    # Added last so it is outermost: it times everything, extension middleware included.
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.openapi = lambda: _openapi_with_records(app)  # type: ignore[method-assign]
    return app


def record_schemas() -> dict[str, Any]:
    """JSON Schemas of UbiQuery and UbiEvent (and their parts), keyed by name, refs to ``#/components/schemas``."""
    out: dict[str, Any] = {}
    for model in (UbiQuery, UbiEvent):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


def _openapi_with_records(app: FastAPI) -> dict[str, Any]:
    # Ingest routes read raw bytes (to keep what fails to parse), so the record schemas are added by hand.
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        schema.setdefault("components", {}).setdefault("schemas", {}).update(record_schemas())
        app.openapi_schema = schema
    return app.openapi_schema
