"""Search sessions from the store, aggregated in DuckDB to the arrays click models fit on.

A session is one search instance (``query_id``). What it displayed, and at which ranks:

* Several query records may share a ``query_id`` (multi-search front ends log each sub-search, see
  ``ubi_pipeline.collector.ingest``); the session uses the earliest record with a non-empty ``query_response_hit_ids``,
  else the earliest record. Its ``user_query``, normalised (``ubi_pipeline.schemas.text.normalize_query``), is the query.
* When the search has ``impression`` events (``Settings.impression_action``), they say which docs were
  displayed. Their rank is the doc's place in the search's hit list when the search has one (impressions of
  docs outside that list belong to another sub-search and are dropped, counted); without a hit list it is
  ``position.ordinal - base + 1`` (base: ``Settings.position_base``, or per application
  ``Settings.position_base_by_application``), and for impressions without an ordinal their order of arrival
  among those.
  We prefer the hit list because producers disagree on the ordinal base (in the samples ESCI counts from 0;
  Chorus from 1 until February 2025, then from 0 except for the first result, which stays 1);
  ``QualitySummary.ordinal_base_evidence`` shows which base each application's ordinals fit.
  A doc impressed twice keeps its first rank; a second doc claiming an occupied rank is dropped (counted).
  A search whose impressions all fall outside its ranking uses its hit list instead.
* Otherwise the ordered ``query_response_hit_ids`` are the displayed ranking (rank = index + 1).
* A click (``Settings.click_actions``, default ``["click"]``: the custom ``item_click``/``global_click`` of the
  ubi-demo producer in the samples have no query record to attach to, so counting them would only add to
  the clicks without a search) counts for the displayed doc with the clicked ``object_id``. A click on
  a doc not in the displayed list proves it was displayed: it is placed at its ordinal rank when that rank
  is free, and dropped (counted) otherwise. Several clicks on one doc in one search are one click.

Filters applied before fitting, each counted (:class:`FilterCounts`): searches whose normalised query is
empty; every search of a client whose peak query rate over any 60 s window exceeds
``Settings.max_client_queries_per_minute``; searches with a click on every displayed result (when
``Settings.filter_click_all`` and at least ``Settings.click_all_min_results`` were displayed). Clicks without
a matching search are never fitted (counted). Ranks deeper than ``max_rank`` (K) are cut after filtering.

Everything is aggregated in SQL: Python sees one row per distinct query text, per aggregated cell and per
deduplicated pattern rank, never one per event (UBM cells are then summed from those patterns in numpy).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import duckdb
import numpy as np
import pyarrow as pa

from ubi_pipeline.processors.clicks.holdout import ALL_APPLICATIONS, holdout_cut
from ubi_pipeline.processors.clicks.ordinal_base import (
    BaseChoice,
    BaseEvidence,
    choose_bases,
    effective_bases,
)
from ubi_pipeline.processors.clicks.stats import (
    ClickCells,
    PairIndex,
    SessionPatterns,
    StatsError,
    SystemRankings,
    UbmCells,
    ubm_cells_from_sessions,
)
from ubi_pipeline.processors.clicks.system_rankings import keep_shown_by, shown_rankings
from ubi_pipeline.schemas.errors import StoreError, UbiError
from ubi_pipeline.schemas.sessions import Session
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.store.bounded import apply_limits
from ubi_pipeline.store.client import reading


class SessionError(UbiError):
    """Sessions could not be built (store lacks the UBI tables, bad settings)."""


@dataclass(frozen=True)
class QualitySummary:
    """What the raw log looked like: counts of every record the session builder had to repair or drop.

    Impression events split exactly into: without object id, without search, outside the search's ranking,
    bad ordinal (below the base), duplicate (doc impressed again), rank collision (another doc already
    at that rank), displayed. Click events split exactly into: without object id, without search, on a
    search without ranking, on an undisplayed doc (dropped), on a displayed doc (``clicks_displayed``,
    which includes ``clicks_placed_by_ordinal`` and ``repeat_clicks``).
    """

    query_records: int = 0
    searches: int = 0  # distinct query_id
    duplicate_query_records: int = 0  # query records beyond the first of each query_id
    searches_with_several_rankings: int = 0  # query_ids with more than one non-empty hit list
    searches_without_ranking: int = 0  # neither placed impressions nor a hit list
    searches_ranked_by_impressions: int = 0
    searches_ranked_by_hit_list: int = 0
    impression_events: int = 0
    impressions_without_object_id: int = 0
    impressions_without_search: int = 0
    impressions_outside_ranking: int = 0
    impressions_bad_ordinal: int = 0
    duplicate_impressions: int = 0
    impression_rank_collisions: int = 0
    impressions_displayed: int = 0
    impression_rank_checked: int = 0  # impressions with both a hit-list rank and an ordinal
    impression_rank_disagreements: int = 0
    click_events: int = 0
    clicks_without_object_id: int = 0
    clicks_without_search: int = 0
    clicks_on_search_without_ranking: int = 0
    clicks_on_undisplayed: int = 0  # dropped: doc not displayed and its ordinal rank unknown or taken
    clicks_displayed: int = 0
    clicks_placed_by_ordinal: int = 0  # doc missing from the displayed list, placed at its free ordinal rank
    repeat_clicks: int = 0
    click_rank_checked: int = 0  # clicks with both a displayed rank and an ordinal
    click_rank_disagreements: int = 0
    #: per application: events whose ordinal equals hit-list rank - 1 (``base0``) or the rank (``base1``)
    ordinal_base_evidence: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per application: the base in use, why, its evidence (checked before any base is applied)
    ordinal_bases: dict[str, BaseChoice] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ordinal_bases"] = {app: c.as_dict() for app, c in self.ordinal_bases.items()}
        return out


@dataclass(frozen=True)
class FilterCounts:
    """What the traffic filters removed before fitting, and what was left."""

    ranked_searches: int = 0  # searches with a displayed ranking, before filters
    empty_query_searches: int = 0
    bot_clients: int = 0
    bot_searches: int = 0
    click_all_searches: int = 0
    clicks_without_search: int = 0
    sessions_empty_within_k: int = 0  # kept searches that displayed nothing at ranks 1..K
    sessions: int = 0  # kept sessions with at least one result within K (what models fit on)
    impressions: int = 0  # (session, doc) displays within K
    clicks: int = 0  # clicked displays within K
    impressions_beyond_k: int = 0
    clicks_beyond_k: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _DerivedUbmCells:
    """``SessionData.ubm_cells``: given, or summed from the patterns on first read (then kept).

    No fit needs them from here (``UBM.fit`` sums its own from the patterns), and at 20M events deriving them
    took about 0.7 GB of numpy temporaries at the end of the session build; so the build passes None and only a
    reader that asks pays for them. A data descriptor, so the frozen dataclass keeps its fields and order.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> UbmCells:
        if obj is None:  # accessed on the class: the field has no default
            raise AttributeError("ubm_cells")
        cells = obj.__dict__.get(self.slot)
        if cells is None:
            cells = obj.__dict__[self.slot] = ubm_cells_from_sessions(obj.patterns)
        return cells

    def __set__(self, obj: Any, value: UbmCells | None) -> None:
        obj.__dict__[self.slot] = value


