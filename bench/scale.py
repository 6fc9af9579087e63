"""How each step's cost grows with the log: import, process per model, propensity, report, beside plain SQL.

For each size (events) it generates a store in DuckDB SQL (``ubi_pipeline.processors.simulation.bulk_log``: about 12
events per search, UUID ids). The store is built without validation, for the reader steps: the rows are made in
the stored shape and inserted with ``INSERT ... SELECT`` straight into the store's tables, 500,000 searches at a
time (the import path, which validates every record, runs at about 8,000 events/s here and is measured
separately, ``--steps import`` and ``bench/import_speed.py``). Then it runs every step as its own ``ubi`` process
and prints per step wall time,
CPU time (user + system of that process and its threads), peak RSS and the disk the store takes. The
baseline is plain DuckDB SQL computing the statistics process fits on (PBM cells, weighted click patterns,
UBM cells; see ``BASELINE``) from the same store, run the same way, so ``process / baseline`` (CPU and wall)
is measured in the same run; "sessions only" is process's SQL without the fit. Both run under each of
``--limits``: the readers' default DuckDB ``memory_limit`` of 1GB, under which plain SQL fails from about 20M
events while process spills and completes, and DuckDB's own default (``none``), where neither has to spill.
``import`` writes the log as NDJSON and ``_bulk`` files and imports them into a fresh store (sizes up to
``--import-max``: it is the slow step). ``read`` runs ``bench/read_live.py`` on the store last: a collector
ingesting single-event POSTs while readers scan what it sealed; its rows give the reader's wall, CPU and peak
RSS, the sealed segments' size in the disk column, and the POST latency the collector answered meanwhile
(``bench/read_live.py`` itself has more phases and repetitions).

    .venv/bin/python bench/scale.py                    # 1M, 5M, 20M events
    .venv/bin/python bench/scale.py --sizes 1000000 --big   # --big adds 50M
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

UBI = [sys.executable, "-m", "ubi_pipeline.cli"]

# The plain-SQL baseline: the statistics `ubi process` hands to a click model, each in one straightforward DuckDB
# query with the simple rules (one record per query_id, the hit list is the ranking, impressions say what was
# displayed, a click marks its doc), fetched into Python as Arrow as process fetches its own. Per (query,
# doc, rank): impressions and clicks (PBM cells); per distinct (query, ranking, clicks) session: its weight
# (the patterns every model fits on); per (query, doc, rank, previous click rank): UBM cells from those
# patterns. What it leaves out and process does: the data-quality counts, per-application ordinal bases,
# placement of clicks on undisplayed docs, the bot / click-on-everything / empty-query filters, query
# normalisation, and the fit, grading and storing of judgments. "sessions only" times load_sessions and
# nothing after it, so SQL is compared with SQL too.
BASELINE = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
if sys.argv[2]:  # else DuckDB's own default (80% of the machine's memory)
    con.execute("SET memory_limit = ?", [sys.argv[2]])
con.execute("SET enable_progress_bar = false")
con.execute('''
CREATE TEMP TABLE d AS
WITH s AS (
    SELECT query_id, arg_min(user_query, "timestamp") AS user_query, arg_min(query_response_hit_ids, "timestamp") AS hits
    FROM ubi_queries GROUP BY query_id
), e AS (
    SELECT e.query_id, s.user_query, e.object_id, list_position(s.hits, e.object_id) AS rank,
           e.action_name = 'click' AS click
    FROM ubi_events e JOIN s USING (query_id) WHERE e.action_name IN ('impression', 'click')
)
SELECT query_id, user_query, object_id, min(rank) AS rank, bool_or(click) AS clicked FROM e
WHERE rank BETWEEN 1 AND 10 GROUP BY ALL''')
cells = con.sql('''SELECT user_query, object_id, rank, count(*) AS impressions, count(*) FILTER (WHERE clicked) AS clicks
                   FROM d GROUP BY ALL''').to_arrow_table()
con.execute('''
CREATE TEMP TABLE p AS
SELECT row_number() OVER () AS pattern, user_query, sig, count(*) AS weight FROM (
    SELECT query_id, any_value(user_query) AS user_query,
           list({'rank': rank, 'doc': object_id, 'clicked': clicked} ORDER BY rank) AS sig
    FROM d GROUP BY query_id
) GROUP BY user_query, sig''')
patterns = con.sql('SELECT pattern, user_query, weight, sig FROM p').to_arrow_table()
ubm = con.sql('''
SELECT user_query, doc, rank, prev_click, sum(weight) AS impressions, sum(weight) FILTER (WHERE clicked) AS clicks FROM (
    SELECT user_query, weight, r.doc, r.rank, r.clicked,
           coalesce(max(CASE WHEN r.clicked THEN r.rank END) OVER (PARTITION BY pattern ORDER BY r.rank
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS prev_click
    FROM (SELECT pattern, user_query, weight, unnest(sig) AS r FROM p)
) GROUP BY ALL''').to_arrow_table()
print(cells.num_rows, "cells,", patterns.num_rows, "patterns,", ubm.num_rows, "UBM cells")
"""

