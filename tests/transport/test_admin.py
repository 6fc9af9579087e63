"""The admin protocol under attack: SQL through column names, DNS rebinding, seals that fill a disk.

Each test reproduces an attack or fault of issue 11 as it was run against main at 74e9b3e (where every one
of them succeeded) and checks that it is refused now.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pyarrow as pa
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ubi_pipeline.collector.app import create_app
from ubi_pipeline.loader.admin import serve_admin
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.transport.admin import host_name, refused_host

ROOT = Path(__file__).resolve().parents[2]
ARROW = {"content-type": "application/vnd.apache.arrow.stream"}


def arrow_body(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def one_column(name: str) -> bytes:
    """An Arrow stream of one row whose single column is called ``name``."""
    return arrow_body(pa.table({name: ["x"]}))


def judgment_rows() -> pa.Table:
    return pa.table({"query": ["q"], "doc_id": ["d"], "source": ["implicit:test"], "score": [0.5],
                     "created_at": pa.array([0], pa.timestamp("us"))})


def tables_in(db: Path) -> set[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {name for (name,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    finally:
        con.close()


@contextmanager
def local_client(db: Path, **overrides: Any) -> Iterator[TestClient]:
    app = create_app(Settings(db=db, **overrides), extensions=False)
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as c:
        yield c


# ---------------------------------------------------------------- SQL through Arrow column names


def test_a_column_name_cannot_drop_the_events_table(tmp_path: Path) -> None:
    db = tmp_path / "ubi.duckdb"
    evil = "query) SELECT 'x' WHERE false; DROP TABLE ubi_events; --"
    with local_client(db) as c:
        r = c.post("/v1/admin/load/judgments", content=one_column(evil), headers=ARROW)
        # 400 naming the column that is not one of the table's (ubi_pipeline.schemas.tables.JUDGMENT_COLUMNS)
        assert r.status_code == 400, r.text
        assert evil in r.json()["message"] and "doc_id" in r.json()["message"]
    assert "ubi_events" in tables_in(db)  # on 74e9b3e the table was gone


def test_a_column_name_cannot_write_files(tmp_path: Path) -> None:
    db, target = tmp_path / "ubi.duckdb", tmp_path / "written.csv"
    evil = f"query) SELECT 'x' WHERE false; COPY (SELECT 42 AS answer) TO '{target}'; --"
    with local_client(db) as c:
        r = c.post("/v1/admin/load/judgments", content=one_column(evil), headers=ARROW)
        assert r.status_code == 400, r.text
    assert not target.exists()


def test_a_column_name_cannot_leak_a_file_through_failed_records(tmp_path: Path) -> None:
    db, secret = tmp_path / "ubi.duckdb", tmp_path / "secret.txt"
    secret.write_text("s3cret-token")
    evil = (
        "query) SELECT 'x' WHERE false; INSERT INTO failed_records (failed_id, received_at, source, kind, reason) "
        f"SELECT 'leak', now()::TIMESTAMP, 'x', 'x', content FROM read_text('{secret}'); --"
    )
    with local_client(db) as c:
        r = c.post("/v1/admin/load/judgments", content=one_column(evil), headers=ARROW)
        assert r.status_code == 400, r.text
        page = c.get("/v1/failed").json()
    assert page["total"] == 0 and "s3cret-token" not in str(page)


def test_declared_columns_still_load_and_unknown_tables_are_refused(tmp_path: Path) -> None:
    db = tmp_path / "ubi.duckdb"
    rows = judgment_rows()
    with local_client(db) as c:
        r = c.post("/v1/admin/load/judgments", content=arrow_body(rows), headers=ARROW)
        assert r.status_code == 200 and r.json() == {"table": "judgments", "rows": 1}, r.text
        twice = pa.table([pa.array(["q"]), pa.array(["q"])], names=["query", "query"])
        r = c.post("/v1/admin/load/judgments", content=arrow_body(twice), headers=ARROW)
        assert r.status_code == 400 and "more than once" in r.json()["message"]
        # The path parameter is an enum of schemas' loadable tables: anything else is 422 before any SQL.
        assert c.post("/v1/admin/load/ubi_events;--", content=arrow_body(rows)).status_code in (404, 422)


# ---------------------------------------------------------------- Host allow-list (DNS rebinding)


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """``app`` on a real uvicorn server on a free loopback port, for the length of a block."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def rebinding_attempts(url: str) -> list[httpx.Response]:
    """What a page on evil.example, resolved to 127.0.0.1, can send: its own name in Host and Origin."""
    port = url.rsplit(":", 1)[1]
    evil = {"host": f"evil.example:{port}", "origin": f"http://evil.example:{port}"}
    with httpx.Client(base_url=url, headers=evil, timeout=30) as c:
        return [
            c.get("/v1/failed"),
            c.post("/v1/admin/seal"),
            c.post("/v1/admin/load/judgments", content=arrow_body(judgment_rows()), headers=ARROW),
        ]


