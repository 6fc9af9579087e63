"""The report's "Interleaving" section: interleaved searches from the store, their outcomes, gates, rendering.

An interleaved search is a query record whose ``query_attributes.interleaving`` holds the team assignment
(shape in :mod:`ubi_pipeline.schemas.interleaving`). Its clicks are the click events of its ``query_id``
(``Settings.click_actions``); a click on a doc outside ``teams`` credits nobody. Several records of one
``query_id`` use the first that carries the block. Gate names: ``interleaving/<challenger>-vs-<reference>/
win_rate`` (also ``preference``, ``p_value``, ``query_win_rate``), attached to the logged systems whose
searches were interleaved.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import duckdb

from ubi_pipeline.reports.interleaving_outcomes import InterleavedSearch, InterleavingResult, analyse
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.store.sql import sql_string_list

_SQL = """
WITH il AS (
    SELECT query_id,
           arg_min(CAST(json_extract(query_attributes, '$.interleaving') AS VARCHAR), query_key) AS block,
           arg_min(user_query, query_key) AS user_query
    FROM ubi_queries
    WHERE query_attributes IS NOT NULL AND json_extract(query_attributes, '$.interleaving') IS NOT NULL
    GROUP BY query_id
), clicks AS (
    SELECT query_id, list(DISTINCT object_id) AS docs FROM ubi_events
    WHERE action_name IN ({clicks}) AND object_id IS NOT NULL AND query_id IN (SELECT query_id FROM il)
    GROUP BY query_id
)
SELECT il.query_id, il.user_query, il.block, coalesce(c.docs, []::VARCHAR[]) AS docs, s.system
FROM il LEFT JOIN clicks c USING (query_id) LEFT JOIN {systems} s USING (query_id)
ORDER BY il.query_id
"""


def load_interleaved(con: duckdb.DuckDBPyConnection, click_actions: Sequence[str]) -> tuple[list[InterleavedSearch], dict[str, set[str]], int]:
    """Interleaved searches of the store, the systems per experiment key, and the count of unreadable blocks.

    Uses ``_ubi_searches`` (``ubi_pipeline.reports.systems.load_searches``) for each search's system when present.
    """
    try:
        con.execute("SELECT 1 FROM _ubi_searches LIMIT 0")
        systems = "(SELECT query_id, any_value(system) AS system FROM _ubi_searches GROUP BY query_id)"
    except duckdb.CatalogException:
        systems = "(SELECT NULL::VARCHAR AS query_id, NULL::VARCHAR AS system WHERE false)"
    try:
        rows = con.execute(_SQL.format(clicks=sql_string_list(click_actions), systems=systems)).fetchall()
    except duckdb.Error as exc:
        raise StoreError(f"reading interleaved searches failed in DuckDB: {exc}") from exc
    out: list[InterleavedSearch] = []
    where: dict[str, set[str]] = {}
    bad = 0
    for qid, user_query, block, docs, system in rows:
        try:
            data = json.loads(block)
            rankers = tuple(str(r) for r in data["rankers"])
            teams = {str(d): str(t) for d, t in data["teams"].items()}
        except (ValueError, TypeError, KeyError, AttributeError):
            bad += 1
            continue
        if len(rankers) != 2 or rankers[0] == rankers[1]:
            bad += 1
            continue
        out.append(InterleavedSearch(qid, normalize_query(user_query or ""), (rankers[0], rankers[1]), teams,
                                     frozenset(docs)))
        if system is not None:
            where.setdefault(f"{rankers[1]}-vs-{rankers[0]}", set()).add(system)
    return out, where, bad


def interleaving_results(con: duckdb.DuckDBPyConnection, click_actions: Sequence[str], *, n_boot: int = 2000,
                         confidence: float = 0.95, seed: int = 0) -> tuple[list[InterleavingResult], list[str]]:
    """Every interleaving experiment of the store, and notes (unreadable blocks)."""
    searches, where, bad = load_interleaved(con, click_actions)
    results = [replace(r, systems=tuple(sorted(where.get(r.experiment, ()))))
               for r in analyse(searches, n_boot=n_boot, confidence=confidence, seed=seed)]
    notes = [f"{bad} query records carry an unreadable query_attributes.interleaving block (left out)"] if bad else []
    return results, notes


#: The statistics a gate may name as ``interleaving/<experiment>/<name>``.
GATE_STATISTICS = ("win_rate", "preference", "p_value", "query_win_rate")


def gate_values(results: Sequence[InterleavingResult]) -> dict[str, dict[str, tuple[float, int | None]]]:
    """``interleaving/<experiment>/<name>`` per system the experiment's searches belong to."""
    out: dict[str, dict[str, tuple[float, int | None]]] = {}
    for r in results:
        s, q = r.by_search, r.by_query
        values = {"win_rate": (s.win_rate, s.wins + s.losses), "preference": (s.preference, s.n),
                  "p_value": (s.p_value, s.wins + s.losses), "query_win_rate": (q.win_rate, q.wins + q.losses)}
        for system in r.systems or ("(interleaving)",):
            for name, v in values.items():
                out.setdefault(system, {})[f"interleaving/{r.experiment}/{name}"] = v
    return out


def table(results: Sequence[InterleavingResult]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the text/markdown table: one row per experiment and level (searches, queries)."""
    def num(x: float, d: int = 3) -> str:
        return "-" if x != x else f"{x:.{d}f}"

    head = ["experiment", "level", "n", "wins", "losses", "ties", "win rate [CI]", "preference", "sign test p"]
    rows = []
    for r in results:
        for level, t in (("searches", r.by_search), ("queries", r.by_query)):
            rows.append([r.experiment, level, str(t.n), str(t.wins), str(t.losses), str(t.ties),
                         f"{num(t.win_rate)} [{num(t.ci_low)}, {num(t.ci_high)}]", num(t.preference),
                         num(t.p_value, 4)])
    return head, rows


def to_json(results: Sequence[InterleavingResult]) -> list[dict[str, Any]]:
    """Plain JSON of every experiment (tallies at both levels and the per-query outcomes)."""
    def tally(t: Any) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if x != x else round(float(x), 6)

        return {"n": t.n, "wins": t.wins, "losses": t.losses, "ties": t.ties, "win_rate": num(t.win_rate),
                "ci_low": num(t.ci_low), "ci_high": num(t.ci_high), "preference": num(t.preference),
                "p_value": num(t.p_value)}

    return [{"experiment": r.experiment, "reference": r.reference, "challenger": r.challenger,
             "systems": list(r.systems), "searches": r.searches, "searches_without_clicks": r.searches_without_clicks,
             "credited_clicks": {r.reference: r.credited_clicks[0], r.challenger: r.credited_clicks[1]},
             "queries": r.queries, "by_search": tally(r.by_search), "by_query": tally(r.by_query),
             "per_query": r.per_query} for r in results]