@dataclass(frozen=True)
class SessionData:
    """Everything one pass over the store yields: the pair index, the three statistics, the counts.

    ``ubm_cells`` may be given as None: they are then summed from ``patterns`` when first read.
    """

    pairs: PairIndex
    cells: ClickCells
    if TYPE_CHECKING:  # read as UbmCells; given as None by load_sessions and Spark (summed when first read)
        ubm_cells: UbmCells
    else:  # the descriptor raises AttributeError on the class, so the dataclass sees no default
        ubm_cells: UbmCells = _DerivedUbmCells()
    patterns: SessionPatterns
    quality: QualitySummary
    filters: FilterCounts
    max_rank: int
    held_out: np.ndarray | None = None  # per pattern: its searches are in the held-out split (``holdout``)
    application: str | None = None  # the one application these sessions were restricted to, if any
    #: which system showed which ranking (``load_sessions(..., systems=True)``), and the training fold's
    systems: SystemRankings | None = None
    train_systems: SystemRankings | None = None
    #: the searches the filters dropped, as (query_id, reason: empty_query | bot | click_all), so the report's online
    #: metrics leave out the searches the judgments leave out (``ubi_pipeline.reports.online``); None when not read
    dropped: pa.Table | None = None

    def split(self) -> tuple[SessionPatterns, SessionPatterns]:
        """(training, held-out) patterns of a log read with ``holdout``; both keep the same pair index."""
        if self.held_out is None:
            raise SessionError("these sessions were read without a held-out split (load_sessions(..., holdout=f))")
        p, out = self.patterns, []
        for mask in (~self.held_out, self.held_out):
            out.append(SessionPatterns(p.pairs, p.query[mask], p.docs[mask], p.clicks[mask], p.weight[mask]))
        return out[0], out[1]


# ----------------------------------------------------------------------------- SQL stages
# Searches get an integer id (sid) and query texts an integer key (qkey, in text order) early on, so that the
# tables of millions of rows below carry integers and short doc ids, not UUIDs and query strings. Each table
# is dropped as soon as the stages and counts that need it are done, to bound memory.

_SEARCH = """
CREATE OR REPLACE TEMP TABLE _ubi_search0 AS
WITH pick AS (
    -- per query_id, the key of its earliest record with a non-empty hit list, else of its earliest record (ties: the
    -- record key, unique), chosen over narrow columns; the wide columns (hit lists) are read once, for that record
    SELECT arg_min(query_key, (coalesce(len(query_response_hit_ids), 0) = 0,
                               coalesce("timestamp", TIMESTAMP '9999-12-31'), query_key)) AS query_key,
           count(*) AS n_records,
           count(CASE WHEN coalesce(len(query_response_hit_ids), 0) > 0 THEN 1 END) AS n_rankings
    FROM ubi_queries GROUP BY query_id
)
SELECT (row_number() OVER ())::BIGINT AS sid, q.query_id, q.user_query, q.client_id, q.application, q."timestamp" AS ts,
       CASE WHEN coalesce(len(q.query_response_hit_ids), 0) > 0 THEN q.query_response_hit_ids END AS hits,
       p.n_records, p.n_rankings{extra}
FROM ubi_queries q JOIN pick p USING (query_key);
CREATE OR REPLACE TEMP TABLE _ubi_hits AS SELECT sid, hits FROM _ubi_search0 WHERE hits IS NOT NULL;
CREATE OR REPLACE TEMP TABLE _ubi_search AS
SELECT sid, query_id, user_query, client_id, application, ts, hits IS NOT NULL AS has_hits, n_records, n_rankings
FROM _ubi_search0;
"""

# The one scan of ubi_events: clicks and impressions with their search (sid), hit-list rank and raw ordinal.
# The ordinal base is chosen from this table's evidence (``_EVIDENCE``) and applied where a rank is read from an
# ordinal (``_ORD_RANK``), so ubi_events is read once. eid (the event key, a long string) is kept only where
# _IMPRESSIONS needs it: to order impressions that have neither a hit list nor an ordinal.
# The join carries each search's hit list to its events, the scan's main cost (about 1 s of CPU of 1.3 at 1M
# events). By default it carries the list's 64-bit hashes instead (half the cost) and finds an event's rank as
# the first position of its object id's hash. That is the rank the list of strings gives, list_position's own
# NULL matching included, whenever no two distinct values among the events' object ids and the hit lists' docs
# share a hash: ``_HASHES_DISTINCT`` checks exactly that afterwards, and the scan is run again on the strings if
# it fails (``_build_displayed``).
_EVENTS = """
CREATE OR REPLACE TEMP TABLE _ubi_ev AS
SELECT CASE WHEN e.action_name = $imp AND NOT coalesce(s.has_hits, false) AND e.position_ordinal IS NULL
            THEN e.event_key END AS eid,
       s.sid, e.action_name = $imp AS is_imp, nullif(e.object_id, '') AS object_id,
       e."timestamp" AS ts, e.position_ordinal AS ordinal,
       coalesce(e.application, s.application) AS application,
       coalesce(s.has_hits, false) AS search_has_hits,
       {rank} AS hit_rank
FROM ubi_events e
LEFT JOIN (SELECT query_id, sid, application, hits IS NOT NULL AS has_hits, {hits} FROM _ubi_search0) s
       ON s.query_id = e.query_id
WHERE e.action_name = $imp OR list_contains($clicks, e.action_name)
"""
_EVENTS_HASHED = _EVENTS.format(rank="list_position(s.hit_hashes, hash(nullif(e.object_id, '')))",
                                hits="list_transform(hits, lambda h: hash(h)) AS hit_hashes")
