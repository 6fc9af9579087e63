"""Real-browser fixtures: Debian's chromium driven by Playwright, against the demo server in a subprocess.

Never a browser download: Playwright launches ``/usr/bin/chromium`` (installed by ``make browser``); without it
the browser tests are skipped, saying why.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


@dataclass
class DemoServer:
    """A running ``python -m ubi.demo_serve`` on a free loopback port, storing into ``db``."""

    url: str
    db: Path
    proc: subprocess.Popen[str]

    def stop(self) -> None:
        """SIGTERM, as an operator would: the server commits what it acknowledged and closes the store."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("the demo server did not stop within 20 s of SIGTERM") from None
        if self.proc.returncode != 0:
            raise AssertionError(f"the demo server exited with {self.proc.returncode}: {self.proc.stderr.read()}")


def start_demo_server(db: Path, port: int = 0, env: dict[str, str] | None = None) -> DemoServer:
    """Start the demo server (port 0: the OS picks a free one) and wait until it answers /healthz.

    ``env``: extra ``UBI_*`` settings for the server process (the one way settings reach a subprocess).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "ubi.demo_serve", "--db", str(db), "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not match:
        proc.kill()
        raise AssertionError(f"demo server did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    url = match.group(0)
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("demo server did not answer /healthz within 20 s")
        time.sleep(0.1)
    return DemoServer(url, db, proc)


@pytest.fixture
def start_server() -> Iterator[Callable[..., DemoServer]]:
    """Start demo servers (``start_server(db_path, port=0, env=None)``); any still running at the end are killed."""
    servers: list[DemoServer] = []

    def start(db: Path, port: int = 0, env: dict[str, str] | None = None) -> DemoServer:
        servers.append(start_demo_server(db, port, env))
        return servers[-1]

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


@pytest.fixture
def demo_server(start_server: Callable[..., DemoServer], tmp_path: Path) -> DemoServer:
    return start_server(tmp_path / "demo.duckdb")


@pytest.fixture
def artifacts() -> Path:
    """``test-artifacts/`` at the repository root (gitignored): screenshots to look at after a run."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (`make browser` installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()