# The earlier, narrower baseline: PBM cells only (printed beside, for figures measured against it)
BASELINE_CELLS = BASELINE.split("cells = con.sql", 1)[0] + """
n = con.sql('SELECT user_query, object_id, rank, count(*), count(*) FILTER (WHERE clicked) FROM d GROUP BY ALL').fetchall()
print(len(n), "cells")
"""

# load_sessions alone: the SQL process runs before any fitting (same reader, same memory limit)
SESSIONS = """
import sys
from ubi_pipeline.processors.clicks.sessions import read_sessions
d = read_sessions(sys.argv[1])
print(len(d.cells.pair), "cells,", d.patterns.docs.shape[0], "patterns,", len(d.ubm_cells.pair), "UBM cells")
"""


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MB, exit code) of one child process (``env``: variables set for it)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        print(f"    ! {' '.join(cmd[2:5])} exited {code}: {err[-400:]}", flush=True)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, code


def disk_mb(path: Path) -> float:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 1e6


def row(size: int, step: str, res: tuple[float, float, float, int], disk: float,
        base: tuple[float, float, float, int] | None) -> None:
    """One line of the table; ``base``: the baseline's result, for the CPU and wall ratios."""
    wall, cpu, rss, code = res
    if base is not None and base[3] != 0:
        ratio = "(baseline failed)"
    else:
        ratio = f"{cpu / base[1]:5.1f}x {wall / base[0]:5.1f}x" if base and base[0] and base[1] else " " * 12
    flag = "" if code == 0 else f"  (exit {code})"
    print(f"{size:>11,} {step:<42} {wall:8.1f} {cpu:8.1f} {rss:8,.0f} {disk:9,.0f}  {ratio}{flag}", flush=True)