_EVENTS_STRINGS = _EVENTS.format(rank="list_position(s.hits, nullif(e.object_id, ''))", hits="hits")

# Whether hash equality means equality for every value the hashed scan compared: as many distinct hashes as
# distinct values (UNION keeps NULL once, as one value: it is hashed too, and list_position matches a NULL object
# id with a NULL in the list).
_HASHES_DISTINCT = """
SELECT count(*) = count(DISTINCT hash(d))
FROM (SELECT object_id AS d FROM _ubi_ev UNION SELECT unnest(hits) AS d FROM _ubi_hits)
"""

# An event's ordinal base: its application's ($apps, $bases: the chosen bases as two lists), else $base. Its rank
# from the ordinal (NULL for a missing or sub-base ordinal), and whether the ordinal lies below the base.
_BASE = "coalesce(list_extract($bases::BIGINT[], list_position($apps::VARCHAR[], coalesce(application, ''))), $base)"
_ORD_RANK = f"CASE WHEN ordinal - {_BASE} >= 0 THEN ordinal - {_BASE} + 1 END"
_BAD_ORDINAL = f"(ordinal IS NOT NULL AND ordinal - {_BASE} < 0)"

# Impressions placed in their search's ranking (rank NULL: outside the hit list or bad ordinal); a subquery of
# _SHOWN, not a table, so the impressions are not held twice. (The arrival-order window runs only over the
# impressions that need it: no hit list and no ordinal.)
_IMPRESSIONS = """
SELECT sid, object_id AS doc_id, ts,
       CASE WHEN search_has_hits THEN hit_rank WHEN """ + _BAD_ORDINAL + """ THEN NULL ELSE """ + _ORD_RANK + """ END AS rank
FROM _ubi_ev
WHERE is_imp AND sid IS NOT NULL AND object_id IS NOT NULL AND (search_has_hits OR ordinal IS NOT NULL)
UNION ALL
SELECT sid, object_id AS doc_id, ts, row_number() OVER (PARTITION BY sid ORDER BY ts, eid)
FROM _ubi_ev
WHERE is_imp AND sid IS NOT NULL AND object_id IS NOT NULL AND NOT search_has_hits AND ordinal IS NULL
"""

# Displayed rows before click placement: from placed impressions, else from the hit list.
_IMPDOC = """
CREATE OR REPLACE TEMP TABLE _ubi_impdoc AS
SELECT sid, doc_id, min(rank) AS rank, min(ts) AS ts, count(*) AS n FROM (""" + _IMPRESSIONS + """)
WHERE rank IS NOT NULL GROUP BY ALL
"""

_SHOWN = """
CREATE OR REPLACE TEMP TABLE _ubi_shown0 AS
WITH imp_shown AS (
    SELECT sid, rank, doc_id, 'impressions' AS origin
    FROM _ubi_impdoc QUALIFY row_number() OVER (PARTITION BY sid, rank ORDER BY ts, doc_id) = 1
), hit_rows AS (
    SELECT sid, unnest(hits) AS doc_id, unnest(range(1, len(hits) + 1)) AS rank
    FROM _ubi_hits ANTI JOIN (SELECT DISTINCT sid FROM _ubi_impdoc) USING (sid)
)
SELECT * FROM imp_shown
UNION ALL
SELECT sid, min(rank) AS rank, doc_id, 'hit_list' AS origin FROM hit_rows WHERE doc_id <> '' GROUP BY sid, doc_id
"""

_CLICKS = """
CREATE OR REPLACE TEMP TABLE _ubi_clk AS
SELECT c.sid, c.object_id AS doc_id, c.ts, """ + _ORD_RANK + """ AS ord_rank, r.sid IS NOT NULL AS search_ranked,
       d.rank AS shown_rank
FROM _ubi_ev c
LEFT JOIN (SELECT DISTINCT sid FROM _ubi_shown0) r ON r.sid = c.sid
LEFT JOIN _ubi_shown0 d ON d.sid = c.sid AND d.doc_id = c.object_id
WHERE NOT c.is_imp
"""

# Clicked docs missing from the displayed list, placed at their (first) ordinal rank when no doc holds it.
_PLACED = """
CREATE OR REPLACE TEMP TABLE _ubi_placed AS
SELECT sid, rank, arg_min(doc_id, {'ts': ts, 'doc_id': doc_id}) AS doc_id FROM (
    SELECT sid, doc_id, min(ord_rank) AS rank, min(ts) AS ts
    FROM _ubi_clk
    WHERE doc_id IS NOT NULL AND search_ranked AND shown_rank IS NULL AND ord_rank IS NOT NULL
    GROUP BY ALL
) p
WHERE NOT EXISTS (SELECT 1 FROM _ubi_shown0 s WHERE s.sid = p.sid AND s.rank = p.rank)
GROUP BY sid, rank
"""

_DISPLAYED = """
CREATE OR REPLACE TEMP TABLE _ubi_disp AS
SELECT d.sid, d.rank, d.doc_id, c.sid IS NOT NULL AS clicked
FROM (SELECT sid, rank, doc_id FROM _ubi_shown0 UNION ALL SELECT sid, rank, doc_id FROM _ubi_placed) d
LEFT JOIN (SELECT DISTINCT sid, doc_id FROM _ubi_clk WHERE sid IS NOT NULL AND doc_id IS NOT NULL) c
       ON c.sid = d.sid AND c.doc_id = d.doc_id
"""

