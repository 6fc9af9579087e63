"""The column lists of ubi_pipeline.schemas.tables are the columns its DDL declares, in order (SQL identifiers are checked
against these lists, so a list that drifted from its table would refuse good loads or allow none)."""

from __future__ import annotations

import duckdb

from ubi_pipeline.schemas import tables


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


def test_the_not_null_columns_duckdb_creates_are_the_declared_required_ones() -> None:
    """``Table.required`` (what a Kafka row may not leave null, ``ubi_pipeline.transport.wire.REQUIRED``) is what DuckDB enforces."""
    con = duckdb.connect()
    for ddl in tables.ALL_TABLES:
        con.execute(ddl)
    for name, table in tables.TABLES.items():
        not_null = tuple(col for (col,) in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = ? AND NOT is_nullable ORDER BY column_index",
            [name]).fetchall())
        assert not_null == table.required, name
        (key,) = con.execute("SELECT constraint_column_names FROM duckdb_constraints() "
                             "WHERE table_name = ? AND constraint_type = 'PRIMARY KEY'", [name]).fetchone() or (None,)
        # A key kept by a key table (ubi_pipeline.store.keys) has no PRIMARY KEY: DuckDB would hold its index in memory.
        assert tuple(key or ()) == (() if table.key_table else table.key), name


def test_store_arrow_schemas_are_the_types_duckdb_reads_back() -> None:
    """The Arrow schemas of ``ubi_pipeline.store.rows`` (derived from the one declaration) are the types DuckDB itself hands
    back for each created table, JSON columns included (DuckDB exports them as strings)."""
    import pyarrow as pa

    from ubi_pipeline.store import rows

    def plain(t: pa.DataType) -> pa.DataType:  # DuckDB names a list's item field "l", pyarrow "item"
        return pa.list_(t.value_type) if pa.types.is_list(t) else t

    con = duckdb.connect()
    for ddl in tables.ALL_TABLES:
        con.execute(ddl)
    for name, table in tables.TABLES.items():
        got = con.sql(f'SELECT * FROM "{name}"').to_arrow_table().schema
        derived = rows.arrow_schema(table)
        assert derived.names == got.names, name
        assert [plain(f.type) for f in got] == list(derived.types), name
    # the schemas every writer uses are these derived ones
    assert rows.QUERY_SCHEMA == rows.arrow_schema(tables.QUERY_TABLE)
    assert rows.JUDGMENT_SCHEMA.field("grade").type == pa.int32()
    assert rows.HUMAN_JUDGMENT_SCHEMA.field("judged_at").type == pa.timestamp("us")
