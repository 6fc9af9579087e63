"""Judgment parameters stored once per run (judgment_runs) read back as the same dicts as the old whole-row shape."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from ubi_pipeline.processors.clicks.sessions import read_sessions
from ubi_pipeline.processors.labels.implicit import make_judgments, process, store_judgments, write_jsonl
from ubi_pipeline.processors.labels.merge import labels_from_store
from ubi_pipeline.processors.simulation.bulk_log import write_store
from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.client import open_reader
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.judgment_params import merged_from_arrow, read_judgments
from ubi_pipeline.store.rows import JUDGMENT_RUN_SCHEMA

#: ``judgments`` as every store made before ``run_id`` declared it (schemas/tables.py before the split).
OLD_JUDGMENTS_DDL = """CREATE TABLE judgments (
    query VARCHAR NOT NULL, doc_id VARCHAR NOT NULL, source VARCHAR NOT NULL, model_version VARCHAR,
    parameters JSON, score DOUBLE, ci_low DOUBLE, ci_high DOUBLE, impressions BIGINT, clicks BIGINT,
    sessions BIGINT, grade INTEGER, created_at TIMESTAMP NOT NULL, PRIMARY KEY (query, doc_id, source))"""
OLD_COLUMNS = tables.JUDGMENT_COLUMNS[:-1]  # all but run_id

#: Events of the run compared row for row: 200,000 (the same generator as the README's 1M run, a fifth of the
#: size and of the suite's time; the comparison is per row, so size does not change what is compared);
#: UBI_TEST_JUDGMENT_EVENTS=1000000 compares the README's 1M run itself (~27,000 rows).
EVENTS = int(os.environ.get("UBI_TEST_JUDGMENT_EVENTS", "200000"))


def old_shape(rows: pa.Table, runs: pa.Table) -> pa.Table:
    """The rows as the writer before the split stored them: the run's document with the row's keys spliced onto
    its end (``{run keys..., "calibration_split": ..., "observations": n}``), no run_id."""
    text = dict(zip(runs.column("run_id").to_pylist(), runs.column("parameters").to_pylist(), strict=True))
    whole = [text[r][:-1] + "," + own[1:] for r, own in
             zip(rows.column("run_id").to_pylist(), rows.column("parameters").to_pylist(), strict=True)]
    return rows.select(list(OLD_COLUMNS)).set_column(OLD_COLUMNS.index("parameters"), "parameters",
                                                     pa.array(whole, pa.string()))


def old_store(path: Path, rows: pa.Table) -> Path:
    """A store made before the split: the old judgments table holding ``rows``, no judgment_runs."""
    with duckdb.connect(str(path)) as con:
        con.execute(OLD_JUDGMENTS_DDL)
        con.register("_rows", rows)
        con.execute(f"INSERT INTO judgments ({', '.join(OLD_COLUMNS)}) SELECT {', '.join(OLD_COLUMNS)} FROM _rows")
    return path


def read_labels(db: Path) -> list:
    con = open_reader(db)
    try:
        return labels_from_store(con)
    finally:
        con.close()


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("runs") / "ubi.duckdb"
    nq, _ = write_store(db, EVENTS, seed=11)
    assert nq == round(EVENTS / 12)  # bulk_log: one search per 12 events
    return db


@pytest.mark.timeout(900)
def test_old_and_new_shapes_read_the_same_row_for_row(logged: Path, tmp_path: Path) -> None:
    """A PBM run stored the new way and the same rows stored the old way read as equal labels, dict for dict,
    key order included; the JSONL export of both is the same bytes."""
    res = process(logged, "pbm", Settings(db=logged), out=tmp_path / "new.jsonl")
    run = res.run
    n = run.table.num_rows
    assert res.stored == n > 0
    new = read_labels(logged)
    old_rows = old_shape(run.table, run.runs)
    old = read_labels(old_store(tmp_path / "old.duckdb", old_rows))
    assert len(new) == len(old) == n
    for a, b in zip(new, old, strict=True):
        assert a == b
        assert list(a.parameters.items()) == list(b.parameters.items())  # same keys in the same order
    first = new[0].parameters
    assert list(first)[:2] == ["model", "grade_mapping"] and list(first)[-1] == "observations"
    # the export a user sees: byte for byte what the old rows give
    assert write_jsonl(old_rows, tmp_path / "old.jsonl") == n
    assert (tmp_path / "new.jsonl").read_bytes() == (tmp_path / "old.jsonl").read_bytes()
    # what the split is for: the run-wide part once, rows with a few bytes of their own (at 20M: 1.3 KB a row)
    own = sum(len(p) for p in run.table.column("parameters").to_pylist()) / n
    whole = sum(len(p) for p in old_rows.column("parameters").to_pylist()) / n
    assert run.runs.num_rows == 1 and own < 50 and whole > 20 * own
    with duckdb.connect(str(logged), read_only=True) as con:
        assert con.execute("SELECT count(*), count(DISTINCT run_id) FROM judgments").fetchone() == (n, 1)
        assert con.execute("SELECT count(*) FROM judgment_runs").fetchone() == (1,)


def test_a_store_made_before_the_split_is_read_then_migrated_on_open_idempotently(tmp_path: Path) -> None:
    run = make_judgments(read_sessions(*_small(tmp_path)), "ctr", Settings(min_support=1, max_ci_width=100.0))
    rows = old_shape(run.table, run.runs)
    db = old_store(tmp_path / "old.duckdb", rows)
    want = list(merged_from_arrow(run.table, run.runs))
    # read-only, unmigrated: no run_id column, no judgment_runs table
    before = read_labels(db)
    assert [lab.parameters for lab in before] == want
    for _ in range(2):  # the writer adds the column; opening again changes nothing
        Store(db).close()
        with duckdb.connect(str(db), read_only=True) as con:
            cols = [r[0] for r in con.execute("DESCRIBE judgments").fetchall()]
            assert cols == list(tables.JUDGMENT_COLUMNS)
            assert con.execute("SELECT count(*), count(run_id) FROM judgments").fetchone() == (rows.num_rows, 0)
            assert con.execute("SELECT count(*) FROM judgment_runs").fetchone() == (0,)
        assert read_labels(db) == before
    # a new run of another model beside the old rows: both read, each in its shape
    other = make_judgments(read_sessions(*_small(tmp_path)), "coec", Settings(min_support=1, max_ci_width=100.0))
    store_judgments(db, other.table, other.source, runs=other.runs)
    labels = read_labels(db)
    assert [lab.parameters for lab in labels if lab.source == "implicit:ctr"] == want
    assert [lab.parameters for lab in labels if lab.source == "implicit:coec"] == list(
        merged_from_arrow(other.table, other.runs))
    # and the same model again replaces its old-shape rows with new-shape ones
    store_judgments(db, run.table, run.source, runs=run.runs)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM judgments WHERE run_id IS NULL").fetchone() == (0,)
    assert [lab.parameters for lab in read_labels(db) if lab.source == "implicit:ctr"] == want


def _small(tmp_path: Path) -> tuple[Path, Settings]:
    db = tmp_path / "log.duckdb"
    if not db.exists():
        write_store(db, 6_000, seed=2)
    return db, Settings(db=db)


def test_a_run_row_is_stored_once_and_goes_with_the_last_row_that_refers_to_it(tmp_path: Path) -> None:
    db, settings = _small(tmp_path)
    data = read_sessions(db, settings)
    a = make_judgments(data, "ctr", Settings(min_support=1, max_ci_width=100.0))
    b = make_judgments(data, "ctr", Settings(min_support=2, max_ci_width=100.0))  # another run-wide document
    assert a.runs.column("run_id")[0] != b.runs.column("run_id")[0]
    for _ in range(2):  # the same run twice: one row
        store_judgments(db, a.table, a.source, runs=a.runs)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT run_id FROM judgment_runs").fetchall() == [(a.runs.column("run_id")[0].as_py(),)]
    store_judgments(db, b.table, b.source, runs=b.runs)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT run_id FROM judgment_runs").fetchall() == [(b.runs.column("run_id")[0].as_py(),)]
        assert con.execute("SELECT DISTINCT run_id FROM judgments").fetchall() == [(b.runs.column("run_id")[0].as_py(),)]
    assert {lab.parameters["min_support"] for lab in read_labels(db)} == {2}


def test_rows_that_refer_to_a_run_not_stored_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    db, settings = _small(tmp_path)
    run = make_judgments(read_sessions(db, settings), "ctr", Settings(min_support=1, max_ci_width=100.0))
    empty = pa.table({c: pa.array([], t.type) for c, t in zip(JUDGMENT_RUN_SCHEMA.names, JUDGMENT_RUN_SCHEMA,
                                                             strict=True)})
    with pytest.raises(StoreError, match=r"judgments of source 'implicit:ctr' refer to run '[0-9a-f]{24}', which "
                                         r"judgment_runs does not hold"):
        store_judgments(db, run.table, run.source, runs=empty)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM judgments").fetchone() == (0,)


def test_a_reader_of_sealed_segments_gets_the_runs_too(tmp_path: Path) -> None:
    db, settings = _small(tmp_path)
    run = make_judgments(read_sessions(db, settings), "ctr", Settings(min_support=1, max_ci_width=100.0))
    from ubi_pipeline.store.sealed import open_sealed

    with Store(db) as store:
        store.load_tables([("judgment_runs", run.runs, None), ("judgments", run.table, run.source)])
        con = open_sealed(store.seal())
    try:
        got = [p for (p,) in read_judgments(con, ())]
    finally:
        con.close()
    assert got == list(merged_from_arrow(run.table, run.runs)) and len(got) == run.table.num_rows


def test_shared_dicts_read_as_the_unshared_ones(tmp_path: Path) -> None:
    """``read_judgments(..., share=True)`` (what the report's labels use) gives dicts equal to the unshared ones,
    key order included, one object per distinct stored text, from the new rows and from rows stored the old way;
    the labels carry exactly those dicts and the same values."""
    import json

    db, settings = _small(tmp_path)
    run = make_judgments(read_sessions(db, settings), "ctr", Settings(min_support=1, max_ci_width=100.0))
    store_judgments(db, run.table, run.source, runs=run.runs)
    old = old_store(tmp_path / "old.duckdb", old_shape(run.table, run.runs))
    con = open_reader(db)
    try:
        want = [p for (p,) in read_judgments(con, ())]
    finally:
        con.close()
    n_texts = len({json.dumps(p) for p in want})
    assert len(want) == run.table.num_rows and 1 < n_texts < len(want)  # rows differ in observations only
    for path in (db, old):
        con = open_reader(path)
        try:
            shared = [p for (p,) in read_judgments(con, (), share=True)]
            apart = [p for (p,) in read_judgments(con, ())]
        finally:
            con.close()
        assert shared == apart == want
        assert all(list(a.items()) == list(b.items()) for a, b in zip(shared, apart, strict=True))
        assert len({id(p) for p in shared}) == n_texts and len({id(p) for p in apart}) == len(apart)
        labels = read_labels(path)
        assert [lab.parameters for lab in labels] == want
        assert len({id(lab.parameters) for lab in labels}) == n_texts
    con = open_reader(db)
    try:
        rows = con.execute("SELECT query, doc_id, grade, source, model_version, score, impressions, created_at "
                           "FROM judgments ORDER BY query, doc_id, source").fetchall()
    finally:
        con.close()
    labels = read_labels(db)
    assert [(lab.query, lab.doc_id, lab.grade, lab.source, lab.model_version, lab.score, lab.impressions,
             lab.judged_at) for lab in labels] == rows
    assert len({id(lab.source) for lab in labels}) == 1 and len({id(lab.judged_at) for lab in labels}) == 1
