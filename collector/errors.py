"""Typed errors of the collector that a route answers with a status code (the mapping lives on the class).

Extensions (security, Kafka) subclass :class:`RequestError` with their own status (403, 429, 503) and the
app maps them without knowing them: ``status_code``, ``headers`` and ``kind`` (how the body is kept in
``failed_records``) are all it reads.
"""

from __future__ import annotations

from typing import ClassVar

from ubi_pipeline.schemas.errors import UbiError


class RequestError(UbiError):
    """An error the collector answers with ``status_code``; the body is kept in ``failed_records`` if ``keep``."""

    status_code: ClassVar[int] = 400
    #: ``failed_records.kind`` for the kept body (``body``, ``forbidden``, ...).
    kind: ClassVar[str] = "body"
    #: Whether the request body is kept in ``failed_records`` (False where keeping it would be the attack,
    #: e.g. a body over the size limit).
    keep: ClassVar[bool] = True

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})


class TooLarge(RequestError):
    """A body over the byte limit or with too many items (413)."""

    status_code = 413
    kind = "too_large"
    keep = False


class Unprocessable(RequestError):
    """An input that broke the collector in a way nobody foresaw: kept, answered 422, logged as a bug."""

    status_code = 422
    kind = "unprocessable"


class AllRejected(RequestError):
    """Every item of a request was rejected (422): nothing stored, each item kept in ``failed_records`` on its own.

    Answered instead of a 202 ``{"accepted": 0}``, which clients (the reference JavaScript client, ``fetch``
    with ``response.ok``) take for success, so that the developer sending them hears of it.
    """

    status_code = 422
    kind = "rejected"
    keep = False  # the items are kept one by one, with their reasons


class SinkUnavailable(RequestError):
    """The sink could not make the records durable; nothing was acknowledged (503, retry later)."""

    status_code = 503
    kind = "sink_unavailable"
    keep = False  # the sink is what failed; the client still holds the body and retries

    def __init__(self, message: str, *, retry_after: int = 1, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after), **(headers or {})})


class NotSupported(RequestError):
    """A route this collector's sink cannot serve (e.g. ``/v1/failed`` when writing to Kafka): 501."""

    status_code = 501
    keep = False
