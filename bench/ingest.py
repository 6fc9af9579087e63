"""Ingest benchmark: a real ``ubi serve`` on loopback against the in-process ceiling, in one run.

Measures (figures printed as a table; nothing here is asserted):

* in-process ceiling: parse + validate + build rows + one committed DuckDB write per 500-event batch,
  no HTTP (the same functions the server runs), on a fresh database file;
* batch ingest: events/s through ``POST /v1/events`` with 500-event JSON arrays, several connections;
* single events: requests/s through ``POST /v1/events`` with one event per request, many connections;
* p50 / p99 latency of each HTTP run (request written to response read);

then stops the server and checks that the database holds exactly the acknowledged events.

The load generator runs in separate processes (a minimal keep-alive HTTP/1.1 client on asyncio
streams, request bytes built before the clock starts), so the client is not the bottleneck it would be
with a general-purpose client. On a 2-core machine client and server share the CPU: the HTTP figures are
a lower bound for a server with its own cores.

With ``--shapes`` it runs the batch and single-event runs once per producer shape instead (``bench/shapes.py``:
the simulator's events with ``event_id``; the reference JavaScript client's, which posts one-element arrays and
no ``event_id``; Python ``json.dumps``', no ``event_id``), each against a fresh server, and prints per shape
events/s, requests/s, p99, the batch rate over the one-core pydantic validation ceiling of the same bodies
(``TypeAdapter(list[UbiEvent]).validate_python`` of each parsed body, measured in the same run) and the
server's peak RSS.

Every HTTP run also says where its time went: the server's CPU over the run's wall time (cores busy), the
share of wall time the writer thread spent writing groups (``ubi_sink_write_seconds_total``: rows into
DuckDB and COMMIT, or the answer log) and the requests per DuckDB commit. The server's threads share one
GIL, so a server near one core is bound by its CPU per request even with a core idle (``bench/ack_modes.py``
shows it for single events). A run ends when DuckDB has committed its last row (rows answered from the answer
log are committed within ``UBI_LOG_COMMIT_MS``): ``committed`` is the rate up to then, and the server's CPU
and counters include that commit.

    .venv/bin/python bench/ingest.py [--events 100000] [--singles 20000] [--json]
    .venv/bin/python bench/ingest.py --shapes [--events 50000] [--singles 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# last, not first: bench/kafka.py loads this file, and with bench/ first on the path `import kafka` would find
# bench/kafka.py instead of kafka-python (bench/faults.py --kafka broke that way)
sys.path.append(str(ROOT / "bench"))
from shapes import render  # noqa: E402  (bench/shapes.py)

#: The shapes of --shapes: (name, shape of bench/shapes.py, whether a single event is sent as a one-element array).
HTTP_SHAPES = (("simulator (event_id)", "simulator", False), ("js-client (no id)", "js-client", True),
               ("python-json (no id)", "python-json", False))

BATCH = 500


def make_events(n: int, tag: str, seed: int = 0) -> list[dict]:
    """``n`` distinct, realistic events (impressions and clicks of 10-result searches)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        q = i // 10
        out.append(
            {
                "action_name": "click" if rng.random() < 0.1 else "impression",
                "query_id": f"{tag}-q{q}",
                "session_id": f"{tag}-s{q // 5}",
                "client_id": f"{tag}-c{q // 5}",
                "application": "bench",
                "timestamp": f"2024-05-{1 + i % 28:02d}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
                "user_query": rng.choice(["running shoes", "laptop", "usb c cable", "rain jacket"]),
                "event_attributes": {
                    "object": {"object_id": f"doc-{rng.randrange(50_000)}", "object_id_field": "sku"},
                    "position": {"ordinal": i % 10},
                },
            }
        )
    return out


# ---------------------------------------------------------------- in-process ceiling


def in_process(n_events: int, workdir: Path) -> dict:
    from ubi_pipeline.collector.ingest import ingest_many, parse_items, prepare, validate_items
    from ubi_pipeline.collector.workers import tune_gc
    from ubi_pipeline.store.duckdb_store import Store

    events = make_events(n_events, "inproc")
    bodies = [orjson.dumps(events[i : i + BATCH]) for i in range(0, n_events, BATCH)]
    del events
    tune_gc()
    db = workdir / "inproc.duckdb"
    stored = 0
    with Store(db) as store:
        started = time.perf_counter()
        for body in bodies:
            prepared = prepare(validate_items(parse_items(body, "event")), source="/v1/events")
            stored += ingest_many(store, [prepared])[0].accepted
        elapsed = time.perf_counter() - started
    return {
        "run": "in-process ceiling (500/batch)",
        "events": stored,
        "seconds": elapsed,
        "events_per_s": stored / elapsed,
    }


