"""Storage tables: the canonical stored shape of UBI records and of everything derived from them.

Each table is declared once, as a :class:`Table` of :class:`Column` (name, DuckDB type, NOT NULL, note);
everything else is derived from that declaration: the DDL the DuckDB store and the Parquet views run, the
column lists SQL identifiers are checked against, the Arrow schemas of ``ubi_pipeline.store.rows`` (by
:data:`ARROW_TYPE_NAMES`), and the columns a Kafka row may not leave null (``ubi_pipeline.transport.wire.REQUIRED``). So the
collector, the Kafka loader, the processors and the reports agree on names and types. JSON columns hold the
original objects (``event_attributes``, extra keys) so nothing a client sent is lost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """One stored column: its name, DuckDB type, whether it may be NULL, and a note for the DDL."""

    name: str
    sql: str
    not_null: bool = False
    note: str = ""


@dataclass(frozen=True)
class Table:
    """One stored table: its columns in order and its primary key.

    ``key_table``: the key is unique, but kept so by the store against that table of 64-bit key hashes
    (``ubi_pipeline.store.keys``) instead of a DuckDB PRIMARY KEY, whose index DuckDB holds in memory whole (about 125
    bytes per stored event: 2.5 GB at 20M events); the key columns are then NOT NULL without an index.
    """

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    key_table: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in order."""
        return tuple(c.name for c in self.columns)

    @property
    def required(self) -> tuple[str, ...]:
        """The columns that may not be NULL (declared NOT NULL, or part of the primary key), in order."""
        return tuple(c.name for c in self.columns if c.not_null or c.name in self.key)

    def ddl(self, name: str | None = None) -> str:
        """``CREATE TABLE IF NOT EXISTS`` for this table (under ``name`` if given: a same-shaped copy)."""
        indexed = () if self.key_table else self.key
        single = indexed if len(indexed) == 1 else ()
        defs = []
        for c in self.columns:
            required = c.not_null or c.name in self.key
            constraint = " PRIMARY KEY" if c.name in single else " NOT NULL" if required else ""
            defs.append(f"{c.name} {c.sql}{constraint}")
        if len(indexed) > 1:
            defs.append(f"PRIMARY KEY ({', '.join(self.key)})")
        return f"CREATE TABLE IF NOT EXISTS {name or self.name} (\n    " + ",\n    ".join(defs) + "\n)"


def _c(name: str, sql: str = "VARCHAR", not_null: bool = False, note: str = "") -> Column:
    return Column(name, sql, not_null, note)


#: Query records. Identity is ``query_key`` (``query_id`` + ``query_response_id``, see ``ubi_pipeline.schemas.ubi.query_key``).
QUERY_TABLE = Table("ubi_queries", (
    _c("query_key"),
    _c("query_id", not_null=True),
    _c("user_query", not_null=True),
    _c("client_id"),
    _c("application"),
    _c("timestamp", "TIMESTAMP", note="UTC; NULL when the client sent none"),
    _c("query_attributes", "JSON"),
    _c("object_id_field"),
    _c("query_response_id"),
    _c("query_response_hit_ids", "VARCHAR[]"),
    _c("extra", "JSON", note="top-level keys outside the schema"),
    _c("content_hash", not_null=True,
       note="tells a retry (same hash) from a conflict (different record, same key)"),
    _c("received_at", "TIMESTAMP", not_null=True),
), key=("query_key",), key_table="ubi_query_keys")

#: Events. Identity is ``event_key`` (client ``event_id`` or canonical hash, see ``ubi_pipeline.schemas.ubi.event_key``).
EVENT_TABLE = Table("ubi_events", (
    _c("event_key"),
    _c("event_id"),
    _c("action_name", not_null=True),
    _c("query_id"),
    _c("session_id"),
    _c("client_id"),
    _c("user_id"),
    _c("application"),
    _c("timestamp", "TIMESTAMP", not_null=True, note="UTC"),
    _c("message_type"),
    _c("message"),
    _c("user_query"),
    _c("object_id"),
    _c("object_id_field"),
    _c("object_id_type"),
    _c("internal_id"),
    _c("position_ordinal", "INTEGER", note="as sent (0- or 1-based: see Settings.position_base)"),
    _c("position_x", "DOUBLE"),
    _c("position_y", "DOUBLE"),
    _c("event_attributes", "JSON"),
    _c("extra", "JSON"),
    _c("received_at", "TIMESTAMP", not_null=True),
), key=("event_key",), key_table="ubi_event_keys")

#: Everything the collector or a loader would not store, with why, so nothing is lost.
FAILED_TABLE = Table("failed_records", (
    _c("failed_id"),
    _c("received_at", "TIMESTAMP", not_null=True),
    _c("source", not_null=True, note="route, file path, or kafka topic"),
    _c("kind", not_null=True, note="query | event | body | conflict | forbidden | ..."),
    _c("item_index", "INTEGER", note="index of the item in its batch (NULL for a whole body)"),
    _c("field"),
    _c("reason", not_null=True),
    _c("raw", "BLOB", note="the bytes as received"),
    _c("kafka_topic"),
    _c("kafka_partition", "INTEGER"),
    _c("kafka_offset", "BIGINT"),
), key=("failed_id",))

