"""Judgments and rankings as padded arrays: built once per evaluation, read by every metric kernel.

For ``n`` queries and ranking depth ``d`` the evaluation needs only ``grades[n, d]`` (the grade of the doc at
each rank, -1 where the doc is unjudged or the ranking has ended), the ranking lengths, the number of
labelled positives per query, and each query's judged grades sorted descending (for ideal DCG).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat

import numpy as np

from ubi_pipeline.reports.metrics.names import MetricError

UNJUDGED = -1
_MAX_GRADE = 2**31 - 1


@dataclass(frozen=True)
class RankedGrades:
    """Arrays of one evaluation, rows aligned with the evaluated query ids."""

    grades: np.ndarray  # int32 [n, depth]: grade at rank i+1, UNJUDGED for unjudged docs and padding
    lengths: np.ndarray  # int64 [n]: docs in each ranking (before any depth cut)
    n_positive: np.ndarray  # int64 [n]: judged docs with grade >= rel_threshold (all of them, ranked or not)
    ideal: np.ndarray  # int32 [n, ideal_depth]: the query's judged grades sorted descending, 0-padded

    def rows(self, mask: np.ndarray) -> RankedGrades:
        """The same arrays restricted to the rows where ``mask`` is true."""
        return RankedGrades(self.grades[mask], self.lengths[mask], self.n_positive[mask], self.ideal[mask])


def check_matrix(name: str, array: np.ndarray, n_rows: int | None = None) -> np.ndarray:
    """Reject anything that is not a 2-D array (with ``n_rows`` rows when given)."""
    arr = np.asarray(array)
    if arr.ndim != 2:
        raise MetricError(f"{name} must be a 2-D array [queries, ranks], got shape {arr.shape}")
    if n_rows is not None and arr.shape[0] != n_rows:
        raise MetricError(f"{name} has {arr.shape[0]} rows, expected {n_rows} (one per query)")
    return arr


def check_k(k: int | None, *, required: bool = False) -> None:
    """A cutoff is a whole number >= 1 (or ``None`` for the whole ranking where that is allowed)."""
    if k is None:
        if required:
            raise MetricError("this metric needs a cutoff k >= 1")
        return
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise MetricError(f"cutoff k must be a whole number >= 1, got {k!r}")


def _qrels_grades(qrels_rows: Sequence[Mapping[str, int]], validate: bool) -> tuple[np.ndarray, np.ndarray]:
    counts = np.fromiter(map(len, qrels_rows), np.int64, len(qrels_rows))
    total = int(counts.sum())
    values_iter = chain.from_iterable(g.values() for g in qrels_rows)
    if not validate:
        return np.fromiter(values_iter, np.int64, total), counts
    try:
        values = np.fromiter(values_iter, np.float64, total)
    except (TypeError, ValueError) as exc:
        raise MetricError(f"qrels grades must be non-negative integers: {exc}") from exc
    bad = ~np.isfinite(values) | (values < 0) | (values != np.floor(values)) | (values > _MAX_GRADE)
    if bad.any():
        i = int(np.argmax(bad))
        qi = int(np.searchsorted(np.cumsum(counts), i, side="right"))
        raise MetricError(f"qrels: query row {qi} has grade {values[i]!r}; grades must be non-negative integers")
    return values.astype(np.int64), counts


def check_unique(query_ids: Sequence[str], rankings: Sequence[Sequence[str]]) -> None:
    """Duplicate doc ids invalidate a ranking (they would push recall above 1)."""
    for query_id, docs in zip(query_ids, rankings, strict=True):
        if len(set(docs)) != len(docs):
            seen: dict[str, int] = {}
            for rank, doc in enumerate(docs, 1):
                if doc in seen:
                    raise MetricError(
                        f"run: doc {doc!r} is ranked twice for query {query_id!r} (ranks {seen[doc]} and {rank}); "
                        f"duplicates would push recall above 1, so remove them"
                    )
                seen[doc] = rank


def build_ranked_grades(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Sequence[str]],
    query_ids: Sequence[str],
    *,
    depth: int | None,
    ideal_depth: int | None,
    rel_threshold: int,
    validate: bool = True,
    condensed: bool = False,
) -> RankedGrades:
    """Look every ranked doc up in the query's judgments once and lay the grades out as arrays.

    ``depth``: columns kept (``None``: the longest ranking). ``ideal_depth``: columns of sorted judged grades
    (``None``: the most judgments any query has). Queries absent from ``run`` get an empty ranking.
    ``validate`` checks grades and duplicate doc ids (loaders already did when the inputs are theirs).
    ``condensed`` drops unjudged docs from each ranking first (Sakai 2007); ``lengths`` are then the
    condensed lengths.
    """
    n = len(query_ids)
    qrels_rows = [qrels[q] for q in query_ids]
    full = [run.get(q, ()) for q in query_ids]
    if validate:
        check_unique(query_ids, full)
    values, counts = _qrels_grades(qrels_rows, validate)
    lengths = np.fromiter(map(len, full), np.int64, n)
    max_len = int(lengths.max()) if n else 0
    # Without condensing only the first `depth` docs matter, so longer rankings are cut before the lookup.
    cut_at = max_len if (depth is None or condensed) else min(depth, max_len)
    rankings = [r[:cut_at] for r in full] if cut_at < max_len else full
    looked_up = np.minimum(lengths, cut_at)

    # One C-level dict lookup per ranked doc (map over the query's judgment dict); everything after this
    # is array arithmetic.
    lookups = chain.from_iterable(map(g.get, r, repeat(UNJUDGED)) for g, r in zip(qrels_rows, rankings, strict=True))
    flat = np.fromiter(lookups, np.int64, int(looked_up.sum()))
    if condensed:
        keep = flat != UNJUDGED
        flat = flat[keep]
        lengths = np.bincount(np.repeat(np.arange(n), looked_up)[keep], minlength=n).astype(np.int64)
        looked_up = lengths
    width = int(looked_up.max()) if n else 0
    width = width if depth is None else min(depth, width)
    grades = np.full((n, width), UNJUDGED, dtype=np.int32)
    if cut_at == width or not flat.size:
        grades[np.arange(width) < looked_up[:, None]] = flat  # row-major mask order == query-then-rank order
    else:
        starts = np.cumsum(looked_up) - looked_up
        pos = np.arange(flat.size) - np.repeat(starts, looked_up)
        inside = pos < width
        grades[np.repeat(np.arange(n), looked_up)[inside], pos[inside]] = flat[inside]

    qidx = np.repeat(np.arange(n), counts)
    n_positive = np.bincount(qidx, weights=values >= rel_threshold, minlength=n).astype(np.int64)
    max_judged = int(counts.max()) if n else 0
    ideal_width = max_judged if ideal_depth is None else min(ideal_depth, max_judged)
    ideal = np.zeros((n, ideal_width), dtype=np.int32)
    if ideal_width and values.size:
        order = np.lexsort((-values, qidx))  # by query, then grade descending
        starts = np.cumsum(counts) - counts
        pos = np.arange(values.size) - np.repeat(starts, counts)
        keep_ideal = pos < ideal_width
        ideal[qidx[keep_ideal], pos[keep_ideal]] = values[order][keep_ideal]
    return RankedGrades(grades=grades, lengths=lengths, n_positive=n_positive, ideal=ideal)
