"""Snapshot benchmark: how long single-event POSTs wait while a reader's snapshot copies a large store.

``ubi process`` and ``ubi report`` read a running collector's store through ``POST /v1/admin/snapshot``, a
copy of the whole database. This builds a store of ``--events`` events (synthetic rows of the stored shape,
written straight into DuckDB), starts a real ``ubi serve`` on it, sends single-event POSTs over a few
keep-alive connections, asks for one snapshot in the middle, and prints the POST latency before and during
the snapshot: the longest POST during the copy is what a client of the collector feels.

    .venv/bin/python bench/snapshot.py [--events 3000000] [--connections 4] [--json]

Nothing is asserted here; the ordering guarantee (writes commit during a copy, the copy holds whole
commits) is tested in tests/collector/test_store.py. Bounded: the load stops one second after the snapshot
answers, or after ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ingest import _request, make_events, start_server  # noqa: E402  (bench/ingest.py, same folder)


def build_store(db: Path, n: int) -> None:
    """``n`` events of the stored shape (10-result searches, impressions and a tenth clicks), in one INSERT."""
    import duckdb

    from store.duckdb_store import ensure_tables

    con = duckdb.connect(str(db))
    try:
        ensure_tables(con)
        con.execute(
            f"""
            INSERT INTO ubi_events (event_key, event_id, action_name, query_id, session_id, client_id,
                application, timestamp, user_query, object_id, object_id_field, position_ordinal,
                event_attributes, received_at)
            SELECT 'id:pre-' || i, 'pre-' || i, CASE WHEN i % 10 = 3 THEN 'click' ELSE 'impression' END,
                'q' || (i // 10), 's' || (i // 50), 'c' || (i // 50), 'bench',
                TIMESTAMP '2024-05-01' + INTERVAL (i) SECOND,
                'query ' || (i // 10 % 5000), 'doc-' || hash(i) % 50000, 'sku', (i % 10)::INTEGER,
                '{{"object": {{"object_id": "doc-' || hash(i) % 50000 || '", "object_id_field": "sku"}}, '
                    || '"position": {{"ordinal": ' || (i % 10) || '}}}}',
                TIMESTAMP '2024-05-01'
            FROM range({int(n)}) r(i)
            """
        )
        con.execute("CHECKPOINT")
    finally:
        con.close()


async def _client(
    host: str, port: int, requests: list[bytes], out: list[tuple[float, float]], stop: threading.Event
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    i = 0
    try:
        while not stop.is_set():
            req = requests[i % len(requests)]  # past the end, replays count as duplicates: still a commit
            i += 1
            t0 = time.perf_counter()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            match = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await reader.readexactly(int(match.group(1)) if match else 0)
            if not head.startswith(b"HTTP/1.1 202"):
                raise RuntimeError(f"unexpected answer: {head[:200]!r}")
            out.append((t0, time.perf_counter() - t0))
    finally:
        writer.close()


def _stats(latencies: list[float]) -> dict:
    if not latencies:
        return {"requests": 0}
    lat = sorted(latencies)
    return {
        "requests": len(lat),
        "p50_ms": round(1000 * statistics.median(lat), 2),
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
        "max_ms": round(1000 * lat[-1], 2),
    }


def run(n_events: int, connections: int, warmup: float, timeout: float) -> dict:
    import httpx

    work = Path(tempfile.mkdtemp(prefix="ubi-bench-snapshot-"))
    db = work / "ubi.duckdb"
    t0 = time.perf_counter()
    build_store(db, n_events)
    built = time.perf_counter() - t0
    size_mb = sum(p.stat().st_size for p in work.glob("ubi.duckdb*")) / 1e6
    proc, host, port = start_server(db)
    url = f"http://{host}:{port}"
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    window: dict[str, float] = {}
    snap_path: list[str] = []
    try:
        httpx.get(url + "/healthz", timeout=30).raise_for_status()
        events = make_events(200_000, "snap")
        requests = [_request(orjson.dumps(e)) for e in events]
        shares = [requests[i::connections] for i in range(connections)]

        def take_snapshot() -> None:
            time.sleep(warmup)
            window["start"] = time.perf_counter()
            resp = httpx.post(url + "/v1/admin/snapshot", timeout=600)
            window["end"] = time.perf_counter()
            resp.raise_for_status()
            snap_path.append(resp.json()["path"])
            time.sleep(1.0)  # a second of load after the copy, to see it recover
            stop.set()

        def watchdog() -> None:
            if not stop.wait(timeout):
                stop.set()

        threads = [threading.Thread(target=take_snapshot), threading.Thread(target=watchdog, daemon=True)]
        for t in threads:
            t.start()

        async def load() -> None:
            await asyncio.gather(*(_client(host, port, s, samples, stop) for s in shares))

        asyncio.run(load())
        stop.set()
        threads[0].join()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    start, end = window.get("start"), window.get("end")
    if start is None or end is None:
        raise SystemExit("the snapshot did not finish within --timeout; raise it or lower --events")
    # A request overlaps the copy when it was in flight at any moment between the snapshot's start and end.
    before = [lat for s, lat in samples if s + lat < start]
    during = [lat for s, lat in samples if s < end and s + lat > start]
    snap_mb = Path(snap_path[0]).stat().st_size / 1e6 if snap_path and Path(snap_path[0]).exists() else 0.0
    for leftover in work.iterdir():
        leftover.unlink()
    work.rmdir()
    return {
        "events_stored": n_events,
        "store_mb": round(size_mb, 1),
        "build_s": round(built, 1),
        "snapshot_s": round(end - start, 2),
        "snapshot_mb": round(snap_mb, 1),
        "connections": connections,
        "before": _stats(before),
        "during": _stats(during),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--events", type=int, default=3_000_000, help="events in the store (default 3,000,000)"
    )
    parser.add_argument("--connections", type=int, default=4, help="keep-alive connections sending POSTs")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before the snapshot")
    parser.add_argument("--timeout", type=float, default=120.0, help="stop the load after this many seconds")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    row = run(args.events, args.connections, args.warmup, args.timeout)
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    print(
        f"store: {row['events_stored']:,} events, {row['store_mb']} MB (built in {row['build_s']} s); "
        f"snapshot: {row['snapshot_s']} s, {row['snapshot_mb']} MB; {row['connections']} connections"
    )
    print(f"{'single-event POSTs':<28} {'requests':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name in ("before", "during"):
        s = row[name]
        label = "before the snapshot" if name == "before" else "during the snapshot"
        print(
            f"{label:<28} {s['requests']:>9,} {s.get('p50_ms', 0):>8} {s.get('p99_ms', 0):>8} {s.get('max_ms', 0):>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
