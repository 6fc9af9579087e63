"""Reading what the estimators need from the store: session patterns, and the arms of a swap experiment.

Patterns come from :func:`ubi_pipeline.processors.clicks.sessions.load_sessions` (aggregated in DuckDB). A swap experiment
also needs each search's ``query_attributes``, which the patterns fold away: the marked searches are read
with one SQL query, and their click rows are taken from :func:`ubi_pipeline.processors.clicks.sessions.iter_sessions`, so the
displayed ranks and the traffic filters are exactly those of every other estimator.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb
import numpy as np

from ubi_pipeline.processors.clicks.sessions import SessionData, iter_sessions, load_sessions
from ubi_pipeline.processors.propensity.common import PropensityError
from ubi_pipeline.processors.propensity.randomized import SwapSessions
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.bounded import apply_limits
from ubi_pipeline.store.client import reading

#: Where a swap is recorded: ``query_attributes.randomized.ranks`` = [i, j] (1-based; [1, 1] = control).
_MARKED = """
SELECT query_id,
       any_value(TRY_CAST(json_extract(query_attributes, '$.randomized.ranks[0]') AS INTEGER)) AS i,
       any_value(TRY_CAST(json_extract(query_attributes, '$.randomized.ranks[1]') AS INTEGER)) AS j
FROM ubi_queries
WHERE query_attributes IS NOT NULL AND json_extract(query_attributes, '$.randomized') IS NOT NULL
GROUP BY query_id
"""


def read_patterns(db: Path | str, settings: Settings, max_rank: int) -> SessionData:
    """Sessions of the store at ``db`` aggregated to patterns and cells (``ubi_pipeline.processors.clicks.sessions``)."""
    with reading(db, settings) as con:
        apply_limits(con, settings)
        return load_sessions(con, settings, max_rank=max_rank)


def load_swaps(con: duckdb.DuckDBPyConnection, settings: Settings, max_rank: int) -> tuple[SwapSessions, int]:
    """The kept searches by swap arm (unmarked searches in arm (0, 0)); also the count of unusable markers."""
    try:
        marked = con.sql(_MARKED).fetchall()
    except duckdb.Error as exc:
        raise StoreError(f"reading swap markers failed in DuckDB: {exc}") from exc
    arm_of: dict[str, tuple[int, int]] = {}
    bad = 0
    for qid, i, j in marked:
        if i is None or j is None or i < 1 or j < 1:
            bad += 1
            continue
        arm_of[qid] = (min(i, j), max(i, j))
    if not arm_of:
        raise PropensityError(
            "no search is marked as randomised: the swap method needs query_attributes such as "
            '{"randomized": {"method": "swap", "ranks": [1, k]}} (try `ubi simulate --randomize 0.2`)'
        )
    patterns: Counter[tuple[tuple[int, int], int]] = Counter()
    for s in iter_sessions(con, settings, max_rank=max_rank):
        mask = 0
        for rank, clicked in zip(s.ranks, s.clicked, strict=True):
            if clicked:
                mask |= 1 << (rank - 1)
        patterns[(arm_of.get(s.query_id, (0, 0)), mask)] += 1
    arms = sorted({a for a, _ in patterns})
    index = {a: n for n, a in enumerate(arms)}
    rows = sorted(patterns.items())
    masks = np.array([m for (_, m), _ in rows], dtype=np.int64)
    return SwapSessions(
        arms=np.array(arms, dtype=np.int64).reshape(-1, 2),
        arm=np.array([index[a] for (a, _), _ in rows], dtype=np.int64),
        clicks=(masks[:, None] >> np.arange(max_rank)) & 1 > 0,
        weight=np.array([w for _, w in rows], dtype=np.int64),
    ), bad


def read_swaps(db: Path | str, settings: Settings, max_rank: int) -> tuple[SwapSessions, int]:
    """:func:`load_swaps` on the store at ``db`` (read-only, or its sealed segments while a collector runs)."""
    with reading(db, settings) as con:
        apply_limits(con, settings)
        return load_swaps(con, settings, max_rank)
