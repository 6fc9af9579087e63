"""Synthetic UBI logs of any size, made in DuckDB SQL, for scale benches (bench/scale.py) and tests.

Shape, close to what ``ubi simulate`` and real shops produce (about 12 events per search): one query record per
search with 20 hit ids (two rankers order the same candidates differently), 10 ``impression`` events at
0-based ordinals, position-biased ``click`` events (examination 1/k times a per-doc attractiveness), and an
``add_to_cart`` after about one click in three. Ids look like the reference client's (UUIDs), so strings
weigh what they weigh in production. Deterministic for a seed (draws are hashes, not ``random()``, whose
sequence depends on DuckDB's threads).

Two outputs: a DuckDB store (stored-shape rows, as ``ubi serve`` writes them) and UBI files to import
(NDJSON, a JSON array, or an OpenSearch ``_bulk`` export, optionally gzip-compressed), both from the same rows.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from ubi_pipeline.schemas import tables
from ubi_pipeline.store.keys import KeyIndex

EVENTS_PER_SEARCH = 12.0  # about: 10 impressions, 1.5 clicks, 0.5 add_to_cart


def _literal(path: Path) -> str:
    """``path`` as a quoted SQL string literal (embedded quotes doubled): output paths come from the caller."""
    return "'" + str(path).replace("'", "''") + "'"


def searches_for(events: int) -> int:
    return max(1, round(events / EVENTS_PER_SEARCH))


def _uuid(expr: str) -> str:
    """A UUID-shaped string from an md5 of ``expr`` (deterministic)."""
    h = f"md5({expr})"
    return (f"substr({h}, 1, 8) || '-' || substr({h}, 9, 4) || '-4' || substr({h}, 14, 3) || '-a' || "
            f"substr({h}, 18, 3) || '-' || substr({h}, 21, 12)")


def build_rows(con: duckdb.DuckDBPyConnection, events: int, *, seed: int = 0, queries: int | None = None,
               part: tuple[int, int] | None = None) -> None:
    """Temp tables ``gen_queries`` and ``gen_events`` on ``con`` in the stored shape, about ``events`` events.

    ``part`` ``(first, stop)``: only searches ``first <= i < stop`` of the log (and their events), for writing a
    large log in pieces; the pieces of a log together are exactly its rows (every draw is a hash of ``i``).
    """
    s, seed = searches_for(events), int(seed)  # only integers reach the SQL below
    first, stop = (0, s) if part is None else (int(part[0]), int(part[1]))
    nq = int(queries or max(200, s // 40))
    clients = max(1, s // 5)
    con.execute("SET enable_progress_bar = false")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE gen_queries AS
        SELECT {_uuid("'q' || i || '/' || " + str(seed))} AS query_id,
               'query ' || ((i * 7919) % {nq}) AS user_query,
               'client-' || (i % {clients}) AS client_id,
               'shop' AS application,
               TIMESTAMP '2025-01-01' + to_seconds(i * 3) AS timestamp,
               '{{"ranker": "r' || (i % 2) || '"}}' AS query_attributes,
               'sku' AS object_id_field,
               list_transform(range(20), lambda j: 'sku-' || (((i * 7919) % {nq}) * 20
                              + (CASE WHEN i % 2 = 0 THEN j ELSE (j * 7) % 20 END))) AS query_response_hit_ids,
               i
        FROM range({first}, {stop}) t(i)""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE gen_events AS
        WITH imp AS (
            SELECT q.query_id, q.client_id, q.timestamp, q.i, j AS ordinal, q.query_response_hit_ids[j + 1] AS object_id,
                   (hash(q.i, j, {seed}) % 1000003) / 1000003.0 AS u,
                   (hash(q.i, j, {seed}, 'cart') % 1000003) / 1000003.0 AS u2
            FROM gen_queries q, range(10) r(j)
        ), ev AS (
            SELECT query_id, client_id, 'impression' AS action_name, timestamp + to_milliseconds(100 + ordinal) AS ts,
                   object_id, ordinal, i, 0 AS kind FROM imp
            UNION ALL
            SELECT query_id, client_id, 'click', timestamp + to_milliseconds(2000 + 100 * ordinal), object_id, ordinal, i, 1
            FROM imp WHERE u < (1.0 / (ordinal + 1)) * (0.15 + 0.8 * ((hash(object_id) % 100) / 100.0))
            UNION ALL
            SELECT query_id, client_id, 'add_to_cart', timestamp + to_milliseconds(9000 + 100 * ordinal), object_id,
                   ordinal, i, 2
            FROM imp WHERE u < (1.0 / (ordinal + 1)) * (0.15 + 0.8 * ((hash(object_id) % 100) / 100.0)) AND u2 < 0.35
        )
        SELECT {_uuid("query_id || action_name || ordinal")} AS event_id, action_name, query_id,
               'session-' || (i // 3) AS session_id, client_id, 'shop' AS application, ts AS timestamp,
               object_id, 'sku' AS object_id_field, ordinal AS position_ordinal
        FROM ev""")


