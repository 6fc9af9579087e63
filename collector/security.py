"""What makes the collector safe to expose: origins, API keys, rate limits, and privacy at ingest.

Two layers, both built from :class:`~ubi_pipeline.schemas.settings.Settings` (section "security"):

* :class:`SecurityMiddleware` (ASGI, runs before any body is read) answers a request it refuses without
  touching the store: a browser ``Origin`` that is neither the collector's own nor allowed (403), a missing
  or unknown API key (401), a client over its rate (429 with ``Retry-After``; a client is an API key's
  application and the client IP, or the IP alone), an admin route asked for from another host (403).
  None of these bodies is stored: storing what an anonymous or flooding sender posts would hand them the
  disk. Browsers additionally get CORS headers from Starlette's ``CORSMiddleware`` (:func:`install`), so
  only allowed origins can read the collector's answers.
* Record filters run on validated records before the sink: :class:`ApplicationCheck` refuses (403, body kept
  in ``failed_records`` as kind ``forbidden``) a request in which a record's ``application`` is not its API
  key's, and :class:`Privacy` replaces ``client_id``, ``user_id`` and ``session_id`` with a keyed hash and
  drops the fields an operator does not want stored, in stored records and in what ``failed_records`` keeps
  (:func:`body_filters` scrubs bodies refused as a whole the same way).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.routing import Match

from ubi_pipeline.collector.bodies import bulk_verb
from ubi_pipeline.collector.errors import RequestError
from ubi_pipeline.collector.ingest import (
    APPLICATION_SCOPE_KEY,
    IngestContext,
    ItemError,
    RecordFilter,
    Validated,
)
from ubi_pipeline.collector.log_throttle import LogThrottle
from ubi_pipeline.collector.metrics import Metrics
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.terminal import printable
from ubi_pipeline.schemas.ubi import UbiEvent, UbiQuery
from ubi_pipeline.transport.admin import LOOPBACK_HOSTS, host_name

Record = UbiQuery | UbiEvent

log = logging.getLogger("ubi.collector.security")

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

    def __init__(self, message: str, *, reason: str = "refused", headers: dict[str, str] | None = None) -> None:
        super().__init__(message, headers=headers)
        #: ``reason`` label of ``ubi_requests_refused_total``: origin, admin_remote, cors_origin, ...
        self.reason = reason


class Unauthorized(RequestError):
    """A write without a valid API key while keys are configured (401); the body is not stored."""

    status_code = 401
    kind = "unauthorized"
    keep = False
    reason = "unauthorized"


class RateLimited(RequestError):
    """A client over its rate (429); ``Retry-After`` says when a request will be accepted again."""

    status_code = 429
    kind = "rate_limited"
    keep = False
    reason = "rate_limited"


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

    The middleware's client is (application of the API key, client IP) for a keyed request, else the IP.

    At most ``max_clients`` buckets are kept; the least recently seen are forgotten first (a forgotten client
    starts again with a full bucket, which only ever errs towards letting a request through).
    """

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        max_clients: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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


def _headers_named(scope: Mapping[str, Any], name: bytes) -> list[str]:
    return [bytes(v).decode("latin-1") for k, v in scope.get("headers", ()) if k == name]


Networks = Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]


