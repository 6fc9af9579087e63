"""OpenSearch-compatible ingest: the paths and answers of OpenSearch's document APIs, for the UBI indices.

Senders built for OpenSearch (``opensearch-py``'s ``helpers.bulk``, ``index`` and ``create``, Data Prepper's
OpenSearch sink, Logstash's and Fluent Bit's OpenSearch outputs, ``curl`` with a ``_bulk`` file) count an
item as written from its ``status`` in the answer and retry only the items that failed. So these routes
answer as OpenSearch does (field names and statuses of its REST API reference, "Bulk" and "Index
document"):

* ``POST|PUT /_bulk`` and ``/{index}/_bulk``: 200 with ``{"took", "errors", "items": [{"index"|"create":
  {"_index", "_id", "status", "result" | "error": {"type", "reason"}}}]}``, one item per action, in order;
* ``POST /{index}/_doc``, ``POST|PUT /{index}/_doc/{id}``: 201 ``{"result": "created", ...}``;
* ``POST|PUT /{index}/_create/{id}``: 201, or 409 ``version_conflict_engine_exception`` when the id is taken.

``{index}`` (and each ``_index`` of a ``_bulk`` body) must be one of ``Settings.query_index`` and
``Settings.event_index`` (``ubi_queries``, ``ubi_events``): it is only ever looked up in that list, never
used to build SQL or a path; any other name is OpenSearch's 404 ``index_not_found_exception``.

How the collector's outcomes map (an event's ``_id`` is its ``event_id``; a query record's key is its
``query_id``): stored -> 201 ``created``; already stored with the same content (a retry) -> 200 ``noop`` for
``index`` (nothing is written twice) and 409 for ``create`` (as OpenSearch, whose ``create`` never
overwrites); stored with other content -> 409 (first write wins, the item is kept in ``failed_records``);
invalid -> 400 ``mapper_parsing_exception`` naming the field.

The connectivity checks of OpenSearch clients are answered too: ``GET /`` with the cluster's identity (``name``,
``cluster_name``, ``version.distribution`` and ``version.number``, ``tagline``: opensearch-py's ``info()``),
``HEAD /`` 200 (its ``ping()``), and ``HEAD /{index}`` 200 for the UBI indices and 404 for any other name
(``indices.exists()``). A browser asking ``/`` for HTML is sent to the app's home page when it has one (the demo
site sets ``app.state.home_page``).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.datastructures import Headers

from ubi_pipeline.collector.bodies import BodyError, Kind, RawItem, bulk_id, parse_bulk, parse_items
from ubi_pipeline.collector.deps import Collector
from ubi_pipeline.collector.errors import RequestError
from ubi_pipeline.collector.ingest import APPLICATION_SCOPE_KEY, IngestContext, IngestResult, ItemError
from ubi_pipeline.collector.routes import read_request
from ubi_pipeline.store.rows import RowStatus

router = APIRouter(tags=["opensearch"])

#: What OpenSearch adds to every written item; constant here (the collector has no shards or versions).
_WRITTEN = {"_version": 1, "_shards": {"total": 1, "successful": 1, "failed": 0}, "_seq_no": 0, "_primary_term": 1}

#: OpenSearch's error type for a refused request, by status.
_ERROR_TYPES = {
    400: "parse_exception",
    401: "security_exception",
    403: "security_exception",
    404: "index_not_found_exception",
    409: "version_conflict_engine_exception",
    413: "content_too_long_exception",
    415: "illegal_argument_exception",
    422: "illegal_argument_exception",
    429: "rejected_execution_exception",
    500: "exception",
    503: "unavailable_shards_exception",
}


def _json(content: Any, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status, headers=headers, media_type="application/json")


def error_response(
    status: int, kind: str, reason: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    """OpenSearch's error body: ``{"error": {"root_cause": [...], "type", "reason"}, "status"}``."""
    cause = {"type": kind, "reason": reason, **extra}
    return _json({"error": {"root_cause": [cause], **cause}, "status": status}, status, headers)


def _no_such_index(collector: Collector, name: str) -> Response:
    known = " and ".join(collector.indices)
    where: dict[str, Any] = {
        "index": name, "resource.type": "index_or_alias", "resource.id": name, "index_uuid": "_na_"
    }
    return error_response(
        404,
        "index_not_found_exception",
        f"no such index [{name}]: this collector takes {known} (UBI_QUERY_INDEX, UBI_EVENT_INDEX)",
        **where,
    )