#: searches generated and inserted at a time by ``write_store`` (about 6M events: a few GB of DuckDB memory)
STORE_CHUNK_SEARCHES = 500_000


def write_store(db: Path, events: int, *, seed: int = 0, chunk: int = STORE_CHUNK_SEARCHES) -> tuple[int, int]:
    """A DuckDB store at ``db`` holding the generated rows; returns (query records, events).

    The rows go straight into the store's tables with ``INSERT ... SELECT``, without the collector's validation
    (they are made in the stored shape), ``chunk`` searches at a time so that generating 50M events does not
    hold them all in memory at once. The key tables are filled at the end (``ubi_pipeline.store.keys.KeyIndex.open``), so the
    store is what an import or a collector leaves: a bench's first writer (``ubi process`` storing judgments)
    does not pay the one-time fill of every key row (51 s of its 282 s at 50M events).
    """
    con = duckdb.connect(str(db))
    try:
        for ddl in tables.ALL_TABLES:
            con.execute(ddl)
        total, step = searches_for(events), max(1, int(chunk))
        for first in range(0, total, step):
            _insert_part(con, events, seed, (first, min(total, first + step)))
        for keyed in (tables.QUERY_TABLE, tables.EVENT_TABLE):
            KeyIndex(keyed).open(con)
        ((nq, ne),) = con.execute(
            "SELECT (SELECT count(*) FROM ubi_queries), (SELECT count(*) FROM ubi_events)").fetchall()
    finally:
        con.close()
    return int(nq), int(ne)


def _insert_part(con: duckdb.DuckDBPyConnection, events: int, seed: int, part: tuple[int, int]) -> None:
    build_rows(con, events, seed=seed, part=part)
    con.execute("""
            INSERT INTO ubi_queries
            SELECT query_id || chr(31), query_id, user_query, client_id, application, timestamp, query_attributes,
                   object_id_field, NULL, query_response_hit_ids, NULL, md5(query_id), timestamp
            FROM gen_queries""")
    con.execute("""
            INSERT INTO ubi_events (event_key, event_id, action_name, query_id, session_id, client_id, application,
                                    timestamp, object_id, object_id_field, position_ordinal, event_attributes,
                                    received_at)
            SELECT event_id, event_id, action_name, query_id, session_id, client_id, application, timestamp,
                   object_id, object_id_field, position_ordinal,
                   '{"position": {"ordinal": ' || position_ordinal || '}}', timestamp
            FROM gen_events""")
    con.execute("DROP TABLE gen_queries")
    con.execute("DROP TABLE gen_events")


_TS = "strftime({}, '%Y-%m-%dT%H:%M:%S.%gZ')"
_QUERY_COLS = f"""query_id, user_query, client_id, application, {_TS.format('timestamp')} AS timestamp,
    query_attributes::JSON AS query_attributes, object_id_field, query_response_hit_ids"""
_EVENT_COLS = f"""event_id, action_name, query_id, session_id, client_id, application,
    {_TS.format('timestamp')} AS timestamp, 'INFO' AS message_type,
    {{'object': {{'object_id': object_id, 'object_id_field': object_id_field}},
     'position': {{'ordinal': position_ordinal}}}} AS event_attributes"""


