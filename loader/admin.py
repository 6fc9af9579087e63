"""The DuckDB loader's admin server: the store's admin protocol (:mod:`ubi_pipeline.transport.admin`) while it holds the file.

``ubi consume --db`` is the one writer of its store, as ``ubi serve`` is of its own: readers (``ubi
process``, ``ubi report``, ``ubi failed``) find it through the sidecar file and ask it for seals, loads
and failed records, over loopback, through the very routes the collector mounts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn
from fastapi import FastAPI

from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.store.client import advertise, sidecar_path
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.transport import admin


class LoaderAdmin:
    """The loader as the host of the admin routes (:class:`ubi_pipeline.transport.admin.AdminHost`)."""

    def __init__(
        self, store: Store, status: Callable[[], dict[str, Any]], max_load_bytes: int,
        admin_hosts: Sequence[str] = (),
    ) -> None:
        self.store, self.status, self.max_load_bytes = store, status, max_load_bytes
        self.admin_hosts = list(admin_hosts)

    def admin_store(self) -> Store:
        return self.store

    def health(self) -> tuple[bool, dict[str, Any]]:
        return True, self.status()


class AdminServer:
    """uvicorn serving the admin app on a thread of its own; :meth:`stop` ends it and removes the sidecar."""

    def __init__(self, store: Store, server: uvicorn.Server, thread: threading.Thread, url: str) -> None:
        self.store, self.server, self.thread, self.url = store, server, thread, url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        sidecar_path(self.store.path).unlink(missing_ok=True)


def admin_app(host: admin.AdminHost) -> FastAPI:
    """A FastAPI app with nothing but the admin routes."""
    app = FastAPI(title="ubi consume admin", version="0.1.0",
                  summary="The store's admin protocol while `ubi consume --db` holds it")
    admin.install(app, host)
    return app


def serve_admin(store: Store, status: Callable[[], dict[str, Any]], *, max_load_bytes: int,
                admin_hosts: Sequence[str] = (), host: str = "127.0.0.1", port: int = 0) -> AdminServer:
    """Serve the admin routes for ``store`` on ``host:port`` (0: a free port) and advertise them."""
    config = uvicorn.Config(admin_app(LoaderAdmin(store, status, max_load_bytes, admin_hosts)), host=host,
                            port=port, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="ubi-loader-admin", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise StoreError(f"the loader's admin routes could not listen on {host}:{port} (see the log above)")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://{host}:{int(bound)}"
    advertise(store.path, url)
    return AdminServer(store, server, thread, url)
