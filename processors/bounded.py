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

from schemas.errors import UbiError
from schemas.settings import Settings


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
