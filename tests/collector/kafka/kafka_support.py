"""Real processes for the Kafka failure tests: ``ubi serve --sink kafka``, ``ubi consume``, a load generator.

Imported by name (pytest puts this folder on sys.path). Every process listens on loopback only.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import httpx

ROOT = Path(__file__).resolve().parents[3]
#: Short enough that a new group's first join (held for the rebalance timeout by Tansu) takes ~3 s.
POLL_INTERVAL_MS = "3000"


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.2,
             state: Callable[[], Any] | None = None) -> Any:
    """Poll ``pred`` until it returns something truthy; fail with ``what`` (and ``state()``) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"; state: {state()}" if state is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(every)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ---------------------------------------------------------------- ubi serve --sink kafka


class Serve:
    """A ``ubi serve --sink kafka`` process; restartable on the same port and spool."""

    def __init__(self, bootstrap: str, prefix: str, spool: Path, log_dir: Path, port: int | None = None,
                 ack_timeout: float = 1.5) -> None:
        self.bootstrap, self.prefix, self.spool, self.log_dir = bootstrap, prefix, spool, log_dir
        self.port = port or 0
        self.ack_timeout = ack_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.starts = 0

    def start(self) -> Serve:
        self.starts += 1
        log = open(self.log_dir / f"serve-{id(self)}-{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ubi_pipeline", "serve", "--sink", "kafka", "--bootstrap", self.bootstrap,
             "--topic-prefix", self.prefix, "--port", str(self.port), "--spool", str(self.spool),
             "--ack-timeout", str(self.ack_timeout), "--log-level", "warning"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, env=_env())
        log.close()
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not match:
            self.proc.kill()
            raise AssertionError(f"ubi serve did not start: {line!r}; see {self.log_dir}")
        self.port = int(match.group(1))  # restarts reuse it, so clients keep their URL
        self.url = match.group(0)
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self) -> None:
        proc = self.proc
        if proc is not None and proc.stdout is not None:
            for _ in proc.stdout:
                pass

    def health(self) -> dict[str, Any]:
        r = httpx.get(self.url + "/healthz", timeout=5)
        return dict(r.json())

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def spool_drained(self) -> bool:
        try:
            h = self.health()
        except httpx.HTTPError:
            return False
        return h["mode"] == "direct" and h["spool"]["records"] == 0


# ---------------------------------------------------------------- ubi consume


class Consume:
    """A ``ubi consume --json`` process; its JSON lines are collected as they come."""

    def __init__(self, bootstrap: str, prefix: str, group: str, log_dir: Path, *, db: Path | None = None,
                 parquet: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        self.bootstrap, self.prefix, self.group, self.log_dir = bootstrap, prefix, group, log_dir
        self.db, self.parquet, self.extra = db, parquet, extra
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[dict[str, Any]] = []
        self.starts = 0
        self.log_path: Path | None = None  # the stderr of the latest start

    def args(self) -> list[str]:
        target = ["--db", str(self.db)] if self.db is not None else ["--parquet", str(self.parquet)]
        return [sys.executable, "-m", "ubi_pipeline", "consume", "--bootstrap", self.bootstrap, "--topic-prefix",
                self.prefix, "--group", self.group, *target, "--json", "--max-poll-interval-ms", POLL_INTERVAL_MS,
                *self.extra]

    def start(self, stdout: Any = None) -> Consume:
        self.starts += 1
        self.lines = []
        self.log_path = self.log_dir / f"consume-{id(self)}-{self.starts}.log"
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args(), cwd=ROOT, stdout=stdout or subprocess.PIPE, stderr=log,
                                     text=True, env=_env())
        log.close()
        if stdout is None:
            threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        return self

    def _read(self, proc: subprocess.Popen[str]) -> None:
        if proc.stdout is None:
            return
        for line in proc.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                continue

    def last(self) -> dict[str, Any]:
        return self.lines[-1] if self.lines else {}

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> dict[str, Any]:
        """SIGTERM; the loader writes what it holds and prints a summary line."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.2)  # let the reader thread take the last lines
        summaries = [ln for ln in self.lines if ln.get("event") == "summary"]
        return summaries[-1] if summaries else {}


# ---------------------------------------------------------------- load


@dataclass
class Acked:
    """What the collectors acknowledged (202): query ids, and per query id the event sequence numbers."""

    queries: set[str] = field(default_factory=set)
    events: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    retries: int = 0
    unavailable: int = 0  # 503 answers (spool full or shutting down)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def n_events(self) -> int:
        return sum(len(v) for v in self.events.values())

    def messages(self) -> set[str]:
        return {f"{qid}#{seq}" for qid, seqs in self.events.items() for seq in seqs}


class Load:
    """Steady traffic: each thread runs searches one after another (a query record, then its events in
    several requests), waiting for each 202 before the next request, and retrying a request until it is
    acknowledged. So each query id's records are acknowledged in order, and everything sent is acked."""

    def __init__(self, urls: Callable[[], list[str]], tag: str, *, threads: int = 3, events_per_search: int = 6,
                 events_per_request: int = 2, pause: float = 0.02, max_searches: int | None = None) -> None:
        self.urls, self.tag = urls, tag
        self.threads_n, self.per_search, self.per_request = threads, events_per_search, events_per_request
        self.pause, self.max_searches = pause, max_searches
        self.acked = Acked()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rr = itertools.count()
        self.searches = 0

    def start(self) -> Load:
        for t in range(self.threads_n):
            th = threading.Thread(target=self._run, args=(t,), daemon=True)
            th.start()
            self._threads.append(th)
        return self

    def stop(self, timeout: float = 90) -> Acked:
        """Finish the current search of each thread and return what was acknowledged."""
        self._stop.set()
        return self.join(timeout)

    def join(self, timeout: float = 90) -> Acked:
        """Wait until every thread is done (``max_searches`` reached, or stopped)."""
        for th in self._threads:
            th.join(timeout)
            if th.is_alive():
                raise AssertionError("a load thread could not get its last request acknowledged")
        return self.acked

    def _post(self, client: httpx.Client, path: str, body: Any) -> None:
        data = json.dumps(body).encode()
        deadline = time.monotonic() + 120
        while True:
            urls = self.urls()
            url = urls[next(self._rr) % len(urls)]
            try:
                r = client.post(url + path, content=data, headers={"content-type": "application/json"})
                if r.status_code == 202:
                    out = r.json()
                    if out["rejected"]:
                        raise AssertionError(f"unexpected rejections: {out}")
                    return
                if r.status_code == 503:
                    with self.acked.lock:
                        self.acked.unavailable += 1
                else:
                    raise AssertionError(f"{path}: HTTP {r.status_code} {r.text[:200]}")
            except httpx.HTTPError:
                pass  # collector killed or restarting: try again
            with self.acked.lock:
                self.acked.retries += 1
            if time.monotonic() > deadline:
                raise AssertionError(f"{path}: not acknowledged within 120 s")
            time.sleep(0.1)

    def _run(self, t: int) -> None:
        with httpx.Client(timeout=15) as client:
            i = 0
            while not self._stop.is_set() and (self.max_searches is None or i < self.max_searches):
                qid = f"{self.tag}-{t}-{i}"
                ts = f"2024-05-16T12:{i // 60 % 60:02d}:{i % 60:02d}Z"
                self._post(client, "/v1/queries", {
                    "query_id": qid, "user_query": f"shoes {i % 17}", "client_id": f"c{t}", "application": "shop",
                    "timestamp": ts, "query_response_hit_ids": [f"d{k}" for k in range(5)]})
                with self.acked.lock:
                    self.acked.queries.add(qid)
                for start in range(0, self.per_search, self.per_request):
                    seqs = list(range(start, min(start + self.per_request, self.per_search)))
                    events = []
                    for seq in seqs:
                        e = {"action_name": "click" if seq % 3 == 0 else "impression", "query_id": qid,
                             "session_id": f"s{t}", "client_id": f"c{t}", "application": "shop",
                             "timestamp": ts, "message": f"{qid}#{seq}",
                             "event_attributes": {"object": {"object_id": f"d{seq % 5}"},
                                                  "position": {"ordinal": seq % 5}}}
                        if seq % 2 == 0:  # half carry a client event_id, half are keyed by content hash
                            e["event_id"] = f"{qid}:{seq}"
                        events.append(e)
                    self._post(client, "/v1/events", events)
                    with self.acked.lock:
                        self.acked.events[qid].extend(seqs)
                    time.sleep(self.pause)
                i += 1
                with self.acked.lock:
                    self.searches += 1


