"""The Parquet store's reader reads its own folder only, whatever characters the folder's name holds."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from ubi_pipeline.store.parquet_store import glob_literal


def test_a_store_folder_with_glob_characters_reads_only_itself(tmp_path: Path) -> None:
    # issue 25: a store at "pq[12]" read its sibling "pq1" (DuckDB took "[12]" for a character class)
    for name, x in (("pq[12]", 1), ("pq1", 2), ("pq*?", 3)):
        folder = tmp_path / name / "ubi_queries" / "topic.0"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"x": [x]}), folder / "part.parquet")

    def read(name: str, literal: bool) -> list[tuple[int]]:
        root = str(tmp_path / name / "ubi_queries")
        pattern = (glob_literal(root) if literal else root) + "/*/*.parquet"
        return sorted(duckdb.sql(f"SELECT x FROM read_parquet('{pattern}')").fetchall())

    assert read("pq[12]", literal=False) == [(2,)]  # the bug, as DuckDB reads an unescaped name
    assert read("pq[12]", literal=True) == [(1,)]
    assert read("pq*?", literal=True) == [(3,)]
