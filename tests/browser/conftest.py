"""Real-browser fixtures: Debian's chromium driven by Playwright, against the demo server in a subprocess.

Never a browser download: Playwright launches ``/usr/bin/chromium`` (installed by ``make browser``); without it
the browser tests are skipped, saying why.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SHARED, shared_path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
SPEC = SHARED / "ubi-spec" / "1.3.0"


@dataclass
class DemoServer:
    """A running ``python -m ubi_pipeline.demo_serve`` on a free loopback port, storing into ``db``."""

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
            raise AssertionError(
                f"the demo server exited with {self.proc.returncode}: {self.proc.stderr.read()}"
            )


def start_demo_server(db: Path, port: int = 0, env: dict[str, str] | None = None) -> DemoServer:
    """Start the demo server (port 0: the OS picks a free one) and wait until it answers /healthz.

    ``env``: extra ``UBI_*`` settings for the server process (the one way settings reach a subprocess).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "ubi_pipeline.demo_serve", "--db", str(db), "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not match:
        proc.kill()
        raise AssertionError(
            f"demo server did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        )
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


#: OpenSearch's reference UBI client (third-party, never copied into the repository: see its SOURCES.md).
REFERENCE_CLIENT = "ubi-clients/opensearch-ubi-js/ubi.js"  # under ../shared: read through shared_path
#: The axios the reference client imports, from the npm registry (the version its SOURCES.md was tested with).
AXIOS = "axios@1.21.1"
NPM_CACHE = ROOT / ".cache" / "npm"


@pytest.fixture(scope="session")
def axios_esm() -> Path:
    """axios' browser ES module build, installed with npm into ``.cache/npm`` (gitignored) on first use."""
    target = NPM_CACHE / "node_modules" / "axios" / "dist" / "esm" / "axios.js"
    stamp = NPM_CACHE / f".{AXIOS}"
    if target.is_file() and stamp.exists():
        return target
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not installed: the reference client needs {AXIOS} from the npm registry")
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(NPM_CACHE), AXIOS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0 or not target.is_file():
        pytest.skip(f"`npm install {AXIOS}` failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    stamp.touch()
    return target


@pytest.fixture(scope="package")
def browser() -> Iterator[object]:
    """One chromium for the browser tests of this folder (was one per module: four launches), closed when the
    folder's tests end. Tests never share state through it: each opens its own context or page."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (`make browser` installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


# ---------------------------------------------------------------- the UBI 1.3.0 JSON Schemas


def enum_one_of_as_any_of(schema: Any) -> Any:
    """A copy of ``schema`` in which ``oneOf: [{..., enum}, {...}]`` (a branch and itself with an enum of
    common values) reads ``anyOf``.

    The spec writes ``action_name`` and ``object_id_type`` so: the first branch lists well-known values, the
    second allows any string up to 100 characters. Under JSON Schema's ``oneOf`` a well-known value such as
    ``"click"`` matches both branches and is therefore invalid, the opposite of what the spec means ("we have
    a set of common defaults, however you can pass in whatever you want"). ``anyOf`` says what it means.
    Every other ``oneOf`` (the position's ordinal / xy) is kept as written.
    """
    if isinstance(schema, list):
        return [enum_one_of_as_any_of(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: enum_one_of_as_any_of(v) for k, v in schema.items()}
    branches = out.get("oneOf")
    if (
        isinstance(branches, list)
        and len(branches) == 2
        and all(isinstance(b, dict) for b in branches)
        and "enum" in branches[0]
        and {k: v for k, v in branches[0].items() if k != "enum"} == branches[1]
    ):
        out["anyOf"] = out.pop("oneOf")
    return out


_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def is_rfc3339(value: object) -> bool:
    """JSON Schema's ``date-time`` (RFC 3339: a time zone is required), which jsonschema only checks when the
    optional rfc3339-validator is installed; written out here so the check cannot silently be skipped."""
    if not isinstance(value, str):
        return True  # formats apply to strings only; the type keyword rules out the rest
    if not _RFC3339.fullmatch(value):
        return False
    try:
        datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        return False
    return True


class UbiSpec:
    """Validators of the UBI 1.3.0 event and query-request JSON Schemas (``../shared/ubi-spec/1.3.0``)."""

    FILES = {"event": "event.schema.json", "query": "query.request.schema.json"}

    def __init__(self, folder: Path = SPEC) -> None:
        from jsonschema import Draft202012Validator, FormatChecker

        checker = FormatChecker(formats=())
        checker.checks("date-time")(is_rfc3339)
        self.schemas = {kind: json.loads((folder / name).read_text()) for kind, name in self.FILES.items()}
        self.validators = {
            kind: Draft202012Validator(enum_one_of_as_any_of(copy.deepcopy(schema)), format_checker=checker)
            for kind, schema in self.schemas.items()
        }
        self.as_written = {
            kind: Draft202012Validator(schema, format_checker=checker)
            for kind, schema in self.schemas.items()
        }

    def errors(self, kind: str, record: Any) -> list[str]:
        """Why ``record`` is not a valid UBI 1.3.0 ``kind`` ("event" or "query"): one line per error."""
        return sorted(
            f"{'/'.join(map(str, e.absolute_path)) or '(record)'}: {e.message}"
            for e in self.validators[kind].iter_errors(record)
        )


@pytest.fixture(scope="session")
def ubi_spec() -> UbiSpec:
    return UbiSpec(shared_path("ubi-spec/1.3.0"))