# ---------------------------------------------------------------- checks


def store_contents(con: duckdb.DuckDBPyConnection, tag: str) -> tuple[list[str], list[str]]:
    """Query ids and event messages of ``tag`` in a store connection (one entry per stored row)."""
    qids = [r[0] for r in con.execute("SELECT query_id FROM ubi_queries WHERE query_id LIKE ?", [tag + "-%"]).fetchall()]
    msgs = [r[0] for r in con.execute("SELECT message FROM ubi_events WHERE query_id LIKE ?", [tag + "-%"]).fetchall()]
    return qids, msgs


def assert_exactly(acked: Acked, qids: list[str], msgs: list[str]) -> None:
    """The store holds every acknowledged record, and each once."""
    assert len(qids) == len(set(qids)), "a query record is stored twice"
    assert len(msgs) == len(set(msgs)), "an event is stored twice (under two different keys)"
    assert set(qids) == acked.queries, (len(set(qids)), len(acked.queries))
    assert set(msgs) == acked.messages(), (len(set(msgs)), acked.n_events)


def read_topic(bootstrap: str, topic: str) -> list[tuple[int, int, bytes]]:
    """Every record of ``topic`` now, as (partition, offset, value), without a consumer group."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                      allow_auto_create_topics=False)
    try:
        parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        out: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 30
        while any(c.position(tp) < ends[tp] for tp in tps):
            for tp, recs in c.poll(timeout_ms=500).items():
                out.extend((tp.partition, r.offset, r.value) for r in recs)
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end")
        return out
    finally:
        c.close()


def rows_of(records: list[tuple[int, int, bytes]]) -> list[tuple[int, int, dict[str, Any]]]:
    """The rows in topic records (one per line of a message), as (partition, offset, row), in log order."""
    return [(p, o, json.loads(line)) for p, o, value in sorted(records, key=lambda r: (r[0], r[1]))
            for line in value.split(b"\n")]


def first_occurrence_order(records: list[tuple[int, int, bytes]]) -> dict[str, list[int]]:
    """Per query id, event sequence numbers in the order their first copy appears in the topic."""
    seen: set[str] = set()
    order: dict[str, list[int]] = defaultdict(list)
    for _, _, row in rows_of(records):
        msg = row["message"]
        if msg in seen:
            continue
        seen.add(msg)
        qid, seq = msg.rsplit("#", 1)
        order[qid].append(int(seq))
    return order
