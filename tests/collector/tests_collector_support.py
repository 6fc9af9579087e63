"""Paths and counts shared by the collector tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import httpx

ROOT = Path(__file__).resolve().parents[2]
#: Counted in ubi-samples/ubi_queries_events.ndjson by its action lines (grep -c '"_index": "ubi_queries"' and '"ubi_events"'),
#: as docs/ubi.md states: 473 query records and 3,448 events.
SAMPLE_QUERIES, SAMPLE_EVENTS = 473, 3448


def run_ubi(argv: list[str]) -> int:
    """Run a collector subcommand as ``ubi`` does (typed errors exit 2), without importing other stages."""
    import argparse

    from ubi_pipeline.commands.collector import register
    from ubi_pipeline.schemas.errors import UbiError

    parser = argparse.ArgumentParser(prog="ubi")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    # `ubi` renders into a pipe at LOG_WIDTH columns (ubi/stages.py _log_width), so rich does not fold its
    # tables; at rich's default 80 a long tmp path (a pytest-xdist worker's .../popen-gw1/...) was folded
    # mid-word and the tests looking for it failed.
    wide = "COLUMNS" not in os.environ and not sys.stdout.isatty()
    if wide:
        os.environ["COLUMNS"] = "10000"  # ubi_pipeline.stages.LOG_WIDTH (not imported: it imports every stage)
    try:
        return int(args.func(args) or 0)
    except UbiError:
        return 2
    finally:
        if wide:
            os.environ.pop("COLUMNS", None)


def count(db: Path, sql: str) -> Any:
    """One value from the database file, opened read-only (the writer must be closed)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute(sql).fetchone()
        return row[0] if row else None
    finally:
        con.close()


@dataclass
class Served:
    """A real ``ubi serve`` process on a free loopback port."""

    url: str
    db: Path
    proc: subprocess.Popen[str]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(db: Path, *extra: str, env: dict[str, str] | None = None) -> Served:
    """Start ``ubi serve --port 0`` and return once it listens (it prints its URL after binding).

    ``env``: extra ``UBI_*`` settings for the server process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ubi_pipeline", "serve", "--db", str(db), "--port", "0", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not match:
        proc.kill()
        rest = proc.stdout.read() if proc.stdout else ""
        raise AssertionError(f"ubi serve did not start: {line!r}{rest}")
    server = Served(match.group(0), db, proc)
    # The socket listens before the line is printed; /healthz answers once the app has started.
    httpx.get(server.url + "/healthz", timeout=30).raise_for_status()
    return server