def remove_store(db: Path) -> None:
    """A store file and everything DuckDB and the collector leave beside it (WAL, spill folder, sealed segments)."""
    for p in db.parent.glob(db.name + "*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink()


def read_while_ingesting(size: int, db: Path, root: Path, work: Path, *, copy: bool) -> None:
    """Readers of the store while a collector ingests into it: ``bench/read_live.py`` on ``db`` (the first read,
    which seals the whole store once, then a read after it, and POSTs alone before them), one row per phase with
    the reader's wall and CPU time, its peak RSS, and the POST p50/p99 the collector answered meanwhile.

    The collector writes into the store it serves, so this runs last on a size's store, on a copy when the store
    is kept (``--reuse``)."""
    target = db
    if copy:
        target = work / f"live-{db.name}"
        shutil.copy(db, target)
    out = subprocess.run([sys.executable, str(root / "bench" / "read_live.py"), "--store", str(target), "--phases",
                          "baseline", "first", "next", "--json"], cwd=root, capture_output=True, text=True)
    if copy:
        remove_store(target)
    if out.returncode != 0:
        print(f"    ! read_live exited {out.returncode}: {out.stderr[-400:]}", flush=True)
        return
    result = json.loads(out.stdout)
    for phase in result["phases"]:
        pooled = result["pooled"].get(phase["phase"], {})
        step = f"read: {phase['phase']}"[:42]
        res = (float(phase.get("reader_wall_s", phase["seconds"])), float(phase.get("reader_cpu_s", 0.0)),
               float(phase.get("reader_rss_mb", 0.0)), 0)
        print(f"{size:>11,} {step:<42} {res[0]:8.1f} {res[1]:8.1f} {res[2]:8,.0f} {phase['sealed_mb']:9,.0f}  "
              f"POST p50 {pooled.get('p50_ms', 0):.1f} ms, p99 {pooled.get('p99_ms', 0):.1f} ms "
              f"({pooled.get('requests', 0):,} POSTs; collector CPU {phase['collector_cpu_s']} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000, 20_000_000])
    ap.add_argument("--big", action="store_true", help="also 50M events")
    ap.add_argument("--models", nargs="+", default=["pbm", "ubm", "dbn"])
    ap.add_argument("--import-max", type=int, default=1_000_000, help="largest size whose import is timed")
    ap.add_argument("--dir", type=Path, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--steps", nargs="+", default=["process", "propensity", "report", "import", "read"],
                    choices=("process", "propensity", "report", "import", "read"),
                    help="steps to time beside the baseline (default: all)")
    ap.add_argument("--before", type=Path, metavar="TREE",
                    help="also time sessions and process with the code of this checkout (e.g. `git archive main | "
                         "tar -x -C TREE`), interleaved with this one, for a before/after in the same run")
    ap.add_argument("--reuse", action="store_true", help="keep the generated stores in --dir and reuse them")
    ap.add_argument("--limits", nargs="+", default=["1GB", "none"], metavar="LIMIT",
                    help="DuckDB memory limits under which the baseline, sessions and process run, each against the "
                         "baseline under the same limit (default: 1GB, the readers' default UBI_MEMORY_LIMIT, and "
                         "none: DuckDB's own default of 80%% of the machine's memory, where plain SQL need not spill)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run baseline, sessions and process this many times, interleaved (load drifts)")
    args = ap.parse_args()
    sizes = args.sizes + ([50_000_000] if args.big else [])
    root = Path(__file__).resolve().parents[1]
    work = args.dir or Path(tempfile.mkdtemp(prefix="ubi-scale-"))
    work.mkdir(parents=True, exist_ok=True)  # a --dir that does not exist yet is made, not an error
    load = os.getloadavg()
    print(f"{os.cpu_count()} cores, load average {load[0]:.1f} at start; DuckDB memory limits: {', '.join(args.limits)} "
          "(the reader steps after process run under the readers' default, 1GB)")
    print(f"{'events':>11} {'step':<42} {'wall s':>8} {'CPU s':>8} {'RSS MB':>8} {'disk MB':>9}  "
          "/baseline CPU, wall")
    try:
        for size in sizes:
            db = work / f"s{size}.duckdb"
            if args.reuse and db.exists():
                gen = (0.0, 0.0, 0.0, 0)
            else:
                remove_store(db)
                # in a child process: a child's peak RSS starts at its parent's, so this process must stay small
                gen = run([sys.executable, "-c", "import sys; from pathlib import Path; from ubi_pipeline.processors.simulation."
                           "bulk_log import write_store; write_store(Path(sys.argv[1]), int(sys.argv[2]))",
                           str(db), str(size)], root)
            with duckdb.connect(str(db), read_only=True) as con:
                ((ne,),) = con.execute("SELECT count(*) FROM ubi_events").fetchall()
            row(size, f"generate ({ne:,} events)", gen, disk_mb(db), None)
            for _ in range(args.repeat):
                for limit in args.limits:
                    # the same DuckDB memory limit for the baseline and for process: "none" is DuckDB's default
                    value, tag_limit = ("", "no limit") if limit == "none" else (limit, limit)
                    env = {"UBI_MEMORY_LIMIT": value}
                    base = run([sys.executable, "-c", BASELINE, str(db), value], root)
                    row(size, f"baseline: plain SQL [{tag_limit}]", base, disk_mb(db), None)
                    if limit == args.limits[0]:
                        row(size, f"(baseline: PBM cells only) [{tag_limit}]",
                            run([sys.executable, "-c", BASELINE_CELLS, str(db), value], root), disk_mb(db), base)
                    for tree, tag in ((root, ""), *(((args.before, "before: "),) if args.before else ())):
                        res = run([sys.executable, "-c", SESSIONS, str(db)], tree, env)
                        row(size, f"{tag}sessions only [{tag_limit}]", res, disk_mb(db), base)
                        for model in args.models if "process" in args.steps else ():
                            store = [] if model == "pbm" else ["--no-store"]
                            res = run([*UBI, "process", "--db", str(db), "--model", model, *store], tree, env)
                            row(size, f"{tag}process --model {model} [{tag_limit}]", res, disk_mb(db), base)
            if "propensity" in args.steps:
                res = run([*UBI, "propensity", "--db", str(db), "--method", "em", "--json"], root)
                row(size, "propensity --method em", res, disk_mb(db), base)
            if "report" in args.steps:
                res = run([*UBI, "report", "--db", str(db), "--format", "json", "--out", os.devnull], root)
                row(size, "report (pbm labels)", res, disk_mb(db), base)
            if "import" in args.steps and size <= args.import_max:
                for fmt in ("ndjson", "bulk"):
                    folder = work / f"in{size}{fmt}"
                    run([sys.executable, "-c", "import sys; from pathlib import Path; from ubi_pipeline.processors.simulation."
                         "bulk_log import write_files; write_files(Path(sys.argv[1]), int(sys.argv[2]), fmt=sys.argv[3])",
                         str(folder), str(size), fmt], root)
                    files = sorted(folder.iterdir(), key=lambda p: "0" if "queries" in p.name else p.name)
                    target = work / f"import{size}{fmt}.duckdb"
                    res = run([*UBI, "import", *map(str, files), "--db", str(target)], root)
                    rate = ne / res[0] if res[0] else 0
                    row(size, f"import {fmt} ({rate:,.0f} ev/s)", res, disk_mb(target), None)
                    shutil.rmtree(work / f"in{size}{fmt}", ignore_errors=True)
                    remove_store(target)
            if "read" in args.steps:
                read_while_ingesting(size, db, root, work, copy=args.reuse)
            if not args.reuse:
                remove_store(db)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end (shared machine: compare CPU s, not wall s)")


if __name__ == "__main__":
    main()
