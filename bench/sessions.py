"""How long building sessions takes, and how much memory, on a store with millions of UBI events.

Generates a synthetic store directly in DuckDB SQL (query records with 20 hit ids, 10 impression events
per search at 0-based ordinals, position-biased clicks), then times ``ubi_pipeline.processors.clicks.sessions.read_sessions``
(sessions, filters, quality counts, PBM/UBM cells, weighted patterns) and reports peak memory.

    .venv/bin/python bench/sessions.py --searches 1000000     # about 11 M events
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from ubi_pipeline.processors.clicks.sessions import read_sessions
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.duckdb_store import Store


def generate(db: Path, searches: int, queries: int, seed: int) -> tuple[int, int]:
    """A store with ``searches`` searches over ``queries`` query texts; returns (query records, events)."""
    with Store(db) as store, store.transaction() as cur:
        cur.execute(f"SELECT setseed({(seed % 1000) / 1000})")
        # three rankers (i % 3) show the same candidates in different orders
        cur.execute(f"""
            INSERT INTO ubi_queries
            SELECT 'q' || i || chr(31), 'q' || i, 'query ' || (i % {queries}), 'client' || (i % {searches // 5 + 1}),
                   'bench', TIMESTAMP '2025-01-01' + to_seconds(i), '{{}}', 'sku', NULL,
                   list_transform(range(20), lambda j: 'd' || ((i % {queries}) * 20 + (j * (1 + i % 3)) % 20)),
                   NULL, 'h', TIMESTAMP '2025-01-01'
            FROM range({searches}) t(i)""")
        cur.execute("""
            INSERT INTO ubi_events (event_key, action_name, query_id, client_id, application, timestamp, object_id,
                                    position_ordinal, received_at)
            SELECT 'i' || q.query_id || '-' || j, 'impression', q.query_id, q.client_id, 'bench',
                   q.timestamp + to_milliseconds(j), q.query_response_hit_ids[j + 1], j, q.timestamp
            FROM ubi_queries q, range(10) r(j)""")
        # click probability: examination 1/(k) times an attractiveness that depends on the doc
        cur.execute("""
            INSERT INTO ubi_events (event_key, action_name, query_id, client_id, application, timestamp, object_id,
                                    position_ordinal, received_at)
            SELECT 'c' || query_id || '-' || position_ordinal, 'click', query_id, client_id, 'bench',
                   timestamp + INTERVAL 2 SECOND, object_id, position_ordinal, received_at
            FROM ubi_events
            WHERE action_name = 'impression'
              AND random() < (1.0 / (position_ordinal + 1)) * (0.1 + 0.8 * ((hash(object_id) % 100) / 100.0))""")
        (nq,) = cur.execute("SELECT count(*) FROM ubi_queries").fetchall()[0]
        (ne,) = cur.execute("SELECT count(*) FROM ubi_events").fetchall()[0]
    return int(nq), int(ne)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--searches", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=20_000, help="distinct query texts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", type=Path, help="keep the generated store here (default: a temporary file)")
    ap.add_argument(
        "--reuse", action="store_true", help="--db already holds a generated store: only time the build"
    )
    ap.add_argument("--memory-limit", help="Settings.memory_limit, e.g. 2GB (default: 1GB)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "bench.duckdb"
        t0 = time.perf_counter()
        if args.reuse and args.db:
            with Store(db) as store:
                ((nq, ne),) = store.read(
                    "SELECT (SELECT count(*) FROM ubi_queries), (SELECT count(*) FROM ubi_events)"
                )
        else:
            nq, ne = generate(db, args.searches, args.queries, args.seed)
        t_gen = time.perf_counter() - t0
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        data = read_sessions(db, Settings(**({"memory_limit": args.memory_limit} if args.memory_limit else {})))
        t_build = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    how = "reused" if args.reuse else f"generated in {t_gen:.1f} s"
    print(f"store: {nq:,} query records, {ne:,} events ({how})")
    print(
        f"read_sessions (memory limit {args.memory_limit or 'DuckDB default'}): {t_build:.1f} s wall, {cpu:.1f} s CPU "
        f"(all threads), {ne / t_build:,.0f} events/s; peak RSS {rss:,.0f} MB (before: {rss_before:,.0f} MB)"
    )
    f = data.filters
    print(
        f"sessions {f.sessions:,}, impressions {f.impressions:,}, clicks {f.clicks:,}; pairs {len(data.pairs):,}, "
        f"PBM cells {len(data.cells.pair):,}, UBM cells {len(data.ubm_cells.pair):,}, "
        f"patterns {data.patterns.docs.shape[0]:,}"
    )


if __name__ == "__main__":
    main()
