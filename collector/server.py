"""Running the collector app under uvicorn: the listening socket and a server that lets us clean up.

Shared by ``ubi serve`` and the demo search page (``ubi demo --serve``).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

from schemas.errors import UbiError


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