def write_files(out: Path, events: int, *, fmt: str = "ndjson", seed: int = 0, gzip: bool = False) -> list[Path]:
    """UBI files for ``ubi import`` under folder ``out``: one with the query records, one with the events.

    ``fmt``: ``ndjson`` (one record a line), ``array`` (one JSON array per file) or ``bulk`` (one OpenSearch
    ``_bulk`` file with both indexes, ``_id`` = the record's id, as an export carries it).
    """
    if fmt not in ("ndjson", "array", "bulk"):
        raise ValueError(f"unknown format {fmt!r}; expected ndjson, array or bulk")
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    try:
        build_rows(con, events, seed=seed)
        con.execute(f"CREATE TEMP TABLE qj AS SELECT i AS n, {_QUERY_COLS} FROM gen_queries")
        con.execute(f"CREATE TEMP TABLE ej AS SELECT row_number() OVER () AS n, {_EVENT_COLS} FROM gen_events")
        ext = {"ndjson": ".ndjson", "array": ".json", "bulk": ".bulk.ndjson"}[fmt] + (".gz" if gzip else "")
        comp = "gzip" if gzip else "none"
        if fmt == "bulk":
            path = out / f"ubi{ext}"
            # one VARCHAR column written as CSV without quoting: each value is one line of JSON
            con.execute(f"""
                COPY (
                    SELECT line FROM (
                        SELECT 0 AS t, n, 0 AS part,
                               json_object('index', json_object('_index', 'ubi_queries', '_id', query_id))::VARCHAR AS line
                        FROM qj
                        UNION ALL SELECT 0, n, 1, json_merge_patch(to_json(qj), '{{"n": null}}')::VARCHAR FROM qj
                        UNION ALL
                        SELECT 1, n, 0, json_object('index', json_object('_index', 'ubi_events', '_id', event_id))::VARCHAR
                        FROM ej
                        UNION ALL SELECT 1, n, 1, json_merge_patch(to_json(ej), '{{"n": null}}')::VARCHAR FROM ej
                    ) ORDER BY t, n, part
                ) TO {_literal(path)} (FORMAT csv, HEADER false, QUOTE '', ESCAPE '', DELIMITER '\x01', COMPRESSION {comp})""")
            return [path]
        files = []
        for name, view in (("queries", "qj"), ("events", "ej")):
            path = out / f"ubi_{name}{ext}"
            array = "true" if fmt == "array" else "false"
            con.execute(f"COPY (SELECT * EXCLUDE (n) FROM {view} ORDER BY n) TO {_literal(path)} "
                        f"(FORMAT json, ARRAY {array}, COMPRESSION {comp})")
            files.append(path)
        return files
    finally:
        con.close()


def write_parquet(root: Path, events: int, *, seed: int = 0, redeliver: float = 0.05) -> tuple[int, int]:
    """A Parquet folder of about ``events`` generated events (see :func:`store_to_parquet`).

    Returns the distinct (query records, events): what a reader that deduplicates must find.
    """
    db = root.with_suffix(".gen.duckdb")
    try:
        counts = write_store(db, events, seed=seed)
        store_to_parquet(db, root, redeliver=redeliver)
    finally:
        db.unlink(missing_ok=True)
    return counts


def store_to_parquet(db: Path, root: Path, *, redeliver: float = 0.05) -> None:
    """The UBI tables of the DuckDB store ``db`` as a Parquet folder in the layout ``ubi consume --parquet``
    writes (one topic partition per table), with a share ``redeliver`` of the rows written again in a later
    file with a later ``received_at``, as a re-delivered Kafka batch is: readers must deduplicate them.
    """
    con = duckdb.connect(str(db), read_only=True)
    try:
        con.execute("SET enable_progress_bar = false")
        for table, topic in (("ubi_queries", "ubi.queries"), ("ubi_events", "ubi.events")):
            folder = root / table / f"{topic}.0"
            folder.mkdir(parents=True, exist_ok=True)
            key = "query_key" if table == "ubi_queries" else "event_key"
            # JSON columns as plain strings, as the Kafka loader writes them
            js = "query_attributes" if table == "ubi_queries" else "event_attributes"
            cols = f"* REPLACE ({js}::VARCHAR AS {js}, extra::VARCHAR AS extra)"
            origin = (f"0::INTEGER AS kafka_partition, (row_number() OVER (ORDER BY {key}))::BIGINT AS kafka_offset, "
                      "0::INTEGER AS kafka_line")
            first = folder / "part-00000000000000000000-00000000000000000000-first.parquet"
            again = folder / "part-00000000000000000001-00000000000000000001-again.parquet"
            con.execute(f"COPY (SELECT {cols}, {origin} FROM {table}) TO {_literal(first)} (FORMAT parquet)")
            con.execute(f"""COPY (SELECT * REPLACE (received_at + INTERVAL 1 HOUR AS received_at)
                                  FROM (SELECT {cols}, {origin} FROM {table})
                                  WHERE hash({key}) % 1000 < {int(redeliver * 1000)})
                            TO {_literal(again)} (FORMAT parquet)""")
    finally:
        con.close()
