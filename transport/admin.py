"""The one admin protocol of a store's writer: seal, load, failed, health.

DuckDB has one writing process: a running collector (``ubi serve``) or a DuckDB loader (``ubi consume
--db``). Readers find that process through the sidecar file (:func:`ubi_pipeline.store.client.sidecar_path`) and ask it,
over HTTP on loopback, for what they cannot do themselves while it holds the file:

* ``POST /v1/admin/seal``: seal the rows stored since the last seal into Parquet segments
  (:meth:`Store.seal`) and answer with every segment to read and the small derived tables
  (:func:`ubi_pipeline.store.sealed.encode_seal`);
* ``POST /v1/admin/load/{table}?replace_source=...``: rows of a derived table as an Arrow IPC stream;
* ``POST /v1/admin/delete/{table}``: the keys of derived-table rows to delete, as an Arrow IPC stream;
* ``GET /v1/failed``: a page of ``failed_records``;
* ``GET /healthz``: whether the writer is healthy, and its own state.

Both processes mount this one router with :func:`install` (the loader in a small app of its own), so
the protocol cannot drift between them. What differs is the :class:`AdminHost`: where the store is (the
collector's sink may have none) and what health says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Annotated, Any, ClassVar, Protocol
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.store.duckdb_store import LOADABLE_TABLES, Store
from ubi_pipeline.store.failed import failed_page
from ubi_pipeline.store.sealed import MEDIA_TYPE, encode_seal


class AdminError(StoreError):
    """An admin request that cannot be served; ``status_code`` is the answer."""

    status_code: ClassVar[int] = 400


class NoStore(AdminError):
    """The process serving the admin routes writes to no local store (e.g. the Kafka sink): 501."""

    status_code = 501


class LoadTooLarge(AdminError):
    """A load body over ``max_load_bytes`` (413)."""

    status_code = 413


class BadLoad(AdminError):
    """A load body that is not an Arrow IPC stream, or does not fit the table (400)."""

    status_code = 400


class WrongHost(AdminError):
    """An admin request whose ``Host`` (or ``Origin``) names a host not on the allow-list (403)."""

    status_code = 403


class SealUnavailable(AdminError):
    """A seal that could not be written, e.g. on a full disk (503: try again once there is room)."""

    status_code = 503


#: Host names the admin routes always answer to: the loopback ones.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def host_name(netloc: str) -> str:
    """The host of a ``Host`` header or URL netloc, lower-cased, port removed (IPv6 kept in brackets)."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        end = netloc.find("]")
        return netloc[: end + 1] if end > 0 else netloc
    if netloc.count(":") > 1:  # a bare IPv6 address, as configured: the Host header brackets it
        return f"[{netloc}]"
    return netloc.rsplit(":", 1)[0] if ":" in netloc else netloc


def refused_host(host_header: str | None, origin: str | None, extra: Iterable[str]) -> str | None:
    """Why an admin request is refused for its ``Host``/``Origin``, or ``None`` when both name allowed hosts.

    A page reached through DNS rebinding talks to the loopback collector under its own name
    (``Host: evil.example:8000``), so the peer address alone cannot tell it from a local tool: the name can.
    A browser's ``Origin`` must name an allowed host too, so no other page can post to the admin routes.
    """
    allowed = {*LOOPBACK_HOSTS, *(host_name(h) for h in extra)}
    names = ", ".join([*LOOPBACK_HOSTS, *extra])
    hint = f"admin routes answer only to the host names {names}; add a name to UBI_ADMIN_HOSTS to allow it"
    if not host_header or host_name(host_header) not in allowed:
        return f"Host {host_header!r} is not allowed: {hint}"
    if origin is not None and (origin == "null" or host_name(urlsplit(origin).netloc) not in allowed):
        return f"Origin {origin!r} is not allowed: {hint}"
    return None


class AdminHost(Protocol):
    """What the process mounting the admin routes provides."""

    #: Largest body ``POST /v1/admin/load`` reads, in bytes.
    max_load_bytes: int
    @property
    def admin_hosts(self) -> Sequence[str]:
        """Host names the admin routes answer to besides :data:`LOOPBACK_HOSTS` (``Settings.admin_hosts``)."""
        ...

    def admin_store(self) -> Store:
        """The store this process writes; raises :class:`NoStore` when it has none."""
        ...

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, state shown by ``/healthz``)."""
        ...


async def get_host(request: Request) -> AdminHost:
    """The :class:`AdminHost` of the app serving ``request`` (set by :func:`install`)."""
    host: AdminHost = request.app.state.admin_host
    return host


async def get_store(host: Annotated[AdminHost, Depends(get_host)]) -> Store:
    """The host's store; 501 when it has none."""
    return host.admin_store()


async def check_host(request: Request, host: Annotated[AdminHost, Depends(get_host)]) -> None:
    """Refuse (403) a request whose Host or Origin is not an allowed name (:func:`refused_host`)."""
    why = refused_host(request.headers.get("host"), request.headers.get("origin"), host.admin_hosts)
    if why is not None:
        raise WrongHost(f"{request.url.path}: {why}")


HostDep = Annotated[AdminHost, Depends(get_host)]
StoreDep = Annotated[Store, Depends(get_store)]

router = APIRouter()
#: The routes that read stored bodies or write the store: behind the Host allow-list (``/healthz`` is not).
guarded = APIRouter(dependencies=[Depends(check_host)])

LoadableTable = Enum("LoadableTable", {name: name for name in LOADABLE_TABLES}, type=str)  # type: ignore[misc]


