"""Systems found in the logs and the rankings they showed, and systems given as run files.

A *system* is the ``application`` of a query record, split further by the ``ranker`` and ``experiment`` keys
of its ``query_attributes`` when present: ``shop``, ``shop/ranker=bm25``, ``shop/ranker=ltr/experiment=b``.
Query records without an application belong to ``(no application)``.

A *search instance* is one ``query_id``, as in :mod:`ubi_pipeline.processors.clicks.sessions`. Multi-search front ends (Chorus in
the samples) log several responses under one ``query_id``; the instance takes its query text, system and
ranking from the earliest response with a non-empty ``query_response_hit_ids`` (else the earliest response),
the rule the click models use, so online and offline numbers describe the same searches.

The *logged ranking* of an instance, in order of preference:

1. its hit ids, in the order returned (duplicates dropped after their first occurrence, and counted;
   ``several_rankings`` flags a query_id whose responses logged different non-empty hit lists);
2. else the docs of its ``impression`` events, ordered by position ordinal, then first impression time;
3. else none: the instance has no known ranking and is left out of offline evaluation. An instance whose
   responses all logged an empty hit list and which has no impression is a *zero-result* search: its ranking
   is known to be empty and every offline metric of it is 0.

**Repeated searches** of one query by one system (mode ``modal``, the default): the system's ranking for the
query is the ranking it showed most often (ties: the one shown most recently, then the lexicographically
smallest); the share of searches that showed it is kept, so an unstable ranker is visible. Mode ``each``
evaluates every search instance on its own (query id ``<query> #<instance>``), so frequent queries weigh
more: a traffic-weighted view.

**Run files** (:func:`file_run`) are systems too, evaluated offline like the logged ones. Judgments are keyed by
normalised query text, so each run query id is mapped to a text by one rule: an id that is the ``query_id``
of a human judgment (a qrels file or the ``human_judgments`` table) or of a query set stands for that query's
text; any other id is taken as the query text itself, normalised (how Workbench judgments, implicit judgments
and the logs name queries), percent-decoded first in a TREC run (``red%20shoes``: a TREC id holds no
whitespace, so ``ubi judgments export --format trec`` writes texts that way, and ``ubi judgments import`` reads
them back with the same function, ``ubi_pipeline.processors.labels.implicit.query_from_trec_id``). Two run query
ids that land on one text are an error, never merged.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import duckdb
import pyarrow as pa

from ubi_pipeline.formats.runs import Run, RunError
from ubi_pipeline.processors.labels.implicit import query_from_trec_id
from ubi_pipeline.schemas.cli_names import DEFAULT_SPLIT_KEYS
from ubi_pipeline.schemas.systems import SystemsError, json_path, system_sql
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.store.sql import sql_string_list

DEFAULT_IMPRESSION_ACTIONS: tuple[str, ...] = ("impression",)
RankingMode = Literal["modal", "each"]


def _register_query_texts(con: duckdb.DuckDBPyConnection) -> None:
    """Normalise each distinct logged query text once in Python (NFKC is not a SQL function) and join back."""
    raw = [r[0] for r in con.execute("SELECT DISTINCT user_query FROM ubi_queries").fetchall()]
    con.register("_ubi_qtext", pa.table({"user_query": raw, "query": [normalize_query(t) for t in raw]}))


def load_searches(
    con: duckdb.DuckDBPyConnection,
    *,
    split_keys: Sequence[str] = DEFAULT_SPLIT_KEYS,
    class_key: str | None = None,
    impression_actions: Sequence[str] = DEFAULT_IMPRESSION_ACTIONS,
) -> pa.Table:
    """One row per search instance (the temp table of :func:`prepare_searches`, fetched as Arrow, by instance).

    At 20M events that is 1.7M rows with a 20-doc ranking each (about 1.5 GB as Arrow): the report reads the
    temp table in SQL instead (:func:`logged_runs_in`, :func:`search_counts`, :func:`classes_by_text`).
    """
    prepare_searches(con, split_keys=split_keys, class_key=class_key, impression_actions=impression_actions)
    return con.sql("SELECT * FROM _ubi_searches ORDER BY instance").to_arrow_table()


def prepare_searches(
    con: duckdb.DuckDBPyConnection,
    *,
    split_keys: Sequence[str] = DEFAULT_SPLIT_KEYS,
    class_key: str | None = None,
    impression_actions: Sequence[str] = DEFAULT_IMPRESSION_ACTIONS,
) -> int:
    """Temp tables ``_ubi_searches`` (one row per search instance) and ``_ubi_search_events`` on ``con``; returns
    the number of search instances.

    Columns: ``instance`` (int, ordered by time), ``system``, ``application``, ``query_id``, ``query``
    (normalised), ``user_query``, ``ts`` (naive UTC, may be NULL), ``client_id``, ``session`` (the
    ``session_id`` of its events, else its ``client_id``), ``ranking`` (list of doc ids), ``ranking_source``
    (``hits`` | ``impressions`` | ``none``), ``result_count`` (NULL when unknown), ``zero_result`` (bool),
    ``duplicate_hits`` (ids dropped from the hit list), ``query_class`` (value of ``class_key`` or NULL).
    ``_ubi_search_events`` holds every event that belongs to an instance, with its ``instance`` (only the
    columns the online metrics read: ``action_name``, ``object_id``, ``timestamp``, ``position_ordinal``,
    ``session_id``, so a report of tens of millions of events does not copy their JSON columns).
    """
    system_expr, params = system_sql(split_keys)
    class_expr = "NULL::VARCHAR"
    if class_key:
        class_expr = "json_extract_string(query_attributes, ?)"
        params.append(json_path(class_key, "class key"))
    _register_query_texts(con)
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _ubi_records AS
        SELECT row_number() OVER () AS rid, q.query_id, q.query_response_id, q.user_query, t.query, q.application, q.client_id,
               q.timestamp, q.query_response_hit_ids AS hits, {system_expr} AS system, {class_expr} AS query_class
        FROM ubi_queries q JOIN _ubi_qtext t USING (user_query)
        """,
        params,
    )
    # Per query_id, over narrow columns only (the hit lists are read for their length and hash, never carried
    # through an operator): which record stands for the search (arg_min over the sort key the rows would be
    # ordered by: a hit list first, then the earliest timestamp, then the smallest query_response_id, NULLs
    # last), its first timestamp, what its records say of the hits, and its number in time order. Window
    # functions partitioned by query_id over the wide rows did the same and ran DuckDB out of its memory
    # limit at 50M events (README, scale).
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _ubi_pick AS
        SELECT row_number() OVER (ORDER BY ts NULLS LAST, query_id) - 1 AS instance, *
        FROM (
            SELECT query_id,
                   arg_min(rid, (coalesce(len(hits), 0) = 0, timestamp IS NULL, coalesce(epoch_us(timestamp), 0),
                                 query_response_id IS NULL, coalesce(query_response_id, ''))) AS rid,
                   min(timestamp) AS ts,
                   bool_or(hits IS NOT NULL) AS hits_known,
                   max(coalesce(len(hits), 0)) AS max_hits,
                   count(DISTINCT hash(hits)) FILTER (WHERE len(hits) > 0) AS n_rankings,
                   any_value(client_id) AS any_client
            FROM _ubi_records GROUP BY query_id
        )
        """
    )
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _ubi_inst AS
        SELECT p.instance, r.system, r.application, r.query_id, r.query, r.user_query, p.ts,
               coalesce(r.client_id, p.any_client) AS client_id, r.hits, p.hits_known, p.max_hits, p.n_rankings,
               r.query_class
        FROM _ubi_pick p JOIN _ubi_records r USING (rid)
        """
    )
    con.execute("DROP TABLE temp._ubi_pick")
    con.execute("DROP TABLE temp._ubi_records")  # each instance's record is in _ubi_inst: free the pool
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _ubi_search_events AS
        SELECT i.instance, e.action_name, e.object_id, e.timestamp, e.position_ordinal, e.session_id
        FROM ubi_events e JOIN _ubi_inst i USING (query_id)
        """
    )
    imp = sql_string_list(impression_actions)
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _ubi_searches AS
        WITH shown AS (
            SELECT instance, object_id, min(position_ordinal) AS pos, min(timestamp) AS first_ts
            FROM _ubi_search_events WHERE action_name IN ({imp}) AND object_id IS NOT NULL
            GROUP BY instance, object_id
        ), n_shown AS (
            SELECT instance, count(*) AS n FROM shown GROUP BY instance
        ), impressed AS (
            -- the ordered list only where it is the ranking (no hit list): an ordered list per search of a log
            -- whose searches all have hits would be held for nothing
            SELECT instance, list(object_id ORDER BY pos NULLS LAST, first_ts, object_id) AS docs
            FROM shown SEMI JOIN (SELECT instance FROM _ubi_inst WHERE max_hits = 0) USING (instance)
            GROUP BY instance
        ), sess AS (
            SELECT instance, min(session_id) AS session_id FROM _ubi_search_events
            WHERE session_id IS NOT NULL GROUP BY instance
        ), ranked AS (
            SELECT i.*, p.docs AS impressed, c.n AS n_impressed, s.session_id,
                   list_filter(i.hits, lambda x, n: list_position(i.hits, x) = n) AS dedup_hits
            FROM _ubi_inst i LEFT JOIN n_shown c USING (instance) LEFT JOIN impressed p USING (instance)
                 LEFT JOIN sess s USING (instance)
        )
        SELECT instance, system, application, query_id, query, user_query, ts, client_id,
               coalesce(session_id, client_id) AS session,
               CASE WHEN max_hits > 0 THEN dedup_hits WHEN impressed IS NOT NULL THEN impressed
                    ELSE []::VARCHAR[] END AS ranking,
               CASE WHEN max_hits > 0 THEN 'hits' WHEN n_impressed IS NOT NULL THEN 'impressions'
                    WHEN hits_known THEN 'hits' ELSE 'none' END AS ranking_source,
               n_rankings > 1 AS several_rankings,
               CASE WHEN hits_known THEN greatest(max_hits, coalesce(n_impressed, 0))
                    WHEN n_impressed IS NOT NULL THEN n_impressed END AS result_count,
               (hits_known AND max_hits = 0 AND n_impressed IS NULL) AS zero_result,
               coalesce(len(hits) - len(dedup_hits), 0) AS duplicate_hits,
               query_class
        FROM ranked ORDER BY instance
        """
    )
    con.execute("DROP TABLE temp._ubi_inst")  # with its hit lists: at 50M events 4M of them, spilled otherwise
    return int(con.execute("SELECT count(*) FROM _ubi_searches").fetchall()[0][0])


