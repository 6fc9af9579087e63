"""Which system showed which ranking, read from the store: the evidence PBM's and UBM's empirical prior takes
beside the session patterns (``ubi_pipeline.processors.click_models.priors.SystemRankings``, :func:`system_features`).

A *system* is named by the rule of ``ubi_pipeline.reports.systems`` (:func:`ubi_pipeline.reports.systems.system_sql`: the application,
split by the ``ranker`` and ``experiment`` keys of ``query_attributes``). A search instance (``query_id``) takes
its system, query text and hit list from its earliest record with a non-empty ``query_response_hit_ids``, as
the session builder does (``ubi_pipeline.processors.clicks.sessions``); its *ranking* is that hit list cut to ``max_rank``, with the
docs the sessions know as pairs (a doc no kept session displayed is left out of the list's votes). What is
counted is what each system showed, so every search with a hit list counts, also those the session filters
drop (a bot sees what the rankers show); searches ranked only by their impression events carry no hit list and
are not counted. One row per distinct (query, system, ranking): a small table beside the patterns, which the
other models and Spark's sessions never see. With ``holdout`` the searches of the training fold only
(``ubi_pipeline.processors.clicks.sessions.holdout_flags``' md5 rule), so a model fitted on that fold sees no held-out ranking.

Two ways in. ``load_sessions(..., systems=True)`` (what ``ubi process`` uses) keeps the distinct (query text,
application, system, ranking) of the query record its search table picked per ``query_id`` (:func:`keep_shown_by`,
before that table is dropped) and numbers them against the pairs it built (:func:`shown_rankings`): the store's
``ubi_queries`` is read once, by the session build, where :func:`load_system_rankings` (for a caller without
a session build) reads it again with the same earliest-record rule. The two agree but for one tie: records of
one ``query_id`` with a hit list and the same earliest timestamp are told apart by the record key in the
session build and by ``query_response_id`` here.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from ubi_pipeline.processors.clicks.holdout import ALL_APPLICATIONS, holdout_cut
from ubi_pipeline.processors.clicks.stats import PairIndex, SystemRankings
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.schemas.systems import system_sql
from ubi_pipeline.schemas.text import normalize_query

_RANKINGS = """
WITH rec AS (
    SELECT query_id, user_query, application, query_response_hit_ids AS hits, {system} AS system,
           row_number() OVER (PARTITION BY query_id
                              ORDER BY coalesce(len(query_response_hit_ids), 0) > 0 DESC, timestamp NULLS LAST,
                                       query_response_id NULLS LAST) AS rn
    FROM ubi_queries
), first AS (
    SELECT * FROM rec
    WHERE rn = 1 AND len(hits) > 0 AND ({all_apps} OR application IS NOT DISTINCT FROM ?) AND {fold}
), r AS (
    SELECT (row_number() OVER () - 1)::BIGINT AS ranking, n.qi, system, hits
    FROM (SELECT DISTINCT user_query, system, hits[1:{k}] AS hits FROM first) JOIN _ubi_sr_q n USING (user_query)
), slots AS (
    SELECT ranking, qi, system, unnest(hits) AS doc_id, generate_subscripts(hits, 1)::BIGINT AS rank FROM r
)
SELECT s.ranking, s.qi, s.system, s.rank, p.pair
FROM slots s LEFT JOIN _ubi_sr_p p ON p.qi = s.qi AND p.doc_id = s.doc_id
"""


# Kept from the session build's _ubi_search0 (hits NULL where the picked record has none), before it is dropped:
# one row per distinct (text, application, system, ranking, fold); `train` only with a held-out split.
_SHOWN_BY = """
CREATE OR REPLACE TEMP TABLE _ubi_shown_by AS
SELECT DISTINCT user_query, application, {system} AS system, hits[1:{k}] AS hits, {train} AS train
FROM _ubi_search0 WHERE hits IS NOT NULL
"""

# Numbered against the session build's pairs: _ubi_qnorm (text -> qkey), _ubi_pairs (qkey, doc_id -> pair, qi).
# DISTINCT over the raw text, as load_system_rankings: two spellings of one query that showed one list are two rows.
_SHOWN = """
WITH q AS (
    SELECT DISTINCT n.user_query, p.qi FROM _ubi_qnorm n JOIN (SELECT DISTINCT qkey, qi FROM _ubi_pairs) p USING (qkey)
), r AS (
    SELECT (row_number() OVER (ORDER BY d.user_query, d.system, d.hits) - 1)::BIGINT AS ranking, q.qi, d.system,
           d.hits
    FROM (SELECT DISTINCT user_query, system, hits FROM _ubi_shown_by
          WHERE ($all_apps OR application IS NOT DISTINCT FROM $app) AND ($all_folds OR train)) d
    JOIN q USING (user_query)
), slots AS (
    SELECT ranking, qi, system, unnest(hits) AS doc_id, generate_subscripts(hits, 1)::BIGINT AS rank FROM r
)
SELECT s.ranking, s.qi, s.system, s.rank, p.pair
FROM slots s LEFT JOIN _ubi_pairs p ON p.qi = s.qi AND p.doc_id = s.doc_id
"""


def keep_shown_by(con: duckdb.DuckDBPyConnection, max_rank: int, holdout: float | None) -> None:
    """``_ubi_shown_by`` from the session build's search table (``ubi_pipeline.processors.clicks.sessions._SEARCH`` with the query
    records' ``query_attributes``); ``holdout`` marks the training fold (md5 rule of ``holdout_flags``)."""
    expr, params = system_sql()
    train = "true" if holdout is None else f"('0x' || left(md5(query_id), 8))::UBIGINT >= {holdout_cut(holdout)}"
    con.execute(_SHOWN_BY.format(system=expr, k=int(max_rank), train=train), params)