def test_the_collectors_admin_routes_refuse_a_rebound_host_name(tmp_path: Path) -> None:
    db = tmp_path / "ubi.duckdb"
    with served(create_app(Settings(db=db))) as url:
        for r in rebinding_attempts(url):
            assert r.status_code == 403, (r.request.url, r.text)
            assert "UBI_ADMIN_HOSTS" in r.json()["message"] and "evil.example" in r.json()["message"]
        assert not list(tmp_path.rglob("*.parquet"))  # refused before sealing anything
        # A loopback name still works, and so does the page of another loopback name with its own Origin.
        ok = httpx.get(url + "/v1/failed", timeout=30)
        assert ok.status_code == 200, ok.text
        port = url.rsplit(":", 1)[1]
        own = httpx.get(url + "/v1/failed", headers={"host": f"localhost:{port}",
                                                     "origin": f"http://localhost:{port}"}, timeout=30)
        assert own.status_code == 200
        # A loopback Host with a foreign Origin (a page elsewhere reading 127.0.0.1) is refused too (the
        # collector's own origin check covers writes only).
        cross = httpx.get(url + "/v1/failed", headers={"origin": "https://evil.example"}, timeout=30)
        assert cross.status_code == 403 and "Origin" in cross.json()["message"]
        assert httpx.get(url + "/healthz", headers={"host": "evil.example"}, timeout=30).status_code == 200


def test_a_configured_host_name_is_allowed(tmp_path: Path) -> None:
    with served(create_app(Settings(db=tmp_path / "ubi.duckdb", admin_hosts=["evil.example"]))) as url:
        assert [r.status_code for r in rebinding_attempts(url)] == [200, 200, 200]


def test_the_loaders_admin_routes_refuse_a_rebound_host_name(tmp_path: Path) -> None:
    # ``ubi consume --db`` serves the same router (loader/admin.py); on 74e9b3e it checked nothing at all.
    with Store(tmp_path / "ubi.duckdb") as store:
        admin = serve_admin(store, lambda: {}, max_load_bytes=1 << 20)
        try:
            codes = [r.status_code for r in rebinding_attempts(admin.url)]
            assert codes == [403, 403, 403]
            assert httpx.get(admin.url + "/v1/failed", timeout=30).status_code == 200
        finally:
            admin.stop()


# ---------------------------------------------------------------- seals


