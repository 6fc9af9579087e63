"""Reading a live store: what a reader costs, and what single-event POSTs feel, while a collector ingests.

Builds a store of ``--events`` events (synthetic rows of the stored shape, written straight into DuckDB),
starts a collector on it (``ubi serve``'s app and server, plus one bench-only route, below), keeps single-event
POSTs going over ``--connections`` keep-alive connections, and runs readers in other processes one phase at a
time, printing for each phase the reader's wall and CPU time and peak RSS, the collector's CPU, POST latency
p50/p99/max while the phase ran, and the disk used by the store and its sealed segments:

* ``sealed, first read``: the first reader makes the collector seal the whole store (one-time cost);
* ``sealed, next read``: a reader after it, sealing only what was POSTed since;
* ``sealed, 2 readers at once``: two readers together (no per-reader copy: disk does not grow per reader);
* ``..., not yielding``: the same two phases with readers as they ran before ``ubi_pipeline.store.client.yield_to_writer``
  (``UBI_READER_NICE=0``, ``UBI_READER_THREADS`` = the cores);
* ``in-collector query``: design (a) of issue 14 item 3, prototyped here only: the same read query run
  by the collector itself in one read transaction on its own cursor, the (small) Arrow result sent back;
* ``control: a busy process, no read``: a process that only burns CPU (one thread, ``BURN_SECONDS``), touching
  neither the store nor the collector: what CPU contention alone does to POST latency on this machine;
* ``no reader again``: POSTs only, after the reads, so the baseline is taken twice in the same run;
* ``plain scan, file free``: the same query on the DuckDB file opened read-only, the collector stopped.

Each POST is also counted in the stage the (first) reader was in when it was sent (Python start, imports, the
seal request, opening the segments, the scan, exit). ``--phases`` picks phases, ``--repeat`` runs them that many
times, interleaved, and pools their POSTs; ``--tag`` with ``--whole-key-scan`` measures retries (below).

Every reader runs the same aggregation, the shape of the processors' statistics: events and clicks per
(query text, position), 50,000 rows out of the whole events table.

    .venv/bin/python bench/read_live.py [--events 3000000] [--connections 4] [--json]
    .venv/bin/python bench/read_live.py --store COPY.duckdb   # an existing store (e.g. bench/scale.py's), in place

Retries: a second run with the same ``--tag`` on the same ``--store`` POSTs the same events again, every one a
duplicate whose keys the Bloom filter cannot rule out; ``--whole-key-scan`` makes the collector's lookups read the
whole key table, as before ``ubi_pipeline.store.keys.BlockFilters``.

With ``--store`` the file is used as it is and written to (the bench's POSTs, its sealed segments beside it):
pass a copy. It is not removed afterwards.

Bounded: each phase has a ``--timeout``; the POST load stops when the phases are done. Figures depend on the
machine's load: CPU time is printed beside wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ingest import _request, make_events  # noqa: E402  (bench/ingest.py, same folder)

#: wall seconds of the control phase's busy process (about a reader's wall time at 20M events here)
BURN_SECONDS = 8.0

SCAN_SQL = """
SELECT user_query, position_ordinal, count(*) AS events, count(*) FILTER (WHERE action_name = 'click') AS clicks
FROM ubi_events GROUP BY ALL
"""


def build_store(db: Path, n: int) -> None:
    """``n`` events of the stored shape (10-result searches, impressions and a tenth clicks), in one INSERT."""
    import duckdb

    from ubi_pipeline.store.duckdb_store import ensure_tables

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
                TIMESTAMP '2024-05-01' + INTERVAL (i // 100000) DAY
            FROM range({int(n)}) r(i)
            """
        )
        con.execute("CHECKPOINT")
    finally:
        con.close()


# ---------------------------------------------------------------- the collector (run with --serve DB)


