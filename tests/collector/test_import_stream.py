"""`ubi import` streams its files: gzip and plain NDJSON / _bulk / arrays, bounded memory, safe re-runs."""

from __future__ import annotations

import gzip
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from ubi_pipeline.collector.importer import import_files, iter_items
from ubi_pipeline.processors.simulation.bulk_log import write_files

UBI = [sys.executable, "-m", "ubi_pipeline.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _counts(db: Path) -> tuple[int, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        ((q, e),) = con.execute("SELECT (SELECT count(*) FROM ubi_queries), (SELECT count(*) FROM ubi_events)").fetchall()
    finally:
        con.close()
    return int(q), int(e)


@pytest.mark.parametrize(("fmt", "gz"), [("ndjson", True), ("bulk", True), ("bulk", False), ("array", False)])
def test_every_format_and_gzip_imports_exactly(tmp_path: Path, fmt: str, gz: bool) -> None:
    files = write_files(tmp_path / "in", 6_000, fmt=fmt, gzip=gz, seed=4)
    seen: list[tuple[int, int, int]] = []
    reports, mode = import_files(files, tmp_path / "ubi.duckdb",
                                 on_progress=lambda _p, done, total, n: seen.append((done, total, n)))
    # bulk_log's rows for 6,000 events and seed 4: 500 searches, 6,075 events (counted in DuckDB below too)
    assert mode == "direct"
    assert (sum(r.counts.queries for r in reports), sum(r.counts.events for r in reports)) == (500, 6_075)
    assert sum(r.rejected for r in reports) == 0
    assert _counts(tmp_path / "ubi.duckdb") == (500, 6_075)
    done, total, n = seen[-1]
    assert done == total == files[-1].stat().st_size  # progress ends at the file's size on disk
    assert n == (6_575 if fmt == "bulk" else 6_075)  # records of the last file


def test_bulk_lines_and_indexes_survive_the_runs(tmp_path: Path) -> None:
    """Records are parsed in runs of 2,000: indexes and line numbers still count from the file's start."""
    (path,) = write_files(tmp_path, 60_000, fmt="bulk", seed=1)
    items = list(iter_items(path))
    assert [it.index for it in items[:3]] == [0, 1, 2] and items[-1].index == len(items) - 1
    assert (items[0].line, items[2_000].line, items[-1].line) == (2, 4_002, 2 * len(items))
    assert items[0].kind == "query" and items[-1].kind == "event"


def _limit_address_space(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


#: The address-space cap of the big-file tests. Python with the importer's modules loaded maps about 330 MB
#: in the child below (435 MB with glibc's default of a malloc arena per thread and OpenBLAS' thread pool,
#: which :data:`_CHILD_ENV` turns down: neither changes what the reader does, and they let cap and file be
#: 110 MB smaller); reading either big file stays under 360 MB, so the cap leaves ~100 MB of headroom.
CAP = 450 * 1024 * 1024
#: The big files' (uncompressed) size: larger than the cap, so a reader that held the file could not pass.
BIG_FILE = 470 * 1024 * 1024
_CHILD_ENV = {**os.environ, "MALLOC_ARENA_MAX": "1", "OPENBLAS_NUM_THREADS": "1"}


def _records_read_under_cap(path: Path, whole_read: str) -> int:
    """Records ``ubi import``'s reader finds in ``path`` in a child process under :data:`CAP`, after checking
    that ``whole_read`` (code reading the file at once, ``sys.argv[1]``) fails under the same cap: the
    limit is real."""
    code = ("import sys; from pathlib import Path; from ubi_pipeline.collector.importer import iter_items, chunks; "
            "print(sum(len(c) for c in chunks(iter_items(Path(sys.argv[1]), 'event'))))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, env=_CHILD_ENV, preexec_fn=lambda: _limit_address_space(CAP))
    assert out.returncode == 0, out.stderr[-2000:]
    whole = subprocess.run([sys.executable, "-c", whole_read, str(path)], capture_output=True, timeout=300,
                           env=_CHILD_ENV, preexec_fn=lambda: _limit_address_space(CAP))
    assert whole.returncode != 0 and b"MemoryError" in whole.stderr
    return int(out.stdout)


def test_reading_a_file_larger_than_the_memory_cap(tmp_path: Path) -> None:
    """A 470 MB NDJSON file read under a 450 MB address-space cap: the reader holds a line at a time.

    (Python with the importer's modules loaded already maps about 330 MB here; the old reader, which read
    the whole file and kept every record, needed the file's size several times over. The records are as
    short as before the cap was lowered, ~1.25 million of them: a reader keeping ~75 bytes per record
    would run out too.)
    """
    path = tmp_path / "big.ndjson"
    line = ('{"action_name": "impression", "query_id": "q%09d", "timestamp": "2025-01-01T00:00:00Z", '
            '"event_attributes": {"object": {"object_id": "sku-%d"}, "position": {"ordinal": 3}}, '
            '"message": "' + "x" * 200 + '"}\n')
    with open(path, "w") as f:
        n = 0
        while f.tell() < BIG_FILE:
            f.writelines(line % (n + i, i) for i in range(10_000))
            n += 10_000
    assert path.stat().st_size > CAP
    assert _records_read_under_cap(path, "import sys; open(sys.argv[1], 'rb').read()") == n


def test_reading_a_json_array_larger_than_the_memory_cap(tmp_path: Path) -> None:
    """A JSON array of 470 MB (gzip-compressed on disk) read under the same 450 MB cap: split into its
    elements a block at a time (the old reader parsed an array whole, and decompressing it whole fails here)."""
    path = tmp_path / "big.json.gz"
    element = ('{"action_name": "impression", "query_id": "q%09d", "timestamp": "2025-01-01T00:00:00Z", '
               '"event_attributes": {"object": {"object_id": "sku-%d"}, "position": {"ordinal": 3}}, '
               '"message": "' + "x" * 1000 + '"}')
    size = n = 0
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write("[\n")
        while size < BIG_FILE:
            part = ",\n".join(element % (n + i, i) for i in range(5_000))
            f.write(("" if n == 0 else ",\n") + part)
            size += len(part) + 2
            n += 5_000
        f.write("\n]\n")
    assert size > CAP
    assert _records_read_under_cap(path, "import gzip, sys; gzip.open(sys.argv[1]).read()") == n


def test_a_killed_import_run_again_stores_every_record_once(tmp_path: Path) -> None:
    files = write_files(tmp_path / "in", 120_000, fmt="ndjson", seed=6)
    db = tmp_path / "ubi.duckdb"
    # one transaction per 50,000-record chunk (UBI_IMPORT_BATCH_RECORDS, set here as a larger default would
    # write this file's events in one), so that the kill can come between two commits
    env = {**os.environ, "COLUMNS": "200", "UBI_IMPORT_BATCH_RECORDS": "50000"}
    # --progress-every 0: a line after every committed chunk (the default, one per 5 s, can come only after
    # the last chunk of a file the fast path imports in a few seconds, and the kill would find it all stored)
    proc = subprocess.Popen([*UBI, "import", *map(str, files), "--db", str(db), "--progress-every", "0"],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 300
    for progress_line in proc.stderr:  # not a terminal: plain progress lines, the first at 0 records
        if "ubi_events" in progress_line and ", 0 records" not in progress_line:
            break
        assert time.monotonic() < deadline, "no progress"
    proc.send_signal(signal.SIGKILL)  # mid-file: some chunks of events committed, the rest not
    proc.wait(timeout=30)
    partial = _counts(db)
    assert partial[0] == 10_000 and 0 < partial[1] < 121_347  # every query record, some events
    again = subprocess.run([*UBI, "import", *map(str, files), "--db", str(db), "--json"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    # bulk_log's rows for 120,000 events, seed 6: 10,000 searches and 121,347 events
    assert _counts(db) == (10_000, 121_347)
    assert summary["duplicates"] == 10_000 + partial[1]  # what the first run had stored counts as duplicates
    assert summary["events"] == 121_347 - partial[1] and summary["rejected"] == 0


def test_an_import_whose_keys_outgrow_the_writer_memory_limit(tmp_path: Path) -> None:
    """150,000 events imported with the writer's DuckDB held to 20 MB (``UBI_WRITER_MEMORY_LIMIT``): their keys
    would not fit that limit as the PRIMARY KEY index the store had (checked below on the same keys: DuckDB
    then fails to commit, as a 5M import did at 256 MB), and the import stores every record once."""
    files = write_files(tmp_path / "in", 150_000, fmt="ndjson", seed=3)
    db = tmp_path / "ubi.duckdb"
    env = {**os.environ, "UBI_WRITER_MEMORY_LIMIT": "20MB"}
    out = subprocess.run([*UBI, "import", *map(str, files), "--db", str(db), "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    # every line of bulk_log's files is one distinct record: 12,500 query records, 151,863 events (seed 3)
    lines = [sum(1 for _ in open(p, "rb")) for p in files]
    assert sorted(lines) == [12_500, 151_863]
    assert _counts(db) == (12_500, 151_863)
    again = json.loads(subprocess.run([*UBI, "import", *map(str, files), "--db", str(db), "--json"], cwd=ROOT,
                                      env=env, capture_output=True, text=True, timeout=600, check=True).stdout)
    assert (again["duplicates"], again["events"], again["queries"]) == (164_363, 0, 0)
    assert _counts(db) == (12_500, 151_863)

    # The control: the same keys under the same limit, kept unique by a PRIMARY KEY (an ART index in memory).
    control = duckdb.connect(str(tmp_path / "control.duckdb"))
    control.execute("SET memory_limit = '20MB'")
    control.execute("SET threads = 1")
    control.execute(f"ATTACH '{db}' AS store (READ_ONLY)")
    control.execute("CREATE TABLE k (event_key VARCHAR PRIMARY KEY)")
    with pytest.raises(duckdb.Error, match="could not allocate|memory"):
        for start in range(0, 151_863, 50_000):  # the importer's chunks, one transaction each
            control.execute(f"INSERT INTO k SELECT event_key FROM store.ubi_events WHERE rowid >= {start} "
                            f"AND rowid < {start + 50_000}")
    control.close()
