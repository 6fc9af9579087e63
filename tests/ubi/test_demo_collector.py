"""ubi/demo.py's running_collector: the URL it yields is the collector it started, never another server.

A CI run failed this way: the demo picked a free port, another test's server took it before the demo's
collector could bind it, the collector exited ("address already in use"), and the health check on that port
was answered by the other server, so the demo posted its traffic there and then found its own store empty.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from ubi_pipeline.demo import DemoError, running_collector


class _Healthy(BaseHTTPRequestHandler):
    """Another program's server: 200 to every GET, as a collector's /healthz would answer."""

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_a_taken_port_is_an_error_not_another_programs_server(tmp_path: Path, other_server: int) -> None:
    with pytest.raises(DemoError, match="exited"), running_collector(tmp_path / "a.duckdb", other_server,
                                                                     tmp_path / "a.log"):
        pass
    assert "already in use" in (tmp_path / "a.log").read_text()


def test_by_default_the_collector_picks_its_port_and_the_url_is_the_one_it_advertises(tmp_path: Path) -> None:
    db = tmp_path / "b.duckdb"
    with running_collector(db, log=tmp_path / "b.log") as url:
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200
        side = json.loads(Path(str(db) + ".collector.json").read_text())
        assert side["url"] == url and url.startswith("http://127.0.0.1:") and not url.endswith(":0")
