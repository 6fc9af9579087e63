"""Running the collector app under uvicorn: the listening socket, the server's limits, and a server that
lets us clean up.

Shared by ``ubi serve`` and the demo search page (``ubi demo --serve``). What uvicorn does not bound on its
own is bounded here, from :class:`~ubi_pipeline.schemas.settings.Settings`:

* ``idle_timeout_s``: a connection without a request in progress is closed after this long, a fresh one
  that never sends a byte included (uvicorn's keep-alive timer only starts after a first response);
* ``header_timeout_s``: from a request's first byte, its request line and headers must be complete within
  this long, so a client trickling header bytes (slowloris) is disconnected;
* ``body_timeout_s``: from the end of a request's headers, its whole body must arrive within this long, so
  a client trickling body bytes is disconnected too (the route then sees the client gone);
* ``max_header_bytes``, ``max_headers``: a request line and headers longer than this, or more header lines,
  are answered 431 and the connection closed, before the headers are held whole (httptools; under h11, its
  own incomplete-event limit bounds the size and the count is not checked);
* ``max_connections``: one connection more than this is answered 503 and closed at once;
* forwarded headers: uvicorn's own ``proxy_headers`` are off (it trusts loopback's ``X-Forwarded-For``
  by default); the collector reads that header itself, only from ``trusted_proxies``
  (:func:`ubi_pipeline.collector.security.client_ip`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.settings import Settings

log = logging.getLogger("ubi.collector.server")

#: What a connection over ``max_connections`` is told before it is closed.
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"retry-after: 1\r\ncontent-length: 70\r\n\r\n"
    b'{"error":"TooManyConnections","message":"connection limit reached"}  '
)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0 = a free port); a clear error when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UbiError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port") from exc
    # Listening before advertising: a reader that finds the sidecar early waits in the backlog, never refused.
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def make_server(config: Any) -> Any:
    """uvicorn's server, minus re-raising SIGTERM/SIGINT after shutdown (it would kill us before cleanup)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return Server(config)


def fast_loop() -> dict[str, Any]:
    """uvloop and httptools when installed (measured faster in bench/ingest.py), else asyncio and h11."""
    opts: dict[str, Any] = {}
    try:
        import uvloop  # noqa: F401

        opts["loop"] = "uvloop"
    except ImportError:
        opts["loop"] = "asyncio"
    try:
        import httptools  # noqa: F401

        opts["http"] = "httptools"
    except ImportError:
        opts["http"] = "h11"
    return opts


def guarded_protocol(http: str, settings: Settings) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (``httptools`` or ``h11``) with the idle and header timeouts and the
    connection cap of ``settings`` (see the module docstring)."""
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]

    header_timeout, body_timeout = settings.header_timeout_s, settings.body_timeout_s
    max_header_bytes, max_headers = settings.max_header_bytes, settings.max_headers
    cap = settings.max_connections

    class Guarded(Base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0  # request line and header bytes of the request being read (httptools callbacks)
        _head_lines = 0
        _head_raw = 0  # bytes received while the request's head is incomplete
        _refused = False  # the request's headers broke a limit: answered 431, nothing started

        def on_message_begin(self) -> None:
            self._head_bytes = self._head_lines = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._head_bytes += len(url)
            if not self._refused:
                super().on_url(url)
            self._check_head()

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_bytes += len(name) + len(value) + 4
            self._head_lines += 1
            if not self._check_head():
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if not self._refused:
                super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._refused:
                super().on_message_complete()

        def _check_head(self) -> bool:
            """Whether the request's head broke a limit (answered 431 and closed, once)."""
            if self._refused:
                return True
            if self._head_bytes <= max_header_bytes and self._head_lines <= max_headers:
                return False
            self._refused = True
            what = (f"more than {max_headers} header lines (UBI_MAX_HEADERS)" if self._head_lines > max_headers
                    else f"request line and headers over {max_header_bytes} bytes (UBI_MAX_HEADER_BYTES)")
            log.info("refused a request from %s: %s", self.client[0] if self.client else "?", what)
            body = b'{"error":"HeadersTooLarge","message":"' + what.encode() + b'"}'
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            self.transport.close()
            return True

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > cap:
                log.warning("connection from %s refused: %d open connections is the limit (UBI_MAX_CONNECTIONS)",
                            self.client[0] if self.client else "?", cap)
                transport.write(_BUSY)
                transport.close()
                return
            # Until its first byte a connection is idle: uvicorn's keep-alive timer closes it, and uvicorn
            # cancels that timer itself when data arrives.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # answered 431 and closing: nothing more is read
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:  # a request's headers completed (each request gets a new cycle)
                self._head_raw = 0
                self._cancel_header_timer()
                self._cancel_body_timer()
                if self.cycle.more_body:  # its body must be complete within body_timeout
                    self._body_timer = self.loop.call_later(body_timeout, self._body_too_slow, self.cycle)
            elif self.cycle is None or self.cycle.response_complete:
                # Bytes of a request's head, still incomplete: the parser holds them (a header value arrives
                # whole in on_header), so they are counted here as they come.
                self._head_raw += len(data)
                if self._head_raw > max_header_bytes:
                    self._head_bytes = self._head_raw
                    self._check_head()
                    return
                if self._header_timer is None:
                    # The first bytes of a request: its headers must be complete within header_timeout.
                    self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)
            if self._body_timer is not None and self.cycle is not None and not self.cycle.more_body:
                self._cancel_body_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            self._cancel_body_timer()
            super().connection_lost(exc)

        def _cancel_body_timer(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _body_too_slow(self, cycle: Any) -> None:
            self._body_timer = None
            if cycle is self.cycle and cycle.more_body and not self.transport.is_closing():
                log.info("closed a connection from %s: request body not complete within %g s (UBI_BODY_TIMEOUT_S)",
                         self.client[0] if self.client else "?", body_timeout)
                self.transport.close()

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                log.info("closed a connection from %s: request headers not complete within %g s",
                         self.client[0] if self.client else "?", header_timeout)
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{Base.__name__}"
    return Guarded


def server_config(app: Any, settings: Settings, **options: Any) -> Any:
    """The uvicorn configuration every collector runs with: fast loop, the limits of ``settings``, no
    ``proxy_headers`` (see the module docstring); ``options`` are passed on (log level, shutdown grace)."""
    import uvicorn

    stack = fast_loop()
    return uvicorn.Config(
        app,
        loop=stack["loop"],
        http=guarded_protocol(stack["http"], settings),
        proxy_headers=False,
        timeout_keep_alive=max(1, round(settings.idle_timeout_s)),
        h11_max_incomplete_event_size=settings.max_header_bytes,
        access_log=False,
        lifespan="on",
        **options,
    )


def close_serving(sock: socket.socket, sink: Any, advertised: Path | None) -> None:
    """After the server stopped: withdraw the URL advertised beside the store (``store.client.advertise``), close
    the sink (its last commit) and then the listening socket."""
    if advertised is not None:
        advertised.unlink(missing_ok=True)
    sink.close()
    sock.close()
