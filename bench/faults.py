"""Faults against a live collector: the attacks of issue 25, then valid traffic; nothing acknowledged may be lost.

Starts ``ubi serve`` on a fresh DuckDB store on loopback (``--writer-memory-limit``, default 64MB, smaller than the
default so that the store's limits are tested where they are tight), then, in turn:

* ``big malformed bodies``: ``--big`` bodies of 4.9 MB that are not JSON (kept in ``failed_records``, truncated);
* ``big user_query``: ``--big`` query records with a 4.9 MB ``user_query`` (refused by the length limit);
* ``slow body``: connections that send one byte of body every second (closed at ``UBI_BODY_TIMEOUT_S``);
* ``big headers``: requests with 1 MB of headers (431, connection closed);
* ``rebinding page``: POSTs whose Origin and Host name a DNS name the collector does not know (403);
* ``key collisions``: query records whose ids would share a key (refused per item);
* ``valid traffic``: ``--valid`` batches of 50 events and 5 query records, each POSTed, some twice (retries).

After each step it sends one valid batch and times how long the collector takes to store it (recovery). At the end
it stops the collector (SIGTERM), opens the store and counts: records acknowledged (202 ``accepted``), stored,
lost (acknowledged but not stored: must be 0), duplicated (stored twice: must be 0), and the 5xx answers seen.

    .venv/bin/python bench/faults.py [--big 60] [--valid 200] [--writer-memory-limit 64MB] [--json]

The Kafka loader's poison messages are not replayed here: tests/collector/kafka/ drives them against a real broker.
Bounded: every request has a timeout, every step a count; the collector is stopped at the end whatever happened.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import httpx

MB = 1024 * 1024


def start(db: Path, limit: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "UBI_WRITER_MEMORY_LIMIT": limit, "UBI_BODY_TIMEOUT_S": "5"}
    proc = subprocess.Popen([sys.executable, "-m", "ubi_pipeline", "serve", "--db", str(db), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    line = proc.stdout.readline() if proc.stdout else ""
    found = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not found:
        proc.kill()
        raise SystemExit(f"ubi serve did not start: {line!r}")
    url = found.group(0)
    httpx.get(url + "/healthz", timeout=30).raise_for_status()
    return proc, url


class Tally:
    def __init__(self) -> None:
        self.acked_events: set[str] = set()
        self.acked_queries: set[str] = set()
        self.answers: dict[int, int] = {}

    def saw(self, status: int) -> None:
        self.answers[status] = self.answers.get(status, 0) + 1


def valid_batch(client: httpx.Client, url: str, n: int, tally: Tally) -> float:
    """POST one batch of 50 events and 5 queries (ids from ``n``); returns the seconds until both were stored."""
    t0 = time.perf_counter()
    events = [{"event_id": f"e{n}-{i}", "action_name": "click", "query_id": f"q{n}-{i % 5}",
               "timestamp": "2026-12-01T10:00:00Z", "event_attributes": {"position": {"ordinal": i % 10}}}
              for i in range(50)]
    queries = [{"query_id": f"q{n}-{i}", "user_query": f"query {n} {i}", "timestamp": "2026-12-01T10:00:00Z",
                "query_response_hit_ids": [f"d{j}" for j in range(10)]} for i in range(5)]
    for route, body, acked, key in (("/v1/events", events, tally.acked_events, "event_id"),
                                    ("/v1/queries", queries, tally.acked_queries, "query_id")):
        for _ in range(20):  # a 503 asks for a retry: retry as a client would
            try:
                r = client.post(url + route, json=body, timeout=30)
            except httpx.HTTPError:
                tally.saw(0)
                time.sleep(0.5)
                continue
            tally.saw(r.status_code)
            if r.status_code == 202:
                if r.json()["accepted"] + r.json()["duplicates"] == len(body):
                    acked.update(item[key] for item in body)
                break
            time.sleep(float(r.headers.get("retry-after", "0.5")))
    return time.perf_counter() - t0


def raw_request(url: str, data: bytes, *, pause: float = 0.0, chunks: int = 1, timeout: float = 15) -> str:
    """Send ``data`` over a raw socket (in ``chunks`` pieces, ``pause`` seconds apart); the status line or why none."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        step = max(1, len(data) // chunks)
        try:
            for i in range(0, len(data), step):
                s.sendall(data[i:i + step])
                if pause:
                    time.sleep(pause)
            return s.recv(200).split(b"\r\n", 1)[0].decode(errors="replace") or "closed"
        except OSError as exc:
            return f"closed ({type(exc).__name__})"


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ubi-faults-"))
    db = work / "faults.duckdb"
    proc, url = start(db, args.writer_memory_limit)
    tally = Tally()
    steps: list[dict[str, Any]] = []
    batch = 0
    try:
        with httpx.Client() as client:
            def step(name: str, attack: Any) -> None:
                nonlocal batch
                t0 = time.perf_counter()
                detail = attack()
                took = time.perf_counter() - t0
                batch += 1
                recovery = valid_batch(client, url, batch, tally)
                health = client.get(url + "/healthz", timeout=10).json()
                steps.append({"step": name, "seconds": round(took, 2), "detail": detail,
                              "valid_batch_after_s": round(recovery, 3), "health": health.get("status")})
                print(f"{name:22s} {took:6.1f} s  {detail}  then a valid batch stored in {recovery:.3f} s "
                      f"(health {health.get('status')})", flush=True)

            def big_bodies() -> str:
                codes: dict[int, int] = {}
                body = b"not json " * (int(4.9 * MB) // 9)
                for _ in range(args.big):
                    r = client.post(url + "/v1/events", content=body, headers={"content-type": "application/json"},
                                    timeout=60)
                    tally.saw(r.status_code)
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                return f"answers {codes}"

            def big_queries() -> str:
                codes: dict[int, int] = {}
                for i in range(args.big):
                    r = client.post(url + "/v1/queries", json=[{"query_id": f"big{i}", "user_query": "x" * int(4.9 * MB)}],
                                    timeout=60)
                    tally.saw(r.status_code)
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                return f"answers {codes}"

            def slow_body() -> str:
                head = (b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 1000\r\n\r\n")
                return raw_request(url, head + b"[" * 20, pause=1.0, chunks=20, timeout=30)

            def big_headers() -> str:
                pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(1000))
                return raw_request(url, b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n" + pad + b"\r\n")

            def rebinding() -> str:
                r = client.post(url + "/v1/events", json=[{"action_name": "click", "timestamp": "2026-12-01T10:00:00Z"}],
                                headers={"Host": "evil.example:8000", "Origin": "http://evil.example:8000"})
                tally.saw(r.status_code)
                return f"answer {r.status_code}"

            def collisions() -> str:
                body = [{"query_id": "col\x1fb", "user_query": "x"},
                        {"query_id": "col", "query_response_id": "b\x1f", "user_query": "y"},
                        {"query_id": "h:" + "0" * 32, "user_query": "z"}]
                r = client.post(url + "/v1/queries", json=body)
                tally.saw(r.status_code)
                return f"answer {r.status_code}, rejected {r.json().get('rejected')}"

            step("big malformed bodies", big_bodies)
            step("big user_query", big_queries)
            step("slow body", slow_body)
            step("big headers", big_headers)
            step("rebinding page", rebinding)
            step("key collisions", collisions)
            t0 = time.perf_counter()
            for _ in range(args.valid):
                batch += 1
                valid_batch(client, url, batch, tally)
                if batch % 3 == 0:  # a retry of a batch already acknowledged: must add nothing
                    valid_batch(client, url, batch, tally)
            print(f"{'valid traffic':22s} {time.perf_counter() - t0:6.1f} s  {args.valid} batches", flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    con = duckdb.connect(str(db), read_only=True)
    try:
        events = [r[0] for r in con.execute("SELECT event_id FROM ubi_events").fetchall()]
        queries = [r[0] for r in con.execute("SELECT query_id FROM ubi_queries").fetchall()]
        failed = con.execute("SELECT count(*), max(octet_length(raw)) FROM failed_records").fetchone()
    finally:
        con.close()
    lost = len(tally.acked_events - set(events)) + len(tally.acked_queries - set(queries))
    duplicated = (len(events) - len(set(events))) + (len(queries) - len(set(queries)))
    out = {"acknowledged": len(tally.acked_events) + len(tally.acked_queries),
           "stored": len(events) + len(queries), "lost": lost, "duplicated": duplicated,
           "answers_5xx": sum(n for s, n in tally.answers.items() if s >= 500), "answers": tally.answers,
           "failed_records": failed[0], "largest_kept_body_bytes": failed[1], "steps": steps,
           "writer_memory_limit": args.writer_memory_limit, "store": str(db)}
    print(f"acknowledged {out['acknowledged']:,}  stored {out['stored']:,}  lost {lost}  duplicated {duplicated}  "
          f"5xx answers {out['answers_5xx']}  failed_records {failed[0]:,} (largest kept body {failed[1]} bytes)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", type=int, default=60, help="big bodies and big user_query records sent (default 60)")
    ap.add_argument("--valid", type=int, default=200, help="valid batches after the attacks (default 200)")
    ap.add_argument("--writer-memory-limit", default="64MB", help="UBI_WRITER_MEMORY_LIMIT of the collector (64MB)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    args = ap.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=2))
    return 0 if out["lost"] == 0 and out["duplicated"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
