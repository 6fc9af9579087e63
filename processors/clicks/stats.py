"""Sufficient statistics of click logs: the arrays every click model and estimator fits on.

Built once, in DuckDB SQL from the store (``ubi_pipeline.processors.clicks.sessions``) or in numpy from simulated sessions,
then handed to pure numpy kernels. Ten million events never become ten million Python objects.

Conventions: ranks are 1-based; ``pair`` indexes :class:`PairIndex` (one normalised query text and one doc
id); ``K`` is the deepest rank kept (``Settings``/``--max-rank``, default 10).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.schemas.errors import UbiError


class StatsError(UbiError):
    """Arrays handed to a model are inconsistent (wrong shapes, ranks outside 1..K, negative counts)."""


@dataclass(frozen=True)
class PairIndex:
    """The (query, doc) pairs the arrays refer to: pair ``p`` is ``(queries[p], doc_ids[p])``."""

    queries: NDArray[np.object_]  # normalised query text per pair
    doc_ids: NDArray[np.object_]
    query_index: NDArray[np.int64]  # query number per pair (0..n_queries-1), for per-query grouping

    def __len__(self) -> int:
        return len(self.doc_ids)


@dataclass(frozen=True)
class ClickCells:
    """PBM statistics: one row per (pair, rank) cell with its impression and click counts."""

    pairs: PairIndex
    pair: NDArray[np.int64]
    rank: NDArray[np.int64]  # 1..K
    impressions: NDArray[np.int64]
    clicks: NDArray[np.int64]
    max_rank: int

    def check(self) -> None:
        n = len(self.pair)
        for name in ("rank", "impressions", "clicks"):
            if len(getattr(self, name)) != n:
                raise StatsError(f"ClickCells.{name} has {len(getattr(self, name))} rows, expected {n}")
        if n and (self.rank.min() < 1 or self.rank.max() > self.max_rank):
            raise StatsError(f"ClickCells.rank must lie in 1..{self.max_rank}")
        if n and (self.clicks > self.impressions).any():
            raise StatsError("ClickCells.clicks exceed impressions in some cell")


@dataclass(frozen=True)
class UbmCells:
    """UBM statistics: cells keyed by (pair, rank, rank of the previous click; 0 = no click before)."""

    pairs: PairIndex
    pair: NDArray[np.int64]
    rank: NDArray[np.int64]
    prev_click: NDArray[np.int64]  # 0..rank-1
    impressions: NDArray[np.int64]
    clicks: NDArray[np.int64]
    max_rank: int


@dataclass(frozen=True)
class SessionPatterns:
    """Deduplicated sessions for the cascade family: identical (query, ranking, clicks) weighted by count.

    ``docs[s, k-1]`` is the pair shown at rank k of pattern s, -1 when the list was shorter than K;
    ``clicks[s, k-1]`` whether it was clicked; ``weight[s]`` how many sessions had that pattern.
    """

    pairs: PairIndex
    query: NDArray[np.int64]  # query number per pattern
    docs: NDArray[np.int64]  # [n, K]
    clicks: NDArray[np.bool_]  # [n, K]
    weight: NDArray[np.int64]  # [n]

    @property
    def max_rank(self) -> int:
        return int(self.docs.shape[1])

    @property
    def n_sessions(self) -> int:
        return int(self.weight.sum())

    def check(self) -> None:
        if self.docs.shape != self.clicks.shape:
            raise StatsError(f"SessionPatterns.docs {self.docs.shape} and clicks {self.clicks.shape} differ")
        if len(self.weight) != self.docs.shape[0] or len(self.query) != self.docs.shape[0]:
            raise StatsError("SessionPatterns.weight/query must have one entry per pattern")
        if (self.clicks & (self.docs < 0)).any():
            raise StatsError("SessionPatterns has a click where no doc was shown")


#: patterns summed at a time by :func:`cells_from_sessions` and :func:`ubm_cells_from_sessions`: their per-slot
#: temporaries (a key, weight and click per shown rank) then hold at most 5M slots, about 40 MB each, instead
#: of the whole log's (a log of 2M patterns x 10 ranks: 160 MB each, several of them at once in the PBM fit)
CELL_CHUNK_PATTERNS = 500_000


def _row_chunks(s: SessionPatterns, rows: int) -> Iterator[SessionPatterns]:
    """``s`` in consecutive slices of at most ``rows`` patterns (views, no copy)."""
    n = s.docs.shape[0]
    for lo in range(0, max(n, 1), max(int(rows), 1)):
        hi = min(lo + int(rows), n)
        yield SessionPatterns(s.pairs, s.query[lo:hi], s.docs[lo:hi], s.clicks[lo:hi], s.weight[lo:hi])


def _keyed_sums(parts: Iterable[tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.bool_]]]
                ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """(distinct keys ascending, summed weight, summed weight of the clicked) over ``(key, weight, clicked)``
    parts: each part is summed by its keys, then merged into the running sums, so what is held at once is the
    running cells plus one part."""
    keys = np.empty(0, dtype=np.int64)
    imps: NDArray[np.float64] = np.empty(0, dtype=np.float64)
    clk: NDArray[np.float64] = np.empty(0, dtype=np.float64)
    for key, w, c in parts:
        uniq, inv = np.unique(np.concatenate([keys, key]), return_inverse=True)
        imps = np.bincount(inv, weights=np.concatenate([imps, w]), minlength=len(uniq)).astype(np.float64, copy=False)
        clk = np.bincount(inv, weights=np.concatenate([clk, w * c]), minlength=len(uniq)).astype(np.float64, copy=False)
        keys = uniq
    return keys, imps.astype(np.int64), clk.astype(np.int64)


def cells_from_sessions(s: SessionPatterns, chunk: int = CELL_CHUNK_PATTERNS) -> ClickCells:
    """Aggregate weighted session patterns to PBM cells with ``bincount`` (vectorised, no Python loop over
    patterns), ``chunk`` patterns at a time (:data:`CELL_CHUNK_PATTERNS`)."""
    k = s.docs.shape[1]

    def parts() -> Iterator[tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.bool_]]]:
        for part in _row_chunks(s, chunk):
            shown = part.docs >= 0
            rank = np.broadcast_to(np.arange(1, k + 1), shown.shape)[shown]
            w = np.broadcast_to(part.weight[:, None], shown.shape)[shown].astype(np.float64)
            yield part.docs[shown] * (k + 1) + rank, w, part.clicks[shown]

    uniq, imps, clk = _keyed_sums(parts())
    return ClickCells(s.pairs, (uniq // (k + 1)).astype(np.int64), (uniq % (k + 1)).astype(np.int64), imps, clk, k)


def ubm_cells_from_sessions(s: SessionPatterns, chunk: int = CELL_CHUNK_PATTERNS) -> UbmCells:
    """Aggregate weighted session patterns to UBM cells (pair, rank, previous click rank), ``chunk`` patterns
    at a time."""
    k = s.docs.shape[1]
    ranks = np.arange(1, k + 1)

    def parts() -> Iterator[tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.bool_]]]:
        for part in _row_chunks(s, chunk):
            clicked_rank = np.where(part.clicks, ranks, 0)
            # previous click rank before position k: running max of clicked ranks over positions < k
            prev = np.zeros(part.docs.shape, dtype=np.int64)
            if k > 1:
                prev[:, 1:] = np.maximum.accumulate(clicked_rank, axis=1)[:, :-1]
            shown = part.docs >= 0
            rank = np.broadcast_to(ranks, shown.shape)[shown]
            w = np.broadcast_to(part.weight[:, None], shown.shape)[shown].astype(np.float64)
            yield (part.docs[shown] * (k + 1) + rank) * (k + 1) + prev[shown], w, part.clicks[shown]

    uniq, imps, clk = _keyed_sums(parts())
    pc_u = uniq % (k + 1)
    rest = uniq // (k + 1)
    return UbmCells(s.pairs, (rest // (k + 1)).astype(np.int64), (rest % (k + 1)).astype(np.int64),
                    pc_u.astype(np.int64), imps, clk, k)


@dataclass(frozen=True)
class SystemRankings:
    """The distinct rankings of a log with the system that showed each: a small aggregate beside the patterns.

    A *system* is what ``ubi_pipeline.reports.systems`` calls one (the application, split by the ``ranker`` and
    ``experiment`` keys of ``query_attributes``); ``names[j]`` is system j. Row r is one distinct
    (query, system, list of docs) of the log: ``query[r]`` in the numbering of ``PairIndex.query_index``,
    ``docs[r, k-1]`` the pair shown at rank k (-1 where none). The session patterns do not carry the system
    (two systems showing the same list with the same clicks are one pattern), so it travels apart from them.
    """

    names: tuple[str, ...]
    query: NDArray[np.int64]
    system: NDArray[np.int64]
    docs: NDArray[np.int64]

    def check(self, n_pairs: int) -> None:
        """Raise ``StatsError`` naming the first inconsistent field."""
        if self.docs.ndim != 2 or len(self.query) != len(self.docs) or len(self.system) != len(self.docs):
            raise StatsError(f"SystemRankings: query {self.query.shape}, system {self.system.shape} and docs "
                                  f"{self.docs.shape} must have one row per ranking")
        if len(self.system) and (self.system.min() < 0 or self.system.max() >= len(self.names)):
            bad = int(np.flatnonzero((self.system < 0) | (self.system >= len(self.names)))[0])
            raise StatsError(f"SystemRankings.system[{bad}] = {int(self.system[bad])}: expected a system "
                                  f"number in 0..{len(self.names) - 1}")
        if self.docs.size and self.docs.max() >= n_pairs:
            bad = int(np.flatnonzero((self.docs >= n_pairs).any(axis=1))[0])
            raise StatsError(f"SystemRankings.docs[{bad}] names a pair beyond the {n_pairs} pairs fitted")