def _refused(exc: RequestError) -> Response:
    kind = _ERROR_TYPES.get(exc.status_code, "exception")
    return error_response(exc.status_code, kind, exc.message, headers=exc.headers)


# ---------------------------------------------------------------- the cluster


#: The OpenSearch release whose REST answers these routes follow: ``version.number`` is what a client reads to
#: pick its protocol (2.x: document APIs without mapping types, ``_bulk`` item statuses as here).
OPENSEARCH_API_VERSION = "2.19.0"


def cluster_info() -> dict[str, Any]:
    """``GET /`` as OpenSearch answers it; the build fields say what answers (the collector, not a node)."""
    try:
        ours = importlib.metadata.version("ubi-pipeline")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        ours = "unknown"
    return {
        "name": "ubi-pipeline-collector",
        "cluster_name": "ubi-pipeline",
        "cluster_uuid": "_na_",
        "version": {
            "distribution": "opensearch",
            "number": OPENSEARCH_API_VERSION,
            "build_type": f"ubi-pipeline {ours}",
            "build_snapshot": False,
            "minimum_wire_compatibility_version": "7.10.0",
            "minimum_index_compatibility_version": "7.0.0",
        },
        "tagline": "The OpenSearch Project: https://opensearch.org/ (UBI collector of ubi-pipeline)",
    }


def _wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


@router.get("/", summary="OpenSearch cluster info (what opensearch-py's info() reads)")
async def root(request: Request) -> Response:
    home = getattr(request.app.state, "home_page", None)
    if home is not None and _wants_html(request):  # a person with a browser, not a client library
        return RedirectResponse(home)
    return _json(cluster_info(), 200)


@router.head("/", summary="OpenSearch ping (opensearch-py's ping())")
async def ping() -> Response:
    return Response(status_code=200, media_type="application/json")


@router.head("/{index}", summary="OpenSearch index exists: 200 for the UBI indices this collector takes, else 404")
async def index_exists(index: str, request: Request) -> Response:
    collector: Collector = request.app.state.collector
    return Response(status_code=200 if index in collector.indices else 404, media_type="application/json")


# ---------------------------------------------------------------- items


def _item_error(err: ItemError) -> tuple[int, dict[str, Any]]:
    if err.kind == "conflict":
        return 409, {"type": "version_conflict_engine_exception", "reason": err.message}
    if err.field == "_index":
        return 404, {"type": "index_not_found_exception", "reason": err.message}
    if err.field in ("_id", "action"):
        return 400, {"type": "illegal_argument_exception", "reason": err.message}
    return 400, {"type": "mapper_parsing_exception", "reason": err.message, "field": err.field}


def item_answer(item: RawItem, result: IngestResult, errors: dict[int, ItemError]) -> dict[str, Any]:
    """One item of a ``_bulk`` answer (also the body of a ``_doc`` / ``_create`` answer)."""
    out: dict[str, Any] = {"_index": item.index_name, "_id": item.event_id}
    err = errors.get(item.index)
    if err is not None:
        status, error = _item_error(err)
        error["index"] = item.index_name
        return {**out, "status": status, "error": error}
    state, key = result.item_status.get(item.index, (RowStatus.INSERTED, item.event_id or ""))
    if item.event_id is None:
        out["_id"] = key or None
    if state == RowStatus.DUPLICATE and item.action == "create":
        reason = f"[{out['_id']}]: version conflict, document already exists (current version [1])"
        error = {"type": "version_conflict_engine_exception", "reason": reason, "index": item.index_name}
        return {**out, "status": 409, "error": error}
    if state == RowStatus.DUPLICATE:
        return {**out, **_WRITTEN, "result": "noop", "status": 200}
    return {**out, **_WRITTEN, "result": "created", "status": 201}


async def _accept(
    request: Request, source: str, parse: Callable[[bytes], list[RawItem]]
) -> tuple[list[RawItem], IngestResult] | Response:
    """Read, parse (``parse`` also keeps the items, for the answer) and store one body."""
    collector: Collector = request.app.state.collector
    scope = request.scope
    ctx = IngestContext(
        source=source,
        headers=Headers(scope=scope),
        client=(scope.get("client") or (None,))[0],
        application=scope.get(APPLICATION_SCOPE_KEY),
    )
    seen: list[RawItem] = []

    def parse_and_keep(body: bytes) -> list[RawItem]:
        seen.extend(parse(body))
        return seen

    try:
        body = await read_request(collector, scope, request.receive, ctx)
        result = await collector.accept(body, kind=None, ndjson=True, ctx=ctx, parse=parse_and_keep)
    except RequestError as exc:
        return _refused(exc)
    return seen, result


