"""Bounded memory for the readers: DuckDB's ``memory_limit`` and where it spills, from ``Settings``.

Every statistic the processors and reports need is computed inside DuckDB, and Python sees only aggregated
rows (cells, patterns, one row per system and query). What is left to bound is DuckDB itself: its hash
tables, sorts and temporary tables stay under ``Settings.memory_limit`` and spill to
``Settings.temp_directory`` (DuckDB's default when unset: ``<db>.tmp`` beside a store file, ``.tmp`` in the
working directory for an in-memory connection such as a Parquet folder's). DuckDB deletes its spill files when
the connection closes.
"""

from __future__ import annotations

import duckdb

from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.settings import Settings


class LimitError(UbiError):
    """A memory limit or temp directory DuckDB does not accept (names the setting and the value)."""


def apply_limits(con: duckdb.DuckDBPyConnection, settings: Settings) -> duckdb.DuckDBPyConnection:
    """Set ``memory_limit`` and ``temp_directory`` on ``con`` (each only when set); returns ``con``."""
    for name, value in (("memory_limit", settings.memory_limit), ("temp_directory", settings.temp_directory)):
        if value is None or value == "":
            continue
        if name == "temp_directory":
            try:
                settings.temp_directory.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
            except OSError as exc:
                raise LimitError(f"temp_directory {str(value)!r} (UBI_TEMP_DIRECTORY): cannot create it: "
                                 f"{exc.strerror or exc}") from exc
        try:
            con.execute(f"SET {name} = ?", [str(value)])
        except duckdb.Error as exc:
            raise LimitError(f"{name} {str(value)!r} (UBI_{name.upper()}): DuckDB refused it: {exc}") from exc
    return con


def release_pool(con: duckdb.DuckDBPyConnection, settings: Settings) -> None:
    """Hand DuckDB's cached buffers back to the system between a reader's SQL and its Python work.

    DuckDB keeps the blocks a query read or built in its buffer pool after the query ends, up to ``memory_limit``,
    for the next query to reuse. A reader that goes on holding the connection while it works in Python (the
    report: labels, fits, predictions) would carry that pool under everything it allocates: at 20M events the
    pool gave back 400-760 MB at each step of the report (``bench/memprobe.py``). Lowering the limit makes DuckDB
    evict every unpinned block; the limit is then set back to ``Settings.memory_limit`` (or, when that is unset,
    to the value read before). Call it where no large temp table is live: evicting one would write it to
    ``temp_directory`` and read it back. Eviction DuckDB cannot complete is not an error: the limit is set back
    and the reader goes on as before.
    """
    restore = settings.memory_limit or con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    try:
        con.execute("SET memory_limit = '1MB'")
    except duckdb.Error:
        pass  # pinned buffers: nothing to give back now
    finally:
        con.execute("SET memory_limit = ?", [str(restore)])
