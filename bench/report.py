"""How long `ubi report` takes on a large store: every stage timed, on synthetic logs written as Arrow.

    .venv/bin/python bench/report.py [--searches 200000] [--queries 20000] [--rankers 2]

The store holds ``--searches`` query records (10 hits each, ``--rankers`` rankers as ``query_attributes``),
about one click per search, human judgments for every query (20 graded docs) and one implicit source with
a grade on half of the pairs. Prints the wall time of each report stage and of each renderer.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from ubi_pipeline.processors.labels.merge import Label, LabelSet, labels_from_store
from ubi_pipeline.reports.joint import ReportConfig, build_report
from ubi_pipeline.reports.render.html import render_html
from ubi_pipeline.reports.render.json_out import render_json
from ubi_pipeline.reports.render.text import render_text
from ubi_pipeline.store.client import open_reader
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import EVENT_SCHEMA, QUERY_SCHEMA


def build(path: Path, n_searches: int, n_queries: int, n_rankers: int, seed: int = 0) -> list[Label]:
    rng = np.random.default_rng(seed)
    t0 = datetime(2025, 1, 1)
    docs_per_query = 20
    grades = rng.choice(4, size=(n_queries, docs_per_query), p=[0.4, 0.3, 0.2, 0.1])
    q_of = rng.integers(0, n_queries, n_searches)
    ranker = rng.integers(0, n_rankers, n_searches)
    # each ranker shows 10 of the query's 20 docs, better rankers sort more by grade
    noise = rng.normal(0, 1.0, (n_searches, docs_per_query)) * (1 + ranker[:, None])
    order = np.argsort(-(grades[q_of] + noise), axis=1)[:, :10]
    hits = [[f"d{q}-{d}" for d in row] for q, row in zip(q_of.tolist(), order.tolist(), strict=True)]
    ts = [t0 + timedelta(seconds=int(s)) for s in np.sort(rng.integers(0, 30 * 86400, n_searches))]
    qids = [f"s{i}" for i in range(n_searches)]
    queries = pa.table({
        "query_key": [q + "\x1f" for q in qids], "query_id": qids,
        "user_query": [f"query {q}" for q in q_of.tolist()], "client_id": [f"c{i % 5000}" for i in range(n_searches)],
        "application": ["shop"] * n_searches, "timestamp": ts,
        "query_attributes": [orjson.dumps({"ranker": f"r{r}"}).decode() for r in ranker.tolist()],
        "object_id_field": [None] * n_searches, "query_response_id": [None] * n_searches,
        "query_response_hit_ids": hits, "extra": [None] * n_searches, "content_hash": qids,
        "received_at": ts,
    }, schema=QUERY_SCHEMA)
    # one click per search at a rank drawn from 1/k, on a doc of the shown list
    n_clicks = n_searches
    rank = np.minimum(rng.geometric(0.35, n_clicks), 10) - 1
    eq = rng.permutation(n_searches)[:n_clicks]
    events = pa.table({
        "event_key": [f"e{i}" for i in range(n_clicks)], "event_id": [f"e{i}" for i in range(n_clicks)],
        "action_name": ["click"] * n_clicks, "query_id": [qids[i] for i in eq.tolist()],
        "session_id": [f"S{i % 20000}" for i in eq.tolist()], "client_id": [None] * n_clicks,
        "user_id": [None] * n_clicks, "application": ["shop"] * n_clicks,
        "timestamp": [ts[i] + timedelta(seconds=3) for i in eq.tolist()], "message_type": [None] * n_clicks,
        "message": [None] * n_clicks, "user_query": [None] * n_clicks,
        "object_id": [hits[i][r] for i, r in zip(eq.tolist(), rank.tolist(), strict=True)],
        "object_id_field": [None] * n_clicks, "object_id_type": [None] * n_clicks, "internal_id": [None] * n_clicks,
        "position_ordinal": rank.astype(np.int32), "position_x": [None] * n_clicks, "position_y": [None] * n_clicks,
        "event_attributes": [None] * n_clicks, "extra": [None] * n_clicks, "received_at": [t0] * n_clicks,
    }, schema=EVENT_SCHEMA)
    qq, dd = np.meshgrid(np.arange(n_queries), np.arange(docs_per_query), indexing="ij")
    keep = rng.random(qq.shape) < 0.5
    implicit_grade = np.clip(grades + rng.integers(-1, 2, grades.shape), 0, 3)
    judg = pa.table({
        "query": [f"query {q}" for q in qq[keep].tolist()], "doc_id": [f"d{q}-{d}" for q, d in zip(qq[keep].tolist(), dd[keep].tolist(), strict=True)],
        "source": ["implicit:ctr"] * int(keep.sum()), "model_version": ["1"] * int(keep.sum()),
        "parameters": ["{}"] * int(keep.sum()), "score": rng.random(int(keep.sum())),
        "ci_low": [None] * int(keep.sum()), "ci_high": [None] * int(keep.sum()),
        "impressions": [20] * int(keep.sum()), "clicks": [5] * int(keep.sum()), "sessions": [20] * int(keep.sum()),
        "grade": implicit_grade[keep].astype(np.int32), "created_at": [t0] * int(keep.sum()),
    })
    with Store(path) as store:
        store.write(queries, events)
        store.load_table("judgments", judg)
    return [Label(f"query {q}", f"d{q}-{d}", int(grades[q, d]), "human", origin="bench")
            for q in range(n_queries) for d in range(docs_per_query)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--searches", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--rankers", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        t = time.perf_counter()
        human = build(db, args.searches, args.queries, args.rankers)
        print(f"built store: {args.searches:,} searches, {args.searches:,} clicks, {len(human):,} human labels "
              f"({time.perf_counter() - t:.1f} s)")
        con = open_reader(db)
        t = time.perf_counter()
        labels = LabelSet().add(human).add(labels_from_store(con))
        print(f"{'labels (file + store)':<32}{time.perf_counter() - t:8.2f} s  ({len(labels):,} labels)")
        marks = [("start", time.perf_counter())]
        report = build_report(con, labels, ReportConfig(baseline="shop/ranker=r0"),
                              progress=lambda name: marks.append((name, time.perf_counter())))
        marks.append(("end", time.perf_counter()))
        for (name, t0), (_, t1) in zip(marks[1:], marks[2:], strict=False):
            print(f"{name:<32}{t1 - t0:8.2f} s")
        print(f"{'build_report total':<32}{marks[-1][1] - marks[0][1]:8.2f} s")
        for name, fn in (("render text", render_text), ("render json", render_json), ("render html", render_html)):
            t = time.perf_counter()
            out = fn(report)
            print(f"{name:<32}{time.perf_counter() - t:8.2f} s  ({len(out):,} chars)")
        con.close()


if __name__ == "__main__":
    main()
