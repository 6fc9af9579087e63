"""Readers run under Settings.memory_limit and spill to Settings.temp_directory (ubi_pipeline.store.bounded)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

from ubi_pipeline.processors.clicks.sessions import read_sessions
from ubi_pipeline.processors.simulation.bulk_log import write_store
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.bounded import LimitError, apply_limits


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("bounded") / "ubi.duckdb"
    nq, ne = write_store(db, 60_000, seed=3)
    # 60,000 / 12 searches; 10 impressions each plus clicks and carts (bulk_log's shape)
    assert nq == 5_000 and ne > 50_000
    return db


def test_settings_reach_duckdb(tmp_path: Path) -> None:
    con = duckdb.connect()
    apply_limits(con, Settings(memory_limit="64MB", temp_directory=tmp_path / "spill"))
    # DuckDB reports its limit in MiB: 64 MB = 61.0 MiB
    assert con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0] == "61.0 MiB"
    assert con.sql("SELECT current_setting('temp_directory')").fetchall()[0][0] == str(tmp_path / "spill")
    assert (tmp_path / "spill").is_dir()


def test_default_limit_is_one_gigabyte() -> None:
    con = duckdb.connect()
    apply_limits(con, Settings())
    assert con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0] == "953.6 MiB"  # 1 GB in MiB


def test_a_bad_limit_names_the_setting() -> None:
    with pytest.raises(LimitError, match=r"memory_limit 'lots' \(UBI_MEMORY_LIMIT\)"):
        apply_limits(duckdb.connect(), Settings(memory_limit="lots"))


def test_a_tight_limit_gives_the_same_statistics(store: Path, tmp_path: Path) -> None:
    """Under a tight limit (50 MB for 5,000 searches) the statistics do not change and no spill file stays."""
    free = read_sessions(store, Settings(memory_limit=""))
    spill = tmp_path / "spill"
    tight = read_sessions(store, Settings(memory_limit="50MB", temp_directory=spill))
    for name in ("pair", "rank", "impressions", "clicks"):
        assert np.array_equal(getattr(free.cells, name), getattr(tight.cells, name)), name
    assert np.array_equal(free.patterns.weight, tight.patterns.weight)
    assert np.array_equal(free.patterns.docs, tight.patterns.docs)
    assert free.filters == tight.filters and free.quality == tight.quality
    assert free.filters.sessions == 5_000 and free.filters.impressions == 50_000  # every search shows 10 results
    assert list(spill.iterdir()) == []  # DuckDB removed its spill files when the reader closed


def test_release_pool_gives_cached_blocks_back_and_keeps_the_limit(store: Path) -> None:
    """After a scan, DuckDB caches the blocks it read (up to memory_limit); release_pool evicts them and sets the
    limit back to the configured value, not to a rounded reading of it."""
    from ubi_pipeline.store.bounded import release_pool

    settings = Settings(db=store, memory_limit="256MB")
    con = duckdb.connect(str(store), read_only=True)
    apply_limits(con, settings)
    used = "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()"
    con.execute("SELECT count(DISTINCT event_key), max(object_id) FROM ubi_events").fetchall()
    before = con.sql(used).fetchall()[0][0]
    release_pool(con, settings)
    after = con.sql(used).fetchall()[0][0]
    assert before > 1_000_000 and after < before / 2  # most cached blocks of the scanned columns are gone
    assert con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0] == "244.1 MiB"  # 256 MB
    for _ in range(3):  # repeated calls do not drift
        release_pool(con, settings)
    assert con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0] == "244.1 MiB"
    con.close()
