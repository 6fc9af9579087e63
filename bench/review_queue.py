"""How long the review page takes to open on a queue of 10,000 pairs: from reading the store to the first pair.

Builds a DuckDB store of ``--queries`` queries x ``--docs`` documents (10,000 pairs by default), each judged by two
sources (``implicit:pbm`` with an interval, ``model:llm`` without; seeded random grades, so about three pairs in
four disagree), ``--searches`` rows of ``ubi_queries`` (query counts following a Zipf law, written straight into
DuckDB) and one human grade per 20 pairs. Then, ``--repeat`` times, times what ``ubi review serve`` does before it
answers the first request and that request itself:

* ``read``: :func:`ubi_pipeline.review.session.read_inputs` on a read-only connection (judgments, human grades,
  searches per normalised query);
* ``order``: :func:`ubi_pipeline.processors.labels.queue.build_queue` (held-out sample of 50, then the order);
* ``first pair``: ``GET /review/api/next`` through the app (FastAPI's TestClient: the route's own cost, no socket).

Prints the median and the worst of each over the repeats, wall time; the target is a total under 1 s. Figures
depend on the machine's load.

    .venv/bin/python bench/review_queue.py [--queries 1000] [--docs 10] [--searches 200000] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
from fastapi.testclient import TestClient

from ubi_pipeline.processors.labels.queue import HumanGrade, Queue, build_queue
from ubi_pipeline.review.app import create_review_app
from ubi_pipeline.review.session import ReviewSession, read_inputs, read_rubric
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import HUMAN_JUDGMENT_SCHEMA


def build(path: Path, n_queries: int, n_docs: int, n_searches: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    queries = [f"query {i}" for i in range(n_queries)]
    q = np.repeat(np.arange(n_queries), n_docs)
    docs = [f"d{i}-{j}" for i in range(n_queries) for j in range(n_docs)]
    n = len(docs)
    lo = rng.uniform(0, 0.6, n)
    t = datetime(2025, 1, 1)
    rows = []
    for source, width in (("implicit:pbm", rng.uniform(0.02, 0.6, n)), ("model:llm", None)):
        rows.append(pa.table({
            "query": [queries[i] for i in q], "doc_id": docs, "source": [source] * n, "score": rng.uniform(0, 1, n),
            "ci_low": pa.nulls(n, pa.float64()) if width is None else lo,
            "ci_high": pa.nulls(n, pa.float64()) if width is None else lo + width,
            "impressions": rng.integers(1, 500, n), "clicks": rng.integers(0, 50, n), "sessions": rng.integers(1, 500, n),
            "grade": rng.integers(0, 4, n), "created_at": pa.array([t] * n, pa.timestamp("us"))}))
    humans = [{"query_id": queries[q[i]], "query": queries[q[i]], "doc_id": docs[i], "grade": int(rng.integers(0, 4)),
               "source": "human", "assessor": "ann", "judged_at": t, "rubric": None, "origin": "bench", "note": None}
              for i in range(0, n, 20)]
    with Store(path) as store:
        for table in rows:
            store.load_table("judgments", table)
        store.load_table("human_judgments", pa.Table.from_pylist(humans, schema=HUMAN_JUDGMENT_SCHEMA))
    # Zipf-distributed searches, inserted straight into ubi_queries (the review page only counts them)
    which = np.minimum(rng.zipf(1.3, n_searches) - 1, n_queries - 1)
    con = duckdb.connect(str(path))
    try:
        searches = pa.table({"query_key": [f"k{i}" for i in range(n_searches)],
                             "query_id": [f"q{i}" for i in range(n_searches)],
                             "user_query": [queries[i] for i in which], "content_hash": ["h"] * n_searches,
                             "received_at": pa.array([t] * n_searches, pa.timestamp("us"))})
        con.register("searches", searches)
        con.execute("INSERT INTO ubi_queries (query_key, query_id, user_query, content_hash, received_at) "
                    "SELECT * FROM searches")
    finally:
        con.close()
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--searches", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "review.duckdb"
        pairs = build(db, args.queries, args.docs, args.searches)
        settings = Settings(db=db)
        timings: dict[str, list[float]] = {"read": [], "order": [], "first pair": [], "total": []}
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            con = duckdb.connect(str(db), read_only=True)
            inputs = read_inputs(con)
            con.close()
            t1 = time.perf_counter()
            humans = [HumanGrade(r["query"], r["doc_id"], r["assessor"], r["grade"], r["source"])
                      for r in inputs.humans]
            items = build_queue(inputs.candidates, humans, inputs.frequencies, held_out=50)
            queue = Queue.of(items, humans, 2)
            t2 = time.perf_counter()
            session = ReviewSession(db, settings, queue, {}, read_rubric(None, 3))
            with TestClient(create_review_app(session, settings), base_url="http://127.0.0.1:8081") as c:
                first = c.get("/review/api/next", params={"assessor": "bob"}).json()["item"]
            t3 = time.perf_counter()
            for name, value in (("read", t1 - t0), ("order", t2 - t1), ("first pair", t3 - t2), ("total", t3 - t0)):
                timings[name].append(value)
        # the same path as `ubi review serve`, once, as a check that the timed steps are what it runs
        served = ReviewSession.open(db, settings, rubric=read_rubric(None, 3), held_out=50, assessors_per_pair=2)
        if served.next("bob")["item"]["doc_id"] != first["doc_id"]:
            raise SystemExit("the bench's steps no longer match ReviewSession.open")
    result = {"pairs": pairs, "searches": args.searches, "repeat": args.repeat,
              **{name: {"median_s": round(statistics.median(v), 4), "max_s": round(max(v), 4)}
                 for name, v in timings.items()}}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{pairs:,} pairs, {args.searches:,} searches, {args.repeat} runs (wall time, median / worst):")
        for name, v in timings.items():
            print(f"  {name:<11} {statistics.median(v):7.3f} s / {max(v):7.3f} s")
        print("target: total under 1 s " + ("met" if max(timings["total"]) < 1.0 else "NOT met"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