# ---------------------------------------------------------------- load generator


async def _connection(host: str, port: int, requests: list[bytes], latencies: list[float]) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    ok = 0
    try:
        for req in requests:
            t0 = time.perf_counter()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            match = re.search(rb"(?i)content-length:\s*(\d+)", head)
            body = await reader.readexactly(int(match.group(1)) if match else 0)
            latencies.append(time.perf_counter() - t0)
            if head.startswith(b"HTTP/1.1 202"):
                ok += 1
            else:
                raise RuntimeError(f"unexpected answer: {head[:200]!r} {body[:200]!r}")
    finally:
        writer.close()
    return ok


def shaped_bodies(events: list[dict], per_request: int, shape: str | None, array_of_one: bool = False) -> list[bytes]:
    """Request bodies of ``events``, ``per_request`` each, in ``shape`` (None: this bench's own compact JSON)."""
    if shape is None:
        if per_request == 1:
            return [orjson.dumps(e) for e in events]
        return [orjson.dumps(events[i : i + per_request]) for i in range(0, len(events), per_request)]
    docs = [render(shape, "event", {**e, "event_id": f"{e['query_id']}-{n}"}) for n, e in enumerate(events)]
    sep = b", " if shape == "python-json" else b","
    if per_request == 1 and not array_of_one:
        return docs
    return [b"[" + sep.join(docs[i : i + per_request]) + b"]" for i in range(0, len(docs), per_request)]


def validation_ceiling(bodies: list[bytes]) -> float:
    """Events per CPU second of pydantic validating ``bodies`` (orjson parse, then one validate_python call
    per body), one core, nothing else: the ceiling the issue compares HTTP ingest to."""
    from pydantic import TypeAdapter

    from ubi_pipeline.schemas.ubi import UbiEvent

    many = TypeAdapter(list[UbiEvent])
    t0, n = time.process_time(), 0
    for body in bodies:
        n += len(many.validate_python(orjson.loads(body)))
    return n / (time.process_time() - t0)


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident set (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _request(body: bytes) -> bytes:
    return (
        b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body


def _worker(args: tuple) -> tuple[int, list[float], float, float]:
    host, port, tag, n_events, per_request, connections, barrier, shape, array_of_one = args
    events = make_events(n_events, tag, seed=hash(tag) % 1000)
    bodies = shaped_bodies(events, per_request, shape, array_of_one)
    requests = [_request(b) for b in bodies]
    shares = [requests[i::connections] for i in range(connections)]
    latencies: list[float] = []
    barrier.wait()

    async def main() -> int:
        counts = await asyncio.gather(*(_connection(host, port, s, latencies) for s in shares))
        return sum(counts)

    t0 = time.time()
    try:  # the client's own CPU comes out of the same two cores: keep it as cheap as possible
        import uvloop

        ok = uvloop.run(main())
    except ImportError:
        ok = asyncio.run(main())
    return ok, latencies, t0, time.time()


def http_load(
    host: str, port: int, *, name: str, n_events: int, per_request: int, processes: int, connections: int,
    shape: str | None = None, array_of_one: bool = False,
) -> dict:
    ctx = mp.get_context("fork")
    barrier = ctx.Manager().Barrier(processes)
    per_proc = n_events // processes
    jobs = [
        (host, port, f"{name}-{p}-{os.getpid()}", per_proc, per_request, connections, barrier, shape, array_of_one)
        for p in range(processes)
    ]
    with ctx.Pool(processes) as pool:
        results = pool.map(_worker, jobs)
    ok = sum(r[0] for r in results)
    lat = sorted(x for r in results for x in r[1])
    elapsed = max(r[3] for r in results) - min(r[2] for r in results)
    requests = len(lat)
    return {
        "run": name,
        "events": ok * per_request,
        "requests": requests,
        "seconds": elapsed,
        "events_per_s": ok * per_request / elapsed,
        "requests_per_s": requests / elapsed,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "connections": processes * connections,
    }


# ---------------------------------------------------------------- server


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc), to report server cost per request."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_idle_seconds() -> tuple[float, float]:
    """The machine's (idle, all) CPU seconds so far, over every core (Linux /proc/stat; iowait counts as
    idle): the share left idle during a run says whether it was bound by the CPU or by the time a request
    takes (client round trips, fsync), which more connections would hide."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    return (fields[3] + fields[4]) / tick, sum(fields) / tick


def children(pid: int) -> list[int]:
    """The child processes of ``pid``: the server's parse workers (and multiprocessing's resource tracker)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread that ended
            continue
    return out