def drop_searches(con: duckdb.DuckDBPyConnection) -> None:
    """Drop what :func:`prepare_searches` made on ``con`` (its temp tables and the registered query texts), once
    every step that reads them is done, so DuckDB's pool is free for what comes after."""
    con.execute("DROP TABLE IF EXISTS temp._ubi_searches")
    con.execute("DROP TABLE IF EXISTS temp._ubi_search_events")
    try:
        con.unregister("_ubi_qtext")
    except duckdb.Error:
        pass


@dataclass
class SystemRun:
    """The logged rankings of one system, as a run: ``run[qid]`` is a list of doc ids in rank order.

    ``query_of[qid]`` is the normalised query text (the key into judgments); ``searches[qid]`` how many
    search instances stand behind it; ``distinct_rankings[qid]`` how many different rankings those showed;
    ``modal_share[qid]`` the share of them that showed ``run[qid]`` (1.0 in mode ``each``).
    """

    system: str
    mode: str
    run: dict[str, list[str]] = field(default_factory=dict)
    query_of: dict[str, str] = field(default_factory=dict)
    searches: dict[str, int] = field(default_factory=dict)
    distinct_rankings: dict[str, int] = field(default_factory=dict)
    modal_share: dict[str, float] = field(default_factory=dict)
    query_class: dict[str, str | None] = field(default_factory=dict)
    unranked_searches: int = 0  # instances without a known ranking (left out)
    origin: str | None = None  # the run file this system was read from; None: found in the logs

    @property
    def n_queries(self) -> int:
        return len(self.run)