def serve(db: Path, whole_key_scan: bool = False) -> int:
    """``ubi serve --db DB --port 0`` (ubi/commands/collector.py: same app, sink, sidecar and server config), plus
    ``POST /bench/in-collector-query``: design (a), the read query run by the collector in a read transaction."""
    import pyarrow as pa
    from fastapi import Response

    from ubi_pipeline.collector.app import create_app
    from ubi_pipeline.collector.server import bind_socket, make_server, server_config
    from ubi_pipeline.collector.sinks import create_sink
    from ubi_pipeline.collector.workers import tune_gc
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.store.client import advertise

    if whole_key_scan:  # every lookup reads the whole key table, as before the block filters (store/keys.py)
        from ubi_pipeline.store.keys import BlockFilters

        BlockFilters.candidates = lambda self, hashes, most=None: None  # type: ignore[method-assign]
    settings = Settings(db=db, port=0)
    sock = bind_socket(settings.host, 0)
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}"
    sink = create_sink(settings)
    app = create_app(settings, sink)
    store = sink.store

    def in_collector_query() -> bytes:
        with store.reading_cursor() as cur:
            cur.execute("BEGIN TRANSACTION")
            try:
                table = cur.sql(SCAN_SQL).to_arrow_table()
            finally:
                cur.execute("COMMIT")
        out = pa.BufferOutputStream()
        with pa.ipc.new_stream(out, table.schema) as writer:
            writer.write_table(table)
        return out.getvalue().to_pybytes()

    @app.post("/bench/in-collector-query")
    async def bench_query() -> Response:
        return Response(await asyncio.to_thread(in_collector_query), media_type="application/vnd.apache.arrow.stream")

    side = advertise(store.path, url)
    tune_gc()
    print(f"ubi collector listening on {url} (bench, db {db})", flush=True)
    try:
        make_server(server_config(app, settings, log_level="warning", timeout_graceful_shutdown=10)).run(sockets=[sock])
    finally:
        side.unlink(missing_ok=True)
        sink.close()
        sock.close()
    return 0


# ---------------------------------------------------------------- a reader (run with --read DB MODE)


def read(db: Path, mode: str, url: str) -> int:
    """One reader process; prints its timings as JSON."""
    import resource

    t0, c0 = time.perf_counter(), time.process_time()
    stamps: dict[str, float] = {"started": t0}  # perf_counter is CLOCK_MONOTONIC on Linux: the bench's clock too
    sealing = 0.0
    if mode == "burn":  # the control: a process as busy as a reader for as long, touching neither store nor collector
        while time.perf_counter() - t0 < BURN_SECONDS:
            sum(range(10_000))
        print(json.dumps({"wall_s": time.perf_counter() - t0, "open_s": 0.0, "seal_s": 0.0,
                          "cpu_s": time.process_time() - c0, "rss_mb": 0.0, "rows": 0,
                          "stamps": {**stamps, "burned": time.perf_counter()}}), flush=True)
        return 0
    if mode == "sealed" or mode == "file":
        from ubi_pipeline.schemas.settings import Settings
        from ubi_pipeline.store.client import open_reader, request_seal, yield_to_writer
        from ubi_pipeline.store.sealed import open_sealed

        stamps["imported"] = time.perf_counter()
        if mode == "sealed":  # what open_reader does when a collector holds the file, keeping the seal's time
            sealed = request_seal(db)
            stamps["sealed"] = time.perf_counter()
            sealing = sealed.seconds
            con = open_sealed(sealed, threads=yield_to_writer(Settings()))
        else:
            con = open_reader(db)
        stamps["opened"] = time.perf_counter()
        opened = stamps["opened"] - t0
        rows = len(con.execute(SCAN_SQL).fetchall())
        stamps["scanned"] = time.perf_counter()
        con.close()
    else:
        import httpx
        import pyarrow as pa

        stamps["imported"] = time.perf_counter()
        resp = httpx.post(url + "/bench/in-collector-query", timeout=600)
        resp.raise_for_status()
        opened = 0.0
        rows = pa.ipc.open_stream(pa.py_buffer(resp.content)).read_all().num_rows
        stamps["answered"] = time.perf_counter()
    print(json.dumps({
        "wall_s": time.perf_counter() - t0, "open_s": opened, "seal_s": sealing, "cpu_s": time.process_time() - c0,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rows": rows, "stamps": stamps,
    }), flush=True)
    return 0


# ---------------------------------------------------------------- the bench


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def disk_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 1e6
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6 if path.exists() else 0.0


async def _client(host: str, port: int, requests: list[bytes], out: list[tuple[float, float]],
                  stop: threading.Event) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    i = 0
    try:
        while not stop.is_set():
            req = requests[i % len(requests)]
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


#: A reader's stages, by the stamp that ends each (the first begins when the bench spawns the reader).
STAGES = {"started": "python start", "imported": "imports", "sealed": "seal request", "answered": "query in collector",
          "opened": "open segments", "scanned": "scan", "burned": "burn", "exited": "exit"}


