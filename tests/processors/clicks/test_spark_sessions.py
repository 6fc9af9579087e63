"""The Spark engine (ubi_pipeline.processors.clicks.spark_sessions) gives the statistics DuckDB gives, on the same Parquet folder.

One Spark session (local mode) serves every test here: starting one costs 10-60 s on this machine.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.processors.ubi_records import build_sample_store, build_store, make_event, make_query
from ubi_pipeline.processors.clicks.sessions import SessionData, load_sessions
from ubi_pipeline.processors.simulation.bulk_log import store_to_parquet, write_parquet
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.parquet_store import open_parquet_reader

pyspark = pytest.importorskip("pyspark", reason="PySpark is not installed (the dev extra has it)")
if shutil.which("java") is None:
    pytest.skip("no Java runtime: `make test` installs Debian's openjdk-17-jre-headless", allow_module_level=True)


#: JVM options of the tests' Spark driver: the client JIT only and the serial collector. A test run is all
#: start-up and first queries, where C2 compilation costs more than it gains: measured on the shared 2-core
#: machine, starting a session and building the synthetic folder's sessions twice took 119 s of JVM CPU with
#: the defaults and 67 s with these. Results do not depend on them; PYSPARK_SUBMIT_ARGS set by hand wins.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    from ubi_pipeline.processors.clicks.spark_sessions import spark_session

    with pytest.MonkeyPatch.context() as mp:
        if "PYSPARK_SUBMIT_ARGS" not in os.environ:  # read once, when PySpark starts the JVM
            mp.setenv("PYSPARK_SUBMIT_ARGS", f"--driver-java-options '{TEST_JVM_OPTIONS}' pyspark-shell")
        session = spark_session("local[2]", "ubi-tests")
    yield session
    session.stop()


def _edge_records() -> tuple[list, list]:
    """The rules that bite: bots, click-on-everything, empty queries, searches without hit lists (ranks from
    ordinals, and from arrival order), impressions outside the hit list, clicks placed at a free ordinal
    rank or dropped, repeated clicks, clicks without a search."""
    queries, events = [], []
    for i in range(61):  # a bot: 61 searches within a minute
        queries.append(make_query(f"b{i}", "cheap", ["a", "b"], at=i * 0.9, client_id="bot"))
        events.append(make_event("click", f"b{i}", "a", 0, at=i * 0.9 + 0.5, client_id="bot"))
    for i in range(30):  # a person, one search a minute
        queries.append(make_query(f"h{i}", "Cheap ", ["a", "b", "c"], at=i * 61.0, client_id="human"))
        events.append(make_event("click", f"h{i}", "abc"[i % 3], i % 3, at=i * 61.0 + 2, client_id="human"))
    queries.append(make_query("all", "cheap", ["a", "b"], at=5000, client_id="o"))
    events += [make_event("click", "all", "a", 0, at=5001), make_event("click", "all", "b", 1, at=5002)]
    queries.append(make_query("blank", "   ", ["a"], at=5000, client_id="o"))
    # no hit list: ranks from ordinals, a doc impressed twice, two docs claiming rank 2
    queries.append(make_query("ord", "shoes", None, at=6000, client_id="o"))
    events += [make_event("impression", "ord", d, o, at=6000 + n) for n, (d, o) in
               enumerate([("x", 0), ("y", 1), ("x", 2), ("z", 1)])]
    events.append(make_event("click", "ord", "y", 1, at=6010))
    # no hit list and no ordinals: arrival order; a click on an undisplayed doc at a free rank is placed
    queries.append(make_query("arr", "boots", None, at=7000, client_id="o"))
    events += [make_event("impression", "arr", d, None, at=7000 + n) for n, d in enumerate("pqr")]
    events += [make_event("click", "arr", "s", 5, at=7010), make_event("click", "arr", "t", 1, at=7011),
               make_event("click", "arr", "p", None, at=7012), make_event("click", "arr", "p", None, at=7013)]
    # a hit list and impressions of a doc outside it (another sub-search): dropped
    queries.append(make_query("sub", "hats", ["h1", "h2"], at=8000, client_id="o"))
    events += [make_event("impression", "sub", "h1", 0, at=8001), make_event("impression", "sub", "zz", 1, at=8002),
               make_event("click", "sub", "h2", 1, at=8003)]
    events.append(make_event("click", "nosuch", "a", 0, at=9000))  # no search
    return queries, events


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("spark")
    out = {}
    sample = build_sample_store(base / "sample.duckdb")
    store_to_parquet(sample, base / "sample", redeliver=0.2)
    out["sample"] = base / "sample"
    queries, events = _edge_records()
    edge = build_store(base / "edge.duckdb", queries, events)
    store_to_parquet(edge, base / "edge", redeliver=0.3)
    out["edge"] = base / "edge"
    nq, ne = write_parquet(base / "synthetic", 24_000, seed=5, redeliver=0.05)
    assert (nq, ne) == (2_000, 24_306)  # bulk_log's shape for this seed (distinct rows, before re-delivery)
    out["synthetic"] = base / "synthetic"
    return out


def _same(duck: SessionData, spark: SessionData) -> None:
    assert duck.pairs.queries.tolist() == spark.pairs.queries.tolist()
    assert duck.pairs.doc_ids.tolist() == spark.pairs.doc_ids.tolist()
    assert np.array_equal(duck.pairs.query_index, spark.pairs.query_index)
    for name in ("pair", "rank", "impressions", "clicks"):
        assert np.array_equal(getattr(duck.cells, name), getattr(spark.cells, name)), f"cells.{name}"
    for name in ("pair", "rank", "prev_click", "impressions", "clicks"):
        assert np.array_equal(getattr(duck.ubm_cells, name), getattr(spark.ubm_cells, name)), f"ubm_cells.{name}"
    for name in ("query", "docs", "clicks", "weight"):
        assert np.array_equal(getattr(duck.patterns, name), getattr(spark.patterns, name)), f"patterns.{name}"
    assert duck.filters == spark.filters


@pytest.mark.parametrize("name", ["sample", "edge", "synthetic"])
def test_spark_gives_duckdbs_statistics(spark, folders: dict[str, Path], name: str) -> None:  # type: ignore[no-untyped-def]
    from ubi_pipeline.processors.clicks.spark_sessions import spark_sessions

    # The Spark engine applies the configured ordinal bases only; DuckDB's per-application auto-detection
    # (processors/clicks/ordinal_base.py) landed beside it and is not on Spark yet, so both read with detection off.
    settings = Settings(position_base_auto=False)
    duck = load_sessions(open_parquet_reader(folders[name]), settings)
    _same(duck, spark_sessions(spark, folders[name], settings))
    assert duck.filters.sessions > 0 and len(duck.cells.pair) > 0


def test_edge_folder_exercises_the_rules(folders: dict[str, Path]) -> None:
    """The edge folder is worth comparing on: DuckDB finds each rule at work in it (counts by hand above)."""
    d = load_sessions(open_parquet_reader(folders["edge"]))
    f, q = d.filters, d.quality
    assert (f.bot_clients, f.bot_searches, f.click_all_searches, f.empty_query_searches) == (1, 61, 1, 1)
    assert f.clicks_without_search == 1
    assert q.searches_ranked_by_impressions == 3  # ord, arr, sub
    assert q.duplicate_impressions == 1 and q.impression_rank_collisions == 1  # x twice; z on y's rank
    assert q.impressions_outside_ranking == 1  # zz
    # placed: s at its free rank 6, h2 (not impressed) at rank 2; dropped: t, whose rank 2 q holds
    assert (q.clicks_placed_by_ordinal, q.clicks_on_undisplayed) == (2, 1)
    assert q.repeat_clicks == 1  # p clicked twice


def test_settings_reach_spark(spark, folders: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    from ubi_pipeline.processors.clicks.spark_sessions import spark_sessions

    relaxed = Settings(max_client_queries_per_minute=1000, filter_click_all=False, max_rank=1)
    duck = load_sessions(open_parquet_reader(folders["edge"]), relaxed)
    s = spark_sessions(spark, folders["edge"], relaxed)
    _same(duck, s)
    assert s.filters.bot_searches == 0 and s.cells.rank.max() == 1
