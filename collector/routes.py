"""The collector's HTTP routes. Each is a few lines: read the body, call the stage, answer.

Typed errors become status codes in :mod:`ubi_pipeline.collector.app` (``RequestError.status_code``); the work is in
:class:`ubi_pipeline.collector.deps.Collector` and :mod:`ubi_pipeline.collector.ingest`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, Field, ValidationError
from starlette.datastructures import Headers
from starlette.types import Receive, Scope

from ubi_pipeline.collector.bodies import Kind, NotGzip, dropped_keys, duplicate_keys, gunzip
from ubi_pipeline.collector.deps import Collector, ORJSONResponse, error_answer, get_collector
from ubi_pipeline.collector.errors import AllRejected, RequestError, TooLarge
from ubi_pipeline.collector.ingest import APPLICATION_SCOPE_KEY, IngestContext, IngestResult
from ubi_pipeline.collector.metrics import Labels
from ubi_pipeline.schemas.interleaving import METHOD, InterleavingError, team_draft

router = APIRouter()

#: Path -> record kind (None: ``_bulk``) of every ingest route (POST), for the fast paths in :mod:`ubi_pipeline.collector.app`.
INGEST_ROUTES: dict[str, Kind | None] = {}

# ---------------------------------------------------------------- dependencies

CollectorDep = Annotated[Collector, Depends(get_collector)]

# ---------------------------------------------------------------- response models (OpenAPI)


class ItemErrorOut(BaseModel):
    """Why one item of the request was rejected (it is kept in failed_records)."""

    index: int = Field(description="0-based position of the item in the request (for _bulk: record number)")
    field: str | None = Field(description="dotted path of the offending field, when one is to blame")
    message: str


class IngestResponse(BaseModel):
    """202: the accepted items are committed; rejected ones are kept in failed_records."""

    accepted: int = Field(description="records newly stored")
    duplicates: int = Field(description="records already stored (a retry or a replay); not stored twice")
    rejected: int = Field(description="items refused; each is listed in errors and kept in failed_records")
    errors: list[ItemErrorOut]


class ErrorOut(BaseModel):
    """A refused request: what went wrong and, for malformed JSON, where."""

    error: str
    message: str
    line: int | None = None
    column: int | None = None


class RejectedOut(ErrorOut):
    """422: every item was rejected (``error`` AllRejected, the first reasons in ``message``; each item kept in
    failed_records), or an input the collector could not process (``error`` Unprocessable; body kept)."""

    accepted: int | None = Field(None, description="AllRejected: 0")
    duplicates: int | None = Field(None, description="AllRejected: 0")
    rejected: int | None = Field(None, description="AllRejected: items refused, every item of the request")
    errors: list[ItemErrorOut] | None = Field(None, description="AllRejected: why each item was refused")


_NDJSON_TYPES = ("application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines")
# Beacons (navigator.sendBeacon) and some senders use text/plain or no type at all: read those as JSON too.
_JSON_TYPES = ("application/json", "text/plain", "application/octet-stream", "")


class UnsupportedType(RequestError):
    """Content type the collector cannot read (415)."""

    status_code = 415


def _ndjson(headers: Mapping[str, str]) -> bool:
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media in _NDJSON_TYPES:
        return True
    if media in _JSON_TYPES or media.endswith("+json"):
        return False
    raise UnsupportedType(
        f"content type {media!r} is not supported: send application/json (one object or an "
        "array) or application/x-ndjson (one object per line)"
    )


def _body_doc(kind: Kind | None) -> dict[str, Any]:
    """OpenAPI request body of an ingest route (the routes read raw bytes, so FastAPI cannot infer it)."""
    if kind is None:
        content: dict[str, Any] = {
            "application/x-ndjson": {
                "schema": {
                    "type": "string",
                    "description": "OpenSearch _bulk body: for each record an action line "
                    '{"index": {"_index": "ubi_queries"|"ubi_events", "_id": "..."}} then the document',
                }
            }
        }
    else:
        model = "UbiQuery" if kind == "query" else "UbiEvent"
        ref = {"$ref": f"#/components/schemas/{model}"}
        content = {
            "application/json": {"schema": {"oneOf": [ref, {"type": "array", "items": ref}]}},
            "application/x-ndjson": {
                "schema": {"type": "string", "description": f"one {model} JSON object per line"}
            },
        }
    return {"requestBody": {"required": True, "content": content}}


_INGEST_RESPONSES: dict[int | str, dict[str, Any]] = {
    202: {"model": IngestResponse},
    400: {
        "model": ErrorOut,
        "description": "malformed JSON (line and column given); body kept in failed_records",
    },
    413: {"model": ErrorOut, "description": "body over max_body_bytes or more than max_items items"},
    415: {"model": ErrorOut, "description": "content type other than JSON or NDJSON; body kept"},
    422: {
        "model": RejectedOut,
        "description": "every item rejected (AllRejected: the first reasons named, each item kept in failed_records),"
        " or an input the collector could not process (Unprocessable: body kept, please report)",
    },
    503: {
        "model": ErrorOut,
        "description": "the sink could not commit; nothing was stored, retry (Retry-After)",
    },
}


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body straight from the ASGI ``receive``, refusing (413) as soon as it exceeds ``limit``.

    Content-Length is checked first, and bytes are counted while streaming, so a body that lies about its
    length or is sent chunked cannot get past the limit.
    """
    for name, value in scope["headers"]:
        if name == b"content-length":
            if value.isdigit() and int(value) > limit:
                raise TooLarge(
                    f"body of {value.decode()} bytes is over the limit of {limit} bytes: split it into batches"
                )
            break
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("the client closed the connection before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"body is over the limit of {limit} bytes: split it into batches")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class UnsupportedEncoding(RequestError):
    """A ``Content-Encoding`` other than gzip (415); the body is not read, so nothing is kept."""

    status_code = 415
    keep = False


def content_encoding(scope: Scope) -> str | None:
    """``gzip`` for a gzip body, None for a plain one; 415 for any other ``Content-Encoding``."""
    codings = [
        c.strip().lower()
        for name, value in scope["headers"]
        if name == b"content-encoding"
        for c in value.decode("latin-1").split(",")
        if c.strip() and c.strip().lower() != "identity"
    ]
    if not codings:
        return None
    if codings in (["gzip"], ["x-gzip"]):
        return "gzip"
    raise UnsupportedEncoding(
        f"Content-Encoding {', '.join(codings)!r} is not supported: send the body as is, or gzip-compressed "
        "with Content-Encoding: gzip"
    )


class ClientGone(RequestError):
    """The client disconnected mid-body; nothing was read, so nothing is kept (499, never sent)."""

    status_code = 499
    keep = False


async def read_request(collector: Collector, scope: Scope, receive: Receive, ctx: IngestContext) -> bytes:
    """An ingest request's body, decompressed when it says ``Content-Encoding: gzip``; the byte limit
    applies to what is read and again to what it decompresses to."""
    limit = collector.settings.max_body_bytes
    encoding = content_encoding(scope)
    body = await read_body(scope, receive, limit)
    if encoding is None:
        return body
    try:
        return gunzip(body, limit) if len(body) < 65536 else await asyncio.to_thread(gunzip, body, limit)
    except NotGzip as exc:
        await collector.keep_body(body, ctx, reason=exc.message, kind=exc.kind)
        raise


async def ingest(
    collector: Collector, scope: Scope, receive: Receive, kind: Kind | None, route: str
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Serve one ingest request: (status, headers, body) of the answer, typed errors included.

    Every way into an ingest route ends here: FastAPI's router (documented in OpenAPI), the fast lane
    inside the middleware and the front door outside it (:mod:`ubi_pipeline.collector.app`).
    """
    ctx = IngestContext(
        source=route,
        headers=Headers(scope=scope),
        client=(scope.get("client") or (None,))[0],
        application=scope.get(APPLICATION_SCOPE_KEY),
    )
    try:
        body = await read_request(collector, scope, receive, ctx)
        try:
            ndjson = _ndjson(ctx.headers) if kind is not None else True
        except RequestError as exc:
            await collector.keep_body(body, ctx, reason=exc.message, kind=exc.kind)
            raise
        result = await collector.accept(body, kind=kind, ndjson=ndjson, ctx=ctx)
    except RequestError as exc:
        return error_answer(exc)
    if kind is not None and result.rejected and not (result.accepted or result.duplicates):
        return all_rejected_answer(result)
    payload = orjson.dumps(result.public())
    return 202, [_JSON, (b"content-length", str(len(payload)).encode())], payload


#: How many item errors the message of an :class:`AllRejected` answer names (all are in its ``errors``).
NAMED_ERRORS = 3


def all_rejected_answer(result: IngestResult) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """422 for a request of ``/v1/events``, ``/v1/queries`` (and the reference client's ``/ubi_*``) whose every
    item was rejected: ``{"error": "AllRejected", "message"}`` naming the first errors, then the usual counts and
    ``errors``. ``/v1/bulk`` keeps its 202 (``ubi import`` reads its counts chunk by chunk)."""
    named = [f"item {e.index}" + (f" field {e.field}" if e.field else "") + f": {e.message}"
             for e in result.errors[:NAMED_ERRORS]]
    more = result.rejected - len(named)
    message = (f"every item was rejected ({result.rejected}), nothing was stored: " + "; ".join(named)
               + (f"; and {more} more (see errors)" if more > 0 else "")
               + ". Each item is kept in failed_records (`ubi failed`)")
    payload = orjson.dumps({"error": AllRejected.__name__, "message": message, **result.public()})
    return AllRejected.status_code, [_JSON, (b"content-length", str(len(payload)).encode())], payload


_JSON = (b"content-type", b"application/json")


def _ingest_route(path: str, kind: Kind | None, doc: str) -> None:
    # What FastAPI dispatches (and documents). In practice the fast lane and the front door serve these
    # paths before the router is reached; all three call the same :func:`ingest`.
    async def endpoint(request: Request) -> Response:
        status, headers, payload = await ingest(
            request.app.state.collector, request.scope, request.receive, kind, path
        )
        return Response(payload, status_code=status, headers={k.decode(): v.decode() for k, v in headers})

    endpoint.__doc__ = doc
    endpoint.__name__ = "post" + path.replace("/", "_")
    router.add_api_route(
        path,
        endpoint,
        methods=["POST"],
        status_code=202,
        responses=_INGEST_RESPONSES,
        openapi_extra=_body_doc(kind),
        response_class=ORJSONResponse,
        tags=["ingest"],
    )
    INGEST_ROUTES[path] = kind


_ingest_route("/v1/queries", "query", "Store UBI query records: one object, a JSON array, or NDJSON.")
_ingest_route("/v1/events", "event", "Store UBI events: one object, a JSON array, or NDJSON.")
_ingest_route(
    "/ubi_queries", "query", "Store UBI query records as the OpenSearch reference client posts them."
)
_ingest_route("/ubi_events", "event", "Store UBI events as the OpenSearch reference client posts them.")
_ingest_route("/v1/bulk", None, "Replay an OpenSearch _bulk export of ubi_queries and ubi_events.")

# ---------------------------------------------------------------- metrics
# (``/healthz``, ``/v1/failed`` and the store admin routes are the store's admin protocol, ``ubi_pipeline.transport.admin``,
# mounted by ``ubi_pipeline.collector.app.create_app``.)


@router.get("/metrics", response_class=PlainTextResponse, tags=["ops"])
async def metrics(collector: CollectorDep) -> Response:
    """Prometheus metrics (text exposition format 0.0.4)."""
    sink = collector.sink
    labels: Labels = (("sink", sink.name),)
    gauges: dict[str, tuple[str, dict[Labels, float]]] = {
        f"ubi_sink_{name}": (f"{sink.name} sink: {name.replace('_', ' ')}", {labels: value})
        for name, value in sink.gauges().items()
    }
    pool = collector.parse_pool
    for name, value, what in (
        ("workers", pool.live_workers(), "parse worker processes running"),
        ("bodies_total", pool.handed, "request bodies parsed by a worker"),
        ("fallbacks_total", pool.fell_back, "large bodies a worker gave back to the collector's process"),
    ):
        gauges[f"ubi_parse_{name}"] = (what, {(): float(value)})
    return PlainTextResponse(collector.metrics.render(gauges), media_type="text/plain; version=0.0.4")


# ---------------------------------------------------------------- interleaving (ubi_pipeline.schemas.interleaving)


class InterleaveRequest(BaseModel):
    """Two rankings of one search to interleave; the first is the reference (e.g. the production ranker)."""

    query_id: str = Field(min_length=1, description="the search's query_id: the same id always gets the same list")
    rankings: dict[str, list[str]] = Field(
        description='exactly two rankings, name -> doc ids best first, e.g. {"baseline": [...], "candidate": [...]}')
    size: int | None = Field(None, ge=0, description="results to return (default: the longer ranking's length)")


class InterleaveResponse(BaseModel):
    """The interleaved list to show, the team of each result, and the block to log in query_attributes."""

    query_id: str
    hits: list[str]
    teams: dict[str, str] = Field(description="doc id -> name of the ranking that contributed it")
    method: str = Field(description="team_draft (Radlinski, Kurup & Joachims, CIKM 2008)")
    query_attributes: dict[str, Any] = Field(
        description="merge into the query record's query_attributes so that `ubi report` can credit the clicks")


@router.post(
    "/v1/interleave", response_model=InterleaveResponse, tags=["interleaving"],
    responses={400: {"model": ErrorOut}, 413: {"model": ErrorOut}},
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": InterleaveRequest.model_json_schema()}}}},
)
async def interleave(request: Request, collector: CollectorDep) -> dict[str, Any]:
    """Team-draft interleave two rankings, seeded per query_id (a retry gets the same list)."""
    # Read as the ingest routes are (max_body_bytes, 413) and parsed by orjson, which refuses NaN and lone
    # surrogates; a large body is parsed and interleaved off the event loop.
    body = await read_body(request.scope, request.receive, collector.settings.max_body_bytes)
    seed = collector.settings.seed
    if len(body) < 65536:
        return _interleave(body, seed)
    return await asyncio.to_thread(_interleave, body, seed)


def _interleave(body: bytes, seed: int) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    if isinstance(value, dict) and dropped_keys(body, value):
        repeated = duplicate_keys(body)
        raise RequestError(f"duplicate key {repeated[0] if repeated else '?'!r}: send each key once")
    try:
        req = InterleaveRequest.model_validate(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise RequestError(f"{where}: {first['msg']}") from exc
    try:
        result = team_draft(req.query_id, req.rankings, size=req.size, seed=seed)
    except InterleavingError as exc:
        raise RequestError(str(exc)) from exc
    return {"query_id": result.query_id, "hits": result.hits, "teams": result.teams, "method": METHOD,
            "query_attributes": result.query_attributes()}
