"""What makes the collector safe to expose: origins, API keys, rate limits, and privacy at ingest.

Two layers, both built from :class:`~schemas.settings.Settings` (section "security"):

* :class:`SecurityMiddleware` (ASGI, runs before any body is read) answers a request it refuses without
  touching the store: a browser ``Origin`` that is neither the collector's own nor allowed (403), a missing
  or unknown API key (401), a client over its rate (429 with ``Retry-After``), an admin route asked for from
  another host (403). None of these bodies is stored: storing what an anonymous or flooding sender posts
  would hand them the disk. Browsers additionally get CORS headers from Starlette's ``CORSMiddleware``
  (:func:`install`), so only allowed origins can read the collector's answers.
* Record filters run on validated records before the sink: :class:`ApplicationCheck` refuses (403, body kept
  in ``failed_records`` as kind ``forbidden``) a request in which a record's ``application`` is not its API
  key's, and
  :class:`Privacy` replaces ``client_id``, ``user_id`` and ``session_id`` with a keyed hash and drops the
  fields an operator does not want stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson
from pydantic import ValidationError

from collector.errors import RequestError
from collector.ingest import IngestContext, RecordFilter, Validated
from schemas.errors import UbiError
from schemas.settings import Settings
from schemas.ubi import UbiEvent, UbiQuery

Record = UbiQuery | UbiEvent

#: Header and (for ``navigator.sendBeacon``, which cannot set headers) query parameter carrying the key.
API_KEY_HEADER = "x-api-key"
API_KEY_PARAM = "api_key"

#: Paths that only read the collector's own files or its health: never keyed, never rate limited.
OPEN_PREFIXES = ("/healthz", "/metrics", "/static/", "/openapi.json", "/docs", "/redoc")
#: Paths that expose stored raw bodies or write derived tables: loopback only unless ``admin_remote``.
ADMIN_PREFIXES = ("/v1/admin", "/v1/failed")


class Forbidden(RequestError):
    """Records claim an application their API key does not belong to (403); the body is kept."""

    status_code = 403
    kind = "forbidden"


class Refused(RequestError):
    """A browser origin that may not write, or an admin route asked for from another host (403); not kept."""

    status_code = 403
    kind = "refused"
    keep = False


class Unauthorized(RequestError):
    """A write without a valid API key while keys are configured (401); the body is not stored."""

    status_code = 401
    kind = "unauthorized"
    keep = False


class RateLimited(RequestError):
    """A client over its rate (429); ``Retry-After`` says when a request will be accepted again."""

    status_code = 429
    kind = "rate_limited"
    keep = False


# ---------------------------------------------------------------- API keys


def _digest(key: str) -> bytes:
    # Comparing fixed-length digests keeps compare_digest's time independent of the key's length too.
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    """Which application an ``X-API-Key`` belongs to, checked in constant time against every key."""

    def __init__(self, keys: Mapping[str, Sequence[str]]) -> None:
        self._keys = [(_digest(k), app) for app, ks in keys.items() for k in ks if k]

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        return cls({app: [k.get_secret_value() for k in keys] for app, keys in settings.api_keys.items()})

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def application_for(self, presented: str | None) -> str | None:
        """The application of a presented key, or ``None`` when it matches no configured key."""
        if not presented:
            return None
        digest = _digest(presented)
        found = None
        for known, app in self._keys:  # no early exit: the time taken does not say which key matched
            if hmac.compare_digest(known, digest):
                found = app
        return found


# ---------------------------------------------------------------- rate limits


class RateLimiter:
    """Token buckets per client: ``burst`` tokens, refilled at ``rate`` per second, one token per request.

    At most ``max_clients`` buckets are kept; the least recently seen are forgotten first (a forgotten client
    starts again with a full bucket, which only ever errs towards letting a request through).
    """

    def __init__(self, rate: float, burst: float, *, max_clients: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0 or burst < 1:
            raise UbiError(f"rate limit needs rate >= 0 and burst >= 1, got rate={rate}, burst={burst}")
        self.rate, self.burst, self.max_clients, self.clock = rate, burst, max_clients, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def take(self, client: str, cost: float = 1.0) -> float:
        """Take ``cost`` tokens from ``client``'s bucket: 0.0 when allowed, else seconds until it would be."""
        if not self.enabled:
            return 0.0
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.pop(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            wait = 0.0
            if tokens >= cost:
                tokens -= cost
            else:
                wait = (cost - tokens) / self.rate
            self._buckets[client] = (tokens, now)
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        return wait


# ---------------------------------------------------------------- origins and clients


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def client_ip(scope: Mapping[str, Any], trusted_proxies: int) -> str:
    """The client's address: the socket peer, or with ``trusted_proxies`` = n the n-th last X-Forwarded-For hop."""
    peer = scope.get("client") or ("", 0)
    if trusted_proxies > 0:
        forwarded = _header(scope, b"x-forwarded-for")
        hops = [h.strip() for h in forwarded.split(",") if h.strip()] if forwarded else []
        if len(hops) >= trusted_proxies:
            return hops[-trusted_proxies]
    return str(peer[0])


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def origin_allowed(origin: str, host_header: str | None, allowed: Iterable[str]) -> bool:
    """Whether a browser ``Origin`` may write: the collector's own (same host and port) or a listed one."""
    allowed = list(allowed)
    if "*" in allowed or origin in allowed:
        return True
    if origin == "null" or not host_header:
        return False
    # The own page: the Origin's host[:port] is the Host header (scheme may differ behind a TLS proxy).
    return urlsplit(origin).netloc.lower() == host_header.lower()


# ---------------------------------------------------------------- the middleware


class SecurityMiddleware:
    """Pure ASGI middleware refusing requests before their body is read (see the module docstring)."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.keys = ApiKeys.from_settings(settings)
        self.limiter = RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst)
        self.allowed_origins = list(settings.cors_allow_origins)
        self.trusted_proxies = settings.trusted_proxies
        self.admin_remote = settings.admin_remote

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.check(scope)
        if refusal is not None:
            await _send_error(send, refusal)
            return
        await self.app(scope, receive, send)

    def check(self, scope: dict[str, Any]) -> RequestError | None:
        """The refusal for this request, or ``None`` to let it through."""
        path: str = scope.get("path", "")
        method: str = scope.get("method", "GET")
        if method == "OPTIONS" or path.startswith(OPEN_PREFIXES):
            return None
        ip = client_ip(scope, self.trusted_proxies)
        if path.startswith(ADMIN_PREFIXES) and not self.admin_remote and not is_loopback(ip):
            return Refused(f"{path} is only served to loopback clients; set UBI_ADMIN_REMOTE=true to change that")
        write = method not in ("GET", "HEAD")
        origin = _header(scope, b"origin")
        if write and origin is not None and not origin_allowed(origin, _header(scope, b"host"), self.allowed_origins):
            return Refused(f"origin {origin!r} may not send records here; add it to UBI_CORS_ALLOW_ORIGINS")
        application = presented = None
        keyed = write and self.keys.enabled and not path.startswith(ADMIN_PREFIXES)
        if keyed:
            header = _header(scope, API_KEY_HEADER.encode())
            presented = header or _query_param(scope, API_KEY_PARAM)
            application = self.keys.application_for(presented)
            if application is not None and header is None and presented is not None:
                # A beacon's key came in the URL; the record filter (ApplicationCheck) reads the header.
                scope["headers"] = [*scope.get("headers", ()), (API_KEY_HEADER.encode(), presented.encode())]
        # Limit before answering 401, so guessing keys is as rate limited as anything else.
        wait = self.limiter.take("key:" + application if application else "ip:" + ip)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            return RateLimited(f"rate limit of {self.limiter.rate:g} requests/s exceeded; retry in {seconds} s",
                               headers={"Retry-After": str(seconds)})
        if keyed and application is None:
            what = "an unknown" if presented else "no"
            return Unauthorized(f"{what} API key: send the application's key in X-API-Key "
                                f"(or ?{API_KEY_PARAM}= from navigator.sendBeacon)")
        return None


def _query_param(scope: Mapping[str, Any], name: str) -> str | None:
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    for key, value in parse_qsl(query):
        if key == name:
            return value
    return None


async def _send_error(send: Any, error: RequestError) -> None:
    body = orjson.dumps({"error": type(error).__name__, "message": error.message})  # as collector.app does
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install(app: Any, settings: Settings) -> None:
    """Add CORS (outermost, so refusals carry CORS headers too) and :class:`SecurityMiddleware` to ``app``."""
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(SecurityMiddleware, settings=settings)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(settings.cors_allow_origins),
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["content-type", "x-api-key"],
        expose_headers=["retry-after"],
        max_age=600,
    )


# ---------------------------------------------------------------- record filters


class ApplicationCheck:
    """Records must belong to their API key's application (else 403); a record without one gets it.

    One key authorises one request, so a request in which any record claims another application is refused
    as a whole and its body kept in ``failed_records`` (kind ``forbidden``), the reason naming each item.
    """

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys

    def __call__(self, batch: Validated, ctx: IngestContext) -> Validated:
        application = self.keys.application_for(ctx.headers.get(API_KEY_HEADER))
        if application is None:  # `ubi import` and other local loaders carry no key: nothing to check
            return batch
        wrong: list[str] = []

        def own(index: int, record: Record) -> Record:
            if record.application is None:
                return record.model_copy(update={"application": application})
            if record.application != application:
                wrong.append(f"item {index}, field 'application': {record.application!r}")
            return record

        batch.queries = [(i, own(i, q)) for i, q in batch.queries]  # type: ignore[misc]
        batch.events = [(i, own(i, e), b) for i, e, b in batch.events]  # type: ignore[misc]
        if wrong:
            more = f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else ""
            raise Forbidden(f"the API key belongs to application {application!r}; records claim another: "
                            + "; ".join(wrong[:3]) + more)
        return batch


def pseudonym(value: str, key: bytes) -> str:
    """HMAC-SHA256 of ``value`` under ``key``, hex, first 32 characters (128 bits, stable for one key)."""
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:32]


class DropFailed(UbiError):
    """Dropping the configured fields left a record invalid; it is rejected and kept as sent."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field '{field}': {message}")
        self.field, self.message = field, message