def _each_child(pid: int, value) -> float:
    total = 0.0
    for child in children(pid):
        try:
            total += value(child)
        except (FileNotFoundError, ProcessLookupError):  # a worker replaced meanwhile
            continue
    return total


def workers_cpu_seconds(pid: int) -> float:
    """CPU seconds of the server's parse workers so far."""
    return _each_child(pid, cpu_seconds)


def workers_peak_rss_mb(pid: int) -> float:
    """The parse workers' peak resident sets, summed, in MB."""
    return _each_child(pid, peak_rss_mb)


def parse_workers_running(host: str, port: int) -> float:
    import httpx

    text = httpx.get(f"http://{host}:{port}/metrics", timeout=30).text
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith("ubi_parse_workers ")), 0.0)


def warm_workers(host: str, port: int, shape: str | None, timeout: float = 120.0) -> int:
    """Start the server's parse workers before the clock (a collector starts them on its first large body and
    parses in process meanwhile, a second or two of a short run); returns the events stored doing so, which
    the runs' acknowledged counts must include. Does nothing when the server runs none (--parse-workers 0)."""
    import httpx

    sent, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = shaped_bodies(make_events(BATCH, f"warm-{sent}"), BATCH, shape)[0]
        answer = httpx.post(f"http://{host}:{port}/v1/events", content=body, timeout=60,
                            headers={"content-type": "application/json"})
        answer.raise_for_status()
        sent += int(answer.json()["accepted"])
        if parse_workers_running(host, port) > 0:
            return sent
        time.sleep(0.2)
    return sent


def sink_counters(host: str, port: int) -> dict[str, float]:
    """The DuckDB sink's commit counters from /metrics (group commit: requests per commit)."""
    import httpx

    text = httpx.get(f"http://{host}:{port}/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith(("ubi_sink_commits_total", "ubi_sink_grouped_requests_total", "ubi_sink_write_seconds_total",
                            "ubi_sink_answered_uncommitted_rows", "ubi_sink_answered_from_log_total")):
            out[line.split("{")[0]] = float(line.split()[-1])
    return out


def committed(host: str, port: int, timeout: float = 120.0) -> dict[str, float]:
    """The sink's counters once DuckDB has committed every row answered from the answer log (the collector
    commits them within UBI_LOG_COMMIT_MS of answering): the run's work is then all counted."""
    deadline = time.monotonic() + timeout
    while True:
        counters = sink_counters(host, port)
        if not counters.get("ubi_sink_answered_uncommitted_rows") or time.monotonic() > deadline:
            return counters
        time.sleep(0.005)


def measured(proc: subprocess.Popen, host: str, port: int, **kwargs) -> dict:
    """One HTTP run with the server's CPU seconds and commits spent on it, up to the DuckDB commit of its
    last row (``committed_per_s``: events over that time; ``events_per_s``: while the clients sent)."""
    cpu0, c0 = cpu_seconds(proc.pid), sink_counters(host, port)
    w0 = workers_cpu_seconds(proc.pid)
    idle0 = machine_idle_seconds()
    row = http_load(host, port, **kwargs)
    idle1 = machine_idle_seconds()
    row["machine_idle"] = (idle1[0] - idle0[0]) / max(1e-9, idle1[1] - idle0[1])
    sent = time.monotonic()
    c1 = committed(host, port)
    row["drain_seconds"] = time.monotonic() - sent
    row["committed_per_s"] = row["events"] / (row["seconds"] + row["drain_seconds"])
    cpu1 = cpu_seconds(proc.pid)
    row["workers_cores"] = (workers_cpu_seconds(proc.pid) - w0) / row["seconds"]
    commits = c1["ubi_sink_commits_total"] - c0["ubi_sink_commits_total"]
    row["server_cpu_ms_per_request"] = 1000 * (cpu1 - cpu0) / max(1, row["requests"])
    row["requests_per_commit"] = (
        c1["ubi_sink_grouped_requests_total"] - c0["ubi_sink_grouped_requests_total"]
    ) / max(1, commits)
    # Where the time went: the server's CPU over the run's wall time (cores busy, of os.cpu_count()), and the
    # share of it the writer thread spent writing groups (rows to DuckDB and COMMIT). Both well under their
    # limits while requests wait means the run is bound by the time a request takes, not by the CPU.
    row["server_cores"] = (cpu1 - cpu0) / row["seconds"]
    row["writer_busy"] = (c1["ubi_sink_write_seconds_total"] - c0["ubi_sink_write_seconds_total"]) / row["seconds"]
    row["from_log"] = (c1.get("ubi_sink_answered_from_log_total", 0) - c0.get("ubi_sink_answered_from_log_total", 0)) / max(
        1, row["requests"])
    return row