class FailedOut(BaseModel):
    """One kept failed record; ``raw`` is text when it is UTF-8, else base64 (see ``raw_encoding``)."""

    failed_id: str
    received_at: str
    source: str
    kind: str
    item_index: int | None
    field: str | None
    reason: str
    raw: str | None
    raw_encoding: str | None = Field(description="utf-8 or base64")
    kafka_topic: str | None = None
    kafka_partition: int | None = None
    kafka_offset: int | None = None


class FailedPage(BaseModel):
    """A page of failed records, newest first."""

    total: int
    offset: int
    items: list[FailedOut]
    next_offset: int | None


@router.get("/healthz", tags=["ops"])
async def healthz(host: HostDep) -> JSONResponse:
    """Liveness and the writer's state: 200 when it is healthy, else 503."""
    ok, state = host.health()
    return JSONResponse({"status": "ok" if ok else "degraded", **state}, status_code=200 if ok else 503)


@guarded.get("/v1/failed", response_model=FailedPage, tags=["failed"])
async def get_failed(
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="records per page")] = 100,
    offset: Annotated[int, Query(ge=0, le=2**62, description="records to skip (newest first)")] = 0,
    kind: Annotated[
        str | None, Query(max_length=100, description="only this kind (event, query, body, ...)")
    ] = None,
) -> Any:
    """List kept failed records (rejected items and unparseable bodies), newest first."""
    return await asyncio.to_thread(failed_page, store, limit=limit, offset=offset, kind=kind)


@guarded.post("/v1/admin/seal", tags=["admin"],
              responses={200: {"content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}})
async def admin_seal(store: StoreDep) -> Response:
    """Seal what was stored since the last seal (one read transaction; ingestion goes on) and list every segment.

    The body is a length-prefixed JSON header naming the segment files, then the rows of ``judgments`` and
    ``human_judgments`` as Arrow IPC streams (:func:`ubi_pipeline.store.sealed.encode_seal`).
    """
    try:
        sealed = await asyncio.to_thread(store.seal)
    except StoreError as exc:  # full disk, unwritable seal directory, store closing: try again later
        raise SealUnavailable(str(exc)) from exc
    return Response(b"".join(encode_seal(sealed)), media_type=MEDIA_TYPE)


async def _read_limited(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is over ``limit`` bytes, whatever Content-Length says."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise LoadTooLarge(f"body of {declared} bytes is over the load limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise LoadTooLarge(f"body is over the load limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@guarded.post(
    "/v1/admin/load/{table}",
    tags=["admin"],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/vnd.apache.arrow.stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def admin_load(
    table: LoadableTable,
    request: Request,
    host: HostDep,
    replace_source: Annotated[str | None, Query(max_length=200)] = None,
) -> dict[str, Any]:
    """Insert or replace rows of a derived table from an Arrow IPC stream; ``replace_source`` first deletes that source's rows."""
    store = host.admin_store()
    body = await _read_limited(request, host.max_load_bytes)
    try:
        data = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise BadLoad(f"body is not an Arrow IPC stream: {exc}") from exc
    too_long = over_long_strings(data)
    if too_long is not None:
        raise BadLoad(too_long)
    try:
        rows = await asyncio.to_thread(store.load_table, table.value, data, replace_source=replace_source)
    except StoreError as exc:
        raise BadLoad(str(exc)) from exc
    except Exception as exc:  # duckdb rejects columns or types that do not fit
        raise BadLoad(f"rows do not fit table {table.value}: {type(exc).__name__}: {exc}") from exc
    return {"table": table.value, "rows": rows}


@guarded.post(
    "/v1/admin/delete/{table}",
    tags=["admin"],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/vnd.apache.arrow.stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def admin_delete(table: LoadableTable, request: Request, host: HostDep) -> dict[str, Any]:
    """Delete the rows of a derived table whose keys an Arrow IPC stream holds (the review page's undo)."""
    store = host.admin_store()
    body = await _read_limited(request, host.max_load_bytes)
    try:
        keys = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise BadLoad(f"body is not an Arrow IPC stream: {exc}") from exc
    try:
        rows = await asyncio.to_thread(store.delete_rows, table.value, keys)
    except StoreError as exc:
        raise BadLoad(str(exc)) from exc
    except Exception as exc:  # duckdb rejects key values of the wrong type
        raise BadLoad(f"keys do not fit table {table.value}: {type(exc).__name__}: {exc}") from exc
    return {"table": table.value, "deleted": rows}


#: Longest string value a derived table's row may hold through ``/v1/admin/load`` (judgment parameters included):
#: the body limit bounds the load, this bounds one value, so that no row can make the writer's checkpoint fail.
LOAD_STRING_MAX_BYTES = 1024 * 1024


def over_long_strings(data: pa.Table, limit: int = LOAD_STRING_MAX_BYTES) -> str | None:
    """Why ``data`` is refused for a string or binary value over ``limit`` bytes (naming column and row), or None."""
    for name, column in zip(data.column_names, data.columns, strict=True):
        kind = column.type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
                or pa.types.is_large_binary(kind)):
            continue
        sizes = pc.binary_length(column)
        longest = pc.max(sizes).as_py()
        if longest is not None and longest > limit:
            row = pc.index(sizes, longest).as_py()
            return (f"column {name!r}, row {row}: a value of {longest:,} bytes; a derived table takes at most "
                    f"{limit:,} bytes per value")
    return None


async def _admin_error(request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, AdminError):  # registered for AdminError only
        raise exc
    return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status_code=exc.status_code)


def install(app: FastAPI, host: AdminHost) -> None:
    """Mount the admin routes on ``app``, served for ``host``."""
    app.state.admin_host = host
    app.include_router(router)
    app.include_router(guarded)
    app.add_exception_handler(AdminError, _admin_error)