class Privacy:
    """Replace identifying fields with their keyed hash and drop unwanted fields, before storage.

    The same input and key always give the same pseudonym, so sessions and clients still link up, but the
    original value cannot be recovered without the key (keep it away from the database; rotating it changes
    every pseudonym). Empty strings stay empty (``user_id`` may be ``""`` for anonymous users). Rejected
    items kept in ``failed_records`` are scrubbed too when they are JSON objects; a body that is not JSON at
    all is kept as received.
    """

    def __init__(self, key: bytes | None, fields: Sequence[str], drop: Sequence[str]) -> None:
        self.key = key
        self.fields = tuple(fields) if key else ()
        self.drop_top = tuple(f for f in drop if "." not in f)
        self.drop_nested = tuple(tuple(f.split(".")) for f in drop if "." in f)

    @classmethod
    def from_settings(cls, settings: Settings) -> Privacy:
        key = settings.pseudonymise_key.get_secret_value().encode() if settings.pseudonymise_key else None
        return cls(key, settings.pseudonymise_fields, settings.drop_fields)

    @property
    def enabled(self) -> bool:
        return bool(self.fields or self.drop_top or self.drop_nested)

    def record(self, record: Record) -> Record:
        """One record with its identifying fields hashed and the dropped fields gone."""
        update: dict[str, Any] = {}
        known = type(record).model_fields
        extra = record.__pydantic_extra__ or {}
        for name in self.fields:
            value = getattr(record, name) if name in known else extra.get(name)
            if isinstance(value, str) and value and self.key is not None:
                update[name] = pseudonym(value, self.key)
        for name in self.drop_top:
            if name in known:
                update[name] = None
        out = record.model_copy(update=update) if update else record
        dropped_extra = [n for n in self.drop_top if n in extra]
        if dropped_extra or self.drop_nested:
            out = _rebuild_without(out, dropped_extra, self.drop_nested)
        return out

    def __call__(self, batch: Validated, ctx: IngestContext) -> Validated:
        if not self.enabled:
            return batch
        failed: list[tuple[int, DropFailed]] = []

        def apply(index: int, record: Record) -> Record | None:
            try:
                return self.record(record)
            except DropFailed as exc:
                failed.append((index, exc))
                return None

        queries = [(i, apply(i, q)) for i, q in batch.queries]
        events = [(i, apply(i, e), b) for i, e, b in batch.events]
        batch.queries = [(i, q) for i, q in queries if q is not None]  # type: ignore[misc]
        batch.events = [(i, e, b) for i, e, b in events if e is not None]  # type: ignore[misc]
        for index, exc in failed:
            batch.reject(index, field=exc.field, message=exc.message, kind="privacy")
        # Rejected items are kept with their raw bytes: scrub those that are JSON objects the same way.
        batch.errors = [dataclasses.replace(e, raw=self.scrub(e.raw)) for e in batch.errors]
        return batch

    def scrub(self, raw: bytes) -> bytes:
        """Raw bytes of one rejected item with the same fields hashed and dropped (if it is a JSON object)."""
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw  # not JSON at all: kept as received (see the README, "What is stored")
        if not isinstance(data, dict):
            return raw
        for name in self.fields:
            value = data.get(name)
            if isinstance(value, str) and value and self.key is not None:
                data[name] = pseudonym(value, self.key)
        for name in self.drop_top:
            data.pop(name, None)
        for path in self.drop_nested:
            _pop_path(data, path)
        try:
            return orjson.dumps(data)
        except TypeError:  # integers beyond 64 bits: leave the item as it came
            return raw