# Ranked searches with their query key, time and client, and the filter each one falls to.
_SESSIONS = """
CREATE OR REPLACE TEMP TABLE _ubi_sess AS
WITH shown AS (
    SELECT sid, count(*) AS n_shown, count(*) FILTER (WHERE clicked) AS n_clicked FROM _ubi_disp GROUP BY ALL
), evts AS (
    SELECT sid, min(ts) AS ts FROM _ubi_ev WHERE sid IS NOT NULL GROUP BY ALL
), rate AS (
    SELECT client_id, max(n) AS peak FROM (
        SELECT client_id, count(*) OVER (
            PARTITION BY client_id ORDER BY ts RANGE BETWEEN CURRENT ROW AND INTERVAL 60 SECOND FOLLOWING) AS n
        FROM (SELECT s.client_id, coalesce(s.ts, e.ts) AS ts FROM _ubi_search s LEFT JOIN evts e USING (sid))
        WHERE client_id IS NOT NULL AND ts IS NOT NULL
    ) GROUP BY ALL
)
SELECT s.sid, n.qkey, n.query = '' AS empty_query, s.client_id, s.application, coalesce(s.ts, e.ts) AS ts,
       sh.n_shown, sh.n_clicked,
       CASE WHEN n.query = '' THEN 'empty_query'
            WHEN r.peak > $max_rate THEN 'bot'
            WHEN $click_all AND sh.n_shown >= $click_all_min AND sh.n_clicked = sh.n_shown THEN 'click_all'
       END AS dropped
FROM _ubi_search s
JOIN shown sh USING (sid)
JOIN _ubi_qnorm n USING (user_query)
LEFT JOIN evts e USING (sid)
LEFT JOIN rate r USING (client_id)
"""

# Kept sessions cut at K: the one table every statistic below is aggregated from.
_KEPT = """
CREATE OR REPLACE TEMP TABLE _ubi_kept AS
SELECT d.sid, s.qkey, d.rank, d.doc_id, d.clicked
FROM _ubi_disp d JOIN _ubi_sess s USING (sid)
WHERE s.dropped IS NULL AND d.rank <= $k AND ($all_apps OR s.application IS NOT DISTINCT FROM $app)
"""

# The filters' verdict per search, by query_id: the dropped ranked searches, and every other search of a client
# dropped as a bot (the rate filter judges the client, and its unranked searches are no less a bot's).
_DROPPED = """
SELECT q.query_id, s.dropped AS reason FROM _ubi_sess s JOIN _ubi_search q USING (sid) WHERE s.dropped IS NOT NULL
UNION ALL
SELECT q.query_id, 'bot' AS reason FROM _ubi_search q
WHERE q.client_id IN (SELECT client_id FROM _ubi_sess WHERE dropped = 'bot')
  AND q.sid NOT IN (SELECT sid FROM _ubi_sess)
"""

# Held-out flag per search for model selection: the first 32 bits of md5(query_id), below the cut-off, are
# held out (``holdout_flags`` computes the same in Python, so a simulated log splits as the store would).
_FOLD = """
CREATE OR REPLACE TEMP TABLE _ubi_fold AS
SELECT sid, ('0x' || left(md5(query_id), 8))::UBIGINT < $cut AS fold FROM _ubi_search
"""

# qkey follows the text order of the queries, so (qkey, doc_id) order is (query, doc_id) order.
_PAIRS = """
CREATE OR REPLACE TEMP TABLE _ubi_pairs AS
SELECT qkey, doc_id, (row_number() OVER (ORDER BY qkey, doc_id) - 1)::BIGINT AS pair,
       (dense_rank() OVER (ORDER BY qkey) - 1)::BIGINT AS qi
FROM (SELECT DISTINCT qkey, doc_id FROM _ubi_kept)
"""

_KEPT_P = """
CREATE OR REPLACE TEMP TABLE _ubi_kp AS
SELECT k.sid, p.qi, p.pair, k.rank, k.clicked FROM _ubi_kept k JOIN _ubi_pairs p USING (qkey, doc_id)
"""

_CELLS = """
SELECT pair, rank::BIGINT AS rank, count(*)::BIGINT AS impressions, count(*) FILTER (WHERE clicked)::BIGINT AS clicks
FROM _ubi_kp GROUP BY pair, rank ORDER BY pair, rank
"""

# A pattern's signature lists (rank, pair, clicked) as one BIGINT per shown rank, ((rank * P) + pair) * 2 + clicked
# with P the number of pairs: lists of integers group and sort fast, in (rank, pair, clicked) order. A search
# shows one doc per rank, so sorting the codes orders them by rank: list_sort of a plain list() costs far less
# than an ordered aggregate (list(... ORDER BY rank)), which sorts every search's rows apart.
_PATTERNS = """
CREATE OR REPLACE TEMP TABLE _ubi_pat AS
SELECT (row_number() OVER (ORDER BY qi, sig) - 1)::BIGINT AS pattern, qi, sig, count::BIGINT AS weight
FROM (
    SELECT qi, sig, count(*) AS count FROM (
        SELECT any_value(qi) AS qi, list_sort(list(((rank::BIGINT * $n_pairs) + pair) * 2 + clicked::BIGINT)) AS sig
        FROM _ubi_kp GROUP BY sid
    ) GROUP BY qi, sig
)
"""

# The same patterns kept apart by held-out flag (a pattern seen in both folds is two rows).
_PATTERNS_FOLD = """
CREATE OR REPLACE TEMP TABLE _ubi_pat AS
SELECT (row_number() OVER (ORDER BY qi, sig, fold) - 1)::BIGINT AS pattern, qi, sig, fold, count::BIGINT AS weight
FROM (
    SELECT qi, sig, fold, count(*) AS count FROM (
        SELECT any_value(k.qi) AS qi, any_value(f.fold) AS fold,
               list_sort(list(((k.rank::BIGINT * $n_pairs) + k.pair) * 2 + k.clicked::BIGINT)) AS sig
        FROM _ubi_kp k JOIN _ubi_fold f USING (sid) GROUP BY sid
    ) GROUP BY qi, sig, fold
)
"""

# One row per shown rank of each pattern: its signature's codes, decoded in numpy batch by batch
# (``_fill_patterns``) into the [n, K] arrays, so neither DuckDB nor Python holds a table of every pattern rank.
_PATTERN_CODES = "SELECT pattern, unnest(sig) AS code FROM _ubi_pat"