def logged_runs(searches: pa.Table, mode: RankingMode = "modal") -> dict[str, SystemRun]:
    """Group search instances (rows of :func:`load_searches`) into one run per system; see :func:`logged_runs_in`."""
    con = duckdb.connect()
    try:
        con.register("_ubi_searches", searches)
        return logged_runs_in(con, mode)
    finally:
        con.close()


def logged_runs_in(con: duckdb.DuckDBPyConnection, mode: RankingMode = "modal") -> dict[str, SystemRun]:
    """Group the search instances of ``_ubi_searches`` on ``con`` (:func:`prepare_searches`) into one run per
    system (see the module docstring for the two modes), in SQL on ``con``, under its memory limit; Python
    receives one ranking per (system, query) in mode ``modal``.

    Every doc id, query text and class is one string object however many rankings hold it: the systems of a log
    rank the same candidates, and DuckDB makes a new string for each list element it returns. At 50M events
    (about 400,000 rankings of 20 docs) the runs took 680 MB before this (``bench/memprobe.py``)."""
    if mode not in ("modal", "each"):
        raise SystemsError(f"ranking mode {mode!r}: expected 'modal' or 'each'")
    seen: dict[str, str] = {}
    one = seen.setdefault  # equal strings -> the first object seen

    systems = [r[0] for r in con.execute("SELECT DISTINCT system FROM _ubi_searches ORDER BY system").fetchall()]
    out = {name: SystemRun(name, mode) for name in systems}
    for name, n in con.execute(
        "SELECT system, count(*) FROM _ubi_searches WHERE ranking_source = 'none' GROUP BY system"
    ).fetchall():
        out[name].unranked_searches = int(n)
    if mode == "each":
        rows = con.execute(
            "SELECT system, instance, query, ranking, query_class FROM _ubi_searches WHERE ranking_source <> 'none' "
            "ORDER BY instance"
        ).fetchall()
        for system, instance, query, ranking, cls in rows:
            qid = f"{query} #{instance}"
            sr = out[system]
            sr.run[qid] = [one(d, d) for d in ranking]
            sr.query_of[qid] = one(query, query)
            sr.searches[qid] = 1
            sr.distinct_rankings[qid] = 1
            sr.modal_share[qid] = 1.0
            sr.query_class[qid] = cls if cls is None else one(cls, cls)
        return out
    # rows are read 50,000 at a time, on ``con`` itself (its temp tables are not visible to a cursor): only the
    # runs, with their shared strings, are kept
    con.execute(
        """
        WITH g AS (
            SELECT system, query, ranking, count(*) AS n, max(instance) AS last,
                   array_to_string(ranking, chr(31)) AS key
            FROM _ubi_searches WHERE ranking_source <> 'none' GROUP BY system, query, ranking
        ), c AS (
            SELECT system, query, mode(query_class) AS cls FROM _ubi_searches
            WHERE ranking_source <> 'none' GROUP BY system, query
        ), r AS (
            SELECT *, row_number() OVER (PARTITION BY system, query ORDER BY n DESC, last DESC, key) AS rn,
                   sum(n) OVER (PARTITION BY system, query) AS total,
                   count(*) OVER (PARTITION BY system, query) AS distinct_rankings
            FROM g
        )
        SELECT r.system, r.query, r.ranking, r.n, r.total, r.distinct_rankings, c.cls
        FROM r JOIN c USING (system, query) WHERE rn = 1 ORDER BY r.system, r.query
        """
    )
    while rows := con.fetchmany(50_000):
        for system, query, ranking, n, total, distinct, cls in rows:
            sr = out[system]
            query = one(query, query)
            sr.run[query] = [one(d, d) for d in ranking]
            sr.query_of[query] = query
            sr.searches[query] = int(total)
            sr.distinct_rankings[query] = int(distinct)
            sr.modal_share[query] = n / total
            sr.query_class[query] = cls if cls is None else one(cls, cls)
    return out