def shown_rankings(con: duckdb.DuckDBPyConnection, max_rank: int, *,
                   application: str | None | object = ALL_APPLICATIONS, train_only: bool = False) -> SystemRankings:
    """The SystemRankings of ``_ubi_shown_by`` over the session build's pairs, on the connection building them.

    ``application`` as ``load_sessions``; ``train_only`` keeps the training fold (needs ``keep_shown_by`` with
    a held-out fraction). Raises ``duckdb.Error`` as the session build's stages do (it wraps them).
    """
    every = application is ALL_APPLICATIONS
    t = con.sql(_SHOWN, params={"all_apps": every, "app": None if every else application,
                                "all_folds": not train_only}).to_arrow_table()
    return _rankings(t, int(max_rank))


def load_system_rankings(con: duckdb.DuckDBPyConnection, pairs: PairIndex, max_rank: int, *,
                         application: str | None | object = ALL_APPLICATIONS,
                         holdout: float | None = None) -> SystemRankings:
    """The distinct (query, system, ranking) of the store on ``con``, over the pairs of ``pairs`` (module docstring).

    ``application`` keeps one application's searches (as ``load_sessions``); ``holdout`` keeps the training
    fold of that split. Aggregated in SQL: Python sees one row per distinct query text and per ranking slot.
    """
    expr, params = system_sql()
    every = application is ALL_APPLICATIONS
    fold = "true" if holdout is None else f"('0x' || left(md5(query_id), 8))::UBIGINT >= {holdout_cut(holdout)}"
    k = int(max_rank)
    sql = _RANKINGS.format(system=expr, all_apps="true" if every else "false", fold=fold, k=k)
    query_no = {q: int(qi) for q, qi in zip(pairs.queries.tolist(), pairs.query_index.tolist(), strict=True)}
    try:
        texts = [r[0] for r in con.execute("SELECT DISTINCT user_query FROM ubi_queries "
                                           "WHERE user_query IS NOT NULL").fetchall()]
        normal = [(t, normalize_query(t)) for t in texts]
        known = [(t, query_no[n]) for t, n in normal if n in query_no]
        con.register("_ubi_sr_q", pa.table({"user_query": pa.array([t for t, _ in known], pa.string()),
                                            "qi": pa.array([q for _, q in known], pa.int64())}))
        con.register("_ubi_sr_p", pa.table({"qi": pa.array(pairs.query_index, pa.int64()),
                                            "doc_id": pa.array([str(d) for d in pairs.doc_ids], pa.string()),
                                            "pair": pa.array(np.arange(len(pairs)), pa.int64())}))
        t = con.sql(sql, params=[*params, None if every else application]).to_arrow_table()
    except duckdb.Error as exc:
        raise StoreError(f"reading which system showed which ranking failed in DuckDB: {exc}") from exc
    finally:
        for view in ("_ubi_sr_q", "_ubi_sr_p"):
            try:
                con.unregister(view)
            except duckdb.Error:
                pass
    return _rankings(t, k)


def _rankings(t: pa.Table, k: int) -> SystemRankings:
    """SystemRankings from rows (ranking, qi, system, rank, pair): one row per slot of each distinct ranking."""
    if not t.num_rows:
        return SystemRankings((), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, k), np.int64))
    names, sys_no = np.unique(np.asarray(t.column("system").to_pylist(), dtype=object), return_inverse=True)
    ranking = t.column("ranking").to_numpy()
    rank = t.column("rank").to_numpy()
    pair = t.column("pair").to_numpy(zero_copy_only=False)
    pair = np.where(np.isnan(pair.astype(np.float64)), -1, np.nan_to_num(pair.astype(np.float64))).astype(np.int64)
    n_rank = int(ranking.max()) + 1
    out_docs = np.full((n_rank, k), -1, dtype=np.int64)
    out_query = np.zeros(n_rank, dtype=np.int64)
    out_sys = np.zeros(n_rank, dtype=np.int64)
    out_query[ranking] = t.column("qi").to_numpy()
    out_sys[ranking] = sys_no.ravel()
    ok = (pair >= 0) & (rank >= 1) & (rank <= k)
    out_docs[ranking[ok], rank[ok] - 1] = pair[ok]
    keep = (out_docs >= 0).any(axis=1)
    return SystemRankings(tuple(str(n) for n in names), out_query[keep], out_sys[keep], out_docs[keep])


def read_system_rankings(db: str, pairs: PairIndex, max_rank: int, **options: object) -> SystemRankings:
    """:func:`load_system_rankings` on the store at ``db``, through a reader (works while a collector runs)."""
    from ubi_pipeline.store.client import reading

    with reading(db) as con:
        return load_system_rankings(con, pairs, max_rank, **options)  # type: ignore[arg-type]

