"""CPU per event of the collector's two paths for request bodies, in process, no HTTP.

For each producer layout (``bench/shapes.py``) it builds 500-event request bodies as ``bench/ingest.py`` sends
them and stores them into a fresh DuckDB store, timing per event (CPU of the process, best of ``--repeat``):

* the exact path, one body at a time, stage by stage, as ``Collector.accept`` runs it for a body under
  ``fastpath.HTTP_MIN_ITEMS`` items: ``parse_items`` (orjson), ``validate_items`` (pydantic), ``prepare``
  (stored rows) and ``ingest_many`` (Arrow table, key lookups, INSERT, COMMIT);
* the columnar path (``fastpath.prepare_items`` then ``ingest_many``) on the items of ``--groups`` bodies
  taken together, what a writer gathering requests could give it.

It answers whether either path leaves room for 60,000 events/s over HTTP on two cores shared with the load
generator (issue 26): that needs well under 1/60,000 s = 16.7 us of server CPU per event.

    .venv/bin/python bench/batch_paths.py
    .venv/bin/python bench/batch_paths.py --shapes js-client --events 40000 --groups 1 16
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import BATCH, make_events, shaped_bodies  # noqa: E402  (bench/ingest.py, beside this file)

from ubi_pipeline.collector.bodies import RawItem  # noqa: E402
from ubi_pipeline.collector.fastpath import prepare_items  # noqa: E402
from ubi_pipeline.collector.ingest import ingest_many, parse_items, prepare, validate_items  # noqa: E402
from ubi_pipeline.collector.workers import tune_gc  # noqa: E402
from ubi_pipeline.stages import skip_pyarrow_pandas_probe  # noqa: E402
from ubi_pipeline.store.duckdb_store import Store  # noqa: E402

#: Layouts of bench/ingest.py's --shapes runs (None: its own compact JSON, with event_id).
SHAPES: dict[str, str | None] = {"simulator": "simulator", "js-client": "js-client", "python-json": "python-json"}


def stored(store: Store) -> int:
    return int(store.read("SELECT count(*) FROM ubi_events")[0][0])


def exact(bodies: list[bytes], n: int) -> tuple[dict[str, float], int]:
    """CPU seconds per event of each exact-path stage, bodies one at a time into a fresh store; events stored."""
    spent = dict.fromkeys(("orjson", "pydantic", "rows", "write"), 0.0)
    with tempfile.TemporaryDirectory() as d, Store(Path(d) / "s.duckdb") as store:
        for body in bodies:
            t0 = time.process_time()
            items = parse_items(body, "event")
            t1 = time.process_time()
            validated = validate_items(items)
            t2 = time.process_time()
            prepared = prepare(validated, source="/v1/events")
            t3 = time.process_time()
            ingest_many(store, [prepared])
            t4 = time.process_time()
            for stage, seconds in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                spent[stage] += seconds
        return {stage: seconds / n for stage, seconds in spent.items()}, stored(store)


def columnar(bodies: list[bytes], n: int, group: int) -> tuple[float, int]:
    """CPU seconds per event of parse + ``prepare_items`` + write, ``group`` bodies per call; events stored."""
    with tempfile.TemporaryDirectory() as d, Store(Path(d) / "s.duckdb") as store:
        t0 = time.process_time()
        for g in range(0, len(bodies), group):
            items: list[RawItem] = []
            for body in bodies[g:g + group]:
                # positions in the gathered list, as one body's would be
                items.extend(replace(item, index=len(items) + k) for k, item in enumerate(parse_items(body, "event")))
            ingest_many(store, [prepare_items(items, source="/v1/events")])
        return (time.process_time() - t0) / n, stored(store)


def best(repeat: int, run: Callable[[], tuple[Any, int]]) -> Any:
    """The figure of the run with the least total (a dict's values summed, or the float)."""
    runs = [run()[0] for _ in range(repeat)]
    return min(runs, key=lambda r: sum(r.values()) if isinstance(r, dict) else r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=40_000, help="events per layout (default 40,000)")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--groups", nargs="+", type=int, default=[1, 4, 16],
                    help="bodies per columnar call (default 1 4 16)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per figure; the least is kept (default 2)")
    args = ap.parse_args()
    skip_pyarrow_pandas_probe()
    tune_gc()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; us of CPU per event, "
          f"{BATCH} events per body")
    for name in args.shapes:
        bodies = shaped_bodies(make_events(args.events, name), BATCH, SHAPES[name])
        n = len(bodies) * BATCH
        stages = best(args.repeat, lambda bodies=bodies, n=n: exact(bodies, n))
        line = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in stages.items())
        print(f"{name}: exact path {sum(stages.values()) * 1e6:.1f} us ({line})")
        for group in args.groups:
            per = best(args.repeat, lambda bodies=bodies, n=n, group=group: columnar(bodies, n, group))
            print(f"   columnar path, {group:>2} bodies ({group * BATCH:,} events) per call: {per * 1e6:6.1f} us")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