def start_server(db: Path, *flags: str) -> tuple[subprocess.Popen, str, int]:
    """``ubi serve`` on a free port with ``flags``; the process, its host and port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ubi_pipeline", "serve", "--db", str(db), "--port", "0", *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"http://([\d.]+):(\d+)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"server did not start: {line}{proc.stdout.read() if proc.stdout else ''}")
    return proc, match.group(1), int(match.group(2))


def server_flags(args: argparse.Namespace) -> list[str]:
    return [] if args.parse_workers is None else ["--parse-workers", str(args.parse_workers)]


def pct(row: dict, ceiling: float) -> str:
    """Events/s as a share of the in-process ceiling (batch runs only: single events are not comparable)."""
    if row.get("requests") and row["events"] == row["requests"]:
        return "-"
    return f"{100 * row['events_per_s'] / ceiling:.0f}%"


def server_stack() -> str:
    """Which event loop and HTTP parser ``ubi serve`` picks here (uvloop/httptools when installed)."""
    from ubi_pipeline.collector.server import fast_loop

    opts = fast_loop()
    return f"{opts['loop']} + {opts['http']}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--events", type=int, default=100_000, help="events for the batch runs (default 100,000)"
    )
    parser.add_argument("--singles", type=int, default=20_000, help="single-event requests (default 20,000)")
    parser.add_argument(
        "--batch-connections", type=int, default=16,
        help="connections for the batch runs (default 16, as the issue's single-event target; at 4 a 2-core "
             "machine is left 15%% idle while requests wait on round trips and fsync: see the idle column)")
    parser.add_argument("--single-connections", type=int, default=32, help="connections for the single run")
    parser.add_argument("--processes", type=int, default=2, help="load-generator processes (default 2)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--shapes", action="store_true", help="one batch and one single run per producer shape")
    parser.add_argument("--parse-workers", type=int, default=None, metavar="N",
                        help="the server's parse worker processes (default: its own, one per core; 0: none)")
    args = parser.parse_args()
    if args.shapes:
        return shapes_run(args)

    import duckdb

    rows = []
    with tempfile.TemporaryDirectory(prefix="ubi-bench-") as tmp:
        workdir = Path(tmp)
        rows.append(in_process(args.events, workdir))
        db = workdir / "served.duckdb"
        proc, host, port = start_server(db, *server_flags(args))
        try:
            warmed = warm_workers(host, port, None) if args.parse_workers != 0 else 0
            rows.append(
                measured(
                    proc,
                    host,
                    port,
                    name="HTTP /v1/events, 500/request",
                    n_events=args.events,
                    per_request=BATCH,
                    processes=args.processes,
                    connections=max(1, args.batch_connections // args.processes),
                )
            )
            rows.append(
                measured(
                    proc,
                    host,
                    port,
                    name="HTTP /v1/events, 1/request",
                    n_events=args.singles,
                    per_request=1,
                    processes=args.processes,
                    connections=max(1, args.single_connections // args.processes),
                )
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        con = duckdb.connect(str(db), read_only=True)
        (stored,) = con.execute("SELECT count(*) FROM ubi_events").fetchone()
        con.close()
    acknowledged = warmed + sum(r["events"] for r in rows[1:])
    ceiling = rows[0]["events_per_s"]
    if args.json:
        print(json.dumps({"rows": rows, "acknowledged": acknowledged, "stored": stored}, indent=2))
        return 0 if stored == acknowledged else 1
    print(
        f"\nubi-pipeline ingest benchmark ({os.cpu_count()} cores; loopback; fresh DuckDB files; "
        f"load average {os.getloadavg()[0]:.1f} at the end)\n"
    )
    header = (
        f"{'run':34} {'events':>8} {'requests':>8} {'events/s':>9} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'% ceiling':>9} {'srv CPU ms/req':>14} {'srv cores':>9} {'wrk cores':>9} {'writer':>6} {'req/commit':>10} {'idle':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['run']:34} {r['events']:>8,} {r.get('requests', 0):>8,} {r['events_per_s']:>9,.0f} "
            f"{r.get('requests_per_s', 0):>7,.0f} {r.get('p50_ms', 0):>7.2f} {r.get('p99_ms', 0):>7.2f} "
            f"{pct(r, ceiling):>9} "
            + (f"{r['server_cpu_ms_per_request']:>14.3f} {r['server_cores']:>9.2f} {r['workers_cores']:>9.2f} "
               f"{r['writer_busy']:>6.0%} {r['requests_per_commit']:>10.1f} {r['machine_idle']:>5.0%}"
               if "server_cores" in r else f"{'-':>14} {'-':>9} {'-':>9} {'-':>6} {'-':>10} {'-':>5}")  # the in-process row has no server
        )
    print(
        f"\nacknowledged {acknowledged:,} events over HTTP; found {stored:,} in the database after shutdown"
    )
    print("server loop/http:", server_stack(), "; srv: the collector's process, wrk: its parse workers "
          f"({warmed:,} events sent before the clock started them)")
    return 0 if stored == acknowledged else 1


def shapes_run(args: argparse.Namespace) -> int:
    """``--shapes``: per shape a fresh server, a 500-event batch run and a single-event run."""
    import duckdb

    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start (shared machine: figures "
          "inflated by other work)")
    header = (f"{'shape':22} {'run':7} {'events/s':>9} {'committed':>9} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'/ceil':>6} {'srv RSS MB':>10} {'wrk RSS MB':>10} {'srv cores':>9} {'wrk cores':>9} {'writer':>6} "
              f"{'req/commit':>10} {'from log':>8} {'idle':>5}")
    print(header)
    print("-" * len(header))
    bad = 0
    for name, shape, array_of_one in HTTP_SHAPES:
        ceiling = validation_ceiling(shaped_bodies(make_events(args.events, "ceil"), BATCH, shape))
        with tempfile.TemporaryDirectory(prefix="ubi-bench-") as tmp:
            db = Path(tmp) / "served.duckdb"
            proc, host, port = start_server(db, *server_flags(args))
            rows = []
            try:
                warmed = warm_workers(host, port, shape) if args.parse_workers != 0 else 0
                for run, n, per, conns in (("500/req", args.events, BATCH, args.batch_connections),
                                           ("1/req", args.singles, 1, args.single_connections)):
                    row = measured(proc, host, port, name=f"{shape}-{run}", n_events=n, per_request=per,
                                   processes=args.processes, connections=max(1, conns // args.processes),
                                   shape=shape, array_of_one=array_of_one)
                    rows.append((run, row))
                rss, wrss = peak_rss_mb(proc.pid), workers_peak_rss_mb(proc.pid)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
            with duckdb.connect(str(db), read_only=True) as con:
                ((stored,),) = con.execute("SELECT count(*) FROM ubi_events").fetchall()
        for run, r in rows:
            ratio = f"{r['events_per_s'] / ceiling:6.2f}" if run == "500/req" else "     -"
            print(f"{name:22} {run:7} {r['events_per_s']:>9,.0f} {r['committed_per_s']:>9,.0f} "
                  f"{r['requests_per_s']:>7,.0f} {r['p50_ms']:>7.2f} "
                  f"{r['p99_ms']:>7.2f} {ratio} {rss:>10,.0f} {wrss:>10,.0f} {r['server_cores']:>9.2f} "
                  f"{r['workers_cores']:>9.2f} {r['writer_busy']:>6.0%} "
                  f"{r['requests_per_commit']:>10.1f} {r['from_log']:>8.0%} {r['machine_idle']:>5.0%}", flush=True)
        acknowledged = warmed + sum(r["events"] for _, r in rows)
        if stored != acknowledged:
            print(f"    ! acknowledged {acknowledged:,} events, found {stored:,}")
            bad += 1
    print(f"load average {os.getloadavg()[0]:.1f} at the end; /ceil: batch events/s over the one-core pydantic "
          f"validation ceiling of the same bodies; batch runs at {args.batch_connections} connections, single runs "
          f"at {args.single_connections}; idle: the machine's CPU left idle during the run (all cores); srv cores: "
          "server CPU over wall time (srv: the collector's process, wrk: its parse workers, started before the clock); "
          "writer: share of wall time the writer spent writing groups (DuckDB and COMMIT, "
          "or the answer log); committed: events/s until DuckDB committed the last one; from log: requests answered "
          "once fsync'd to the answer log (UBI_ACK=log, the default), the others after their DuckDB commit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