#: rows per Arrow batch of ``_PATTERN_CODES``: 16 bytes a row, so about 8 MB a batch whatever the log's size
PATTERN_BATCH = 500_000

_TEMP_TABLES = ("_ubi_search0", "_ubi_search", "_ubi_hits", "_ubi_ev", "_ubi_impdoc", "_ubi_shown0",
                "_ubi_clk", "_ubi_placed", "_ubi_disp", "_ubi_sess", "_ubi_kept", "_ubi_pairs", "_ubi_kp",
                "_ubi_pat", "_ubi_fold", "_ubi_shown_by")


# ----------------------------------------------------------------------------- building

# Ordinals checked against the hit list of their search, per application, before any base is applied
# (the evidence ubi_pipeline.processors.clicks.ordinal_base decides on); needs _ubi_search and _ubi_hits.
_EVIDENCE = """
SELECT coalesce(application, '') AS application, count(*) FILTER (WHERE ordinal = hit_rank - 1),
       count(*) FILTER (WHERE ordinal = hit_rank), count(*)
FROM _ubi_ev WHERE hit_rank IS NOT NULL AND ordinal IS NOT NULL GROUP BY ALL ORDER BY 1
"""

# position_bases alone (no sessions) reads ubi_events just for this evidence.
_EVIDENCE_ONLY = """
SELECT coalesce(e.application, s.application, '') AS application,
       count(*) FILTER (WHERE e.position_ordinal = list_position(s.hits, nullif(e.object_id, '')) - 1),
       count(*) FILTER (WHERE e.position_ordinal = list_position(s.hits, nullif(e.object_id, ''))), count(*)
FROM ubi_events e JOIN _ubi_search0 s ON s.query_id = e.query_id
WHERE (e.action_name = $imp OR list_contains($clicks, e.action_name)) AND e.position_ordinal IS NOT NULL
  AND list_position(s.hits, nullif(e.object_id, '')) IS NOT NULL
GROUP BY ALL ORDER BY 1
"""


def _evidence(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | None = None) -> dict[str, BaseEvidence]:
    rows = con.execute(sql, params).fetchall()
    return {app: BaseEvidence(app, int(b0), int(b1), int(n)) for app, b0, b1, n in rows}


def position_bases(con: duckdb.DuckDBPyConnection, settings: Settings | None = None) -> dict[str, BaseChoice]:
    """The ordinal base of each application with its evidence and reason (:mod:`ubi_pipeline.processors.clicks.ordinal_base`).

    The same evidence and choice :func:`load_sessions` uses; for readers that need the bases without the
    sessions (the report's online metrics). ``con`` may be read-only.
    """
    settings = settings or Settings()
    try:
        con.execute(_SEARCH.format(extra=""))
        return choose_bases(_evidence(con, _EVIDENCE_ONLY, {"imp": settings.impression_action,
                                                            "clicks": list(settings.click_actions)}), settings)
    except duckdb.Error as exc:
        raise StoreError(f"reading ordinals failed in DuckDB: {exc}") from exc
    finally:
        _drop(con, "_ubi_search0", "_ubi_search", "_ubi_hits")


def _drop(con: duckdb.DuckDBPyConnection, *tables: str) -> None:
    """Drop the session build's own temp tables: only names of the fixed ``_TEMP_TABLES`` list, quoted."""
    for table in tables:
        if table not in _TEMP_TABLES:
            raise StoreError(f"internal: {table!r} is not one of the session build's temp tables")
        con.execute(f'DROP TABLE IF EXISTS temp."{table}"')


