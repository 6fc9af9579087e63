"""The review page's HTTP app (``ubi review serve``): the page at ``/review`` and its JSON routes.

On loopback (the default) every route answers only to loopback host names in ``Host`` and ``Origin``
(:func:`ubi_pipeline.transport.admin.refused_host`: a page reached through DNS rebinding is refused). Bound to
any other address, ``UBI_REVIEW_TOKEN`` must be set and every ``/review/api`` request carry it (``X-Review-Token``;
the page takes it once from ``?token=`` and keeps it for the tab), and a browser's ``Origin`` must be the page's
own (:func:`ubi_pipeline.collector.security.origin_allowed`). The page builds everything it shows with
``textContent`` and attributes, never ``innerHTML`` with data: document fields are untrusted.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from importlib.resources import files
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ubi_pipeline.collector.security import is_loopback, origin_allowed
from ubi_pipeline.collector.server import bind_socket, make_server, server_config
from ubi_pipeline.review.session import ASSESSOR_MAX, NOTE_MAX, ReviewPageError, ReviewSession
from ubi_pipeline.schemas.errors import StoreError, UbiError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.transport.admin import refused_host

STATIC = files("ubi_pipeline.review") / "static"
TOKEN_HEADER = "x-review-token"
#: what the page may load: its own script and style, document images from anywhere on http(s), nothing else
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' https: http:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class Forbidden(ReviewPageError):
    """A request from a host, origin or without the token the page answers to (403)."""

    status_code = 403


class PairIn(BaseModel):
    """Which pair an assessor acts on."""

    assessor: str = Field(max_length=ASSESSOR_MAX)
    query: str = Field(max_length=4096)
    doc_id: str = Field(max_length=4096)


class GradeIn(PairIn):
    """A grade, with the assessor's optional note."""

    grade: int
    note: str | None = Field(default=None, max_length=NOTE_MAX)


class AssessorIn(BaseModel):
    assessor: str = Field(max_length=ASSESSOR_MAX)


class _Headers:
    """Security headers on every answer (CSP, no framing, no sniffing, no referrer carrying the token)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] += [(b"content-security-policy", CSP.encode()),
                                       (b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff"),
                                       (b"referrer-policy", b"no-referrer"), (b"cache-control", b"no-store")]
            await send(message)

        await self.app(scope, receive, send_with)


def create_review_app(session: ReviewSession, settings: Settings, *, host: str = "127.0.0.1") -> FastAPI:
    """The app serving ``session``; ``host`` is the address it is bound to (loopback unless a token is set)."""
    token = settings.review_token.get_secret_value() if settings.review_token is not None else None
    loopback = is_loopback(host)
    if not loopback and not token:
        raise UbiError(f"--host {host} exposes the review page beyond this machine: set UBI_REVIEW_TOKEN (every "
                       "request must carry it), or keep the default 127.0.0.1")
    own_hosts = [host, *settings.admin_hosts]

    def guard(request: Request) -> None:
        origin = request.headers.get("origin")
        if loopback:
            why = refused_host(request.headers.get("host"), origin, settings.admin_hosts)
            if why is not None:
                raise Forbidden(why.replace("admin routes", "the review page"))
        elif origin is not None and not origin_allowed(origin, request.headers.get("host"), [], own_hosts):
            raise Forbidden(f"Origin {origin!r} is not the review page's own")
        if token is not None:
            given = request.headers.get(TOKEN_HEADER, "")
            if not hmac.compare_digest(given.encode(), token.encode()):
                raise Forbidden("missing or wrong review token: open the page with ?token=<UBI_REVIEW_TOKEN>")

    api = APIRouter(prefix="/review/api", dependencies=[Depends(guard)])
    app = FastAPI(title="ubi review", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_Headers)
    app.mount("/review/static", StaticFiles(directory=str(STATIC)), name="review-static")

    @app.exception_handler(UbiError)
    async def _error(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, ReviewPageError) else 503 if isinstance(exc, StoreError) else 400
        return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status_code=status)

    @app.get("/review", include_in_schema=False)
    def page() -> Response:
        """The review page (its data comes from /review/api)."""
        return FileResponse(str(STATIC / "review.html"), media_type="text/html")

    @api.get("/config")
    def config() -> dict[str, Any]:
        """Scale, rubric and mode of this review."""
        return {"grade_max": settings.grade_max, "blind": session.blind, "rubric": session.rubric._asdict(),
                "assessors_per_pair": session.queue.assessors_per_pair, "pairs": len(session.queue.items)}

    @api.get("/next")
    def next_pair(assessor: Annotated[str, Query(max_length=ASSESSOR_MAX)]) -> dict[str, Any]:
        """The next pair this assessor should grade, and their progress."""
        return session.next(assessor)

    @api.get("/pair")
    def one_pair(assessor: Annotated[str, Query(max_length=ASSESSOR_MAX)],
                 query: Annotated[str, Query(max_length=4096)],
                 doc_id: Annotated[str, Query(max_length=4096)]) -> dict[str, Any]:
        """A given pair of the queue (to adjudicate a disagreement)."""
        return session.pair(assessor, query, doc_id)

    @api.post("/grade")
    def grade(body: GradeIn) -> dict[str, Any]:
        """Store a grade now; answers with the next pair."""
        return session.grade(body.assessor, body.query, body.doc_id, body.grade, body.note)

    @api.post("/skip")
    def skip(body: PairIn) -> dict[str, Any]:
        """Pass a pair by; answers with the next pair."""
        return session.skip(body.assessor, body.query, body.doc_id)

    @api.post("/undo")
    def undo(body: AssessorIn) -> dict[str, Any]:
        """Take back the assessor's last grade or skip; answers with that pair."""
        return session.undo(body.assessor)

    @api.get("/progress")
    def progress() -> list[dict[str, Any]]:
        """Grades, skips and pairs left, per assessor."""
        return session.progress()

    @api.get("/disagreements")
    def disagreements() -> list[dict[str, Any]]:
        """Pairs whose assessors differ, widest spread first."""
        return session.disagreements()

    app.include_router(api)
    return app


def serve_review(session: ReviewSession, settings: Settings, *, host: str = "127.0.0.1", port: int = 8081,
                 ready: Callable[[str], None] | None = None) -> int:
    """Serve the review page on ``host:port`` (0: a free port) until SIGINT/SIGTERM; ``ready(url)`` once it listens."""
    app = create_review_app(session, settings, host=host)
    sock = bind_socket(host, port)
    try:
        bound, real_port = sock.getsockname()[:2]
        shown = "127.0.0.1" if bound in ("0.0.0.0", "") else f"[{bound}]" if ":" in bound else bound
        server = make_server(server_config(app, settings, log_level="warning", timeout_graceful_shutdown=5))
        if ready is not None:
            ready(f"http://{shown}:{real_port}/review")
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