# ---------------------------------------------------------------- _bulk


async def _bulk(request: Request, index: str | None) -> Response:
    collector: Collector = request.app.state.collector
    indices = collector.indices
    if index is not None and index not in indices:
        return _no_such_index(collector, index)
    started = time.perf_counter()
    source = f"/{index}/_bulk" if index else "/_bulk"
    got = await _accept(request, source, lambda body: parse_bulk(body, indices=indices, default_index=index))
    if isinstance(got, Response):
        return got
    items, result = got
    errors = {e.index: e for e in result.errors}
    answers = [{item.action if item.action in ("index", "create") else "index": item_answer(item, result, errors)}
               for item in items]
    took = round(1000 * (time.perf_counter() - started))
    failed = any(next(iter(a.values()))["status"] >= 300 for a in answers)
    return _json({"took": took, "errors": failed, "items": answers}, 200)


_BULK_DOC = "OpenSearch _bulk: index and create actions into the UBI indices, answered item by item."


async def bulk(request: Request) -> Response:
    return await _bulk(request, None)


async def index_bulk(index: str, request: Request) -> Response:
    return await _bulk(request, index)


# ---------------------------------------------------------------- one document


def _one_document(kind: Kind, index: str, doc_id: str | None, action: str) -> Callable[[bytes], list[RawItem]]:
    def parse(body: bytes) -> list[RawItem]:
        items = parse_items(body, kind)
        if len(items) != 1 or (items[0].error is None and not isinstance(items[0].value, dict)):
            raise BodyError("expected one JSON object, the document (send several with _bulk)")
        item = dataclasses.replace(items[0], action=action, index_name=index)
        if doc_id is not None:
            checked, why = bulk_id({"_id": doc_id})
            if why is not None:
                return [dataclasses.replace(item, value=None, error=why, field="_id", event_id=doc_id[:100])]
            item = dataclasses.replace(item, event_id=checked)
        return [item]

    return parse


async def _document(request: Request, index: str, doc_id: str | None, action: str) -> Response:
    collector: Collector = request.app.state.collector
    kind = collector.indices.get(index)
    if kind is None:
        return _no_such_index(collector, index)
    got = await _accept(request, f"/{index}/_{'create' if action == 'create' else 'doc'}",
                        _one_document(kind, index, doc_id, action))
    if isinstance(got, Response):
        return got
    items, result = got
    answer = item_answer(items[0], result, {e.index: e for e in result.errors})
    status = answer.pop("status")
    if "error" in answer:
        return error_response(status, answer["error"]["type"], answer["error"]["reason"], index=index)
    return _json(answer, status)


@router.post("/{index}/_doc", summary="OpenSearch index document (id chosen by the collector)")
async def index_document(index: str, request: Request) -> Response:
    return await _document(request, index, None, "index")


async def index_document_with_id(index: str, doc_id: str, request: Request) -> Response:
    return await _document(request, index, doc_id, "index")


async def create_document(index: str, doc_id: str, request: Request) -> Response:
    return await _document(request, index, doc_id, "create")


# POST and PUT each, with an operation id of their own (one route with both methods would share one).
for _method in ("POST", "PUT"):
    _m = _method.lower()
    router.add_api_route("/_bulk", bulk, methods=[_method], operation_id=f"opensearch_bulk_{_m}",
                         summary="OpenSearch _bulk", description=_BULK_DOC)
    router.add_api_route("/{index}/_bulk", index_bulk, methods=[_method], operation_id=f"opensearch_index_bulk_{_m}",
                         summary="OpenSearch _bulk into one index",
                         description=_BULK_DOC + " Action lines without _index go to {index}.")
    router.add_api_route("/{index}/_doc/{doc_id}", index_document_with_id, methods=[_method],
                         operation_id=f"opensearch_index_document_{_m}", summary="OpenSearch index document")
    router.add_api_route("/{index}/_create/{doc_id}", create_document, methods=[_method],
                         operation_id=f"opensearch_create_document_{_m}", summary="OpenSearch create document")


__all__: Sequence[str] = ["OPENSEARCH_API_VERSION", "cluster_info", "error_response", "item_answer", "router"]