def _by_stage(spawned: float, stamps: dict[str, float], exited: float, samples: list[tuple[float, float]],
              pool: dict[str, list[float]]) -> dict[str, dict]:
    """POST latency per stage of one reader: each POST counted in the stage during which it was sent (and added
    to ``pool``, by stage)."""
    marks = sorted((*stamps.items(), ("exited", exited)), key=lambda kv: kv[1])
    out: dict[str, dict] = {}
    begin = spawned
    for name, end in marks:
        lats = [lat for s, lat in samples if begin <= s < end]
        out[STAGES.get(name, name)] = {"seconds": round(end - begin, 3), **_stats(lats)}
        pool.setdefault(STAGES.get(name, name), []).extend(lats)
        begin = end
    return out


def _start(args: list[str], cwd: Path, stderr: object = subprocess.PIPE,
           env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def count_events(db: Path) -> int:
    """Rows of ``ubi_events`` in a store nobody holds (read-only)."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        return int(con.execute("SELECT count(*) FROM ubi_events").fetchall()[0][0])


#: The phases, in the order they run, by the name ``--phases`` selects them with.
PHASES = {
    "baseline": ("no reader (baseline)", "", 0),
    "first": ("sealed, first read", "sealed", 1),
    "next": ("sealed, next read", "sealed", 1),
    "two": ("sealed, 2 readers at once", "sealed", 2),
    # the same reads as before readers stepped back for the writer (ubi_pipeline.store.client.yield_to_writer)
    "next-eager": ("sealed, next read, not yielding", "sealed", 1),
    "two-eager": ("sealed, 2 at once, not yielding", "sealed", 2),
    "design-a": ("in-collector query (design a)", "in-collector", 1),
    "control": ("control: a busy process, no read", "burn", 1),
    "again": ("no reader again (baseline)", "", 0),
}


def run(n_events: int, connections: int, timeout: float, store: Path | None = None,
        selected: list[str] | None = None, repeat: int = 1, tag: str | None = None,
        whole_key_scan: bool = False) -> dict:
    """The phases on a store built here of ``n_events`` events, or on ``store`` (an existing file, used in place).

    ``store`` is written to (the POSTs land in it, its sealed segments are made beside it): pass a copy.
    """
    work = Path(tempfile.mkdtemp(prefix="ubi-bench-read-live-"))
    reader_cwd = work / "reader-cwd"
    reader_cwd.mkdir()
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    if store is None:
        db = work / "ubi.duckdb"
        build_store(db, n_events)
    else:
        db = store.resolve()
        n_events = count_events(db)
    built = time.perf_counter() - t0
    sealed_dir = Path(str(db) + ".sealed")
    store_mb = disk_mb(db)
    log = open(work / "collector.log", "w")  # noqa: SIM115 (open for the collector's life)
    server = _start(["--serve", str(db), *(["--whole-key-scan"] if whole_key_scan else [])], ROOT, stderr=log)
    line = server.stdout.readline() if server.stdout else ""
    match = re.search(r"http://([\d.]+):(\d+)", line)
    if not match:
        server.kill()
        raise SystemExit(f"collector did not start: {line}{(work / 'collector.log').read_text()}")
    host, port = match.group(1), int(match.group(2))
    url = f"http://{host}:{port}"
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    phases: list[dict] = []
    pooled: dict[str, list[float]] = {}  # POST latencies of every repetition of a phase
    pooled_stages: dict[str, dict[str, list[float]]] = {}  # the same by the (first) reader's stage

    def phase(name: str, mode: str, readers: int = 1) -> None:
        cpu0, start = proc_cpu(server.pid), time.perf_counter()
        if not readers:  # the baseline: POSTs only, for as long as a short read
            time.sleep(5.0)
            end = time.perf_counter()
            phases.append({"phase": name, "readers": 0, "collector_cpu_s": round(proc_cpu(server.pid) - cpu0, 2),
                           "seconds": round(end - start, 2),
                           "post": _stats(window := [lat for s, lat in samples if s < end and s + lat > start]),
                           "sealed_mb": round(disk_mb(sealed_dir), 1), "reader_files_left": 0})
            pooled.setdefault(name, []).extend(window)
            time.sleep(1.0)
            return
        eager = {"UBI_READER_NICE": "0", "UBI_READER_THREADS": str(os.cpu_count() or 1)} if "not yielding" in name else {}
        procs = [_start(["--read", str(db), mode, url], reader_cwd, env=eager) for _ in range(readers)]
        outs = []
        exited = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            exited.append(time.perf_counter())
            if p.returncode != 0:
                raise RuntimeError(f"{name}: reader failed: {err[-2000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
        end = time.perf_counter()
        during = [lat for s, lat in samples if s < end and s + lat > start]
        pooled.setdefault(name, []).extend(during)
        phases.append({
            "phase": name, "readers": readers,
            "reader_wall_s": round(max(o["wall_s"] for o in outs), 2),
            "reader_open_s": round(max(o["open_s"] for o in outs), 2),
            "seal_s": round(max(o["seal_s"] for o in outs), 2),
            "reader_cpu_s": round(max(o["cpu_s"] for o in outs), 2),
            "reader_rss_mb": round(max(o["rss_mb"] for o in outs)),
            "rows": outs[0]["rows"],
            "collector_cpu_s": round(proc_cpu(server.pid) - cpu0, 2),
            "seconds": round(end - start, 2),
            "post": _stats(during),
            "sealed_mb": round(disk_mb(sealed_dir), 1),
            "reader_files_left": len(list(reader_cwd.iterdir())),
            # the first reader's stages (with two readers the second runs alongside)
            "stages": _by_stage(start, outs[0]["stamps"], exited[0], samples, pooled_stages.setdefault(name, {})),
        })
        time.sleep(1.0)

    def phases_then_stop() -> None:
        try:
            time.sleep(2.0)  # load before the first reader
            chosen = [k for k in PHASES if selected is None or k in selected]
            # the first read seals the whole store: once; the others as often as asked, interleaved (load drifts)
            for rep in range(repeat):
                for key in chosen:
                    if key != "first" or rep == 0:
                        phase(*PHASES[key])
        finally:
            stop.set()

    # a tag of this run's own: rerun on the same --store, the POSTs are new events, not retries of the last
    # run's (a retry is a Bloom filter hit and a key-table lookup: another cost, measured with --tag)
    events = make_events(200_000, tag or f"live-{uuid.uuid4().hex[:8]}")
    requests = [_request(orjson.dumps(e)) for e in events]
    shares = [requests[i::connections] for i in range(connections)]
    driver = threading.Thread(target=phases_then_stop)
    before = 0
    try:
        import httpx

        httpx.get(url + "/healthz", timeout=30).raise_for_status()
        driver.start()

        async def load() -> None:
            await asyncio.gather(*(_client(host, port, s, samples, stop) for s in shares))

        asyncio.run(load())
        driver.join()
        before = len(samples)
        collector_hwm = proc_hwm_mb(server.pid)
    finally:
        stop.set()
        server.terminate()
        server.wait(timeout=120)
        log.close()
    plain = _start(["--read", str(db), "file", url], reader_cwd)
    out, err = plain.communicate(timeout=timeout)
    if plain.returncode != 0:
        raise RuntimeError(f"plain scan failed: {err[-2000:]}")
    o = json.loads(out.strip().splitlines()[-1])
    phases.append({"phase": "plain scan, file free", "readers": 1, "reader_wall_s": round(o["wall_s"], 2),
                   "reader_open_s": round(o["open_s"], 2), "reader_cpu_s": round(o["cpu_s"], 2),
                   "reader_rss_mb": round(o["rss_mb"]), "rows": o["rows"], "collector_cpu_s": 0.0,
                   "seconds": round(o["wall_s"], 2), "post": {"requests": 0}, "sealed_mb": round(disk_mb(sealed_dir), 1),
                   "reader_files_left": len(list(reader_cwd.iterdir()))})
    result = {
        "load_average_start": round(load_start, 1), "load_average_end": round(os.getloadavg()[0], 1),
        "events_stored": n_events, "store_mb": round(store_mb, 1), "build_s": round(built, 1),
        "connections": connections, "posts": before, "collector_peak_rss_mb": round(collector_hwm),
        "store_mb_after": round(disk_mb(db), 1), "phases": phases,
        "pooled": {name: _stats(lats) for name, lats in pooled.items()}, "repeat": repeat,
        "pooled_stages": {name: {st: _stats(lats) for st, lats in by.items()} for name, by in pooled_stages.items()},
    }
    shutil.rmtree(work, ignore_errors=True)  # a --store is left where it is, with its sealed segments
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=3_000_000, help="events in the store (default 3,000,000)")
    parser.add_argument("--store", type=Path, metavar="DB",
                        help="use this existing store instead of building one (it is written to: pass a copy)")
    parser.add_argument("--connections", type=int, default=4, help="keep-alive connections sending POSTs")
    parser.add_argument("--timeout", type=float, default=900.0, help="longest a phase's reader may take (s)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--tag", help="tag of the POSTed events (default: one of this run's own); a second run with "
                        "the same tag on the same --store POSTs retries, every one a duplicate")
    parser.add_argument("--whole-key-scan", action="store_true",
                        help="the collector's key lookups read the whole key table (as before store/keys.py's block "
                             "filters), to compare retries")
    parser.add_argument("--phases", nargs="+", choices=list(PHASES), help="run only these phases (default: all)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each phase but the first read this many times; POST latencies are also pooled "
                             "over the repetitions (a 2-s read sees a few hundred POSTs: its p99 is the 4th worst)")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # internal: the collector process
    parser.add_argument("--read", nargs=3, metavar=("DB", "MODE", "URL"), help=argparse.SUPPRESS)  # a reader
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve, args.whole_key_scan)
    if args.read:
        return read(Path(args.read[0]), args.read[1], args.read[2])
    row = run(args.events, args.connections, args.timeout, args.store, args.phases, args.repeat, args.tag,
              args.whole_key_scan)
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    print(f"load average {row['load_average_start']} at the start, {row['load_average_end']} at the end ({os.cpu_count()} "
          "cores, shared machine: latencies include CPU contention)")
    print(f"store: {row['events_stored']:,} events, {row['store_mb']} MB (built or counted in {row['build_s']} s), "
          f"{row['store_mb_after']} MB after the run; {row['connections']} connections, {row['posts']:,} POSTs; "
          f"collector peak RSS {row['collector_peak_rss_mb']} MB")
    base = next((p for p in row["phases"] if p["readers"] == 0), None)
    # the collector's CPU per POST (0 without a baseline phase: "beyond" is then the collector's CPU)
    per_post = base["collector_cpu_s"] / max(1, base["post"]["requests"]) if base else 0.0
    print(f"{'phase':<32} {'reader s':>8} {'open s':>7} {'seal s':>6} {'cpu s':>6} {'rss MB':>6} {'coll cpu':>8} {'beyond':>6} "
          f"{'POSTs':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'sealed MB':>9} {'left':>4}")
    for p in row["phases"]:
        s = p["post"]
        beyond = round(p["collector_cpu_s"] - per_post * s["requests"], 2)  # CPU the read cost the collector
        print(f"{p['phase']:<32} {p.get('reader_wall_s', '-'):>8} {p.get('reader_open_s', '-'):>7} "
              f"{p.get('seal_s', '-'):>6} {p.get('reader_cpu_s', '-'):>6} {p.get('reader_rss_mb', '-'):>6} {p['collector_cpu_s']:>8} "
              f"{beyond:>6} {s['requests']:>6} {s.get('p50_ms', '-'):>7} {s.get('p99_ms', '-'):>7} "
              f"{s.get('max_ms', '-'):>7} {p['sealed_mb']:>9} {p['reader_files_left']:>4}")
    print("open: the reader's wall time to a connection, Python imports included; seal: of that, the time the "
          "collector spent sealing")
    print("coll cpu: the collector's CPU seconds during the phase; beyond: less what its POSTs cost at the "
          "baseline's CPU per POST; left: files left in the readers' working directory")
    if row["repeat"] > 1:
        print(f"POST latency pooled over the {row['repeat']} repetitions of each phase:")
        for name, s in row["pooled"].items():
            print(f"  {name:<32} {s['requests']:>6} POSTs  p50 {s.get('p50_ms', '-')} ms  p99 {s.get('p99_ms', '-')} ms  "
                  f"max {s.get('max_ms', '-')} ms")
    print("POST latency by the stage the (first) reader was in when the POST was sent (over the repetitions):")
    for name, by in row["pooled_stages"].items():
        for stage, s in by.items():
            print(f"  {name:<32} {stage:<20} {s['requests']:>5} POSTs  "
                  f"p50 {s.get('p50_ms', '-'):>7}  p99 {s.get('p99_ms', '-'):>7}  max {s.get('max_ms', '-'):>7} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
