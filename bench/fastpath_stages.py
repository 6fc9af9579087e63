"""Where the columnar path's time goes, per stage, for one chunk of each producer's shape.

For each shape of ``bench/shapes.py`` it writes the simulator's records in that layout, takes the largest
chunk of events ``ubi import`` would read (``collector.importer.fast_chunks``: ``FAST_CHUNK_ITEMS`` lines) and
times, best of ``--repeat``, in microseconds per event:

* CPU of each stage on a one-thread parser: the one-pass probe (``LEAN_EVENT_SQL`` on 500 lines), the parse
  statement (``GENERAL_PARSE_SQL``), the event statement (``GENERAL_EVENT_SQL``), ``_finish`` (the records the
  statements leave to Python), all of ``parse_chunk``, and ``store_chunk`` into a fresh store;
* wall time of both statements on a parser of one thread and of one thread per core (what ``ubi import``
  uses), over the lines in Arrow batches of ``LINE_BATCH_ROWS``;
* the fixed cost of each statement: a call on 10 lines.

    .venv/bin/python bench/fastpath_stages.py                      # every shape, 60,000 events
    .venv/bin/python bench/fastpath_stages.py --shapes js-client --events 100000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_of  # noqa: E402  (bench/_common.py, beside this file)
from shapes import SHAPES, write_shape  # noqa: E402  (bench/shapes.py, beside this file)

from ubi_pipeline.collector import fastpath as fp  # noqa: E402
from ubi_pipeline.collector.importer import fast_chunks  # noqa: E402
from ubi_pipeline.processors.simulation.bulk_log import write_files  # noqa: E402
from ubi_pipeline.store.duckdb_store import Store  # noqa: E402
from ubi_pipeline.store.rows import utcnow  # noqa: E402


def stages(shape: str, sim: list[Path], work: Path, repeat: int) -> None:
    files = write_shape(shape, sim, work / shape)
    chunk = max((c for f in files for c in fast_chunks(f)), key=lambda c: len(c.events))
    n = len(chunk.events)
    lines, _ = fp._lines_table(chunk.events)
    when = utcnow()
    figures: dict[str, float] = {}
    con = fp.fast_parser()
    parsed = fp.general_parse(con, lines)
    rows = fp._events_of(con, fp.GENERAL_EVENT_SQL, parsed, when)
    figures["one-pass probe"] = best_of(
        repeat, lambda: fp._events_of(con, fp.LEAN_EVENT_SQL, lines.slice(0, fp.LEAN_PROBE), when))[1]
    figures["parse statement"] = best_of(repeat, lambda: fp.general_parse(con, lines))[1]
    figures["event statement"] = best_of(repeat, lambda: fp._events_of(con, fp.GENERAL_EVENT_SQL, parsed, when))[1]
    figures["_finish (Python)"] = best_of(repeat, lambda: fp._finish(rows, lines))[1]
    figures["parse_chunk"] = best_of(repeat, lambda: fp.parse_chunk(con, chunk, source="bench", received_at=when))[1]
    done = fp.parse_chunk(con, chunk, source="bench", received_at=when)
    store_cpu = float("inf")
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            store = Store(Path(d) / "s.duckdb")
            t = time.process_time()
            fp.store_chunk(store, done)
            store_cpu = min(store_cpu, time.process_time() - t)
            store.close()
    figures["store_chunk"] = store_cpu
    small = lines.slice(0, 10)
    small_parsed = fp.general_parse(con, small)
    fixed = {
        "parse": best_of(repeat, lambda: fp.general_parse(con, small))[0],
        "event": best_of(repeat, lambda: fp._events_of(con, fp.GENERAL_EVENT_SQL, small_parsed, when))[0],
        "probe": best_of(repeat, lambda: fp._events_of(con, fp.LEAN_EVENT_SQL, small, when))[0],
    }
    con.close()
    walls = {}
    for threads in sorted({1, os.cpu_count() or 1}):
        con = fp.fast_parser(threads)

        def both(con: Any = con) -> None:
            fp._events_of(con, fp.GENERAL_EVENT_SQL, fp.general_parse(con, lines), when)

        walls[threads] = best_of(repeat, both)[0]
        con.close()
    taken = len(done.exact)
    print(f"{shape}: {n:,} events in the chunk, {n - taken:,} on the columnar path")
    for name, seconds in figures.items():
        print(f"   {name:<22} {seconds * 1e6 / n:7.2f} us CPU/event")
    for threads, seconds in walls.items():
        print(f"   both statements, {threads} thread{'s' if threads > 1 else ''}: {seconds * 1e6 / n:7.2f} us wall/event")
    print("   fixed cost per call (10 lines): " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in fixed.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=60_000, help="simulated events (default 60,000)")
    ap.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure; the least is kept (default 3)")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory(prefix="ubi-fastpath-stages-") as d:
        work = Path(d)
        write_files(work / "sim", args.events, fmt="ndjson")
        sim = sorted((work / "sim").iterdir(), key=lambda p: "0" if "queries" in p.name else p.name)
        for shape in args.shapes:
            stages(shape, sim, work, args.repeat)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
