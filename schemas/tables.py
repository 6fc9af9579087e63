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
    #: Longest value a writer stores: characters of a VARCHAR, of each item of a VARCHAR[], UTF-8 bytes of a
    #: JSON text; None: no limit of its own. The collector's models enforce the same limits
    #: (``ubi_pipeline.schemas.ubi``); the Kafka loader checks rows against these (``ubi_pipeline.loader.decode``).
    max_length: int | None = None


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


def _c(name: str, sql: str = "VARCHAR", not_null: bool = False, note: str = "", *,
       max_length: int | None = None) -> Column:
    return Column(name, sql, not_null, note, max_length)


#: The record limits of ``ubi_pipeline.schemas.ubi`` as the stored columns hold them (repeated here because
#: ``tables`` imports nothing of ours; tests/store/test_limits.py checks they agree).
_NAME = 100  # ids and names (UBI 1.3.0's maxLength)
_OBJECT_ID = 256  # object and hit ids (ours)
_USER_QUERY = 2048  # USER_QUERY_MAX_LENGTH
_JSON = 8192  # JSON_FIELD_MAX_LENGTH, UTF-8 bytes
_KEY = 2 * _NAME + 1  # query_id, the unit separator, query_response_id
_HASH = 32


#: Query records. Identity is ``query_key`` (``query_id`` + ``query_response_id``, see ``ubi_pipeline.schemas.ubi.query_key``).
QUERY_TABLE = Table("ubi_queries", (
    _c("query_key", max_length=_KEY),
    _c("query_id", not_null=True, max_length=_NAME),
    _c("user_query", not_null=True, max_length=_USER_QUERY),
    _c("client_id", max_length=_NAME),
    _c("application", max_length=_NAME),
    _c("timestamp", "TIMESTAMP", note="UTC; NULL when the client sent none"),
    _c("query_attributes", "JSON", max_length=_JSON),
    _c("object_id_field", max_length=_NAME),
    _c("query_response_id", max_length=_NAME),
    _c("query_response_hit_ids", "VARCHAR[]", max_length=_OBJECT_ID),
    _c("extra", "JSON", note="top-level keys outside the schema", max_length=_JSON),
    _c("content_hash", not_null=True, max_length=_HASH,
       note="tells a retry (same hash) from a conflict (different record, same key)"),
    _c("received_at", "TIMESTAMP", not_null=True),
), key=("query_key",), key_table="ubi_query_keys")

#: Events. Identity is ``event_key`` (client ``event_id`` or canonical hash, see ``ubi_pipeline.schemas.ubi.event_key``).
EVENT_TABLE = Table("ubi_events", (
    _c("event_key", max_length=3 + _NAME),  # "id:" + event_id, or "h:" + a hash
    _c("event_id", max_length=_NAME),
    _c("action_name", not_null=True, max_length=_NAME),
    _c("query_id", max_length=_NAME),
    _c("session_id", max_length=_NAME),
    _c("client_id", max_length=_NAME),
    _c("user_id", max_length=_NAME),
    _c("application", max_length=_NAME),
    _c("timestamp", "TIMESTAMP", not_null=True, note="UTC"),
    _c("message_type", max_length=_NAME),
    _c("message", max_length=1024),
    _c("user_query", max_length=_USER_QUERY),
    _c("object_id", max_length=_OBJECT_ID),
    _c("object_id_field", max_length=_NAME),
    _c("object_id_type", max_length=_NAME),
    _c("internal_id", max_length=_OBJECT_ID),
    _c("position_ordinal", "INTEGER", note="as sent (0- or 1-based: see Settings.position_base)"),
    _c("position_x", "DOUBLE"),
    _c("position_y", "DOUBLE"),
    _c("event_attributes", "JSON", max_length=_JSON),
    _c("extra", "JSON", max_length=_JSON),
    _c("received_at", "TIMESTAMP", not_null=True),
), key=("event_key",), key_table="ubi_event_keys")

#: Longest ``raw`` kept in a ``failed_records`` row, in bytes. A refused body or item longer than this is kept
#: truncated to its first ``FAILED_RAW_MAX_BYTES``, and its full length and SHA-256 are appended to ``reason``
#: (``ubi_pipeline.store.rows.failed_row``): whole bodies of up to ``max_body_bytes`` (5 MiB) each made DuckDB's
#: checkpoint fail under the writer's memory limit after about fifty of them (the same bound as every stored
#: string, ``ubi_pipeline.schemas.ubi.STORED_STRING_MAX_BYTES``).
FAILED_RAW_MAX_BYTES = 8 * 1024
#: Longest ``reason`` and ``field`` kept in a ``failed_records`` row, in characters (longer ones are cut).
FAILED_TEXT_MAX_LENGTH = 2048

#: Everything the collector or a loader would not store, with why, so nothing is lost.
FAILED_TABLE = Table("failed_records", (
    _c("failed_id", max_length=_NAME),
    _c("received_at", "TIMESTAMP", not_null=True),
    _c("source", not_null=True, note="route, file path, or kafka topic", max_length=FAILED_TEXT_MAX_LENGTH),
    _c("kind", not_null=True, note="query | event | body | conflict | forbidden | ...", max_length=_NAME),
    _c("item_index", "INTEGER", note="index of the item in its batch (NULL for a whole body)"),
    _c("field"),
    _c("reason", not_null=True),
    _c("raw", "BLOB", note="the bytes as received, the first FAILED_RAW_MAX_BYTES of them"),
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

#: Human judgments (and reviewed implicit ones) imported from qrels files, the review round trip or the review
#: page: one row per (query, doc, source, assessor), so a second assessor adds a row instead of replacing the
#: first. ``assessor`` is '' when the file names none (two such files of one source replace each other's rows).
HUMAN_JUDGMENT_TABLE = Table("human_judgments", (
    _c("query_id"),
    _c("query", not_null=True, note="normalised query text"),
    _c("doc_id", not_null=True),
    _c("grade", "INTEGER", not_null=True),
    _c("source", not_null=True, note="human | reviewed:<implicit source>"),
    _c("assessor", not_null=True, note="who graded it; '' when unnamed"),
    _c("judged_at", "TIMESTAMP"),
    _c("rubric", note="rubric name or version"),
    _c("origin", note="file it came from, or review:<page>"),
    # last: stores made before it get it by the key migration (ubi_pipeline.store.duckdb_store.ensure_tables)
    _c("note", note="the assessor's explanation of the grade, if any", max_length=2048),
), key=("query", "doc_id", "source", "assessor"))


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
