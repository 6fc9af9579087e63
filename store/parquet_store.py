"""The Parquet store: a folder the loaders append to, and DuckDB views that read it like the DuckDB store.

Layout (one sub-folder per table, one per topic partition inside it)::

    DIR/ubi_queries/ubi.queries.3/part-00000000000000001200-00000000000000001399-<id>.parquet
    DIR/ubi_events/ubi.events.0/part-...parquet
    DIR/failed_records/ubi.events.0/part-...parquet

Each consumed partition has its own writer, and a group gives each partition to one consumer, so several
``ubi consume --parquet DIR`` processes write side by side without coordination; file names carry the
offset range and a random id, so even two writers briefly owning one partition during a rebalance never
overwrite each other. A file is written to a temporary name, fsync'd and renamed, so readers (and a
restarted loader) only ever see whole files.

Files are an append-only log: a record delivered twice (a batch re-delivered after a crash, a spool replayed
after a timeout) is in two files. The views of :func:`open_parquet_reader` apply the store's dedup keys,
so what processors read is exactly-once: per ``query_key`` and per ``event_key`` the first one (earliest
``received_at``, then partition and offset), the others with different content (a different
``content_hash``; for events :func:`ubi_pipeline.store.rows.event_content_hash`) shown as ``conflict`` rows in
``failed_records``, as the DuckDB store keeps them.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from duckdb import sqltypes

from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.store.files import fsync_dir
from ubi_pipeline.store.rows import EVENT_CONTENT_COLUMNS, event_content_digest

TABLE_DIRS = ("ubi_queries", "ubi_events", "failed_records")
#: Where a row came from (partition, offset, line in the message); kept in the Parquet files of
#: ubi_queries and ubi_events, not shown by the views.
ORIGIN = pa.schema([("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()), ("kafka_line", pa.int32())])


class PartitionWriter:
    """Writes the rows of one topic partition as durable Parquet files."""

    def __init__(self, root: Path, topic: str, partition: int) -> None:
        self.root, self.topic, self.partition = root, topic, partition
        self.files = 0

    def write(self, table_dir: str, rows: pa.Table, first: int, last: int) -> Path:
        folder = self.root / table_dir / f"{self.topic}.{self.partition}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{first:020d}-{last:020d}-{uuid.uuid4().hex[:12]}.parquet"
        tmp = folder / f".{name}.tmp"
        pq.write_table(rows, tmp, compression="zstd")
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        final = folder / name
        os.replace(tmp, final)
        fsync_dir(folder)
        self.files += 1
        return final


# ---------------------------------------------------------------- reading


def glob_literal(path: str) -> str:
    """``path`` with DuckDB's glob characters taken literally (``[`` → ``[[]``, ``*`` → ``[*]``, ``?`` → ``[?]``):
    a store folder named ``pq[12]`` must not read its sibling ``pq1``."""
    return path.replace("[", "[[]").replace("*", "[*]").replace("?", "[?]")


def _glob(root: Path, table_dir: str) -> str | None:
    if not any((root / table_dir).glob("*/*.parquet")):  # pathlib reads only the pattern as a glob, not root
        return None
    return (glob_literal(str(root / table_dir)) + "/*/*.parquet").replace("'", "''")


def _cols(names: tuple[str, ...], alias: str = "") -> str:
    return ", ".join(f"{alias}{c}" for c in names)


def open_parquet_reader(root: Path | str) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection whose ``ubi_queries``, ``ubi_events`` and ``failed_records`` read the folder.

    The views deduplicate as the DuckDB store does (see the module docstring); tables with no file yet are
    empty. ``judgments``, ``judgment_runs`` and ``human_judgments`` exist empty (derived tables live in a DuckDB store).
    """
    path = Path(root)
    if not (path / "ubi_events").is_dir() and not (path / "ubi_queries").is_dir():
        raise StoreError(f"{path}: not a Parquet store (no ubi_queries/ or ubi_events/ folder); load one with "
                         "`ubi consume --parquet DIR`")
    con = duckdb.connect()
    q_glob, e_glob, f_glob = (_glob(path, d) for d in TABLE_DIRS)
    for ddl in (tables.JUDGMENTS, tables.JUDGMENT_RUNS, tables.HUMAN_JUDGMENTS):
        con.execute(ddl)
    read = "read_parquet('{}', union_by_name = true)"
    if e_glob is None:
        con.execute(tables.UBI_EVENTS)
        con.execute("CREATE VIEW _event_conflicts AS SELECT *, NULL::VARCHAR AS _digest, NULL::INTEGER AS kafka_line, "
                    "NULL::INTEGER AS kafka_partition, NULL::BIGINT AS kafka_offset FROM ubi_events WHERE false")
    else:
        order = "ORDER BY received_at, kafka_partition, kafka_offset, kafka_line"
        con.execute(f"""CREATE VIEW ubi_events AS
            SELECT {_cols(tables.EVENT_COLUMNS)} FROM {read.format(e_glob)}
            QUALIFY row_number() OVER (PARTITION BY event_key {order}) = 1""")
        # Another event under a taken event_key, as the DuckDB store judges it (ubi_pipeline.store.duckdb_store): rows whose
        # content differs from the first one's, compared key-order free by the store's own digest (a Python
        # function, called only on rows whose values differ), one conflict row per distinct content.
        content = _cols(EVENT_CONTENT_COLUMNS)
        # The struct's type is the files' own (written from ubi_pipeline.store.rows.EVENT_SCHEMA): no second type list.
        content_type = con.sql(f"SELECT struct_pack({content}) FROM {read.format(e_glob)} LIMIT 0").types[0]
        _register_event_digest(con, content_type)
        con.execute(f"""CREATE VIEW _event_conflicts AS
            WITH versions AS (
                SELECT *, row_number() OVER w AS _rank,
                       struct_pack({content}) AS _content, first_value(struct_pack({content})) OVER w AS _winner
                FROM {read.format(e_glob)}
                WINDOW w AS (PARTITION BY event_key {order})
            ), differing AS (
                SELECT *, ubi_event_digest(_content) AS _digest, ubi_event_digest(_winner) AS _winner_digest
                FROM versions WHERE _rank > 1 AND _content IS DISTINCT FROM _winner
            )
            SELECT * EXCLUDE (_rank, _content, _winner, _winner_digest) FROM differing
            WHERE _digest <> _winner_digest
            QUALIFY row_number() OVER (PARTITION BY event_key, _digest {order}) = 1""")
    if q_glob is None:
        con.execute(tables.UBI_QUERIES)
        con.execute("CREATE VIEW _query_conflicts AS SELECT * FROM ubi_queries WHERE false")
    else:
        con.execute(f"""CREATE VIEW _query_versions AS
            SELECT *, row_number() OVER (PARTITION BY query_key
                                         ORDER BY received_at, kafka_partition, kafka_offset, kafka_line) AS _rank,
                   first_value(content_hash) OVER (PARTITION BY query_key
                                         ORDER BY received_at, kafka_partition, kafka_offset, kafka_line) AS _winner
            FROM {read.format(q_glob)}""")
        con.execute(f"CREATE VIEW ubi_queries AS SELECT {_cols(tables.QUERY_COLUMNS)} FROM _query_versions "
                    "WHERE _rank = 1")
        # Different content under a stored key: one conflict row per distinct conflicting content.
        con.execute("""CREATE VIEW _query_conflicts AS
            SELECT * EXCLUDE (_rank, _winner) FROM _query_versions WHERE content_hash <> _winner
            QUALIFY row_number() OVER (PARTITION BY query_key, content_hash
                                       ORDER BY received_at, kafka_partition, kafka_offset, kafka_line) = 1""")
    conflict_rows = f"""
        SELECT 'conflict:' || sha256(query_key || chr(31) || content_hash)[:32] AS failed_id, received_at,
               kafka_topic_name AS source, 'conflict' AS kind, kafka_line AS item_index, 'query_id' AS field,
               'query_key ' || query_key || ' is already stored with different content; first write wins, '
               || 'this record is kept as a conflict' AS reason,
               encode(to_json(c)::VARCHAR) AS raw, kafka_topic_name AS kafka_topic,
               kafka_partition, kafka_offset
        FROM (SELECT *, '{_topic_of(path)}' AS kafka_topic_name FROM _query_conflicts) c"""
    if q_glob is None:
        conflict_rows = f"SELECT {_cols(tables.FAILED_COLUMNS)} FROM failed_records_kept WHERE false"
    conflict_rows += f"""
        UNION ALL
        SELECT 'conflict:' || sha256(event_key || chr(31) || _digest)[:32] AS failed_id, received_at,
               '{_topic_of(path, "ubi_events")}' AS source, 'conflict' AS kind, kafka_line AS item_index,
               'event_id' AS field,
               'event_id ' || event_id || ' is already stored for an event with different content; first write '
               || 'wins, this event is kept as a conflict' AS reason,
               encode(to_json(c)::VARCHAR) AS raw, '{_topic_of(path, "ubi_events")}' AS kafka_topic,
               kafka_partition, kafka_offset
        FROM _event_conflicts c"""
    if f_glob is None:
        con.execute(tables.FAILED_TABLE.ddl("failed_records_kept"))
    else:
        con.execute(f"""CREATE VIEW failed_records_kept AS
            SELECT {_cols(tables.FAILED_COLUMNS)} FROM {read.format(f_glob)}
            QUALIFY row_number() OVER (PARTITION BY failed_id ORDER BY received_at) = 1""")
    con.execute(f"""CREATE VIEW failed_records AS
        SELECT {_cols(tables.FAILED_COLUMNS)} FROM failed_records_kept
        UNION ALL {conflict_rows}""")
    return con


def _register_event_digest(con: duckdb.DuckDBPyConnection, row_type: sqltypes.DuckDBPyType) -> None:
    """``ubi_event_digest(struct_pack(<EVENT_CONTENT_COLUMNS>))``: the DuckDB store's content digest in SQL."""
    def digest(row: dict[str, Any]) -> str:
        return event_content_digest([row[c] for c in EVENT_CONTENT_COLUMNS])

    con.create_function("ubi_event_digest", digest, [row_type], sqltypes.VARCHAR, side_effects=False)


def _topic_of(root: Path, table_dir: str = "ubi_queries") -> str:
    """The topic a Parquet store's table was loaded from (its sub-folder names say it)."""
    for p in sorted((root / table_dir).glob("*")):
        if p.is_dir():
            return p.name.rsplit(".", 1)[0].replace("'", "''")
    return ""


def is_parquet_store(path: Path | str) -> bool:
    """True when ``path`` is a folder written by ``ubi consume --parquet``."""
    p = Path(path)
    return p.is_dir() and ((p / "ubi_events").is_dir() or (p / "ubi_queries").is_dir())