@dataclass(frozen=True)
class SearchCounts:
    """Per logged system: its search instances, zero-result ones, ones with several rankings, duplicate hits."""

    searches: int
    zero_result: int
    several_rankings: int
    duplicate_hits: int


def search_counts(con: duckdb.DuckDBPyConnection) -> dict[str, SearchCounts]:
    """:class:`SearchCounts` of every system of ``_ubi_searches`` on ``con``, counted in SQL."""
    return {
        system: SearchCounts(int(n), int(zero), int(several), int(dup))
        for system, n, zero, several, dup in con.execute(
            "SELECT system, count(*), count(*) FILTER (WHERE zero_result), count(*) FILTER (WHERE several_rankings), "
            "coalesce(sum(duplicate_hits), 0) FROM _ubi_searches GROUP BY system"
        ).fetchall()
    }


def classes_by_text(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """The class the logs give each query text most often (ties: the smallest), from ``_ubi_searches`` on ``con``;
    texts whose searches have no class are left out."""
    return dict(con.execute(
        """
        SELECT query, arg_min(query_class, (-n, query_class)) FROM (
            SELECT query, query_class, count(*) AS n FROM _ubi_searches WHERE query_class IS NOT NULL
            GROUP BY query, query_class
        ) GROUP BY query
        """
    ).fetchall())


def run_system_name(run: Run, name: str | None = None) -> str:
    """The name of a run-file system: ``name`` when given, else the run's tag, else the file's stem."""
    if name is not None and name.strip():
        return name.strip()
    if run.tag:
        return run.tag
    if run.path:
        return Path(run.path).stem
    raise SystemsError("a run without a tag or a file needs a name")


def _run_query_text(qid: str, run: Run, path: str, line: int | None) -> str:
    """A run query id that names no judged query, as query text: percent-decoded in a TREC run (module docstring)."""
    if run.format != "trec":
        return qid
    try:
        return query_from_trec_id(qid)
    except UnicodeDecodeError as exc:
        raise RunError(path, line, f"query id {qid!r} is not valid percent-escaped UTF-8; write the text escaped "
                                   f"as `ubi judgments export --format trec` does, or give a query set") from exc


def file_run(
    name: str,
    run: Run,
    query_texts: Mapping[str, Collection[str]],
    query_class: Mapping[str, str | None] | None = None,
) -> SystemRun:
    """A run file as a system, each query id mapped to a normalised query text (module docstring).

    ``query_texts[query_id]`` holds the normalised text(s) the judgments give that query id; more than one
    is ambiguous and an error when the run uses that id. ``query_class[text]`` is the class the logs give
    the text (``--class-key``), when known.
    """
    path = run.path or name
    out = SystemRun(name, "run", origin=run.path)
    first: dict[str, str] = {}
    for qid, ranking in run.items():
        texts = sorted(set(query_texts.get(qid, ())))
        line = run.lines.get(qid)
        if len(texts) > 1:
            raise RunError(path, line, f"query id {qid!r} is the query_id of {len(texts)} judged queries "
                                       f"({', '.join(map(repr, texts))}); make the judgments' query ids unique")
        text = texts[0] if texts else normalize_query(_run_query_text(qid, run, path, line))
        if not text:
            raise RunError(path, line, f"query id {qid!r} is blank once normalised; give a query id or text")
        if text in first:
            other = first[text]
            raise RunError(path, line, f"query ids {other!r} (line {run.lines.get(other)}) and {qid!r} both stand "
                                       f"for the query {text!r}; keep one ranking per query")
        first[text] = qid
        out.run[qid] = list(ranking)
        out.query_of[qid] = text
        out.query_class[qid] = (query_class or {}).get(text)
    return out
