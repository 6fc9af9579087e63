"""Single-event ingest with each answer mode of the DuckDB sink, alternated against a real ``ubi serve``.

* ``commit`` (``ubi serve --ack commit``): every answer waits for the DuckDB commit that stores its rows, so
  at most one request per client connection joins a commit, and a commit's cost is nearly all fixed (BEGIN,
  an Arrow INSERT, COMMIT: 3-5 ms of CPU for 16 rows);
* ``log`` (the default): requests whose keys are all new are answered once their rows are fsync'd to the
  store's answer log (``ubi_pipeline.store.answer_log``); DuckDB commits the rows of many requests at once.

Each run prints requests/s while the clients send, requests/s *sustained* (all requests over the time until
DuckDB has committed the last one: a writer that falls behind shows here), p99, the server's CPU per
request, the requests per DuckDB commit and the share answered from the log. Every acknowledged event is
checked to be in the store after the server stops.

    .venv/bin/python bench/ack_modes.py                      # 16 connections, 16,000 requests, 2 runs each
    .venv/bin/python bench/ack_modes.py --rounds 3 --requests 20000 --shape simulator
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "bench"))


def one_run(mode: str, n: int, connections: int, processes: int, shape: str) -> dict:
    import duckdb
    from ingest import cpu_seconds, http_load, sink_counters, start_server

    with tempfile.TemporaryDirectory(prefix="ubi-ack-") as tmp:
        db = Path(tmp) / "s.duckdb"
        proc, host, port = start_server(db, "--ack", mode)
        try:
            c0, s0, t0 = cpu_seconds(proc.pid), sink_counters(host, port), time.time()
            row = http_load(host, port, name=f"ack-{mode}", n_events=n, per_request=1, processes=processes,
                            connections=connections // processes, shape=shape, array_of_one=shape == "js-client")
            sent = time.time()
            while True:  # until the writer has committed every request the clients sent
                s1 = sink_counters(host, port)
                if s1["ubi_sink_grouped_requests_total"] - s0["ubi_sink_grouped_requests_total"] >= row["requests"]:
                    break
                if time.time() - sent > 120:
                    raise SystemExit(f"{mode}: the writer did not catch up within 120 s")
                time.sleep(0.01)
            done, c1 = time.time(), cpu_seconds(proc.pid)
        finally:
            proc.terminate()
            proc.wait()
        stored = duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM ubi_events").fetchone()[0]
    commits = s1["ubi_sink_commits_total"] - s0["ubi_sink_commits_total"]
    return {
        "mode": mode,
        "requests_per_s": row["requests_per_s"],
        "sustained_per_s": row["requests"] / (done - t0),
        "p99_ms": row["p99_ms"],
        "cpu_us": 1e6 * (c1 - c0) / row["requests"],
        "per_commit": (s1["ubi_sink_grouped_requests_total"] - s0["ubi_sink_grouped_requests_total"]) / max(1, commits),
        "from_log": (s1.get("ubi_sink_answered_from_log_total", 0) - s0.get("ubi_sink_answered_from_log_total", 0))
        / row["requests"],
        "stored": stored,
        "sent": row["events"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=16_000, help="single-event requests per run (default 16,000)")
    ap.add_argument("--connections", type=int, default=16, help="client connections (default 16)")
    ap.add_argument("--processes", type=int, default=2, help="load-generator processes (default 2)")
    ap.add_argument("--rounds", type=int, default=2, help="alternated pairs of runs (default 2)")
    ap.add_argument("--shape", default="js-client", choices=["simulator", "js-client", "python-json"],
                    help="producer layout of the events (bench/shapes.py; default js-client, no event_id)")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; "
          f"{args.requests:,} single-event requests ({args.shape}) over {args.connections} connections per run")
    print(f"{'mode':8} {'req/s':>7} {'sustained':>9} {'p99 ms':>7} {'server CPU us/req':>18} {'req/commit':>10} "
          f"{'from log':>8}  stored")
    bad = 0
    for _ in range(args.rounds):
        for mode in ("commit", "log"):
            r = one_run(mode, args.requests, args.connections, args.processes, args.shape)
            ok = r["stored"] == r["sent"]
            bad += not ok
            print(f"{r['mode']:8} {r['requests_per_s']:7,.0f} {r['sustained_per_s']:9,.0f} {r['p99_ms']:7.1f} "
                  f"{r['cpu_us']:18,.0f} {r['per_commit']:10.1f} {100 * r['from_log']:7.0f}%  "
                  f"{r['stored']:,} of {r['sent']:,}"
                  + ("" if ok else "  MISSING"))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
