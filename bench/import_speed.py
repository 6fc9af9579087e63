"""Events per second of ``ubi import`` beside the in-process validation ceiling, measured in the same run.

For each format (NDJSON: one file of query records, one of events; ``_bulk``: one export with both indexes)
it generates the files with the project's simulator (``ubi_pipeline.processors.simulation.bulk_log.write_files``: about 12
events per search, UUID ids), then runs, each as its own child process so that peak RSS is its own:

* the ceiling: read the same lines and validate each record with the project's pydantic models, nothing
  else (no store, no rows, no duplicate-key check), three ways, in chunks of 5,000 lines: ``orjson.loads``
  of each line and ``TypeAdapter(list[UbiEvent]).validate_python`` of the chunk's values (what the importer
  does); ``TypeAdapter(list[UbiEvent]).validate_json`` of the chunk's lines joined into one array; and one
  ``UbiEvent.model_validate_json`` call per line. The fastest of them is the ceiling the ratio is taken to;
* ``ubi import`` of the files into a fresh store (``--json``), its events counted back from the store. It
  takes the columnar fast path (``collector/fastpath.py``: no pydantic model for plain records), so its rate
  may pass the pydantic ceiling's; the ratio says by how much it falls short of it or passes it.

It prints wall time, CPU time (user + system of that process), peak RSS, events/s (events of the log over
wall time, and over CPU time: on a shared machine CPU time is the fairer figure) and the ratio of the
import's rate to the ceiling's (``/ceil``: by wall time; then by CPU time, the fairer figure).

With ``--shapes`` it writes the same simulated records in each producer's byte layout instead
(``bench/shapes.py``: the simulator's, the reference JavaScript client's, Python ``json.dumps``', Logstash's
and Data Prepper's ``_bulk`` exports) and prints per shape: records/s of ``ubi import`` (query records and
events), peak RSS, the import's time over DuckDB's own parse of the same files (the issue's "x DuckDB" figure) and
its CPU rate over the pydantic ceiling's for the same files (``orjson + validate_python``, one core).

DuckDB's parse is measured two ways, each in a fresh process with DuckDB's default threads: ``parse``
(``CREATE TEMP TABLE AS SELECT * FROM read_json(...)``: every field of every line parsed into columns, the
fair reference for an import that parses and stores every field) and ``scan`` (``SELECT count(*)``: DuckDB's
optimiser reads no field for a bare count, so this is a newline scan and a floor, not a parse).

    .venv/bin/python bench/import_speed.py                      # 1M events, ndjson and bulk
    .venv/bin/python bench/import_speed.py --events 200000 --formats bulk
    .venv/bin/python bench/import_speed.py --shapes --events 200000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

UBI = [sys.executable, "-m", "ubi_pipeline.cli"]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import BULK_SHAPES, SHAPES, write_shape  # noqa: E402  (bench/shapes.py, beside this file)

#: DuckDB's own parse of the same files (what issue 26's "x DuckDB" compares to). ``parse``: every field of
#: every line into a temporary table; ``scan``: a bare count, which DuckDB answers without reading a field
#: (measured: 0.15 s for a 218,965-record file against 0.32 s for the table), so a floor rather than a parse.
DUCKDB_PARSE = r"""
import sys, duckdb
mode, files = sys.argv[1], sys.argv[2:]
source = "read_json($f, format='newline_delimited', union_by_name=true)"
con = duckdb.connect()
if mode == "parse":
    con.execute(f"CREATE TEMP TABLE parsed AS SELECT * FROM {source}", {"f": files})
    ((n,),) = con.execute("SELECT count(*) FROM parsed").fetchall()
else:
    ((n,),) = con.execute(f"SELECT count(*) FROM {source}", {"f": files}).fetchall()
print(n)
"""

CEILING = r"""
import sys, orjson
from pathlib import Path
from pydantic import TypeAdapter
from ubi_pipeline.schemas.ubi import UbiEvent, UbiQuery

fmt, mode, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
models = {"query": UbiQuery, "event": UbiEvent}
lists = {k: TypeAdapter(list[m]) for k, m in models.items()}
pending = {"query": [], "event": []}
n = 0

def flush(kind):
    global n
    lines = pending[kind]
    if mode == "line":
        for line in lines:
            models[kind].model_validate_json(line)
    elif mode == "json":
        lists[kind].validate_json(b"[" + b",".join(lines) + b"]")
    else:  # orjson parses each line, pydantic validates the chunk's values in one call
        lists[kind].validate_python([orjson.loads(line) for line in lines])
    n += len(lines)
    lines.clear()