def _hashes_distinct(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the hashed event scan's ranks are exact (``_HASHES_DISTINCT``); a test forces the other answer."""
    rows = con.execute(_HASHES_DISTINCT).fetchall()
    return bool(rows[0][0])


def _build_displayed(con: duckdb.DuckDBPyConnection, settings: Settings,
                     shown_by: tuple[int, float | None] | None = None) -> dict[str, Any]:
    """Every stage up to ``_ubi_disp`` (ranked searches, displayed docs, clicks) and ``_ubi_sess``.

    Returns the raw counts the quality summary is made of, gathered before each intermediate table is dropped.
    ``shown_by`` (max rank, held-out fraction or None): also keep which system showed which ranking, from the
    query record each search was given here (``ubi_pipeline.processors.clicks.system_rankings.SHOWN_BY``), before that table goes.
    """
    for table in ("ubi_queries", "ubi_events"):
        # tables of a DuckDB store, or views over a Parquet folder (ubi_pipeline.store.parquet_store)
        if not _ints(con, "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table])[0]:
            raise SessionError(f"the store has no {table} table; ingest UBI records first (`ubi import`, `ubi serve`)")
    c: dict[str, Any] = {}
    con.execute(_SEARCH.format(extra=", q.query_attributes" if shown_by is not None else ""))
    if shown_by is not None:
        keep_shown_by(con, *shown_by)
    scan = {"imp": settings.impression_action, "clicks": list(settings.click_actions)}
    con.execute(_EVENTS_HASHED, scan)
    if not _hashes_distinct(con):  # two values share a 64-bit hash: ranks from the strings themselves
        con.execute(_EVENTS_STRINGS, scan)
    _drop(con, "_ubi_search0")
    evidence = _evidence(con, _EVIDENCE)
    c["bases"] = choose_bases(evidence, settings)
    c["evidence"] = [(e.application, e.base0, e.base1, e.checked) for e in evidence.values()]
    bases = effective_bases(c["bases"])
    base = {"apps": list(bases), "bases": [int(b) for b in bases.values()], "base": int(settings.position_base)}
    texts = con.sql("SELECT DISTINCT user_query FROM _ubi_search").to_arrow_table().column(0).to_pylist()
    normalised = [normalize_query(t) for t in texts]
    order = {q: i for i, q in enumerate(sorted(set(normalised)))}
    con.register("_ubi_qnorm", pa.table({
        "user_query": pa.array(texts, pa.string()),
        "query": pa.array(normalised, pa.string()),
        "qkey": pa.array([order[q] for q in normalised], pa.int64()),
    }))
    con.execute(_IMPDOC, base)
    con.execute(_SHOWN)
    c["placed_rows"], c["placed_docs"] = _ints(con, "SELECT coalesce(sum(n), 0), count(*) FROM _ubi_impdoc")
    _drop(con, "_ubi_impdoc", "_ubi_hits")
    (c["query_records"], c["searches"], c["several"], c["hit_only"], c["imp_ranked"], c["imp_displayed"]) = _ints(con, """
        SELECT (SELECT count(*) FROM ubi_queries), count(*), count(*) FILTER (WHERE n_rankings > 1),
               (SELECT count(DISTINCT sid) FROM _ubi_shown0 WHERE origin = 'hit_list'),
               (SELECT count(DISTINCT sid) FROM _ubi_shown0 WHERE origin = 'impressions'),
               (SELECT count(*) FROM _ubi_shown0 WHERE origin = 'impressions')
        FROM _ubi_search""")
    con.execute(_CLICKS, base)
    con.execute(_PLACED)
    con.execute(_DISPLAYED)
    c["clk"] = _ints(con, """
        SELECT count(*),
               count(*) FILTER (WHERE doc_id IS NULL),
               count(*) FILTER (WHERE doc_id IS NOT NULL AND sid IS NULL),
               count(*) FILTER (WHERE doc_id IS NOT NULL AND sid IS NOT NULL AND NOT search_ranked),
               count(*) FILTER (WHERE shown_rank IS NOT NULL AND ord_rank IS NOT NULL),
               count(*) FILTER (WHERE shown_rank IS NOT NULL AND ord_rank IS NOT NULL AND shown_rank <> ord_rank)
        FROM _ubi_clk""")
    c["clicks_displayed"], c["distinct_clicked"], c["placed"] = _ints(con, """
        SELECT count(*), count(DISTINCT (c.sid, c.doc_id)), (SELECT count(*) FROM _ubi_placed)
        FROM _ubi_clk c JOIN _ubi_disp d ON d.sid = c.sid AND d.doc_id = c.doc_id""")
    _drop(con, "_ubi_clk", "_ubi_placed", "_ubi_shown0")
    con.execute(_SESSIONS, {
        "max_rate": float(settings.max_client_queries_per_minute),
        "click_all": bool(settings.filter_click_all),
        "click_all_min": int(settings.click_all_min_results),
    })
    c["imp"] = _ints(con, """
        SELECT count(*),
               count(*) FILTER (WHERE object_id IS NULL),
               count(*) FILTER (WHERE object_id IS NOT NULL AND sid IS NULL),
               count(*) FILTER (WHERE object_id IS NOT NULL AND sid IS NOT NULL AND search_has_hits AND hit_rank IS NULL),
               count(*) FILTER (WHERE object_id IS NOT NULL AND sid IS NOT NULL AND NOT search_has_hits AND bad_ordinal),
               count(*) FILTER (WHERE hit_rank IS NOT NULL AND ord_rank IS NOT NULL),
               count(*) FILTER (WHERE hit_rank IS NOT NULL AND ord_rank IS NOT NULL AND hit_rank <> ord_rank)
        FROM (SELECT object_id, sid, search_has_hits, hit_rank, """ + _ORD_RANK + """ AS ord_rank,
                     """ + _BAD_ORDINAL + """ AS bad_ordinal
              FROM _ubi_ev WHERE is_imp)""", base)
    _drop(con, "_ubi_ev")
    return c


def _cleanup(con: duckdb.DuckDBPyConnection) -> None:
    _drop(con, *_TEMP_TABLES)
    for view in ("_ubi_qnorm",):
        try:
            con.unregister(view)
        except duckdb.Error:
            pass


def _ints(con: duckdb.DuckDBPyConnection, sql: str, params: Any = None) -> list[int]:
    rows = con.execute(sql, params).fetchall()  # fetchall: DuckDB 2 keeps a half-read result open
    return [int(v or 0) for v in rows[0]] if rows else []


def _quality(c: dict[str, Any]) -> QualitySummary:
    imp, clk = c["imp"], c["clk"]
    return QualitySummary(
        query_records=c["query_records"],
        searches=c["searches"],
        duplicate_query_records=c["query_records"] - c["searches"],
        searches_with_several_rankings=c["several"],
        searches_without_ranking=c["searches"] - c["hit_only"] - c["imp_ranked"],
        searches_ranked_by_impressions=c["imp_ranked"],
        searches_ranked_by_hit_list=c["hit_only"],
        impression_events=imp[0],
        impressions_without_object_id=imp[1],
        impressions_without_search=imp[2],
        impressions_outside_ranking=imp[3],
        impressions_bad_ordinal=imp[4],
        duplicate_impressions=c["placed_rows"] - c["placed_docs"],
        impression_rank_collisions=c["placed_docs"] - c["imp_displayed"],
        impressions_displayed=c["imp_displayed"],
        impression_rank_checked=imp[5],
        impression_rank_disagreements=imp[6],
        click_events=clk[0],
        clicks_without_object_id=clk[1],
        clicks_without_search=clk[2],
        clicks_on_search_without_ranking=clk[3],
        clicks_on_undisplayed=clk[0] - clk[1] - clk[2] - clk[3] - c["clicks_displayed"],
        clicks_displayed=c["clicks_displayed"],
        clicks_placed_by_ordinal=c["placed"],
        repeat_clicks=c["clicks_displayed"] - c["distinct_clicked"],
        click_rank_checked=clk[4],
        click_rank_disagreements=clk[5],
        ordinal_base_evidence={app: {"base0": int(b0), "base1": int(b1), "checked": int(n)}
                               for app, b0, b1, n in c["evidence"]},
        ordinal_bases=c["bases"],
    )


def _filters(con: duckdb.DuckDBPyConnection, k: int, quality: QualitySummary) -> FilterCounts:
    ranked, empty, bots, click_all, bot_clients, kept_any = _ints(con, """
        SELECT count(*), count(*) FILTER (WHERE dropped = 'empty_query'), count(*) FILTER (WHERE dropped = 'bot'),
               count(*) FILTER (WHERE dropped = 'click_all'), count(DISTINCT client_id) FILTER (WHERE dropped = 'bot'),
               count(*) FILTER (WHERE dropped IS NULL)
        FROM _ubi_sess""")
    kept_k, imps, clicks = _ints(con, "SELECT count(DISTINCT sid), count(*), count(*) FILTER (WHERE clicked) FROM _ubi_kept")
    beyond = _ints(con, """
        SELECT count(*), count(*) FILTER (WHERE clicked)
        FROM _ubi_disp d JOIN _ubi_sess s USING (sid) WHERE s.dropped IS NULL AND d.rank > $k""", {"k": k})
    return FilterCounts(
        ranked_searches=ranked,
        empty_query_searches=empty,
        bot_clients=bot_clients,
        bot_searches=bots,
        click_all_searches=click_all,
        clicks_without_search=quality.clicks_without_search,
        sessions_empty_within_k=kept_any - kept_k,
        sessions=kept_k,
        impressions=imps,
        clicks=clicks,
        impressions_beyond_k=beyond[0],
        clicks_beyond_k=beyond[1],
    )


def _np(table: pa.Table, name: str, dtype: Any) -> np.ndarray:
    return table.column(name).to_numpy().astype(dtype, copy=False)


def _fill_patterns(con: duckdb.DuckDBPyConnection, n: int, k: int, n_pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """The [n, K] ``docs`` and ``clicks`` of the ``n`` patterns of ``_ubi_pat``, filled batch by batch.

    Each code of a signature is ``((rank * n_pairs) + pair) * 2 + clicked`` (``_PATTERNS``). Only the two arrays
    and one batch of ``PATTERN_BATCH`` codes are held at a time: at 20M events the patterns have about 10M
    shown ranks, which as one Arrow table and its numpy copies took more memory than the arrays themselves.
    """
    docs = np.full((n, k), -1, dtype=np.int64)
    clicks = np.zeros((n, k), dtype=bool)
    reader = con.sql(_PATTERN_CODES).to_arrow_reader(PATTERN_BATCH)
    for batch in reader:
        pid = batch.column(0).to_numpy().astype(np.int64, copy=False)
        code = batch.column(1).to_numpy().astype(np.int64, copy=False)
        rest = code // 2
        col = rest // n_pairs - 1
        docs[pid, col] = rest % n_pairs
        clicks[pid, col] = (code % 2) == 1
    return docs, clicks


def load_sessions(con: duckdb.DuckDBPyConnection, settings: Settings | None = None, *,
                  max_rank: int | None = None, application: str | None | object = ALL_APPLICATIONS,
                  holdout: float | None = None, systems: bool = False) -> SessionData:
    """Build sessions from the UBI tables on ``con`` and aggregate them to PBM cells, UBM cells and patterns.

    ``con`` may be read-only (``ubi_pipeline.store.client.open_reader``): only temporary tables are created, and
    dropped before returning. ``max_rank`` defaults to ``Settings.max_rank``. ``application`` keeps the
    searches of one application (``None``: those without one; filters and counts still cover the whole log).
    ``holdout`` (a fraction in (0, 1)) marks each pattern as held out or not by its searches' ``query_id``
    (:func:`holdout_flags`), for model selection; ``SessionData.split`` then gives both halves.
    ``systems``: also which system showed which ranking (``SessionData.systems``, and with ``holdout``
    ``SessionData.train_systems``, the training fold's), for the PBM/UBM prior: taken from the search table
    this build makes (:mod:`ubi_pipeline.processors.clicks.system_rankings`), so ``ubi_queries`` is read once.
    """
    settings = settings or Settings()
    k = int(max_rank if max_rank is not None else settings.max_rank)
    if k < 1:
        raise SessionError(f"max_rank must be at least 1, got {k}")
    if holdout is not None and not 0.0 < holdout < 1.0:
        raise SessionError(f"the held-out fraction must lie strictly between 0 and 1, got {holdout}")
    every = application is ALL_APPLICATIONS
    try:
        quality = _quality(_build_displayed(con, settings, (k, holdout) if systems else None))
        if holdout is not None:
            con.execute(_FOLD, {"cut": holdout_cut(holdout)})
        con.execute(_KEPT, {"k": k, "all_apps": every, "app": None if every else application})
        filters = _filters(con, k, quality)
        dropped = con.sql(_DROPPED).to_arrow_table()
        _drop(con, "_ubi_disp")
        con.execute(_PAIRS)
        con.execute(_KEPT_P)
        _drop(con, "_ubi_kept")
        pt = con.sql("""SELECT q.query, p.doc_id, p.qi FROM _ubi_pairs p
                        JOIN (SELECT DISTINCT qkey, query FROM _ubi_qnorm) q USING (qkey) ORDER BY p.pair""").to_arrow_table()
        pairs = PairIndex(
            queries=np.array(pt.column("query").to_pylist(), dtype=object),
            doc_ids=np.array(pt.column("doc_id").to_pylist(), dtype=object),
            query_index=_np(pt, "qi", np.int64),
        )
        ct = con.sql(_CELLS).to_arrow_table()
        cells = ClickCells(pairs, _np(ct, "pair", np.int64), _np(ct, "rank", np.int64),
                           _np(ct, "impressions", np.int64), _np(ct, "clicks", np.int64), k)
        n_pairs = {"n_pairs": max(len(pairs), 1)}
        con.execute(_PATTERNS if holdout is None else _PATTERNS_FOLD, n_pairs)
        _drop(con, "_ubi_kp")
        wt = con.sql(f"SELECT qi, weight, {'fold' if holdout is not None else 'false AS fold'} FROM _ubi_pat "
                     "ORDER BY pattern").to_arrow_table()
        docs, clicks = _fill_patterns(con, wt.num_rows, k, n_pairs["n_pairs"])
        shown = train_shown = None
        if systems:
            shown = shown_rankings(con, k, application=application)
            if holdout is not None:
                train_shown = shown_rankings(con, k, application=application, train_only=True)
    except duckdb.Error as exc:
        raise StoreError(f"building sessions failed in DuckDB: {exc}") from exc
    finally:
        _cleanup(con)
    patterns = SessionPatterns(pairs, _np(wt, "qi", np.int64), docs, clicks, _np(wt, "weight", np.int64))
    # UBM cells come from the (fewer) deduplicated patterns, in numpy, when first read (SessionData.ubm_cells): as
    # Spark's sessions get them, and cheaper than a per-pattern window in SQL (1.2 s of CPU at 5M events)
    try:
        cells.check()
        patterns.check()
    except StatsError as exc:
        raise SessionError(f"session statistics are inconsistent (a bug): {exc}") from exc
    held = wt.column("fold").to_numpy(zero_copy_only=False).astype(bool) if holdout is not None else None
    app = None if every else cast("str | None", application)
    return SessionData(pairs, cells, None, patterns, quality, filters, k, held,  # type: ignore[arg-type]
                       app, shown, train_shown, dropped)


def applications(con: duckdb.DuckDBPyConnection) -> list[str | None]:
    """Applications of the stored searches (None for searches without one), sorted, None last."""
    try:
        rows = con.execute("SELECT DISTINCT application FROM ubi_queries").fetchall()
    except duckdb.Error as exc:
        raise StoreError(f"reading applications failed in DuckDB: {exc}") from exc
    names = sorted(r[0] for r in rows if r[0] is not None)
    return [*names, *([None] if any(r[0] is None for r in rows) else [])]


def read_sessions(db: Path | str, settings: Settings | None = None, *, max_rank: int | None = None,
                  **options: Any) -> SessionData:
    """:func:`load_sessions` on the store at ``db``, read through ``open_reader`` (works while a collector runs).

    ``Settings.memory_limit`` bounds DuckDB's memory on this connection (it spills to ``Settings.temp_directory``).
    ``options`` (``application``, ``holdout``) go to :func:`load_sessions`.
    """
    settings = settings or Settings()
    with reading(db, settings) as con:
        apply_limits(con, settings)
        return load_sessions(con, settings, max_rank=max_rank, **options)


def iter_sessions(con: duckdb.DuckDBPyConnection, settings: Settings | None = None, *,
                  max_rank: int | None = None, include_filtered: bool = False,
                  batch: int = 10_000) -> Iterator[Session]:
    """Kept sessions one by one, ordered by time then ``query_id``, cut at ``max_rank`` (for small uses).

    The same rules as :func:`load_sessions`; with ``include_filtered`` the filtered searches come too.
    The whole result is read before the first session is yielded (temporary tables are dropped first).
    """
    settings = settings or Settings()
    k = int(max_rank if max_rank is not None else settings.max_rank)
    try:
        _build_displayed(con, settings)
        table = con.sql("""
            SELECT q.query_id, n.query, list(d.doc_id ORDER BY d.rank) AS doc_ids, list(d.rank ORDER BY d.rank) AS ranks,
                   list(d.clicked ORDER BY d.rank) AS clicked, s.client_id, s.application, s.ts
            FROM _ubi_sess s JOIN _ubi_disp d USING (sid) JOIN _ubi_search q USING (sid)
            JOIN (SELECT DISTINCT qkey, query FROM _ubi_qnorm) n USING (qkey)
            WHERE d.rank <= $k AND (s.dropped IS NULL OR $all)
            GROUP BY ALL ORDER BY s.ts NULLS LAST, q.query_id""", params={"k": k, "all": include_filtered}).to_arrow_table()
    except duckdb.Error as exc:
        raise StoreError(f"building sessions failed in DuckDB: {exc}") from exc
    finally:
        _cleanup(con)
    for chunk in table.to_batches(batch):
        for row in chunk.to_pylist():
            yield Session(row["query_id"], row["query"], tuple(row["doc_ids"]), tuple(row["ranks"]),
                          tuple(row["clicked"]), row["client_id"], row["application"], row["ts"])


def patterns_from_sessions(sessions: Iterable[Session], max_rank: int = 10) -> SessionPatterns:
    """Weighted patterns from a few sessions held in Python (tests, hand-made examples); pairs sorted.

    Ranks deeper than ``max_rank`` are cut; identical (query, ranking, clicks) sessions are merged.
    """
    k = int(max_rank)
    sigs: dict[tuple[str, tuple[tuple[int, str, bool], ...]], int] = {}
    for s in sessions:
        if not (len(s.doc_ids) == len(s.ranks) == len(s.clicked)):
            raise SessionError(f"session {s.query_id!r}: doc_ids, ranks and clicked differ in length")
        if len(set(s.ranks)) != len(s.ranks) or any(r < 1 for r in s.ranks):
            raise SessionError(f"session {s.query_id!r}: ranks must be distinct and at least 1, got {s.ranks}")
        shown = tuple(sorted((r, d, bool(c)) for d, r, c in zip(s.doc_ids, s.ranks, s.clicked, strict=True) if r <= k))
        if shown:
            key = (s.query, shown)
            sigs[key] = sigs.get(key, 0) + 1
    pair_keys = sorted({(q, d) for q, shown in sigs for _, d, _ in shown})
    pair_of = {p: i for i, p in enumerate(pair_keys)}
    queries = sorted({q for q, _ in pair_keys})
    q_of = {q: i for i, q in enumerate(queries)}
    pairs = PairIndex(
        queries=np.array([q for q, _ in pair_keys], dtype=object),
        doc_ids=np.array([d for _, d in pair_keys], dtype=object),
        query_index=np.array([q_of[q] for q, _ in pair_keys], dtype=np.int64),
    )
    ordered = sorted(sigs.items(), key=lambda kv: (q_of[kv[0][0]], [(r, pair_of[(kv[0][0], d)], c) for r, d, c in kv[0][1]]))
    docs = np.full((len(ordered), k), -1, dtype=np.int64)
    clicks = np.zeros((len(ordered), k), dtype=bool)
    weight = np.zeros(len(ordered), dtype=np.int64)
    query = np.zeros(len(ordered), dtype=np.int64)
    for i, ((q, shown), w) in enumerate(ordered):
        query[i], weight[i] = q_of[q], w
        for r, d, c in shown:
            docs[i, r - 1] = pair_of[(q, d)]
            clicks[i, r - 1] = c
    return SessionPatterns(pairs, query, docs, clicks, weight)
