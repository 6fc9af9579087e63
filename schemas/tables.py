"""Storage tables: the canonical stored shape of UBI records and of everything derived from them.

One DDL per table, used by the DuckDB store and (as column lists) by the Parquet writer. Every table the
pipeline writes is declared here so that the collector, the Kafka loader, the processors and the reports
agree on names and types. JSON columns hold the original objects (``event_attributes``, extra keys) so
nothing a client sent is lost.
"""

from __future__ import annotations

#: Query records. Identity is ``query_key`` (``query_id`` + ``query_response_id``, see ``schemas.ubi.query_key``).
UBI_QUERIES = """
CREATE TABLE IF NOT EXISTS ubi_queries (
    query_key VARCHAR PRIMARY KEY,
    query_id VARCHAR NOT NULL,
    user_query VARCHAR NOT NULL,
    client_id VARCHAR,
    application VARCHAR,
    timestamp TIMESTAMP,            -- UTC; NULL when the client sent none
    query_attributes JSON,
    object_id_field VARCHAR,
    query_response_id VARCHAR,
    query_response_hit_ids VARCHAR[],
    extra JSON,                     -- top-level keys outside the schema
    content_hash VARCHAR NOT NULL,  -- tells a retry (same hash) from a conflict (different record, same key)
    received_at TIMESTAMP NOT NULL
)
"""

#: Events. Identity is ``event_key`` (client ``event_id`` or canonical hash, see ``schemas.ubi.event_key``).
UBI_EVENTS = """
CREATE TABLE IF NOT EXISTS ubi_events (
    event_key VARCHAR PRIMARY KEY,
    event_id VARCHAR,
    action_name VARCHAR NOT NULL,
    query_id VARCHAR,
    session_id VARCHAR,
    client_id VARCHAR,
    user_id VARCHAR,
    application VARCHAR,
    timestamp TIMESTAMP NOT NULL,   -- UTC
    message_type VARCHAR,
    message VARCHAR,
    user_query VARCHAR,
    object_id VARCHAR,
    object_id_field VARCHAR,
    object_id_type VARCHAR,
    internal_id VARCHAR,
    position_ordinal INTEGER,       -- as sent (0- or 1-based: see Settings.position_base)
    position_x DOUBLE,
    position_y DOUBLE,
    event_attributes JSON,
    extra JSON,
    received_at TIMESTAMP NOT NULL
)
"""

#: Everything the collector or a loader would not store, with why, so nothing is lost.
FAILED_RECORDS = """
CREATE TABLE IF NOT EXISTS failed_records (
    failed_id VARCHAR PRIMARY KEY,
    received_at TIMESTAMP NOT NULL,
    source VARCHAR NOT NULL,        -- route, file path, or kafka topic
    kind VARCHAR NOT NULL,          -- query | event | body | conflict | forbidden | ...
    item_index INTEGER,             -- index of the item in its batch (NULL for a whole body)
    field VARCHAR,
    reason VARCHAR NOT NULL,
    raw BLOB,                       -- the bytes as received
    kafka_topic VARCHAR,
    kafka_partition INTEGER,
    kafka_offset BIGINT
)
"""

#: Candidate (implicit) judgments from a processor. Never mixed with human ones: ``source`` says which model.
JUDGMENTS = """
CREATE TABLE IF NOT EXISTS judgments (
    query VARCHAR NOT NULL,         -- normalised query text (NFKC, case-folded, whitespace collapsed)
    doc_id VARCHAR NOT NULL,
    source VARCHAR NOT NULL,        -- implicit:<model>
    model_version VARCHAR,
    parameters JSON,
    score DOUBLE,
    ci_low DOUBLE,
    ci_high DOUBLE,
    impressions BIGINT,
    clicks BIGINT,
    sessions BIGINT,
    grade INTEGER,                  -- on the human scale, or NULL (too little support / too wide an interval)
    created_at TIMESTAMP NOT NULL,
    PRIMARY KEY (query, doc_id, source)
)
"""

#: Human judgments (and reviewed implicit ones) imported from qrels files or the review round trip.
HUMAN_JUDGMENTS = """
CREATE TABLE IF NOT EXISTS human_judgments (
    query_id VARCHAR,
    query VARCHAR NOT NULL,         -- normalised query text
    doc_id VARCHAR NOT NULL,
    grade INTEGER NOT NULL,
    source VARCHAR NOT NULL,        -- human | reviewed:<implicit source>
    assessor VARCHAR,
    judged_at TIMESTAMP,
    rubric VARCHAR,
    origin VARCHAR,                 -- file it came from
    PRIMARY KEY (query, doc_id, source)
)
"""

ALL_TABLES = (UBI_QUERIES, UBI_EVENTS, FAILED_RECORDS, JUDGMENTS, HUMAN_JUDGMENTS)

QUERY_COLUMNS = (
    "query_key", "query_id", "user_query", "client_id", "application", "timestamp", "query_attributes",
    "object_id_field", "query_response_id", "query_response_hit_ids", "extra", "content_hash", "received_at",
)
EVENT_COLUMNS = (
    "event_key", "event_id", "action_name", "query_id", "session_id", "client_id", "user_id", "application",
    "timestamp", "message_type", "message", "user_query", "object_id", "object_id_field", "object_id_type",
    "internal_id", "position_ordinal", "position_x", "position_y", "event_attributes", "extra", "received_at",
)
FAILED_COLUMNS = (
    "failed_id", "received_at", "source", "kind", "item_index", "field", "reason", "raw",
    "kafka_topic", "kafka_partition", "kafka_offset",
)
JUDGMENT_COLUMNS = (
    "query", "doc_id", "source", "model_version", "parameters", "score", "ci_low", "ci_high", "impressions",
    "clicks", "sessions", "grade", "created_at",
)
HUMAN_JUDGMENT_COLUMNS = (
    "query_id", "query", "doc_id", "grade", "source", "assessor", "judged_at", "rubric", "origin",
)

#: The declared columns of every table, by table name: the one list SQL identifiers are checked against.
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "ubi_queries": QUERY_COLUMNS,
    "ubi_events": EVENT_COLUMNS,
    "failed_records": FAILED_COLUMNS,
    "judgments": JUDGMENT_COLUMNS,
    "human_judgments": HUMAN_JUDGMENT_COLUMNS,
}
