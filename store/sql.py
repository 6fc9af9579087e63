"""Quoting of SQL identifiers, for every module of the store that builds a statement from a name.

Names reach SQL only from the fixed declarations in :mod:`ubi_pipeline.schemas.tables` (or after a check against them, see
:func:`ubi_pipeline.store.duckdb_store.checked_columns`), and always quoted, so a name is never read as SQL.
"""

from __future__ import annotations


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (embedded double quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'