for path in paths:
    with open(path, "rb") as fh:
        if fmt == "bulk":
            kind = None
            for line in fh:
                if kind is None:
                    kind = "query" if b'"ubi_queries"' in line else "event"
                    continue
                pending[kind].append(line.rstrip(b"\n"))
                if len(pending[kind]) >= 5000:
                    flush(kind)
                kind = None
        else:
            kind = "query" if "queries" in Path(path).name else "event"
            for line in fh:
                pending[kind].append(line.rstrip(b"\n"))
                if len(pending[kind]) >= 5000:
                    flush(kind)
for kind in pending:
    if pending[kind]:
        flush(kind)
print(n)
"""


def measured(cmd: list[str], cwd: Path) -> tuple[float, float, float, int, str]:
    """A command run to its end: wall time, the child's own CPU time and peak RSS (``wait4``). The page cache
    is written back first (``sync``): a file written just before, or the last run's database, is otherwise
    still being flushed while the clock runs (measured: 3.73 s against 3.10 s for the same import of a file
    just copied)."""
    os.sync()
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read().decode(errors="replace")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), text


CEILING_NAMES = {"python": "orjson + validate_python", "json": "validate_json", "line": "validate_json per line"}


def line(step: str, res: tuple[float, float, float, int, str], events: int, ceiling: float | None) -> float:
    wall, cpu, rss, code, text = res
    rate, cpu_rate = events / wall if wall else 0.0, events / cpu if cpu else 0.0
    ratio = f"{rate / ceiling:6.2f}" if ceiling else "      "
    print(f"{step:<36} {wall:8.1f} {cpu:8.1f} {rss:8,.0f} {rate:11,.0f} {cpu_rate:11,.0f} {ratio}", flush=True)
    if code != 0:
        print(f"    ! exited {code}: {text[-600:]}", flush=True)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--formats", nargs="+", default=["ndjson", "bulk"], choices=["ndjson", "bulk", "array"])
    ap.add_argument("--ceilings", nargs="+", default=["python", "json", "line"], choices=["python", "json", "line"],
                    help="ways of validating measured for the ceiling (default: all three)")
    ap.add_argument("--dir", type=Path, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--shapes", action="store_true",
                    help="the same records in each producer's byte layout (bench/shapes.py), one row per shape")
    args = ap.parse_args()
    if args.shapes:
        shapes_run(args)
        return
    root = Path(__file__).resolve().parents[1]
    work = args.dir or Path(tempfile.mkdtemp(prefix="ubi-import-speed-"))
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start (shared machine: wall times "
          "inflated by other work; CPU s is the fairer figure)")
    print(f"{'step':<36} {'wall s':>8} {'CPU s':>8} {'RSS MB':>8} {'ev/s wall':>11} {'ev/s CPU':>11} {'/ceil':>6}")
    try:
        for fmt in args.formats:
            folder = work / f"in-{fmt}"
            shutil.rmtree(folder, ignore_errors=True)
            gen = ("import sys; from pathlib import Path; from ubi_pipeline.processors.simulation.bulk_log import write_files; "
                   "write_files(Path(sys.argv[1]), int(sys.argv[2]), fmt=sys.argv[3])")
            subprocess.run([sys.executable, "-c", gen, str(folder), str(args.events), fmt], cwd=root, check=True)
            files = sorted(folder.iterdir(), key=lambda p: "0" if "queries" in p.name else p.name)
            size = sum(p.stat().st_size for p in files) / 1e6
            db = work / f"import-{fmt}.duckdb"
            for p in work.glob(db.name + "*"):
                p.unlink()
            print(f"-- {fmt}: {', '.join(p.name for p in files)} ({size:,.0f} MB)", flush=True)
            ceil_fmt = "bulk" if fmt == "bulk" else "ndjson"
            ceilings = []
            if fmt != "array":
                for mode in args.ceilings:
                    ceilings.append((mode, measured([sys.executable, "-c", CEILING, ceil_fmt, mode, *map(str, files)], root)))
            res_import = measured([*UBI, "import", *map(str, files), "--db", str(db), "--json"], root)
            with duckdb.connect(str(db), read_only=True) as con:
                ((nq, ne),) = con.execute(
                    "SELECT (SELECT count(*) FROM ubi_queries), (SELECT count(*) FROM ubi_events)").fetchall()
            ceiling_rate: float | None = None
            ceiling_cpu_rate: float | None = None
            for mode, res in ceilings:  # the ceiling: the fastest way by CPU time (wall time is the load's)
                rate = line(f"ceiling: {CEILING_NAMES[mode]}", res, ne, None)
                cpu_rate = ne / res[1] if res[1] else 0.0
                if res[3] == 0 and (ceiling_cpu_rate is None or cpu_rate > ceiling_cpu_rate):
                    ceiling_rate, ceiling_cpu_rate = rate, cpu_rate
            print(f"   (stored {nq:,} query records, {ne:,} events)")
            line(f"ubi import {fmt}", res_import, ne, ceiling_rate)
            if ceiling_cpu_rate and res_import[1]:
                print(f"   import / ceiling by CPU time: {ne / res_import[1] / ceiling_cpu_rate:.2f}")
            shutil.rmtree(folder, ignore_errors=True)
            for p in work.glob(db.name + "*"):
                p.unlink()
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end; events/s count events only (query records, "
          "about 1 per 12 events, are imported too)")


def shapes_run(args: argparse.Namespace) -> None:
    """``--shapes``: the simulator's records written in each producer's layout, imported one shape at a time."""
    root = Path(__file__).resolve().parents[1]
    work = args.dir or Path(tempfile.mkdtemp(prefix="ubi-import-shapes-"))
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start (shared machine: wall times "
          "inflated by other work; CPU s is the fairer figure)")
    try:
        sim = work / "sim"
        gen = ("import sys; from pathlib import Path; from ubi_pipeline.processors.simulation.bulk_log import write_files; "
               "write_files(Path(sys.argv[1]), int(sys.argv[2]), fmt='ndjson')")
        subprocess.run([sys.executable, "-c", gen, str(sim), str(args.events)], cwd=root, check=True)
        sim_files = sorted(sim.iterdir(), key=lambda p: "0" if "queries" in p.name else p.name)
        print(f"{'shape':<17} {'MB':>6} {'records':>9} {'wall s':>7} {'CPU s':>7} {'RSS MB':>7} {'rec/s':>9} "
              f"{'rec/s CPU':>10} {'parse s':>7} {'x parse':>7} {'scan s':>7} {'x scan':>7} {'/ceil':>6}")
        for shape in SHAPES:
            files = write_shape(shape, sim_files, work / shape)
            size = sum(p.stat().st_size for p in files) / 1e6
            db = work / f"{shape}.duckdb"
            duck = measured([sys.executable, "-c", DUCKDB_PARSE, "parse", *map(str, files)], root)
            scan = measured([sys.executable, "-c", DUCKDB_PARSE, "scan", *map(str, files)], root)
            fmt = "bulk" if shape in BULK_SHAPES else "ndjson"
            ceil = measured([sys.executable, "-c", CEILING, fmt, "python", *map(str, files)], root)
            res = measured([*UBI, "import", *map(str, files), "--db", str(db), "--json"], root)
            with duckdb.connect(str(db), read_only=True) as con:
                ((n,),) = con.execute(
                    "SELECT (SELECT count(*) FROM ubi_queries) + (SELECT count(*) FROM ubi_events)").fetchall()
            wall, cpu, rss, code, text = res
            ceil_rate = n / ceil[1] if ceil[1] and ceil[3] == 0 else 0.0
            ratio = f"{n / cpu / ceil_rate:6.2f}" if ceil_rate and cpu else "      "
            print(f"{shape:<17} {size:6,.0f} {n:9,} {wall:7.1f} {cpu:7.1f} {rss:7,.0f} {n / wall:9,.0f} "
                  f"{n / cpu if cpu else 0:10,.0f} {duck[0]:7.2f} {wall / duck[0]:7.1f} {scan[0]:7.2f} "
                  f"{wall / scan[0]:7.1f} {ratio}", flush=True)
            for name, r in (("import", res), ("duckdb parse", duck), ("duckdb scan", scan), ("ceiling", ceil)):
                if r[3] != 0:
                    print(f"    ! {name} exited {r[3]}: {r[4][-600:]}", flush=True)
            shutil.rmtree(work / shape, ignore_errors=True)
            for p in work.glob(db.name + "*"):
                p.unlink()
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end. records: query records and events stored; x parse: "
          "import wall time over DuckDB's read_json of every field of the same files into a table; x scan: over "
          "DuckDB's count(*) of them (a newline scan, no field read); /ceil: import records per CPU second over "
          "the pydantic ceiling's (orjson + validate_python, one core)")


if __name__ == "__main__":
    main()
