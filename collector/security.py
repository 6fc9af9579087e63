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
  (:func:`body_filters` scrubs bodies refused as a whole the same way). They live in
  :mod:`ubi_pipeline.collector.record_filters` (no Starlette, for ``ubi import``) and are re-exported here.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.routing import Match

from ubi_pipeline.collector.errors import RequestError
from ubi_pipeline.collector.ingest import (
    APPLICATION_SCOPE_KEY,
)
from ubi_pipeline.collector.log_throttle import LogThrottle
from ubi_pipeline.collector.metrics import Metrics
from ubi_pipeline.collector.record_filters import (
    ApiKeys,
    ApplicationCheck,
    Forbidden,
    Privacy,
    ScrubbedRaws,
    body_filters,
    pseudonym,
    record_filters,
)
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.terminal import printable
from ubi_pipeline.transport.admin import LOOPBACK_HOSTS, host_name

log = logging.getLogger("ubi.collector.security")

#: Header and (for ``navigator.sendBeacon``, which cannot set headers) query parameter carrying the key.
API_KEY_HEADER = "x-api-key"
API_KEY_PARAM = "api_key"

#: Paths that only read the collector's own files or its health: never keyed, never rate limited.
OPEN_PREFIXES = ("/healthz", "/metrics", "/static/", "/openapi.json", "/docs", "/redoc")
#: Paths that expose stored raw bodies or write derived tables: loopback only unless ``admin_remote``.
ADMIN_PREFIXES = ("/v1/admin", "/v1/failed")


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
