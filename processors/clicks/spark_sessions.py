"""The session aggregation on Apache Spark: a Parquet folder of UBI records to the same sufficient statistics.

``ubi process --engine spark --parquet DIR [--master URL]`` runs here what :mod:`ubi_pipeline.processors.clicks.sessions` runs in
DuckDB: dedup of the append-only Parquet log (per ``query_key`` and ``event_key`` the earliest
``received_at``, then Kafka partition, offset and line, as ``ubi_pipeline.store.parquet_store`` does), each search's
record and displayed ranking, click placement, the traffic filters (empty queries, bot clients, click on
every result), the cut at K, and the aggregation to pairs, PBM cells and weighted click patterns. The rules
are the ones documented in :mod:`ubi_pipeline.processors.clicks.sessions`, statement for statement, in Spark SQL; a test runs both
engines on one folder and finds identical cells, UBM cells, patterns and filter counts.

Only aggregated rows come back to the driver: one row per distinct query text (to normalise it: NFKC is not
a Spark SQL function), per pair, per cell and per pattern. UBM cells are derived on the driver from the
patterns (``ubi_pipeline.processors.clicks.stats.ubm_cells_from_sessions``), which are already deduplicated. The fit, the
judgments and the reports continue locally: they work on those small arrays.

Not computed on Spark: the data-quality counts (:class:`ubi_pipeline.processors.clicks.sessions.QualitySummary`, all zero here);
run the DuckDB engine on the same folder for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ubi_pipeline.processors.clicks.sessions import FilterCounts, QualitySummary, SessionData, SessionError
from ubi_pipeline.processors.clicks.stats import ClickCells, PairIndex, SessionPatterns, StatsError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.text import normalize_query

_ORIGIN = "received_at, kafka_partition, kafka_offset, kafka_line"

# Every stage is a temporary view; Spark plans them together. Scalars arrive as named parameters (:imp ...);
# the click actions and per-application position bases as small views.
_STAGES: tuple[tuple[str, str], ...] = (
    ("s_queries", f"""
        SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY query_key ORDER BY {_ORIGIN}) AS _rn FROM _raw_queries)
        WHERE _rn = 1"""),
    ("s_events", f"""
        SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY event_key ORDER BY {_ORIGIN}) AS _rn FROM _raw_events)
        WHERE _rn = 1"""),
    ("s_search0", """
        SELECT query_id AS sid, user_query, client_id, application, ts, hits, n_records, n_rankings FROM (
            SELECT query_id, user_query, client_id, application, `timestamp` AS ts, hits,
                   count(*) OVER w AS n_records, count(hits) OVER w AS n_rankings,
                   row_number() OVER (PARTITION BY query_id
                                      ORDER BY hits IS NULL, coalesce(`timestamp`, TIMESTAMP '9999-12-31'),
                                               query_key) AS _rn
            FROM (SELECT *, CASE WHEN query_response_hit_ids IS NOT NULL AND size(query_response_hit_ids) > 0
                                 THEN query_response_hit_ids END AS hits FROM s_queries)
            WINDOW w AS (PARTITION BY query_id)
        ) WHERE _rn = 1"""),
    ("s_search", "SELECT sid, user_query, client_id, application, ts, hits IS NOT NULL AS has_hits FROM s_search0"),
    ("s_ev", """
        SELECT e.event_key AS eid, s.sid, e.action_name = :imp AS is_imp, nullif(e.object_id, '') AS object_id,
               e.`timestamp` AS ts, e.position_ordinal AS ordinal,
               CASE WHEN e.position_ordinal - coalesce(b.base, :base) >= 0
                    THEN e.position_ordinal - coalesce(b.base, :base) + 1 END AS ord_rank,
               e.position_ordinal IS NOT NULL AND e.position_ordinal - coalesce(b.base, :base) < 0 AS bad_ordinal,
               coalesce(s.has_hits, false) AS search_has_hits,
               CASE WHEN array_position(h.hits, nullif(e.object_id, '')) > 0
                    THEN CAST(array_position(h.hits, nullif(e.object_id, '')) AS INT) END AS hit_rank
        FROM s_events e
        LEFT JOIN s_search s ON s.sid = e.query_id
        LEFT JOIN s_search0 h ON h.sid = s.sid
        LEFT JOIN _p_base b ON b.application = coalesce(e.application, s.application)
        WHERE e.action_name = :imp OR e.action_name IN (SELECT action FROM _p_clicks)"""),
    ("s_imp", """
        SELECT sid, object_id AS doc_id, ts,
               CASE WHEN search_has_hits THEN hit_rank WHEN bad_ordinal THEN NULL ELSE ord_rank END AS rank
        FROM s_ev
        WHERE is_imp AND sid IS NOT NULL AND object_id IS NOT NULL AND (search_has_hits OR ordinal IS NOT NULL)
        UNION ALL
        SELECT sid, object_id AS doc_id, ts, CAST(row_number() OVER (PARTITION BY sid ORDER BY ts, eid) AS INT)
        FROM s_ev
        WHERE is_imp AND sid IS NOT NULL AND object_id IS NOT NULL AND NOT search_has_hits AND ordinal IS NULL"""),
    ("s_impdoc", """
        SELECT sid, doc_id, min(rank) AS rank, min(ts) AS ts FROM s_imp WHERE rank IS NOT NULL GROUP BY sid, doc_id"""),
    ("s_shown0", """
        SELECT sid, rank, doc_id FROM (
            SELECT sid, rank, doc_id, row_number() OVER (PARTITION BY sid, rank ORDER BY ts, doc_id) AS _rn
            FROM s_impdoc) WHERE _rn = 1
        UNION ALL
        SELECT sid, CAST(min(pos) + 1 AS INT) AS rank, doc_id FROM (
            SELECT h.sid, x.pos, x.doc_id
            FROM (SELECT * FROM s_search0 WHERE hits IS NOT NULL) h
            LEFT ANTI JOIN (SELECT DISTINCT sid FROM s_impdoc) i ON i.sid = h.sid
            LATERAL VIEW posexplode(h.hits) x AS pos, doc_id)
        WHERE doc_id <> '' GROUP BY sid, doc_id"""),
    ("s_clk", """
        SELECT c.sid, c.object_id AS doc_id, c.ts, c.ord_rank, r.sid IS NOT NULL AS search_ranked, d.rank AS shown_rank
        FROM (SELECT * FROM s_ev WHERE NOT is_imp) c
        LEFT JOIN (SELECT DISTINCT sid FROM s_shown0) r ON r.sid = c.sid
        LEFT JOIN s_shown0 d ON d.sid = c.sid AND d.doc_id = c.object_id"""),
    ("s_placed", """
        SELECT sid, rank, doc_id FROM (
            SELECT p.*, row_number() OVER (PARTITION BY p.sid, p.rank ORDER BY p.ts, p.doc_id) AS _rn FROM (
                SELECT sid, doc_id, min(ord_rank) AS rank, min(ts) AS ts FROM s_clk
                WHERE doc_id IS NOT NULL AND search_ranked AND shown_rank IS NULL AND ord_rank IS NOT NULL
                GROUP BY sid, doc_id) p
            LEFT ANTI JOIN s_shown0 s ON s.sid = p.sid AND s.rank = p.rank)
        WHERE _rn = 1"""),
    ("s_disp", """
        SELECT d.sid, d.rank, d.doc_id, c.sid IS NOT NULL AS clicked
        FROM (SELECT sid, rank, doc_id FROM s_shown0 UNION ALL SELECT sid, rank, doc_id FROM s_placed) d
        LEFT JOIN (SELECT DISTINCT sid, doc_id FROM s_clk WHERE sid IS NOT NULL AND doc_id IS NOT NULL) c
               ON c.sid = d.sid AND c.doc_id = d.doc_id"""),
    ("s_sess", """
        WITH shown AS (
            SELECT sid, count(*) AS n_shown, count(CASE WHEN clicked THEN 1 END) AS n_clicked FROM s_disp GROUP BY sid
        ), evts AS (
            SELECT sid, min(ts) AS ts FROM s_ev WHERE sid IS NOT NULL GROUP BY sid
        ), rate AS (
            SELECT client_id, max(n) AS peak FROM (
                SELECT client_id, count(*) OVER (
                    PARTITION BY client_id ORDER BY t RANGE BETWEEN CURRENT ROW AND 60000000 FOLLOWING) AS n
                FROM (SELECT s.client_id, unix_micros(CAST(coalesce(s.ts, e.ts) AS TIMESTAMP)) AS t
                      FROM s_search s LEFT JOIN evts e ON e.sid = s.sid)
                WHERE client_id IS NOT NULL AND t IS NOT NULL
            ) GROUP BY client_id
        )
        SELECT s.sid, n.qkey, s.client_id,
               CASE WHEN n.query = '' THEN 'empty_query'
                    WHEN r.peak > :max_rate THEN 'bot'
                    WHEN :click_all AND sh.n_shown >= :click_all_min AND sh.n_clicked = sh.n_shown THEN 'click_all'
               END AS dropped
        FROM s_search s
        JOIN shown sh ON sh.sid = s.sid
        JOIN _p_qnorm n ON n.user_query = s.user_query
        LEFT JOIN rate r ON r.client_id = s.client_id"""),
    ("s_kept", """
        SELECT d.sid, s.qkey, d.rank, d.doc_id, d.clicked
        FROM s_disp d JOIN s_sess s ON s.sid = d.sid WHERE s.dropped IS NULL AND d.rank <= :k"""),
)


#: stages read by several later ones (or by the counts), kept as computed rows
_MATERIALISED = frozenset({"s_search0", "s_ev", "s_shown0", "s_clk", "s_disp", "s_sess", "s_kept"})


def spark_session(master: str = "local[*]", app_name: str = "ubi-process") -> Any:
    """A SparkSession on ``master`` (``local[*]``, ``spark://host:7077``, ``yarn``, ``k8s://...``)."""
    try:
        from pyspark.sql import SparkSession
    except ModuleNotFoundError as exc:
        raise SessionError("the Spark engine needs PySpark: pip install 'ubi-pipeline[spark]' (and Java 17, "
                           "e.g. Debian's openjdk-17-jre-headless)") from exc
    try:
        spark = (SparkSession.builder.master(master).appName(app_name)
                .config("spark.sql.session.timeZone", "UTC")
                .config("spark.sql.shuffle.partitions", "4" if master.startswith("local") else "200")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        return spark
    except Exception as exc:  # Py4J / Java start-up errors have no common base class
        raise SessionError(f"could not start Spark on master {master!r}: {exc}") from exc


def _read(spark: Any, root: Path, table_dir: str) -> Any:
    files = sorted(str(p) for p in (root / table_dir).glob("*/*.parquet"))
    if not files:
        raise SessionError(f"{root / table_dir}: no Parquet files; load some with `ubi consume --parquet {root}`")
    return spark.read.option("mergeSchema", "true").parquet(*files)


def spark_sessions(spark: Any, parquet: Path | str, settings: Settings | None = None, *,
                   max_rank: int | None = None) -> SessionData:
    """Sessions of the Parquet folder ``parquet`` built on ``spark``: pairs, cells, UBM cells, patterns, filters.

    The same rules and the same results as :func:`ubi_pipeline.processors.clicks.sessions.load_sessions` on
    ``ubi_pipeline.store.parquet_store.open_parquet_reader(parquet)``, except the data-quality counts (left zero).
    """
    from pyspark.sql import types as T

    settings = settings or Settings()
    k = int(max_rank if max_rank is not None else settings.max_rank)
    if k < 1:
        raise SessionError(f"max_rank must be at least 1, got {k}")
    root = Path(parquet)
    _read(spark, root, "ubi_queries").createOrReplaceTempView("_raw_queries")
    _read(spark, root, "ubi_events").createOrReplaceTempView("_raw_events")
    spark.createDataFrame([(a,) for a in settings.click_actions], "action STRING").createOrReplaceTempView("_p_clicks")
    spark.createDataFrame(list(settings.position_base_by_application.items()),
                          T.StructType([T.StructField("application", T.StringType()),
                                        T.StructField("base", T.IntegerType())])).createOrReplaceTempView("_p_base")
    texts = [r[0] for r in spark.sql("SELECT DISTINCT user_query FROM _raw_queries").collect()]
    normalised = [normalize_query(t) for t in texts]
    order = {q: i for i, q in enumerate(sorted(set(normalised)))}
    spark.createDataFrame([(t, q, order[q]) for t, q in zip(texts, normalised, strict=True)],
                          "user_query STRING, query STRING, qkey BIGINT").createOrReplaceTempView("_p_qnorm")
    params: dict[str, Any] = {
        "imp": settings.impression_action, "base": int(settings.position_base), "k": k,
        "max_rate": float(settings.max_client_queries_per_minute), "click_all": bool(settings.filter_click_all),
        "click_all_min": int(settings.click_all_min_results),
    }
    for name, sql in _STAGES:
        used = {p: v for p, v in params.items() if f":{p}" in sql}
        df = spark.sql(sql, args=used)
        if name in _MATERIALISED:
            # cut the lineage: later stages and counts read this stage's rows instead of planning (and
            # running) the whole chain from the Parquet files again
            df = df.localCheckpoint(eager=True)
        df.createOrReplaceTempView(name)
    filters = _filters(spark, k, params)
    pt = spark.sql("""
        SELECT p.qkey, p.doc_id, q.query FROM (SELECT DISTINCT qkey, doc_id FROM s_kept) p
        JOIN (SELECT DISTINCT qkey, query FROM _p_qnorm) q ON q.qkey = p.qkey""").toArrow()
    pt = pt.sort_by([("qkey", "ascending"), ("doc_id", "ascending")])
    _, qi = np.unique(pt.column("qkey").to_numpy(), return_inverse=True)
    qi = qi.astype(np.int64)
    pairs = PairIndex(queries=np.array(pt.column("query").to_pylist(), dtype=object),
                      doc_ids=np.array(pt.column("doc_id").to_pylist(), dtype=object), query_index=qi)
    spark.createDataFrame(list(zip(pt.column("qkey").to_pylist(), pt.column("doc_id").to_pylist(),
                                   range(len(pairs)), qi.tolist(), strict=True)),
                          "qkey BIGINT, doc_id STRING, pair BIGINT, qi BIGINT").createOrReplaceTempView("_p_pairs")
    spark.sql("""SELECT k.sid, p.qi, p.pair, k.rank, k.clicked FROM s_kept k
                 JOIN _p_pairs p ON p.qkey = k.qkey AND p.doc_id = k.doc_id""").localCheckpoint(
        eager=True).createOrReplaceTempView("s_kp")
    ct = spark.sql("""SELECT pair, CAST(rank AS BIGINT) AS rank, count(*) AS impressions,
                             count(CASE WHEN clicked THEN 1 END) AS clicks
                      FROM s_kp GROUP BY pair, rank""").toArrow().sort_by([("pair", "ascending"), ("rank", "ascending")])
    col = {c: ct.column(c).to_numpy().astype(np.int64) for c in ("pair", "rank", "impressions", "clicks")}
    cells = ClickCells(pairs, col["pair"], col["rank"], col["impressions"], col["clicks"], k)
    patterns = _patterns(spark, pairs, k)
    try:
        cells.check()
        patterns.check()
    except StatsError as exc:
        raise SessionError(f"session statistics from Spark are inconsistent (a bug): {exc}") from exc
    # UBM cells: summed from the patterns when first read (SessionData.ubm_cells)
    return SessionData(pairs, cells, None, patterns, QualitySummary(), filters, k)  # type: ignore[arg-type]


def _patterns(spark: Any, pairs: PairIndex, k: int) -> SessionPatterns:
    """Identical (query, ranking, clicks) sessions merged with their count, ordered as DuckDB orders them."""
    n_pairs = max(len(pairs), 1)
    pt = spark.sql(f"""
        SELECT qi, sig, count(*) AS weight FROM (
            SELECT first(qi) AS qi,
                   transform(array_sort(collect_list(struct(rank, ((CAST(rank AS BIGINT) * {n_pairs}) + pair) * 2
                                                         + CAST(clicked AS BIGINT) AS code))), x -> x.code) AS sig
            FROM s_kp GROUP BY sid
        ) GROUP BY qi, sig""").toArrow()
    # DuckDB numbers patterns in (query, signature) order; lists compare element by element, a prefix first
    rows = sorted(zip(pt.column("qi").to_pylist(), [tuple(sig) for sig in pt.column("sig").to_pylist()],
                      pt.column("weight").to_pylist(), strict=True))
    n = len(rows)
    docs = np.full((n, k), -1, dtype=np.int64)
    clicks = np.zeros((n, k), dtype=bool)
    for i, (_, sig, _) in enumerate(rows):
        for code in sig:
            rank, pair = divmod(code // 2, n_pairs)
            docs[i, rank - 1] = pair
            clicks[i, rank - 1] = bool(code % 2)
    return SessionPatterns(pairs, np.array([r[0] for r in rows], dtype=np.int64), docs, clicks,
                           np.array([r[2] for r in rows], dtype=np.int64))


def _filters(spark: Any, k: int, params: dict[str, Any]) -> FilterCounts:
    ranked, empty, bots, click_all, bot_clients, kept_any = (int(v or 0) for v in spark.sql("""
        SELECT count(*), count(CASE WHEN dropped = 'empty_query' THEN 1 END), count(CASE WHEN dropped = 'bot' THEN 1 END),
               count(CASE WHEN dropped = 'click_all' THEN 1 END),
               count(DISTINCT CASE WHEN dropped = 'bot' THEN client_id END), count(CASE WHEN dropped IS NULL THEN 1 END)
        FROM s_sess""").collect()[0])
    kept_k, imps, clicks = (int(v or 0) for v in spark.sql(
        "SELECT count(DISTINCT sid), count(*), count(CASE WHEN clicked THEN 1 END) FROM s_kept").collect()[0])
    beyond = [int(v or 0) for v in spark.sql("""
        SELECT count(*), count(CASE WHEN clicked THEN 1 END)
        FROM s_disp d JOIN s_sess s ON s.sid = d.sid WHERE s.dropped IS NULL AND d.rank > :k""",
                                             args={"k": k}).collect()[0]]
    no_search = int(spark.sql("""SELECT count(*) FROM s_clk WHERE doc_id IS NOT NULL AND sid IS NULL""").collect()[0][0])
    return FilterCounts(
        ranked_searches=ranked, empty_query_searches=empty, bot_clients=bot_clients, bot_searches=bots,
        click_all_searches=click_all, clicks_without_search=no_search, sessions_empty_within_k=kept_any - kept_k,
        sessions=kept_k, impressions=imps, clicks=clicks, impressions_beyond_k=beyond[0], clicks_beyond_k=beyond[1],
    )
