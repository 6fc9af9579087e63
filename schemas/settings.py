"""The one place configuration is read: environment variables (``UBI_*``) and command-line flags.

Nothing else in ubi-pipeline reads the environment. Commands build a :class:`Settings` with
:meth:`Settings.from_flags`; flags left unset fall back to the environment, then to the defaults below.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ubi_pipeline.schemas.errors import SettingsError


class Settings(BaseSettings):
    """All settings of ubi-pipeline, each with its environment variable ``UBI_<NAME>``.

    Limits on what a client can send (issue 25: no client can break the store or the loader). Those that are
    settings are fields below; the others are part of the published record schema (``ubi schema``), so a
    client checking with it and the collector agree, and they are fixed:

    * string fields of UBI records: UBI 1.3.0's ``maxLength`` where it gives one (100 for ids and names, 1024
      for ``message``); ours where it gives none: ``user_query`` 2048 characters
      (``ubi_pipeline.schemas.ubi.USER_QUERY_MAX_LENGTH``), object and hit ids 256, ``query_response_id``
      100; each free-form object (``query_attributes``, ``event_attributes``, the extra keys) at most 8,192
      bytes of JSON (UTF-8) once stored (``JSON_FIELD_MAX_LENGTH``, same module). Together they keep every
      stored string within 8 KiB (``STORED_STRING_MAX_BYTES``, same module, says why: DuckDB's checkpoint). Enforced on every path a
      record enters: HTTP and ``_bulk``, ``ubi import`` (fast path included), the Kafka loader;
    * ``failed_records``: a refused body or item is kept truncated to its first 8,192 bytes, its full length
      and SHA-256 appended to ``reason`` (``ubi_pipeline.schemas.tables.FAILED_RAW_MAX_BYTES``); ``reason``
      and ``field`` are cut at 2,048 characters;
    * per request: ``max_body_bytes``, ``max_items`` (every POST route, ``/v1/interleave`` included),
      ``header_timeout_s``, ``body_timeout_s``, ``max_header_bytes``, ``max_headers``, below.
    """

    model_config = SettingsConfigDict(env_prefix="UBI_", extra="ignore")

    # --- store ---
    db: Path = Field(Path("ubi.duckdb"), description="DuckDB file of the embedded store")
    seal_dir: Path | None = Field(
        None, description="where the writer seals its rows into Parquet segments for readers while it holds the "
        "file (POST /v1/admin/seal; default: <db>.sealed beside the db)",
    )
    store_wait_seconds: float = Field(
        30.0, ge=0, description="`ubi serve` / `ubi consume --db`: how long to wait, retrying, while a read-only "
        "reader (`ubi report`, `ubi process`) holds the DuckDB file before giving up",
    )

    # --- collector ---
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = Field(5 * 1024 * 1024, description="largest request body accepted (413 above)")
    max_items: int = Field(10_000, description="most records in one request (413 above)")
    failed_list_limit: int = 100
    # which sink validated records go to, and the body limit of the admin load route
    sink: str = Field("duckdb", description="where validated records go: duckdb (embedded store) or kafka")
    max_load_bytes: int = Field(1024 * 1024 * 1024, description="largest Arrow body for /v1/admin/load (413 above)")
    commit_delay_ms: float = Field(
        0.5, ge=0, le=100,
        description="group commit: when the last commit carried several requests (a loaded collector), the writer "
        "waits this long for more before committing; a lone request is never delayed; 0 turns it off",
    )
    ack: Literal["log", "commit"] = Field(
        "log",
        description="when the collector answers: 'log' after the rows are fsync'd to the answer log beside the store "
        "(when every key is surely new; others wait for their commit), DuckDB committing them within "
        "UBI_LOG_COMMIT_MS or before any read; 'commit' always after the DuckDB commit",
    )
    log_commit_ms: float = Field(
        200.0, gt=0, le=60_000,
        description="longest time rows answered from the answer log wait for their DuckDB commit",
    )
    parse_workers: int | None = Field(
        None, ge=0, le=64,
        description="worker processes that parse and validate request bodies of 32 KiB or more, started on the first "
        "such body (the collector's own process keeps one core's worth of Python: the answers and the writer); "
        "unset: one per core, at most 8; 0: every body in the collector's process",
    )
    answer_log_max_bytes: int = Field(
        256 * 1024**2, ge=1024 * 1024,
        description="answer log size above which the collector answers 503 (reached only while the store cannot commit)",
    )

    # --- kafka transport: `ubi serve --sink kafka`, `ubi consume` ---
    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, HOST:PORT[,HOST:PORT...]")
    kafka_topic_prefix: str = Field("ubi", description="topics are <prefix>.queries, <prefix>.events, <prefix>.failed")
    kafka_partitions: int = Field(6, ge=1, description="partitions of a topic when ubi creates a missing one")
    kafka_replication_factor: int = Field(
        1, ge=1, description="replicas of a topic when ubi creates a missing one (3 on a production cluster)"
    )
    kafka_ack_timeout: float = Field(
        5.0, gt=0, description="seconds the collector waits for the broker's acknowledgement before spooling"
    )
    kafka_linger_ms: int = Field(2, ge=0, description="producer linger: records wait this long to share a batch")
    kafka_batch_bytes: int = Field(1024 * 1024, ge=1024, description="producer batch size per partition")
    kafka_compression: str = Field(
        "auto", description="producer compression: auto (lz4 when installed, else gzip), none, gzip, lz4, snappy, zstd"
    )
    spool_dir: Path = Field(Path("ubi-spool"), description="local durable spool used while the broker is unreachable")
    spool_max_bytes: int = Field(1024**3, ge=1024, description="spool size above which the collector answers 503")
    spool_segment_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="size of one spool segment file")
    consumer_group: str = Field("ubi-loader", description="consumer group of `ubi consume`")
    consumer_batch_records: int = Field(
        5_000, ge=1, description="Kafka records per loaded batch, one commit each (a record holds ~1-10 rows)"
    )
    consumer_batch_seconds: float = Field(1.0, gt=0, description="longest wait to fill a batch before loading it")
    consumer_max_poll_interval_ms: int = Field(
        30_000, ge=1000,
        description="Kafka max.poll.interval.ms, also the rebalance timeout (Tansu makes a new group's first join wait it)",
    )
    consumer_session_timeout_ms: int = Field(10_000, ge=1000, description="Kafka session.timeout.ms of the loader")
    consumer_check_crcs: bool = Field(
        True, description="verify record-batch CRC-32C on fetch (kafka-python computes it in pure Python: slow)"
    )

    # --- processors ---
    position_base: int = Field(0, description="base of event_attributes.position.ordinal (0 as OpenSearch tooling counts)")
    position_base_auto: bool = Field(
        True,
        description="detect each application's ordinal base from ordinals checked against hit lists "
                    "(ubi_pipeline.processors.clicks.ordinal_base); an explicit position_base or position_base_by_application wins",
    )
    min_support: int = Field(10, description="observations under the model (e.g. examined impressions) a (query, doc) needs before it gets a grade")
    max_ci_width: float = Field(0.5, description="widest confidence interval that still gets a grade")
    max_client_queries_per_minute: float = Field(60.0, description="clients above this query rate are filtered as bots")
    filter_click_all: bool = Field(True, description="drop searches with a click on every displayed result")
    # (processors core: sessions, filters, judgments, review)
    position_base_by_application: dict[str, int] = Field(
        default_factory=dict,
        description='position base per application overriding position_base, e.g. {"Chorus": 1} (JSON in UBI_*)',
    )
    click_actions: list[str] = Field(
        default_factory=lambda: ["click"],
        description="action_name values counted as clicks on a result (JSON list in UBI_CLICK_ACTIONS)",
    )
    impression_action: str = Field("impression", description="action_name of the events that say a result was displayed")
    max_rank: int = Field(10, ge=1, le=100, description="deepest rank kept in sessions and click models (K)")
    click_all_min_results: int = Field(
        2, ge=1, description="filter_click_all applies to searches that displayed at least this many results"
    )
    grade_max: int = Field(3, ge=1, description="top grade of the human scale (grades 0..grade_max)")
    calibration_fraction: float = Field(
        0.5, gt=0.0, lt=1.0, description="share of human-graded pairs used to fit the grade mapping (rest: held out)"
    )
    memory_limit: str | None = Field(
        "1GB",
        description="DuckDB memory limit of every reader (`ubi process`, `ubi propensity`, `ubi report`), e.g. '1GB': "
        "sorts, joins and temporary tables spill to temp_directory above it; empty or unset: DuckDB's default (80% of RAM)",
    )
    temp_directory: Path | None = Field(
        None, description="where DuckDB spills above memory_limit (default: DuckDB's, <db>.tmp beside the store)"
    )
    reader_threads: int | None = Field(
        None, ge=1, description="DuckDB threads of a reader while a collector or loader on this machine holds the store "
        "(it then scans the sealed segments beside the writer); empty or unset: one less than the cores, at least 1, "
        "so the writer keeps a core for POSTs (README, 'One writer, many readers')",
    )
    reader_nice: int = Field(
        10, ge=0, le=19, description="the nice value (CPU priority) a reader lowers itself to, this thread and the "
        "DuckDB threads it starts, before it scans the sealed segments of a store a writer holds: on a busy machine "
        "the writer's POSTs go first; 0 keeps the priority",
    )
    writer_memory_limit: str | None = Field(
        "256MB",
        description="DuckDB memory limit of the process writing the store (`ubi serve`, `ubi import`, `ubi consume "
        "--db`): table blocks above it are evicted (the dedup keys hold no index in memory, ubi_pipeline.store.keys); empty: "
        "DuckDB's default (80% of RAM). The record limits keep every stored string within 8 KiB "
        "(ubi_pipeline.schemas.ubi.STORED_STRING_MAX_BYTES): under the default 256MB, 37,560 events with every "
        "string at its longest (1 GiB) were stored without a failed checkpoint. A checkpoint that fails anyway "
        "invalidates the database; the writer reopens it (WAL replay: nothing committed is lost, a write it did "
        "not keep is answered 503) and runs on with DuckDB's default limit until it restarts",
    )
    checkpoint_threshold: str | None = Field(
        "64MB",
        description="WAL size at which the store's writer checkpoints (DuckDB's checkpoint_threshold; empty: DuckDB's "
        "default, 16MB). Each checkpoint rewrites the table's last, partly filled row group: at 16MB a collector "
        "storing 45,000 events/s checkpointed about once a second; at 64MB its own process used a quarter less CPU "
        "and stored a fifth more (docs/benchmarks.md). A killed writer replays up to this much WAL on its next start",
    )
    import_batch_records: int = Field(
        50_000,
        ge=1,
        description="records `ubi import` writes per transaction into a store it holds, or fewer where their lines "
        "reach 128 MiB: one validated chunk of 50,000 records. A killed import loses at most this many (run it "
        "again). 50,000 rather than 125,000 (where DuckDB writes whole row groups past its WAL): on 2M-record "
        "files, faster in 5 of 5 alternated pairs and 60-110 MiB less peak RSS (docs/benchmarks.md, import)",
    )
    seed: int = 0

    # --- reports (reports/joint.py, `ubi report`) ---
    reformulation_window_s: float = Field(
        60.0, gt=0, description="a search followed within this many seconds, in the same session, by a search of "
        "another query counts as reformulated",
    )
    report_bootstrap: int = Field(
        2000, ge=100, description="bootstrap resamples behind every interval of a mean in `ubi report`"
    )
    report_permutations: int = Field(
        10_000, ge=100, description="sign flips of the randomisation test in `ubi report --baseline`"
    )

    # --- security (collector/security.py, README "Safe to expose") ---
    cors_allow_origins: list[str] = Field(
        default_factory=list,
        description='origins allowed to send records from a browser, e.g. ["https://shop.example"] (JSON in '
        'UBI_CORS_ALLOW_ORIGINS; "*" allows any). Empty: only pages served by the collector itself',
    )
    api_keys: dict[str, list[SecretStr]] = Field(
        default_factory=dict,
        description='API keys per application, e.g. {"shop-search": ["k1", "k2"]}. When set, every write needs '
        "X-API-Key (or ?api_key= for beacons) and records must carry the key's application",
    )
    rate_limit_per_second: float = Field(
        default=0.0, ge=0.0, description="requests per second per client (API key and client IP, else client IP); 0 turns the limit off"
    )
    rate_limit_burst: float = Field(default=60.0, ge=1.0, description="requests a client may send at once (bucket size)")
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description='addresses or networks of the reverse proxies in front of the collector, e.g. ["10.0.0.5", '
        '"10.1.0.0/16"] (JSON in UBI_TRUSTED_PROXIES). X-Forwarded-For is read only from '
        "these peers, hop by hop from the right, and the client is the first hop that is not one of them. "
        "Empty (the default): X-Forwarded-For is ignored and the client is the socket peer",
    )
    admin_hosts: list[str] = Field(
        default_factory=list,
        description='host names (beside localhost, 127.0.0.1, [::1]) admin routes answer to in Host and Origin, '
        'e.g. ["collector.internal"] (JSON in UBI_ADMIN_HOSTS); other names get 403 (DNS rebinding)',
    )
    admin_remote: bool = Field(
        default=False, description="allow /v1/admin/* and /v1/failed from other hosts than loopback (default: loopback only)"
    )
    review_token: SecretStr | None = Field(
        default=None, description="token every request of the review page (`ubi review serve`) must carry; required "
        "to bind it to another address than loopback; unset: loopback only",
    )
    pseudonymise_key: SecretStr | None = Field(
        default=None, description="key of the HMAC-SHA256 that replaces client_id, user_id and session_id at ingest; unset: off"
    )
    pseudonymise_fields: list[str] = Field(
        default_factory=lambda: ["client_id", "user_id", "session_id"],
        description="fields replaced by their keyed hash when pseudonymise_key is set",
    )
    drop_fields: list[str] = Field(
        default_factory=list,
        description='fields removed from every record before storage, e.g. ["message"]; dotted paths reach into '
        'objects ("event_attributes.position.x")',
    )

    # --- HTTP server limits (collector/server.py; uvicorn under `ubi serve`) ---
    idle_timeout_s: float = Field(
        5.0, gt=0, description="seconds a connection may stay open without a request in progress (fresh or "
        "kept alive) before the collector closes it",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="seconds a client has, from its request's first byte, to send the whole request "
        "line and headers (slow senders are disconnected)",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="seconds a client has, from the end of its request's headers, to send the whole "
        "body (every route; slow senders are disconnected, and nothing of the request is stored)",
    )
    max_header_bytes: int = Field(
        32 * 1024, ge=1024, description="longest request line plus headers, in bytes; a longer one is answered 431 "
        "and the connection closed before the headers are held whole",
    )
    max_headers: int = Field(
        100, ge=8, description="most header lines in one request; more are answered 431 and the connection closed",
    )
    max_connections: int = Field(
        1000, ge=1, description="open connections the collector holds at once; one more is answered 503 and closed",
    )

    # --- OpenSearch-compatible ingest (collector/opensearch.py) ---
    query_index: str = Field(
        "ubi_queries", pattern=r"^[a-z0-9][a-z0-9_.-]{0,254}$",
        description="index name that OpenSearch-style senders write query records to (/_bulk, /{index}/_doc)",
    )
    event_index: str = Field(
        "ubi_events", pattern=r"^[a-z0-9][a-z0-9_.-]{0,254}$",
        description="index name that OpenSearch-style senders write events to (/_bulk, /{index}/_doc)",
    )

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxy_list(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            if value == 0:  # the former "number of proxies" setting's default: trust none
                return []
            raise ValueError(
                "trusted_proxies is a list of proxy addresses or networks (e.g. [\"10.0.0.5\"]), not a count: "
                "X-Forwarded-For is trusted only from the peers it names"
            )
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return value  # JSON: pydantic parses it
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, value: list[str]) -> list[str]:
        import ipaddress

        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError as exc:
                raise ValueError(f"trusted_proxies: {item!r} is not an IP address or network ({exc})") from None
        return value

    @field_validator("event_index")
    @classmethod
    def _two_indices(cls, value: str, info: Any) -> str:
        if value == info.data.get("query_index"):
            raise ValueError(f"event_index and query_index must differ (both {value!r})")
        return value

    @field_validator("cors_allow_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        import re

        for origin in value:
            if origin != "*" and not re.fullmatch(r"[a-z][a-z0-9+.-]*://[^/\s?#]+", origin):
                hint = f"; did you mean {origin.rstrip('/')!r}?" if origin.endswith("/") else ""
                raise ValueError(
                    f"{origin!r} is not an origin: write scheme://host[:port] "
                    f"exactly as the browser sends it in Origin, without a path or trailing slash{hint}"
                )
        return value

    @classmethod
    def from_flags(cls, args: argparse.Namespace | Mapping[str, Any], *, only: Iterable[str] | None = None,
                   **overrides: Any) -> Settings:
        """Settings from the command-line flags that were given, then ``UBI_*`` variables, then the defaults.

        Every flag whose ``dest`` names a field counts (``only`` narrows that to the fields named); a flag left
        at ``None`` is unset. ``overrides`` are set like flags. A value that does not validate raises
        :class:`~ubi_pipeline.schemas.errors.SettingsError` (exit 2) naming the flag as typed (``--batch-records``; the
        ``flag_names`` that ``ubi`` records on the parsed namespace, else ``--`` and the field name) or the
        ``UBI_*`` variable it came from, and what was expected.
        """
        values = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)
        names: Mapping[str, str] = values.get("flag_names") or {}
        wanted = set(cls.model_fields) if only is None else set(only) & set(cls.model_fields)
        flags = {k: v for k, v in values.items() if k in wanted and v is not None}
        flags.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**flags)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            field = str(first["loc"][0]) if first["loc"] else ""
            if field in flags:
                where = names.get(field) or "--" + field.replace("_", "-")
            elif field:
                where = f"UBI_{field.upper()}"
            else:
                where = "settings"
            value = f" (got {first['input']!r})" if field in flags and not isinstance(first["input"], dict) else ""
            raise SettingsError(f"{where}: {first['msg']}{value}", setting=field or None) from exc

    @field_validator("api_keys", mode="before")
    @classmethod
    def _one_key_or_many(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {app: [keys] if isinstance(keys, str) else keys for app, keys in value.items()}
        return value

    @field_validator("drop_fields")
    @classmethod
    def _keep_required(cls, value: list[str]) -> list[str]:
        required = {"action_name", "timestamp", "user_query"}
        bad = sorted(required.intersection(value))
        if bad:
            raise ValueError(f"drop_fields cannot drop required UBI fields {bad}; records without them are invalid")
        return value