def test_an_unwritable_seal_directory_is_503_not_a_traceback(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with local_client(tmp_path / "ubi.duckdb", seal_dir=not_a_dir / "sealed") as c:
        r = c.post("/v1/admin/seal")
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["error"] == "SealUnavailable" and "UBI_SEAL_DIR" in body["message"]
    assert "Traceback" not in r.text


FULL_DISK_SERVER = """
import re, subprocess, sys
proc = subprocess.Popen([sys.executable, "-m", "ubi_pipeline", "serve", "--db", sys.argv[1], "--port", "0"],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
print(proc.stdout.readline(), end="", flush=True)
sys.stdin.read()
proc.terminate()
print(proc.communicate(timeout=30)[0], end="", flush=True)
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) to mount a private tmpfs")
def test_a_full_disk_is_503_with_a_clear_body(tmp_path: Path) -> None:
    # A real full disk: a 64 KiB tmpfs, mounted in a private mount namespace (unshare -r -m: no root on the
    # host needed, nothing visible outside), is the seal directory of a real `ubi serve`. The store holds
    # 20,000 events with a random 32-character key each, more than 64 KiB however well Parquet compresses.
    with Store(tmp_path / "ubi.duckdb") as store, store.transaction() as cur:
        cur.execute("INSERT INTO ubi_events (event_key, action_name, timestamp, received_at) "
                    "SELECT md5(i::VARCHAR), 'click', now(), now() FROM range(20000) r(i)")
    snap_dir = tmp_path / "tiny"
    snap_dir.mkdir()
    probe = subprocess.run(["unshare", "-r", "-m", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs",
                            str(snap_dir)], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {probe.stderr.strip()}")
    script = (f"mount -t tmpfs -o size=64k tmpfs {snap_dir} && exec {sys.executable} -c "
              f"'{FULL_DISK_SERVER}' {tmp_path / 'ubi.duckdb'}")
    env = {**os.environ, "UBI_SEAL_DIR": str(snap_dir)}
    proc = subprocess.Popen(["unshare", "-r", "-m", "sh", "-c", script], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert match, f"ubi serve did not start: {line!r}"
        url = match.group(0)
        httpx.get(url + "/healthz", timeout=30).raise_for_status()
        r = httpx.post(url + "/v1/admin/seal", timeout=60)
        assert r.status_code == 503, r.text
        message = r.json()["message"]
        assert "No space left on device" in message and "UBI_SEAL_DIR" in message
        assert httpx.get(url + "/healthz", timeout=30).status_code == 200  # the collector carries on
    finally:
        out, _ = proc.communicate("", timeout=60)
    assert "Traceback" not in out, out


@pytest.mark.parametrize(
    ("header", "name"),
    [("LOCALHOST:8000", "localhost"), ("127.0.0.1", "127.0.0.1"), ("[::1]:8000", "[::1]"), ("[::1]", "[::1]"),
     ("::1", "[::1]"), ("evil.example:8000", "evil.example")],
)
def test_host_names_are_compared_without_port_or_case(header: str, name: str) -> None:
    assert host_name(header) == name


def test_refusals_name_the_setting_and_what_was_sent() -> None:
    assert refused_host("localhost:1", None, []) is None
    assert refused_host("shop.internal:1", "http://shop.internal:1", ["shop.internal"]) is None
    why = refused_host("localhost:1", "null", [])  # sandboxed frames and file:// pages send Origin: null
    assert why is not None and "Origin 'null'" in why and "UBI_ADMIN_HOSTS" in why
    missing = refused_host(None, None, [])
    assert missing is not None and "Host None" in missing


def test_a_load_with_a_value_over_the_limit_is_refused_and_names_it(tmp_path: Path) -> None:
    # issue 25: limits hold on every way in, the admin load of derived tables included (its body limit is 1 GB:
    # one row could carry a value large enough to make the writer's checkpoint fail)
    from ubi_pipeline.transport.admin import LOAD_STRING_MAX_BYTES

    db = tmp_path / "ubi.duckdb"
    rows = judgment_rows()
    big = rows.set_column(rows.column_names.index("query"), "query", pa.array(["q" * (LOAD_STRING_MAX_BYTES + 1)]))
    with local_client(db) as c:
        r = c.post("/v1/admin/load/judgments", content=arrow_body(big), headers=ARROW)
        assert r.status_code == 400 and "column 'query', row 0" in r.json()["message"], r.text
        assert c.post("/v1/admin/load/judgments", content=arrow_body(rows), headers=ARROW).status_code == 200