def proxy_networks(addresses: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``Settings.trusted_proxies`` as networks (a bare address is a network of one)."""
    return [ipaddress.ip_network(a, strict=False) for a in addresses]


def _trusted(host: str, networks: Networks) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in net for net in networks)


def client_ip(scope: Mapping[str, Any], trusted: Networks) -> str:
    """The client's address: the socket peer, unless the peer is a trusted proxy.

    From a trusted peer, ``X-Forwarded-For`` is read from the right (every hop appends the address it was
    reached from): each trusted hop hands over to the one before it, and the client is the first address
    that is not a trusted proxy. Hops left of it were written by the client and are never read, so a
    client cannot pick its own address by sending the header; from an untrusted peer it is ignored.
    """
    peer = str((scope.get("client") or ("", 0))[0])
    if not trusted or not _trusted(peer, trusted):
        return peer
    hops = [h.strip() for value in _headers_named(scope, b"x-forwarded-for") for h in value.split(",")]
    current = peer
    for hop in reversed(hops):
        if not hop or not _trusted(current, trusted):
            break
        current = hop
    return current


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def origin_allowed(origin: str, host_header: str | None, allowed: Iterable[str],
                   own_hosts: Iterable[str] = LOOPBACK_HOSTS) -> bool:
    """Whether a browser ``Origin`` may write: a listed one, or the collector's own page: the Origin's host[:port]
    is the ``Host`` header (the scheme may differ behind a TLS proxy) *and* that host is one of ``own_hosts``
    (the loopback names, the address it was told to bind, ``UBI_ADMIN_HOSTS``) or an IP address. A page reached
    through DNS rebinding sends its own name as both Origin and Host (``evil.example:8000``): the name refuses it."""
    allowed = list(allowed)
    if len(origin) > MAX_ORIGIN_LENGTH:
        return False
    if "*" in allowed or origin in allowed:
        return True
    if origin == "null" or not host_header:
        return False
    if urlsplit(origin).netloc.lower() != host_header.lower():
        return False
    # an IP literal is never a rebinding name: a page at http://<ip>:<port> that reaches this collector is its own
    name = host_name(host_header)
    return name in {host_name(h) for h in own_hosts} or _ip_literal(name)


def _ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- the API key of a request

def presented_key(scope: Mapping[str, Any]) -> str | None:
    """The one API key a request presents: the ``X-API-Key`` header or the ``?api_key=`` parameter.

    The only place a key is read. An empty value counts as missing; a key sent both ways, or twice, is
    refused (:class:`Unauthorized`) rather than one of them picked, so no later step can read a different
    key than the one that authenticated.
    """
    headers = [v.strip() for v in _headers_named(scope, API_KEY_HEADER.encode()) if v.strip()]
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    params = [v.strip() for k, v in parse_qsl(query, keep_blank_values=True) if k == API_KEY_PARAM and v.strip()]
    if headers and params:
        raise Unauthorized(f"API key sent both in X-API-Key and in ?{API_KEY_PARAM}=: send it one way only")
    found = headers or params
    if len(found) > 1:
        where = "X-API-Key headers" if headers else f"?{API_KEY_PARAM}= parameters"
        raise Unauthorized(f"{len(found)} {where}: send one API key")
    return found[0] if found else None


# ---------------------------------------------------------------- refused origins


def origin_advice(origin: str) -> str:
    """What a refused browser origin is told: which origin, and the one setting that lets it send."""
    return (
        f"origin {origin!r} may not send records to this collector: start it with "
        f"`ubi serve --allow-origin {origin}` or set UBI_CORS_ALLOW_ORIGINS='[\"{origin}\"]'"
    )


_LOGGED_ORIGINS: OrderedDict[str, None] = OrderedDict()
_LOGGED_LOCK = threading.Lock()
#: Refused origins get at most one log line per this many seconds, whatever their number (each origin once).
REFUSED_ORIGIN_LOG_EVERY_S = 10.0
#: Longest Origin header taken as one (scheme, a host of at most 253 characters, a port): longer is refused
#: outright and logged cut to this length.
MAX_ORIGIN_LENGTH = 300
#: the one throttle of refused-origin lines (it counts the origins it held back)
ORIGIN_LOG = LogThrottle(REFUSED_ORIGIN_LOG_EVERY_S)


def log_refused_origin(origin: str, what: str, *, clock: Callable[[], float] = time.monotonic) -> None:
    """A warning the first time an origin is refused, and then only ``/metrics`` counts it; at most one line per
    :data:`REFUSED_ORIGIN_LOG_EVERY_S` in all (the next line counts the origins not logged), with the origin cut
    to :data:`MAX_ORIGIN_LENGTH` and shown without control characters: a page that forges many long origins
    cannot flood the log."""
    now = clock()
    with _LOGGED_LOCK:
        if origin in _LOGGED_ORIGINS:
            return
        _LOGGED_ORIGINS[origin] = None
        while len(_LOGGED_ORIGINS) > 1000:
            _LOGGED_ORIGINS.popitem(last=False)
        admitted, _, quiet = ORIGIN_LOG.admit(now)
        if not admitted:
            return
    shown = printable(origin[:MAX_ORIGIN_LENGTH]) + ("..." if len(origin) > MAX_ORIGIN_LENGTH else "")
    more = f" ({quiet} other refused origins not logged since the last line)" if quiet else ""
    log.warning("refused %s from browser origin %r (later refusals are counted in /metrics "
                "ubi_requests_refused_total)%s: %s", what, shown, more, origin_advice(shown))


class TellingCORS(CORSMiddleware):
    """Starlette's CORS, except that a refused preflight says why: 403 with a JSON body naming the origin
    and the setting to change, a warning in the log, and ``ubi_requests_refused_total{reason="cors_..."}``
    (Starlette answers a bare 400 "Disallowed CORS origin" that only a browser's developer tools show).

    The request metric's route label is the route the preflight asked about (not ``unmatched``).
    """

    def __init__(self, app: Any, *, metrics: Metrics, routes: Callable[[], Sequence[Any]],
                 gate: Gate | None = None, **options: Any) -> None:
        super().__init__(app, **options)
        self.metrics, self.routes, self.gate = metrics, routes, gate

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await super().__call__(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None or "access-control-request-method" not in headers:
            await super().__call__(scope, receive, send)
            return
        scope["route"] = self._route(scope, headers["access-control-request-method"])
        if self.gate is not None:  # preflights take from the client's own bucket, as its writes do from theirs
            ip = client_ip(scope, self.gate.trusted_proxies)
            wait = self.gate.limiter.take("preflight:" + ip)
            if wait > 0:
                seconds = max(1, math.ceil(wait))
                self.metrics.inc("ubi_requests_refused_total", reason="rate_limited")
                body = orjson.dumps({"error": "RateLimited", "message": f"rate limit of {self.gate.limiter.rate:g} "
                                     f"requests/s exceeded by CORS preflights; retry in {seconds} s"})
                await Response(body, status_code=429, media_type="application/json",
                               headers={"Retry-After": str(seconds)})(scope, receive, send)
                return
        response = self.preflight_response(request_headers=headers)
        if response.status_code < 400:
            await response(scope, receive, send)
            return
        text = bytes(response.body).decode()
        failed = [f.strip() for f in text.removeprefix("Disallowed CORS ").split(",")]
        if "origin" in failed:
            message, reason = origin_advice(origin), "cors_origin"
            log_refused_origin(origin, "a CORS preflight")
        else:
            asked = headers.get("access-control-request-headers", "")
            message = (
                f"CORS preflight from {origin!r} refused: {', '.join(failed)} not allowed (asked for "
                f"method {headers['access-control-request-method']!r}, headers {asked!r}); the collector "
                f"allows methods {sorted(self.allow_methods)} and headers {sorted(self.allow_headers)}"
            )
            reason = "cors_" + failed[0].replace("-", "_")
            log.warning(message)
        self.metrics.inc("ubi_requests_refused_total", reason=reason)
        body = orjson.dumps({"error": "CorsRefused", "message": message})
        refused = Response(body, status_code=403, media_type="application/json")
        await refused(scope, receive, send)

    def _route(self, scope: Any, method: str) -> Any:
        probe = {**scope, "method": method}
        for route in self.routes():
            match, _ = route.matches(probe)
            if match == Match.FULL and hasattr(route, "path"):
                return route
        return None


# ---------------------------------------------------------------- the middleware


Refusal = Refused | Unauthorized | RateLimited


class Gate:
    """The checks made before a request's body is read: origin, API key, rate, admin routes.

    One per app: :class:`SecurityMiddleware` and the collector's ingest front door
    (``Collector.request_checks``) share it, so they share the rate limiter's buckets.
    """

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.keys = ApiKeys.from_settings(settings)
        self.limiter = RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst)
        self.allowed_origins = list(settings.cors_allow_origins)
        # the names the collector's own page may reach it by (a wildcard bind address is no name)
        bound = [settings.host] if settings.host not in ("", "0.0.0.0", "::") else []
        self.own_hosts = [*LOOPBACK_HOSTS, *bound, *settings.admin_hosts]
        self.trusted_proxies = proxy_networks(settings.trusted_proxies)
        self.admin_remote = settings.admin_remote
        self.metrics = metrics

    def check(self, scope: dict[str, Any]) -> RequestError | None:
        """The refusal for this request, or ``None`` to let it through (refusals are counted in /metrics)."""
        refusal = self._check(scope)
        if refusal is not None and self.metrics is not None:
            self.metrics.inc("ubi_requests_refused_total", reason=refusal.reason)
        return refusal

    def _check(self, scope: dict[str, Any]) -> Refusal | None:
        path: str = scope.get("path", "")
        method: str = scope.get("method", "GET")
        if method == "OPTIONS" or path.startswith(OPEN_PREFIXES):
            return None
        ip = client_ip(scope, self.trusted_proxies)
        if path.startswith(ADMIN_PREFIXES) and not self.admin_remote and not is_loopback(ip):
            return Refused(
                f"{path} is only served to loopback clients; set UBI_ADMIN_REMOTE=true to change that",
                reason="admin_remote",
            )
        write = method not in ("GET", "HEAD")
        origin = _header(scope, b"origin")
        if (
            write
            and origin is not None
            and not path.startswith(ADMIN_PREFIXES)  # the admin routes check Host and Origin themselves, more strictly
            and not origin_allowed(origin, _header(scope, b"host"), self.allowed_origins, self.own_hosts)
        ):
            log_refused_origin(origin, "a write")
            return Refused(origin_advice(origin), reason="origin")
        application = presented = None
        keyed = write and self.keys.enabled and not path.startswith(ADMIN_PREFIXES)
        ambiguous: Unauthorized | None = None
        if keyed:
            try:
                presented = presented_key(scope)
            except Unauthorized as exc:
                ambiguous = exc
            application = self.keys.application_for(presented)
        scope[APPLICATION_SCOPE_KEY] = application  # what ApplicationCheck compares records with
        # Limit before answering 401, so guessing keys is as rate limited as anything else. A key is shared by
        # every visitor of its application's site, so its buckets are per (application, client IP).
        wait = self.limiter.take(f"key:{application}\x1f{ip}" if application else "ip:" + ip)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            return RateLimited(
                f"rate limit of {self.limiter.rate:g} requests/s exceeded; retry in {seconds} s",
                headers={"Retry-After": str(seconds)},
            )
        if ambiguous is not None:
            return ambiguous
        if keyed and application is None:
            what = "an unknown" if presented else "no"
            return Unauthorized(
                f"{what} API key: send the application's key in X-API-Key "
                f"(or ?{API_KEY_PARAM}= from navigator.sendBeacon)"
            )
        return None


class SecurityMiddleware:
    """Pure ASGI middleware refusing requests before their body is read (see the module docstring)."""

    def __init__(self, app: Any, gate: Gate) -> None:
        self.app, self.gate = app, gate

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.gate.check(scope)
        if refusal is not None:
            await _send_error(send, refusal)
            return
        await self.app(scope, receive, send)


async def _send_error(send: Any, error: RequestError) -> None:
    body = orjson.dumps({"error": type(error).__name__, "message": error.message})  # as ubi_pipeline.collector.app does
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _api_routes() -> list[Any]:
    """The collector's own routes, each with its path template (FastAPI wraps included routers)."""
    from ubi_pipeline.collector.opensearch import router as opensearch
    from ubi_pipeline.collector.routes import router
    from ubi_pipeline.transport.admin import router as admin

    return [*router.routes, *opensearch.routes, *admin.routes]


def install(app: Any, settings: Settings) -> None:
    """Add CORS (outermost, so refusals carry CORS headers too) and :class:`SecurityMiddleware` to ``app``."""
    metrics = app.state.collector.metrics
    gate = Gate(settings, metrics)
    app.add_middleware(SecurityMiddleware, gate=gate)
    app.state.collector.request_checks.append(gate.check)  # the ingest front door runs it too
    app.add_middleware(
        TellingCORS,
        metrics=metrics,
        routes=_api_routes,
        gate=gate,
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
        application = ctx.application  # resolved once, by the gate (presented_key)
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
            raise Forbidden(
                f"the API key belongs to application {application!r}; records claim another: "
                + "; ".join(wrong[:3])
                + more
            )
        return batch


def pseudonym(value: str, key: bytes) -> str:
    """HMAC-SHA256 of ``value`` under ``key``, hex, first 32 characters (128 bits, stable for one key)."""
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:32]


class DropFailed(UbiError):
    """Dropping the configured fields left a record invalid; it is rejected and kept, scrubbed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field '{field}': {message}")
        self.field, self.message = field, message


class Privacy:
    """Replace identifying fields with their keyed hash and drop unwanted fields, before storage.

    The same input and key always give the same pseudonym, so sessions and clients still link up, but the
    original value cannot be recovered without the key (keep it away from the database; rotating it changes
    every pseudonym). Empty strings stay empty (``user_id`` may be ``""`` for anonymous users).

    What is kept in ``failed_records`` is scrubbed too (:meth:`scrub`): rejected items, conflicting records,
    and whole bodies refused as a whole (403, 413 for too many items, 415, 400, 422). Stored reasons do not
    quote the values of these fields (:meth:`scrub_error`).
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
        # Items rejected so far carry their raw bytes and messages: scrub them once, here. Raw bytes of the
        # valid items are scrubbed only if one is kept later (a conflict, or a record that cannot be stored).
        batch.errors = [self.scrub_error(e) for e in batch.errors]
        batch.raws = ScrubbedRaws(batch.raws, self.scrub)
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
        for index, exc in failed:  # their raw bytes come from the scrubbed raws
            batch.reject(index, field=exc.field, message=exc.message, kind="privacy")
        return batch

    # ------------------------------------------------------------ what failed_records keeps

    def scrub_error(self, error: ItemError) -> ItemError:
        """A rejected item with its raw bytes scrubbed and its message not quoting a scrubbed field's value."""
        return dataclasses.replace(
            error, raw=self.scrub(error.raw), message=self._quiet(error.message, error.raw)
        )

    def _quiet(self, message: str, raw: bytes) -> str:
        # ubi_pipeline.collector.ingest quotes an invalid field's input as "(got <repr(value)[:80]>)"; for a field that is
        # pseudonymised or dropped that would store the very value the settings keep out of the database.
        if "(got " not in message:
            return message
        data = _loads(raw)
        if not isinstance(data, dict):
            return message
        paths = [(n,) for n in (*self.fields, *self.drop_top)] + list(self.drop_nested)
        for path in paths:
            value = _get_path(data, path)
            if value is None or value == "" or isinstance(value, dict | list):
                continue
            shown = [repr(value)[:80]]
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
                shown.append(repr(float(value))[:80])  # what orjson, the collector's parser, made of it
            for text in shown:
                message = message.replace(
                    f"(got {text})", f"(value of '{'.'.join(path)}' not shown: privacy settings)"
                )
        return message

    def scrub(self, raw: bytes) -> bytes:
        """Bytes about to be kept in ``failed_records`` (one item or a whole body), scrubbed like records.

        * JSON: every object, at the top level or as an array item, gets the configured fields hashed and
          dropped, as stored records do; a string or number outside any object field (an item that is not
          a record) is replaced by a redaction marker, since it may be the very id or text to hide.
        * NDJSON and ``_bulk`` bodies: the same, line by line; ``_bulk`` action lines are kept as they are.
        * Anything that is not JSON (a whole body, or one line of it): a redaction marker
          ``{"ubi_redacted": why, "bytes": n, "hmac_sha256" (keyed by the pseudonymisation key) or
          "sha256": digest}``. Personal data in it cannot be located, so it is not kept; the digest still
          lets a sender match the body it sent.

        Identity when no privacy setting is on: then the collector keeps every body as received.
        """
        if not self.enabled or not raw.strip():
            return raw
        try:
            value = _loads(raw, strict=True)
        except _NOT_JSON:
            if b"\n" not in raw.strip():
                return self._marker(raw, "not JSON")
            return b"\n".join(self._scrub_line(line) for line in raw.split(b"\n"))
        return self._dumps(self._scrub_value(value), raw)

    def _scrub_line(self, line: bytes) -> bytes:
        if not line.strip():
            return line
        try:
            value = _loads(line, strict=True)
        except _NOT_JSON:
            return self._marker(line, "a line that is not JSON")
        if bulk_verb(value) is not None:
            return line
        return self._dumps(self._scrub_value(value), line)

    def _scrub_value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return self._scrub_object(value)
        if isinstance(value, list):
            return [self._scrub_value(v) for v in value]
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return self._marker_object(_json_text(value).encode(), "a value that is not a record")
        return value  # null, true, false

    def _scrub_object(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.key is not None:
            for name in self.fields:
                value = data.get(name)
                if value is None or value == "":
                    continue
                data[name] = pseudonym(value if isinstance(value, str) else _json_text(value), self.key)
        for name in self.drop_top:
            data.pop(name, None)
        for path in self.drop_nested:
            _pop_path(data, path)
        return data

    def _marker_object(self, data: bytes, why: str) -> dict[str, Any]:
        if self.key is not None:
            digest = ("hmac_sha256", hmac.new(self.key, data, hashlib.sha256).hexdigest())
        else:
            digest = ("sha256", hashlib.sha256(data).hexdigest())
        return {
            "ubi_redacted": f"{why}: not kept because privacy settings are on",
            "bytes": len(data),
            digest[0]: digest[1],
        }

    def _marker(self, data: bytes, why: str) -> bytes:
        return orjson.dumps(self._marker_object(data, why))

    def _dumps(self, value: Any, original: bytes) -> bytes:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            try:
                return text.encode()
            except UnicodeEncodeError:  # a lone surrogate escape: keep the escapes
                return json.dumps(value, separators=(",", ":")).encode()
        except (ValueError, TypeError, RecursionError):
            return self._marker(original, "JSON that cannot be written back")


#: What the standard library's JSON parser raises for bytes that are not JSON (or nest past the stack).
_NOT_JSON = (ValueError, RecursionError)


def _loads(raw: bytes, *, strict: bool = False) -> Any:
    """JSON by the standard library: unlike orjson it keeps integers beyond 64 bits exactly."""
    try:
        return json.loads(raw)
    except _NOT_JSON:
        if strict:
            raise
        return None


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        return repr(value)


def _get_path(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data


class ScrubbedRaws(dict[int, bytes]):
    """Raw item bytes scrubbed on first read: most are never read (only rejected items are kept)."""

    def __init__(self, raws: Mapping[int, bytes], scrub: Callable[[bytes], bytes]) -> None:
        super().__init__(raws)
        self._scrub = scrub
        self._done: set[int] = set()

    def __getitem__(self, index: int) -> bytes:
        raw = super().__getitem__(index)
        if index not in self._done:
            raw = self._scrub(raw)
            super().__setitem__(index, raw)
            self._done.add(index)
        return raw

    def get(self, index: int, default: Any = None) -> Any:  # type: ignore[override]
        return self[index] if index in self else default

    def values(self) -> Any:
        return [self[i] for i in self]

    def items(self) -> Any:
        return [(i, self[i]) for i in self]


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
        raise DropFailed(
            where,
            "dropping the configured fields (UBI_DROP_FIELDS) leaves an invalid record: "
            f"{exc.errors(include_url=False)[0]['msg']}",
        ) from exc


def _pop_path(data: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = data
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)


def body_filters(settings: Settings) -> list[Callable[[bytes], bytes]]:
    """What scrubs a body refused as a whole before ``failed_records`` keeps it (privacy, when it is on)."""
    privacy = Privacy.from_settings(settings)
    return [privacy.scrub] if privacy.enabled else []


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


__all__ = [
    "ApiKeys",
    "ApplicationCheck",
    "Forbidden",
    "Privacy",
    "ScrubbedRaws",
    "body_filters",
    "RateLimited",
    "RateLimiter",
    "Refused",
    "Gate",
    "SecurityMiddleware",
    "Unauthorized",
    "install",
    "pseudonym",
    "record_filters",
]
