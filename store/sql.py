"""Quoting of SQL identifiers and string lists, for every module that builds a statement from a name or a value.

Names reach SQL only from the fixed declarations in :mod:`ubi_pipeline.schemas.tables` (or after a check against them, see
:func:`checked_columns`), and always quoted, so a name is never read as SQL.
"""

from __future__ import annotations

from collections.abc import Sequence

from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.errors import StoreError


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (embedded double quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def sql_string_list(values: Sequence[str]) -> str:
    """``values`` as the items of a SQL list of string literals (quotes doubled): ``'a', 'b''s'``."""
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def checked_columns(table: str, names: Sequence[str]) -> str:
    """``names`` quoted and joined, after checking each is a declared column of ``table`` (ubi_pipeline.schemas.tables).

    Raises :class:`StoreError` naming the table or the first column that is not declared, so nothing taken
    from a request or a file reaches SQL unless it is on the fixed list.
    """
    declared = tables.TABLE_COLUMNS.get(table)
    if declared is None:
        raise StoreError(f"unknown table {table!r}; expected one of {', '.join(tables.TABLE_COLUMNS)}")
    unknown = [n for n in names if n not in declared]
    if unknown:
        raise StoreError(
            f"table {table} has no column {unknown[0]!r}; its columns are {', '.join(declared)}"
        )
    if len(set(names)) != len(names):
        raise StoreError(f"columns for table {table} are given more than once: {', '.join(names)}")
    return ", ".join(quote_ident(n) for n in names)