def _rebuild_without(record: Record, top: Sequence[str], nested: Sequence[tuple[str, ...]]) -> Record:
    """Re-validate ``record`` without some extra keys and dotted paths (only when configured)."""
    data = record.model_dump(mode="json", exclude_none=True)
    for name in top:
        data.pop(name, None)
    for path in nested:
        _pop_path(data, path)
    try:
        return type(record).model_validate(data)
    except ValidationError as exc:
        where = ", ".join(".".join(p) for p in nested)
        raise DropFailed(where, "dropping the configured fields (UBI_DROP_FIELDS) leaves an invalid record: "
                         f"{exc.errors(include_url=False)[0]['msg']}") from exc


def _pop_path(data: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = data
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)


def record_filters(settings: Settings) -> list[RecordFilter]:
    """The record filters the settings ask for, in order: the key check first, then privacy."""
    filters: list[RecordFilter] = []
    keys = ApiKeys.from_settings(settings)
    if keys.enabled:
        filters.append(ApplicationCheck(keys))
    privacy = Privacy.from_settings(settings)
    if privacy.enabled:
        filters.append(privacy)
    return filters


def describe_stored(settings: Settings) -> dict[str, Any]:
    """What the collector stores about people under these settings (for ``/healthz`` and the README)."""
    return {
        "pseudonymised": list(settings.pseudonymise_fields) if settings.pseudonymise_key else [],
        "dropped": list(settings.drop_fields),
        "api_keys": sorted(settings.api_keys),
        "cors_allow_origins": list(settings.cors_allow_origins),
        "rate_limit_per_second": settings.rate_limit_per_second,
    }


__all__ = [
    "ApiKeys", "ApplicationCheck", "Forbidden", "Privacy", "RateLimited", "RateLimiter", "Refused",
    "SecurityMiddleware", "Unauthorized", "install", "pseudonym", "record_filters",
]