#: Candidate (implicit) judgments from a processor. Never mixed with human ones: ``source`` says which model.
#: ``parameters`` holds what is the pair's own (``observations``, ``calibration_split``); what every row of a run
#: shares (the model's fit, grade mapping, limits, identifiability, selection) is stored once, in
#: ``judgment_runs``, under ``run_id``. Rows written before that split have ``run_id`` NULL and their whole
#: document in ``parameters``; ``ubi_pipeline.store.judgment_params`` reads both shapes into the same dict.
JUDGMENT_TABLE = Table("judgments", (
    _c("query", not_null=True, note="normalised query text (NFKC, case-folded, whitespace collapsed)"),
    _c("doc_id", not_null=True),
    _c("source", not_null=True, note="implicit:<model>"),
    _c("model_version"),
    _c("parameters", "JSON"),
    _c("score", "DOUBLE"),
    _c("ci_low", "DOUBLE"),
    _c("ci_high", "DOUBLE"),
    _c("impressions", "BIGINT"),
    _c("clicks", "BIGINT"),
    _c("sessions", "BIGINT"),
    _c("grade", "INTEGER",
       note="on the human scale, or NULL (too little support / too wide an interval)"),
    _c("created_at", "TIMESTAMP", not_null=True),
    # last: stores made before it get it by ALTER TABLE ... ADD COLUMN, which appends (ubi_pipeline.store.duckdb_store)
    _c("run_id", note="the judgment_runs row (same source) with the run-wide parameters; NULL: parameters is whole"),
), key=("query", "doc_id", "source"))

#: The run-wide part of the judgments' parameters, once per (source, run). ``run_id`` is a digest of the
#: document (``ubi_pipeline.store.judgment_params.run_id``), so writing the same run twice stores one row.
JUDGMENT_RUN_TABLE = Table("judgment_runs", (
    _c("source", not_null=True, note="implicit:<model>, as the rows of the run"),
    _c("run_id", not_null=True),
    _c("parameters", "JSON", not_null=True, note="model fit, grade mapping, limits, identifiability, selection"),
    _c("created_at", "TIMESTAMP", not_null=True),
), key=("source", "run_id"))

#: Human judgments (and reviewed implicit ones) imported from qrels files or the review round trip.
HUMAN_JUDGMENT_TABLE = Table("human_judgments", (
    _c("query_id"),
    _c("query", not_null=True, note="normalised query text"),
    _c("doc_id", not_null=True),
    _c("grade", "INTEGER", not_null=True),
    _c("source", not_null=True, note="human | reviewed:<implicit source>"),
    _c("assessor"),
    _c("judged_at", "TIMESTAMP"),
    _c("rubric"),
    _c("origin", note="file it came from"),
), key=("query", "doc_id", "source"))


def _key_table(of: Table) -> Table:
    """The key table of ``of``: one row per stored row, the key's hash and the stored row's ``rowid``."""
    return Table(of.key_table or "", (
        _c("key_hash", "UBIGINT", not_null=True, note=f"md5_number_lower({of.key[0]})"),
        _c("row_id", "BIGINT", not_null=True, note=f"rowid of the row in {of.name}"),
    ), key=())


#: The stores' own dedup tables of ``ubi_queries`` and ``ubi_events`` (``ubi_pipeline.store.keys``): not UBI data.
QUERY_KEY_TABLE = _key_table(QUERY_TABLE)
EVENT_KEY_TABLE = _key_table(EVENT_TABLE)

#: Every stored table, by name.
TABLES: dict[str, Table] = {
    t.name: t for t in (QUERY_TABLE, EVENT_TABLE, FAILED_TABLE, JUDGMENT_TABLE, JUDGMENT_RUN_TABLE,
                        HUMAN_JUDGMENT_TABLE, QUERY_KEY_TABLE, EVENT_KEY_TABLE)
}

UBI_QUERIES = QUERY_TABLE.ddl()
UBI_EVENTS = EVENT_TABLE.ddl()
FAILED_RECORDS = FAILED_TABLE.ddl()
JUDGMENTS = JUDGMENT_TABLE.ddl()
JUDGMENT_RUNS = JUDGMENT_RUN_TABLE.ddl()
HUMAN_JUDGMENTS = HUMAN_JUDGMENT_TABLE.ddl()
ALL_TABLES = tuple(t.ddl() for t in TABLES.values())

QUERY_COLUMNS = QUERY_TABLE.names
EVENT_COLUMNS = EVENT_TABLE.names
FAILED_COLUMNS = FAILED_TABLE.names
JUDGMENT_COLUMNS = JUDGMENT_TABLE.names
JUDGMENT_RUN_COLUMNS = JUDGMENT_RUN_TABLE.names
HUMAN_JUDGMENT_COLUMNS = HUMAN_JUDGMENT_TABLE.names

#: The declared columns of every table, by table name: the one list SQL identifiers are checked against.
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {name: t.names for name, t in TABLES.items()}
