"""The column lists of schemas.tables are the columns its DDL declares, in order (SQL identifiers are checked
against these lists, so a list that drifted from its table would refuse good loads or allow none)."""

from __future__ import annotations

import duckdb

from schemas import tables


def test_every_table_has_its_declared_columns_listed_in_order() -> None:
    con = duckdb.connect()
    for ddl in tables.ALL_TABLES:
        con.execute(ddl)
    created = {
        name: tuple(col for (col,) in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [name]
        ).fetchall())
        for (name,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()
    }
    assert created == tables.TABLE_COLUMNS
