"""A collector killed (SIGKILL) again and again under load: is every acknowledged event stored exactly once?

Starts ``ubi serve`` on a fresh store (``--ack log`` by default, or ``--ack commit``), and ``--clients`` threads
that POST events to it: single events and batches, half with an ``event_id`` and half without (keyed by content
hash). A client retries a request that got no answer (the collector died, or answered 503) with the same
bytes, as a client library would, until it is answered. Every ``--every`` seconds the collector is killed with
SIGKILL and started again on the same store; after ``--kills`` kills the clients finish their last requests,
the collector is stopped with SIGTERM, and the store is read with ``open_reader`` (which writes what a killed
collector left in the answer log).

It prints the events acknowledged (a 202 naming them accepted or duplicate), stored, lost (acknowledged, not
stored: must be 0), stored twice (must be 0), and how many requests were retried. Exits 1 on any loss or
double. The events of requests that were never answered before the end are not counted either way.

    .venv/bin/python bench/kill_collector.py                       # 8 kills, 1.5 s apart, 4 clients
    .venv/bin/python bench/kill_collector.py --ack commit --kills 5
    .venv/bin/python bench/kill_collector.py --max-batch 400          # large batches: the parse workers too
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]


class Collector:
    """``ubi serve`` on one store, restarted on a fresh port after each kill; clients read :attr:`url`."""

    def __init__(self, db: Path, ack: str) -> None:
        self.db, self.ack = db, ack
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()
        self.replayed = 0  # rows the restarted collectors wrote from the answer log (answered, not committed)

    def start(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ubi_pipeline", "serve", "--db", str(self.db), "--port", "0", "--ack", self.ack],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        seen = []  # what it prints before it listens: a replay of its answer log says how many rows it wrote
        match = None
        while proc.stdout and match is None and len(seen) < 50:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            match = re.search(r"http://[\d.]+:\d+", line)
            replayed = re.search(r"wrote (\d+) rows answered", line)
            if replayed:
                self.replayed += int(replayed.group(1))
        if not match:
            proc.kill()
            raise SystemExit(f"the collector did not start: {''.join(seen)}")
        threading.Thread(target=lambda: proc.stdout and proc.stdout.read(), daemon=True).start()  # drain its log
        with self.lock:
            self.proc, self.url = proc, match.group(0)

    def stop(self, sig: int) -> None:
        with self.lock:
            proc, self.url = self.proc, ""
        if proc is not None:
            proc.send_signal(sig)
            proc.wait(timeout=60)


def bodies(client: int, seed: int, max_batch: int = 60) -> Iterator[tuple[bytes, list[str]]]:
    """One client's request bodies, without end: (bytes, the ``query_id`` of each event, unique per event)."""
    rng = random.Random(seed)
    for r in itertools.count():
        size = 1 if rng.random() < 0.7 else rng.randrange(2, max_batch)
        keyed = rng.random() < 0.5
        events, ids = [], []
        for i in range(size):
            tag = f"c{client}-r{r}-e{i}"
            event = {"action_name": "click", "query_id": f"q-{tag}", "timestamp": "2026-12-07T01:02:03.456Z",
                     "event_attributes": {"object": {"object_id": f"doc-{rng.randrange(1000)}"},
                                          "position": {"ordinal": i}}}
            if keyed:
                event["event_id"] = tag
            events.append(event)
            ids.append(f"q-{tag}")  # query_id is unique per event here: it names the event in the store either way
        yield orjson.dumps(events), ids


def client_loop(collector: Collector, work: Iterator[tuple[bytes, list[str]]], acked: list[str], stats: dict[str, int],
                stop: threading.Event) -> None:
    with httpx.Client(timeout=10) as http:
        for body, ids in work:
            while True:
                url = collector.url
                if not url:  # being restarted
                    time.sleep(0.01)
                    continue
                try:
                    r = http.post(f"{url}/v1/events", content=body, headers={"content-type": "application/json"})
                except httpx.HTTPError:
                    stats["retries"] += 1
                    time.sleep(0.02)
                    continue
                if r.status_code == 202:
                    answer = r.json()
                    if answer["accepted"] + answer["duplicates"] != len(ids):
                        raise SystemExit(f"a 202 that does not account for its {len(ids)} events: {answer}")
                    acked.extend(ids)
                    stats["requests"] += 1
                    break
                if r.status_code == 503:
                    stats["retries"] += 1
                    time.sleep(0.05)
                    continue
                raise SystemExit(f"unexpected {r.status_code}: {r.text[:300]}")
            if stop.is_set():
                return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ack", choices=["log", "commit"], default="log", help="the collector's --ack (default log)")
    ap.add_argument("--kills", type=int, default=8, help="SIGKILLs of the collector (default 8)")
    ap.add_argument("--every", type=float, default=1.5, help="seconds between kills (default 1.5)")
    ap.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    ap.add_argument("--seed", type=int, default=7, help="seed of the request mix (default 7)")
    ap.add_argument("--max-batch", type=int, default=60,
                    help="largest batch, in events (default 60; 400: batches of 32 KiB or more reach the parse "
                    "workers, collector/workers.py)")
    args = ap.parse_args()
    from ubi_pipeline.store.client import open_reader

    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; --ack {args.ack}, {args.kills} kills "
          f"{args.every} s apart, {args.clients} clients")
    with tempfile.TemporaryDirectory(prefix="ubi-kill-") as tmp:
        db = Path(tmp) / "s.duckdb"
        collector = Collector(db, args.ack)
        collector.start()
        stop = threading.Event()
        acked: list[list[str]] = [[] for _ in range(args.clients)]
        stats = [{"requests": 0, "retries": 0} for _ in range(args.clients)]
        threads = [threading.Thread(target=client_loop, args=(collector, bodies(c, args.seed + c, args.max_batch), acked[c],
                                                              stats[c], stop)) for c in range(args.clients)]
        for t in threads:
            t.start()
        for _ in range(args.kills):
            time.sleep(args.every)
            collector.stop(9)
            collector.start()
        time.sleep(args.every)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        collector.stop(15)
        con = open_reader(db)
        rows = con.execute("SELECT query_id, count(*) FROM ubi_events GROUP BY query_id").fetchall()
        con.close()
    stored = dict(rows)
    ack = {i for a in acked for i in a}
    lost = sorted(i for i in ack if i not in stored)
    twice = sorted(i for i, n in stored.items() if n > 1)
    requests = sum(s["requests"] for s in stats)
    retries = sum(s["retries"] for s in stats)
    print(f"requests answered 202: {requests:,}; retried after no answer or a 503: {retries:,}; rows written on "
          f"restart from the answer log: {collector.replayed:,}")
    print(f"events acknowledged: {len(ack):,}; stored: {len(stored):,}; lost: {len(lost)}; stored twice: {len(twice)}")
    if lost or twice:
        print(f"lost (first 10): {lost[:10]}; twice (first 10): {twice[:10]}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
