"""What a write costs when the Bloom filter cannot rule its keys out (a retry, a false positive), by store size.

Opens the store for writing (``Store``, the collector's writer, its 256 MB DuckDB pool), fills the key filters
with a first write, then re-sends stored events, one request of ``--keys`` events at a time, and prints per
retry the CPU and wall time of the key lookup (:meth:`ubi_pipeline.store.keys.KeyIndex.lookup`) and of the whole write,
beside the same lookup reading the whole key table (the SQL before the block filters), on the same cursor, in
the same process, interleaved (``--cold``: each after the pool was churned). Then the memory of the two filters and the process's peak RSS.

    .venv/bin/python bench/retry_lookup.py --store COPY.duckdb [--keys 1] [--retries 20]

The store is written to (the first write may add key rows for rows written around the store): pass a copy.
Figures depend on the machine's load: CPU time is printed beside wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import Usage  # noqa: E402  (bench/_common.py, same folder)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True, help="a store file (written to: pass a copy)")
    ap.add_argument("--keys", type=int, default=1, help="stored events re-sent per request")
    ap.add_argument("--retries", type=int, default=20, help="requests re-sent")
    ap.add_argument("--cold", action="store_true",
                    help="before each retry, read a column of every stored event through the writer's pool (as a "
                         "seal does), so the key table is no longer cached when the lookup runs")
    args = ap.parse_args()

    import numpy as np
    import pyarrow as pa

    from ubi_pipeline.schemas import tables
    from ubi_pipeline.store import keys as store_keys
    from ubi_pipeline.store.duckdb_store import Store

    usage = Usage()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    t0, c0 = time.perf_counter(), time.process_time()
    store = Store(args.store)
    print(f"opened in {time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU")
    cols = ", ".join(tables.EVENT_TABLE.names)
    total = int(store.read("SELECT count(*) FROM ubi_events")[0][0])
    rng = np.random.default_rng(0)
    rowids = rng.choice(total, (args.retries + 1) * args.keys, replace=False)
    with store.transaction() as cur:  # the stored rows to re-send, fetched by rowid
        sample = cur.sql(f"SELECT {cols} FROM ubi_events WHERE rowid IN (SELECT unnest(?::BIGINT[]))",
                         params=[rowids.tolist()]).to_arrow_table()
    t0, c0 = time.perf_counter(), time.process_time()
    first = store.write(events=sample.slice(0, args.keys))  # fills the filters from the key table
    print(f"first write (fills the filters from {total:,} key rows): {time.perf_counter() - t0:.1f} s wall, "
          f"{time.process_time() - c0:.1f} s CPU; {first.event_duplicates} duplicates")

    index = store.keys[tables.EVENT_TABLE.name]
    timed: list[tuple[float, float]] = []
    lookup = store_keys.KeyIndex.lookup

    def timed_lookup(self, cur, keys, hashes, columns):  # type: ignore[no-untyped-def]
        w, c = time.perf_counter(), time.process_time()
        out = lookup(self, cur, keys, hashes, columns)
        if self is index:
            timed.append((time.process_time() - c, time.perf_counter() - w))
        return out

    store_keys.KeyIndex.lookup = timed_lookup  # type: ignore[method-assign]
    blocks_cpu, blocks_wall, write_cpu, scan_cpu, scan_wall, fetch_cpu = [], [], [], [], [], []
    for i in range(1, args.retries + 1):
        batch = sample.slice(i * args.keys, args.keys)
        if args.cold:
            store.read("SELECT max(length(event_attributes)) FROM ubi_events")
        c = time.process_time()
        out = store.write(events=batch)
        write_cpu.append(time.process_time() - c)
        if out.event_duplicates != batch.num_rows:
            raise SystemExit(f"retry {i}: {out} (expected {batch.num_rows} duplicates)")
        blocks_cpu.append(timed[-1][0])
        blocks_wall.append(timed[-1][1])
        # the lookup before the block filters: the probe joined with the whole key table
        hashes = index.hashes(batch.column("event_key").to_pylist())
        _ubi_probe = pa.table({"h": pa.array(hashes, pa.uint64())})  # noqa: F841 (read by DuckDB by name)
        if args.cold:
            store.read("SELECT max(length(event_attributes)) FROM ubi_events")
        with store.transaction() as cur:
            w, c = time.perf_counter(), time.process_time()
            hits = cur.execute(f"SELECT DISTINCT k.row_id FROM {index.keys} k SEMI JOIN _ubi_probe p "
                               "ON k.key_hash = p.h").fetchall()
            scan_cpu.append(time.process_time() - c)
            scan_wall.append(time.perf_counter() - w)
            c = time.process_time()  # the step both lookups share: the stored rows fetched by rowid
            cur.execute(f"SELECT * FROM {index.table} WHERE rowid IN (SELECT unnest(?))", [[r for (r,) in hits]])
            cur.fetchall()
            fetch_cpu.append(time.process_time() - c)

    def ms(xs: list[float]) -> str:
        return f"median {1000 * statistics.median(xs):.1f} ms, max {1000 * max(xs):.1f} ms"

    print(f"{args.retries} retries of {args.keys} stored event(s) each, {total:,} events stored:")
    print(f"  lookup, block filters:      CPU {ms(blocks_cpu)}; wall {ms(blocks_wall)}")
    print(f"  whole write (retry):        CPU {ms(write_cpu)}")
    print(f"  lookup, whole key table:    CPU {ms(scan_cpu)}; wall {ms(scan_wall)} (without the fetch below)")
    print(f"  of a lookup, the fetch of the stored rows by rowid: CPU {ms(fetch_cpu)}")
    if index.filter is None:
        raise SystemExit("the key filter was not filled by the writes")
    print(f"memory: global filter {index.filter.words.nbytes / 2**20:.0f} MB, block filters "
          f"{index.blocks.nbytes / 2**20:.0f} MB ({index.blocks.blocks} blocks of {store_keys.BLOCK_ROWS:,} rowids)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end; {usage.line()}")
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
