"""Online metrics per system, from the event log, each with a confidence interval.

Per-search facts are computed in DuckDB SQL over the temp tables :func:`ubi_pipeline.reports.systems.load_searches`
leaves on the connection; the intervals are numpy (:mod:`ubi_pipeline.reports.intervals`). Definitions (a *search* is a
search instance, see :mod:`ubi_pipeline.reports.systems`; a search *with results* has a known non-empty ranking or a click):

- ``ctr``: distinct clicked results / displayed results. Displayed = the docs of its impression events when
  it has any (those outside its hit list belong to another sub-search and are left out, as in
  :mod:`ubi_pipeline.processors.clicks.sessions`), else its whole hit list; a clicked doc counts as displayed. Wilson interval
  over results.
- ``ctr@k``: the same over results at rank <= k.
- ``abandonment``: searches with results and no click / searches with results. Wilson.
- ``zero_result_rate``: zero-result searches / searches whose result count is known. Wilson.
- ``rr_first_click``: 1 / rank of the first click in time (0 when no click, or when that click has no
  rank), mean over searches with results. Bootstrap.
- ``clicks_per_search``: click events / search, mean over searches with results. Bootstrap.
- ``time_to_first_click``: seconds from the search's timestamp to its first click, mean over searches with a
  click and a timestamp (negative gaps, clock skew, are dropped). Bootstrap.

Means get a percentile bootstrap interval up to ``resample_limit`` searches and the t interval above it
(:func:`ubi_pipeline.reports.intervals.mean_interval`); ``Interval.method`` says which.
- ``reformulation_rate``: searches followed, in the same session, within ``window`` seconds, by a search
  with a different query text / searches with a session. Wilson. The session is the events' ``session_id``,
  else the query record's ``client_id``.

**Filtered searches.** ``excluded`` (query_id, reason) is the session filter's verdict
(``ubi_pipeline.processors.clicks.sessions.SessionData.dropped``: bot clients, searches with a click on every
displayed result, empty queries): those searches are left out of every figure, as they are left out of the
click models and so of the implicit judgments, and each system's :attr:`OnlineMetrics.left_out` counts them
by reason. A crawler then moves no online figure, nor the A/B lines and prediction baselines built on them.

A click's rank is its doc's place in the logged ranking; else ``position.ordinal`` with ``position_base``
(per application when ``position_base_by_application`` says so).
Wilson intervals treat each unit (result or search) as an independent trial; results of one search are not
quite independent, so the result-level intervals of ``ctr`` are somewhat too narrow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from ubi_pipeline.reports.intervals import RESAMPLE_LIMIT, Interval, mean_interval, wilson, wilson_arrays
from ubi_pipeline.reports.systems import DEFAULT_IMPRESSION_ACTIONS
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.store.sql import sql_string_list

DEFAULT_CLICK_ACTIONS: tuple[str, ...] = ("click",)

#: Online metric names in report order, and whether higher is better.
ONLINE_METRICS: tuple[tuple[str, bool], ...] = (
    ("ctr", True),
    ("ctr@k", True),
    ("abandonment", False),
    ("zero_result_rate", False),
    ("rr_first_click", True),
    ("clicks_per_search", True),
    ("time_to_first_click", False),
    ("reformulation_rate", False),
)


class OnlineError(UbiError):
    """Online metrics asked for before the searches were loaded, or with bad settings."""


@dataclass
class RankCtr:
    """CTR at each rank 1..K: displayed and clicked results there, with Wilson intervals."""

    rank: list[int]
    shown: list[int]
    clicked: list[int]
    ctr: list[float]
    low: list[float]
    high: list[float]


@dataclass
class OnlineMetrics:
    """The online metrics of one system (names as in :data:`ONLINE_METRICS`, ``ctr@k`` spelled ``ctr@<k>``)."""

    system: str
    searches: int
    searches_with_results: int
    metrics: dict[str, Interval] = field(default_factory=dict)
    ctr_by_rank: RankCtr | None = None
    notes: dict[str, int] = field(default_factory=dict)
    #: searches the session filter dropped, left out of every figure here, by reason (module docstring)
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def searches_left_out(self) -> int:
        return sum(self.left_out.values())


def _base_sql(base: int, by_application: Mapping[str, int] | None, alias: str) -> str:
    """The position base of each search as SQL: per application when configured, else ``base``."""
    if not by_application:
        return str(int(base))
    whens = " ".join(
        f"WHEN '{app.replace(chr(39), chr(39) * 2)}' THEN {int(b)}" for app, b in sorted(by_application.items())
    )
    return f"(CASE {alias}.application {whens} ELSE {int(base)} END)"


def _exposure_ctes(base: str, clicks: str, imps: str, searches: str = "_ubi_searches") -> str:
    """CTEs ``ev`` (events with click / impression flags) and ``exposure`` (one row per search and result)."""
    return f"""
    ev AS (
        SELECT instance, action_name, object_id, timestamp, position_ordinal,
               action_name IN ({clicks}) AS is_click, action_name IN ({imps}) AS is_imp
        FROM _ubi_search_events
    ), has_imp AS (
        SELECT DISTINCT instance FROM ev WHERE is_imp AND object_id IS NOT NULL
    ), docs AS (
        SELECT instance, object_id AS doc_id, min(position_ordinal) AS ord, bool_or(is_click) AS clicked
        FROM ev WHERE (is_imp OR is_click) AND object_id IS NOT NULL GROUP BY instance, object_id
        UNION ALL
        SELECT s.instance, unnest(s.ranking) AS doc_id, NULL::INTEGER AS ord, false AS clicked
        FROM {searches} s ANTI JOIN has_imp h USING (instance)
    ), exposure AS (
        SELECT d.instance, d.doc_id, d.clicked,
               coalesce(list_position(s.ranking, d.doc_id),
                        CASE WHEN d.ord - {base} + 1 >= 1 THEN d.ord - {base} + 1 END) AS rank
        FROM (SELECT instance, doc_id, bool_or(clicked) AS clicked, min(ord) AS ord FROM docs
              GROUP BY instance, doc_id) d
        JOIN {searches} s USING (instance)
        -- an impression of a doc outside the hit list belongs to another sub-search (ubi_pipeline.processors.clicks.sessions)
        WHERE d.clicked OR s.ranking_source <> 'hits' OR list_position(s.ranking, d.doc_id) IS NOT NULL
    )"""


def _per_search_sql(base: str, clicks: str, imps: str, searches: str = "_ubi_searches") -> str:
    return "WITH " + _exposure_ctes(base, clicks, imps, searches) + f""", click_ranked AS (
        SELECT e.instance, e.timestamp,
               coalesce(list_position(s.ranking, e.object_id),
                        CASE WHEN e.position_ordinal - {base} + 1 >= 1 THEN e.position_ordinal - {base} + 1 END) AS rank,
               list_position(s.ranking, e.object_id) IS NULL AND e.object_id IS NOT NULL AS off_list
        FROM ev e JOIN {searches} s USING (instance) WHERE e.is_click
    ), first_click AS (
        SELECT instance, rank AS first_rank, timestamp AS first_ts, count(*) OVER (PARTITION BY instance) AS n_clicks,
               sum(off_list::INTEGER) OVER (PARTITION BY instance) AS off_list,
               row_number() OVER (PARTITION BY instance ORDER BY timestamp, rank NULLS LAST) AS rn
        FROM click_ranked
    ), reform AS (
        SELECT DISTINCT a.instance FROM {searches} a JOIN {searches} b
          ON a.session = b.session AND b.instance <> a.instance AND b.query <> a.query
         AND b.ts >= a.ts AND b.ts <= a.ts + to_microseconds(CAST($window * 1e6 AS BIGINT))
         AND (b.ts > a.ts OR b.instance > a.instance)
    ), expo AS (
        SELECT instance, count(*) AS shown, sum(clicked::INTEGER) AS clicked_docs,
               count(*) FILTER (WHERE rank <= $k) AS shown_k,
               count(*) FILTER (WHERE rank <= $k AND clicked) AS clicked_k
        FROM exposure GROUP BY instance
    )
    SELECT s.instance, list_position($systems::VARCHAR[], s.system) AS system_code, s.zero_result, s.ranking_source <> 'none' OR s.zero_result AS count_known,
           s.session IS NOT NULL AS has_session, r.instance IS NOT NULL AS reformulated,
           coalesce(f.n_clicks, 0) AS n_clicks, f.first_rank,
           epoch(f.first_ts - s.ts) AS first_secs, coalesce(f.off_list, 0) AS off_list,
           coalesce(x.shown, 0) AS shown, coalesce(x.clicked_docs, 0) AS clicked_docs,
           coalesce(x.shown_k, 0) AS shown_k, coalesce(x.clicked_k, 0) AS clicked_k
    FROM {searches} s
    LEFT JOIN (SELECT * FROM first_click WHERE rn = 1) f USING (instance)
    LEFT JOIN reform r USING (instance)
    LEFT JOIN expo x USING (instance)
    ORDER BY s.instance
    """


def _rank_sql(base: str, clicks: str, imps: str, searches: str = "_ubi_searches") -> str:
    return "WITH " + _exposure_ctes(base, clicks, imps, searches) + f"""
    SELECT s.system, e.rank, count(*) AS shown, sum(e.clicked::INTEGER) AS clicked
    FROM exposure e JOIN {searches} s USING (instance)
    WHERE e.rank IS NOT NULL AND e.rank <= $max_rank
    GROUP BY s.system, e.rank ORDER BY s.system, e.rank
    """


# The searches the online figures are computed on: every search instance but the filtered ones (a view, so
# the rankings are not copied), and the filtered ones counted per system and reason.
_ONLINE_VIEW = """
CREATE OR REPLACE TEMP VIEW _ubi_online AS
SELECT s.* FROM _ubi_searches s ANTI JOIN _ubi_excluded x USING (query_id)
"""
_LEFT_OUT = """
SELECT s.system, x.reason, count(*) FROM _ubi_searches s
JOIN (SELECT query_id, min(reason) AS reason FROM _ubi_excluded GROUP BY query_id) x USING (query_id)
WHERE s.system IS NOT NULL GROUP BY ALL ORDER BY ALL
"""


def _exclude(con: duckdb.DuckDBPyConnection, excluded: pa.Table) -> dict[str, dict[str, int]]:
    """Temp table ``_ubi_excluded`` and view ``_ubi_online`` (module docstring); the left-out counts per system."""
    if set(excluded.column_names) != {"query_id", "reason"}:
        raise OnlineError(f"excluded searches need the columns query_id and reason, got {excluded.column_names}")
    con.register("_ubi_excluded_in", excluded)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _ubi_excluded AS SELECT CAST(query_id AS VARCHAR) AS query_id, "
                    "CAST(reason AS VARCHAR) AS reason FROM _ubi_excluded_in")
    finally:
        con.unregister("_ubi_excluded_in")
    con.execute(_ONLINE_VIEW)
    out: dict[str, dict[str, int]] = {}
    for system, reason, n in con.execute(_LEFT_OUT).fetchall():
        out.setdefault(system, {})[reason] = int(n)
    return out


def _drop_exclusion(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("DROP VIEW IF EXISTS temp._ubi_online")
    con.execute("DROP TABLE IF EXISTS temp._ubi_excluded")


def online_metrics(
    con: duckdb.DuckDBPyConnection,
    *,
    k: int = 10,
    position_base: int = 0,
    position_base_by_application: Mapping[str, int] | None = None,
    click_actions: Sequence[str] = DEFAULT_CLICK_ACTIONS,
    impression_actions: Sequence[str] = DEFAULT_IMPRESSION_ACTIONS,
    reformulation_window_s: float = 60.0,
    max_rank: int = 20,
    confidence: float = 0.95,
    n_boot: int = 2_000,
    seed: int = 0,
    resample_limit: int = RESAMPLE_LIMIT,
    excluded: pa.Table | None = None,
) -> dict[str, OnlineMetrics]:
    """Online metrics of every system on ``con`` (call :func:`ubi_pipeline.reports.systems.load_searches` first),
    leaving out the searches of ``excluded`` (query_id, reason; module docstring)."""
    if k < 1 or max_rank < 1:
        raise OnlineError(f"k and max_rank must be >= 1, got k={k}, max_rank={max_rank}")
    if reformulation_window_s <= 0:
        raise OnlineError(f"the reformulation window must be positive seconds, got {reformulation_window_s}")
    try:
        con.execute("SELECT 1 FROM _ubi_searches LIMIT 0")
    except duckdb.CatalogException as exc:
        raise OnlineError("call ubi_pipeline.reports.systems.load_searches(con) before online_metrics(con)") from exc
    clicks, imps = sql_string_list(click_actions), sql_string_list(impression_actions)
    base = _base_sql(position_base, position_base_by_application, "s")
    # a search's system comes back as its 1-based position in ``names``, not as a string: at 50M events the
    # 4.17M searches' system names were 4.17M Python strings (about 270 MB) held beside the other columns
    names = [r[0] for r in con.execute("SELECT DISTINCT system FROM _ubi_searches WHERE system IS NOT NULL "
                                       "ORDER BY system").fetchall()]
    left_out: dict[str, dict[str, int]] = {}
    searches = "_ubi_searches"
    try:
        if excluded is not None and excluded.num_rows:
            left_out, searches = _exclude(con, excluded), "_ubi_online"
        cols = con.execute(
            _per_search_sql(base, clicks, imps, searches),
            {"window": float(reformulation_window_s), "k": int(k), "systems": names},
        ).fetchnumpy()
        rank_rows = con.execute(_rank_sql(base, clicks, imps, searches), {"max_rank": int(max_rank)}).fetchall()
    finally:
        if searches != "_ubi_searches":
            _drop_exclusion(con)
    codes = np.asarray(cols.pop("system_code"))
    out: dict[str, OnlineMetrics] = {}
    for code, name in enumerate(names, start=1):
        m = codes == code
        out[name] = _system_metrics(name, {c: v[m] for c, v in cols.items()}, k, confidence,
                                    {"n_boot": n_boot, "seed": seed, "resample_limit": resample_limit})
        out[name].left_out = left_out.get(name, {})
    for name in out:
        rows = [r for r in rank_rows if r[0] == name]
        shown = np.zeros(max_rank, dtype=np.int64)
        clicked = np.zeros(max_rank, dtype=np.int64)
        for _, rank, s, c in rows:
            shown[rank - 1], clicked[rank - 1] = s, c
        p, lo, hi = wilson_arrays(clicked, shown, confidence)
        out[name].ctr_by_rank = RankCtr(
            list(range(1, max_rank + 1)), shown.tolist(), clicked.tolist(), p.tolist(), lo.tolist(), hi.tolist()
        )
    return out


def _as_float(a: np.ndarray) -> np.ndarray:
    """DuckDB gives nullable numbers as masked arrays; NULL becomes NaN."""
    return np.ma.filled(np.ma.asarray(a).astype(float), np.nan)


def _as_bool(a: np.ndarray) -> np.ndarray:
    return np.ma.filled(np.ma.asarray(a), False).astype(bool)


def _system_metrics(
    name: str, c: dict[str, np.ndarray], k: int, confidence: float, boot: dict[str, int]
) -> OnlineMetrics:
    zero = _as_bool(c["zero_result"])
    known = _as_bool(c["count_known"])
    n_clicks = _as_float(c["n_clicks"])
    with_results = (known & ~zero) | (n_clicks > 0)
    first_rank = _as_float(c["first_rank"])
    first_secs = _as_float(c["first_secs"])
    shown, clicked = _as_float(c["shown"]), _as_float(c["clicked_docs"])
    shown_k, clicked_k = _as_float(c["shown_k"]), _as_float(c["clicked_k"])
    has_session = _as_bool(c["has_session"])
    reform = _as_bool(c["reformulated"])

    rr = np.where(np.isnan(first_rank), 0.0, 1.0 / np.where(np.isnan(first_rank), 1.0, first_rank))
    ttfc = first_secs[(n_clicks > 0) & ~np.isnan(first_secs) & (first_secs >= 0)]
    res = OnlineMetrics(name, int(len(zero)), int(with_results.sum()))
    res.metrics = {
        "ctr": wilson(int(clicked[with_results].sum()), int(shown[with_results].sum()), confidence),
        f"ctr@{k}": wilson(int(clicked_k[with_results].sum()), int(shown_k[with_results].sum()), confidence),
        "abandonment": wilson(int((with_results & (n_clicks == 0)).sum()), int(with_results.sum()), confidence),
        "zero_result_rate": wilson(int((zero & known).sum()), int(known.sum()), confidence),
        "rr_first_click": mean_interval(rr[with_results], confidence=confidence, **boot),
        "clicks_per_search": mean_interval(n_clicks[with_results], confidence=confidence, **boot),
        "time_to_first_click": mean_interval(ttfc, confidence=confidence, **boot),
        "reformulation_rate": wilson(int((reform & has_session).sum()), int(has_session.sum()), confidence),
    }
    res.notes = {
        "searches_unknown_result_count": int((~known).sum()),
        "clicks_off_ranking": int(_as_float(c["off_list"]).sum()),
        "clicks_without_rank_first": int(((n_clicks > 0) & np.isnan(first_rank)).sum()),
    }
    return res
