"""What the collector's routes depend on: the :class:`Collector` of an app, its JSON answers and errors.

Routes (:mod:`ubi_pipeline.collector.routes`) and the app (:mod:`ubi_pipeline.collector.app`, which includes the routes) both import
this module, so neither imports the other's internals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import Scope

from ubi_pipeline.collector import workers
from ubi_pipeline.collector.bodies import BodyError, Kind, RawItem
from ubi_pipeline.collector.errors import RequestError, TooLarge, Unprocessable
from ubi_pipeline.collector.fastpath import HTTP_MIN_ITEMS, prepare_items
from ubi_pipeline.collector.ingest import (
    IngestContext,
    IngestResult,
    Prepared,
    RecordFilter,
    apply_filters,
    validate_items,
)
from ubi_pipeline.collector.log_throttle import LogThrottle
from ubi_pipeline.collector.metrics import Metrics
from ubi_pipeline.collector.sinks.base import Sink
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.terminal import printable

log = logging.getLogger("ubi.collector")

#: A step run on a body refused as a whole before ``failed_records`` keeps it (e.g. the privacy scrub).
BodyFilter = Callable[[bytes], bytes]

class TooManyItems(TooLarge):
    """More items in one body than ``max_items`` (413); the body is within the byte limit, so it is kept."""

    keep = True


#: At most one log line about rejected items per this many seconds (the others are counted in the next line).
REJECTION_LOG_EVERY_S = 10.0


@dataclass
class RejectionLog(LogThrottle):
    """Warn about rejected items at the default log level without flooding it.

    A sender with a bug sends the same bad item thousands of times a minute: one line per ``every`` seconds
    names the route, how many items of the request were rejected and the first reason; the next line says how
    many rejected items (and requests) went unlogged since. ``/metrics`` and ``ubi failed`` have every one.
    """

    every: float = REJECTION_LOG_EVERY_S
    _quiet_items: int = 0

    def note(self, result: IngestResult, source: str) -> None:
        if not result.rejected:
            return
        admitted, since, held = self.admit()
        if not admitted:
            self._quiet_items += result.rejected
            return
        total = result.accepted + result.duplicates + result.rejected
        first = ""
        if result.errors:
            e = result.errors[0]
            # client text: no escape sequence or line break reaches the log
            reason = printable(e.message).replace("\n", "\\n")
            first = f": item {e.index}" + (f" field {printable(e.field)}" if e.field else "") + f": {reason}"
        quiet = (f" (and {self._quiet_items} rejected items in {held} requests not logged in the "
                 f"last {since:.0f} s)" if held and since is not None else "")
        log.warning("rejected %d of %d items on %s%s%s; `ubi failed` lists them with their reasons",
                    result.rejected, total, source, first, quiet)
        self._quiet_items = 0


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
    rejections: RejectionLog = field(default_factory=RejectionLog)
    #: Worker processes that parse large bodies (:mod:`ubi_pipeline.collector.workers`); none: all in process.
    parse_pool: workers.ParsePool = field(default_factory=lambda: workers.ParsePool(0))

    @property
    def rows_without_models(self) -> bool:
        """Whether a body's rows may be built without pydantic models (the columnar path, a parse worker): the
        sink takes rows and no record filter needs the models."""
        return self.sink.takes_rows and not self.record_filters

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
            prepared = await self.from_worker(body, kind=kind, ndjson=ndjson, ctx=ctx, parse=parse)
            if prepared is None:
                items = parse(body) if parse is not None else workers.body_items(body, kind, ndjson, self.bulk_indices)
                if len(items) > self.settings.max_items:
                    raise TooManyItems(
                        f"{len(items)} items in one request; at most {self.settings.max_items} "
                        "(UBI_MAX_ITEMS): split the batch"
                    )
                if self.rows_without_models and len(items) >= HTTP_MIN_ITEMS:
                    # the columnar path: rows without models (DuckDB releases the GIL: off the loop)
                    prepared = await asyncio.to_thread(prepare_items, items, source=ctx.source)
                else:
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
            if prepared is not None:
                result = await self.sink.submit_prepared(prepared)
            else:
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

    async def from_worker(
        self, body: bytes, *, kind: Kind | None, ndjson: bool, ctx: IngestContext,
        parse: Callable[[bytes], list[RawItem]] | None,
    ) -> Prepared | None:
        """The body's rows from a parse worker (:mod:`ubi_pipeline.collector.workers`) when it is large, its
        records need no filter and the sink takes rows; None: the caller parses it in process."""
        if (parse is not None or len(body) < workers.MIN_BODY_BYTES or not self.rows_without_models
                or not self.parse_pool.ready()):
            return None
        return await self.parse_pool.parse(
            body, kind, ndjson, self.bulk_indices, self.settings.max_items, ctx.source
        )

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
        self.rejections.note(result, route)
        m = self.metrics
        m.inc("ubi_records_accepted_total", result.queries, kind="query", route=route)
        m.inc("ubi_records_accepted_total", result.events, kind="event", route=route)
        m.inc("ubi_records_duplicate_total", result.counts.query_duplicates, kind="query", route=route)
        m.inc("ubi_records_duplicate_total", result.counts.event_duplicates, kind="event", route=route)
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


def error_body(exc: RequestError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": type(exc).__name__, "message": exc.message}
    if isinstance(exc, BodyError) and exc.line is not None:
        body["line"], body["column"] = exc.line, exc.column
    return body


async def request_error_handler(request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, RequestError):  # registered for RequestError only
        raise exc
    return JSONResponse(error_body(exc), status_code=exc.status_code, headers=exc.headers)


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


