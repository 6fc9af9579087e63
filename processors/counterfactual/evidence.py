"""What documents the log never showed rest on: every signal the user has, each kept apart.

A candidate's top k holds documents the log showed for the query (their click probability is fitted) and
documents it never showed. For the latter, in this order of precedence (the first that applies):

* ``human_grade``: the pair has a human grade. A grade-to-click-probability map is fitted on the shown pairs
  that have both (the impression-weighted mean fitted click probability at rank 1 per grade, a weighted
  linear fit on the grade where a grade has fewer than ``MIN_PER_GRADE`` shown pairs) is its point; its range
  runs from two standard errors below that mean to two above, or to the candidate's own ordering (below)
  where that is higher: the candidate may pick, within a grade, the documents that draw more clicks;
* ``returned_not_shown``: a logged hit list returned the document below the displayed depth
  (``query_response_hit_ids`` holds every returned id, of which only the top ones were displayed). Its range
  runs from the logging rankers' own ordering, continued below the display: a weighted fit of click
  probability on log(mean displayed rank) over the shown pairs, read at the document's mean returned rank
  (what a document at that depth is worth if the candidate picked it at random there), up to the
  candidate's own ordering: the same fit on log(candidate rank) over the shown pairs the candidate ranks,
  or their mean at that rank where it is higher and rests on ``MIN_PAIRS`` pairs or more, read at the rank
  the candidate gives the document (what it is worth if the candidate picks as well among
  the documents the log hid as among those it showed; the log's hit lists put a hidden document below the
  shown ones, so this end is the optimistic one);
* ``candidate_score``: the run carries the candidate's score for the document: a weighted linear fit of
  click probability on the candidate's score over the shown pairs it scores gives the optimistic end, the
  logging rankers' ordering read just below the deepest returned rank the pessimistic one;
* ``prior``: nothing but the log: the range of the fitted click probabilities of the pairs the log showed
  deep (mean displayed rank below K/2), ``PRIOR_RANGE`` quantiles (by default all of it).

Each slot's point is the middle of its range, except a grade's (the map's mean) and the prior's (the deep
pairs' median, as before). A kind whose fit lacks data (fewer than ``MIN_PAIRS`` pairs) takes the prior's. The
ranges bound the primary interval of :mod:`ubi_pipeline.processors.counterfactual.predict`: every unseen document at the low
end of its range for the lower bootstrap quantile, at the high end for the upper one (a sensitivity bound,
Manski 2003). The weaker the evidence, the farther apart the two ends, up to the prior-free bounds.

The store's hit lists are read by :func:`returned_not_shown`; the kernels are pure numpy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import duckdb
import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.schemas.text import normalize_query

#: evidence kinds of a candidate's top-k slot, in order of precedence after "shown" (module docstring)
EVIDENCE_KINDS: tuple[str, ...] = ("shown", "human_grade", "returned_not_shown", "candidate_score", "prior")
SHOWN, GRADE, RETURNED, SCORE, PRIOR = range(len(EVIDENCE_KINDS))
#: a grade's own mean is used when at least this many shown pairs carry it; otherwise the linear fit on grade
MIN_PER_GRADE = 5
#: fits need at least this many shown pairs; with fewer the kind falls back to the prior's range
MIN_PAIRS = 5
#: quantiles of the deep pairs' click probabilities that bound documents resting on the prior only
PRIOR_RANGE = (0.0, 1.0)


@dataclass(frozen=True)
class UnseenEvidence:
    """What the user knows about documents beyond the clicks: keyed by normalised query text, then doc id.

    ``grades``: human grades. ``returned``: the mean rank at which the log's hit lists returned a document
    below the displayed depth (:func:`returned_not_shown`). ``scores``: the candidate's own scores.
    """

    grades: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    returned: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    scores: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


class EvidenceArrays(NamedTuple):
    """The evidence laid on a candidate's lists ([Q, K] per slot) and on the log's pairs ([P])."""

    kind: NDArray[np.int64]  # [Q, K] EVIDENCE_KINDS index of a slot the candidate fills, -1 elsewhere
    slot_grade: NDArray[np.float64]  # [Q, K]
    slot_rank: NDArray[np.float64]  # [Q, K] mean returned rank below the display (NaN: not returned)
    slot_score: NDArray[np.float64]  # [Q, K]
    pair_grade: NDArray[np.float64]  # [P]
    pair_score: NDArray[np.float64]  # [P] the candidate's score of a shown pair it ranks
    deepest_returned: float  # deepest returned rank of any hit list (K when none went deeper)


def evidence_arrays(texts: list[str], doc_ids: list[list[str | None]], pair_query: NDArray[np.int64],
                    pair_docs: list[str], filled: NDArray[np.bool_], evidence: UnseenEvidence | None,
                    k: int) -> EvidenceArrays:
    """Lay ``evidence`` on the candidate's slots (``doc_ids[q][j]``, the doc at rank j + 1 of query q's list).

    ``filled``: where the list has a doc. ``kind`` is the evidence a slot rests on *if* its pair has no
    fitted click probability (:func:`slot_kinds` lays it on one fit).
    """
    ev = evidence or UnseenEvidence()
    shape = filled.shape
    kind = np.where(filled, PRIOR, -1).astype(np.int64)
    grade = np.full(shape, np.nan)
    rank = np.full(shape, np.nan)
    score = np.full(shape, np.nan)
    for q, text in enumerate(texts):
        g, r, s = ev.grades.get(text, {}), ev.returned.get(text, {}), ev.scores.get(text, {})
        if not (g or r or s):
            continue
        for j, doc in enumerate(doc_ids[q]):
            if doc is None:
                continue
            grade[q, j] = g.get(doc, np.nan)
            rank[q, j] = r.get(doc, np.nan)
            score[q, j] = s.get(doc, np.nan)
    unseen = kind == PRIOR
    kind[unseen & np.isfinite(score)] = SCORE
    kind[unseen & np.isfinite(rank)] = RETURNED
    kind[unseen & np.isfinite(grade)] = GRADE
    n = len(pair_docs)
    pair_grade = np.full(n, np.nan)
    pair_score = np.full(n, np.nan)
    for p in range(n) if ev.grades or ev.scores else ():  # a Python loop over the pairs only when it can find any
        text = texts[int(pair_query[p])] if int(pair_query[p]) < len(texts) else ""
        pair_grade[p] = ev.grades.get(text, {}).get(pair_docs[p], np.nan)
        pair_score[p] = ev.scores.get(text, {}).get(pair_docs[p], np.nan)
    deepest = max((float(v) for ranks in ev.returned.values() for v in ranks.values()), default=float(k))
    return EvidenceArrays(kind, grade, rank, score, pair_grade, pair_score, max(deepest, float(k)))


def slot_kinds(ev: EvidenceArrays, on_prior: NDArray[np.bool_]) -> NDArray[np.int64]:
    """The evidence of each slot under one fit: shown where the fit values the pair, ``ev.kind`` elsewhere."""
    return np.where(on_prior, ev.kind, np.where(ev.kind >= 0, SHOWN, -1)).astype(np.int64)


def _wls(x: NDArray[np.float64], y: NDArray[np.float64], w: NDArray[np.float64]) -> tuple[float, float] | None:
    """Weighted least squares y ≈ b0 + b1 x; None without two distinct x or MIN_PAIRS points."""
    ok = np.isfinite(x) & np.isfinite(y) & (w > 0)
    if ok.sum() < MIN_PAIRS or np.ptp(x[ok]) == 0:
        return None
    x, y, w = x[ok], y[ok], w[ok]
    xm, ym = np.average(x, weights=w), np.average(y, weights=w)
    b1 = float(np.sum(w * (x - xm) * (y - ym)) / np.sum(w * (x - xm) ** 2))
    return ym - b1 * xm, b1


def _line(fit: tuple[float, float] | None, x: NDArray[np.float64]) -> NDArray[np.float64]:
    if fit is None:
        return np.full(x.shape, np.nan)
    return np.clip(fit[0] + fit[1] * x, 0.0, 1.0)


def grade_map(a1: NDArray[np.float64], weight: NDArray[np.float64], grade: NDArray[np.float64],
              levels: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(point, half-width) of click probability at rank 1 per grade in ``levels``, from the shown pairs.

    Per grade with at least MIN_PER_GRADE pairs: the weighted mean and two standard errors (weighted variance
    over Kish's effective sample size); otherwise the weighted linear fit on grade, with two standard errors
    of the fit's residuals over the effective size of all graded pairs.
    """
    ok = np.isfinite(a1) & np.isfinite(grade) & (weight > 0)
    point = np.full(len(levels), np.nan)
    half = np.full(len(levels), np.nan)
    if ok.sum() < MIN_PAIRS:
        return point, half
    a, w, g = a1[ok], weight[ok], grade[ok]
    line = _wls(g, a, w)
    resid_sd = float(np.sqrt(np.average((a - _line(line, g)) ** 2, weights=w))) if line is not None else np.nan
    n_eff_all = w.sum() ** 2 / np.sum(w ** 2)
    for i, level in enumerate(levels):
        at = g == level
        if at.sum() >= MIN_PER_GRADE:
            wa = w[at]
            mean = float(np.average(a[at], weights=wa))
            var = float(np.average((a[at] - mean) ** 2, weights=wa))
            n_eff = wa.sum() ** 2 / np.sum(wa ** 2)
            point[i], half[i] = mean, 2.0 * np.sqrt(var / n_eff)
        elif line is not None:
            point[i] = float(_line(line, np.array([level]))[0])
            half[i] = 2.0 * resid_sd / np.sqrt(n_eff_all) + abs(line[1])  # off the grades seen: a grade's step more
    return point, half


class SlotValues(NamedTuple):
    """Click probability at rank 1 of each unseen slot: point and the ends of its range ([Q, K], NaN elsewhere)."""

    point: NDArray[np.float64]
    low: NDArray[np.float64]
    high: NDArray[np.float64]


def slot_values(ev: EvidenceArrays, kind: NDArray[np.int64], a1: NDArray[np.float64], pair_weight: NDArray[np.float64],
                pair_rank: NDArray[np.float64], cand_rank: NDArray[np.int64], deep: NDArray[np.float64],
                prior_point: float) -> SlotValues:
    """Value every unseen slot of the candidate from its evidence (module docstring).

    ``kind``: the slots' evidence under this fit (:func:`slot_kinds`); ``a1``: fitted click probability at rank 1 per pair; ``pair_weight``: its impressions; ``pair_rank``: its
    mean displayed rank; ``cand_rank``: the rank the candidate gives it (0: not ranked); ``deep``: the deep
    pairs' click probabilities; ``prior_point``: what a slot on the prior takes as its point.
    """
    shape = ev.kind.shape
    point, low, high = (np.full(shape, np.nan) for _ in range(3))
    if len(deep):
        p_lo, p_hi = np.quantile(deep, PRIOR_RANGE).tolist()
    else:
        p_lo, p_hi = 0.0, 1.0
    prior_point = prior_point if np.isfinite(prior_point) else (p_lo + p_hi) / 2
    # the logging rankers' ordering, continued below the display
    logger = _wls(np.log(np.maximum(pair_rank, 1.0)), a1, pair_weight)
    # the candidate's ordering over the shown pairs it ranks
    ranked = cand_rank > 0
    candidate = _wls(np.where(ranked, np.log(np.maximum(cand_rank, 1)), np.nan), a1, pair_weight * ranked)
    cand_curve = np.fmax(_line(candidate, np.log(np.arange(1, shape[1] + 1, dtype=np.float64))),
                         rank_means(a1, pair_weight, cand_rank, shape[1]))
    cand_curve = np.where(np.isnan(cand_curve), p_hi, cand_curve)  # no ordering to read: the prior's high end
    optimistic = cand_curve[None, :]
    by_score = _wls(ev.pair_score, a1, pair_weight)

    def put(mask: NDArray[np.bool_], lo: NDArray[np.float64], hi: NDArray[np.float64],
            mid: NDArray[np.float64] | None = None) -> None:
        good = mask & np.isfinite(lo) & np.isfinite(hi)
        lo, hi = np.minimum(lo, hi), np.maximum(lo, hi)
        low[good], high[good] = lo[good], hi[good]
        point[good] = ((lo + hi) / 2 if mid is None else mid)[good]
        rest = mask & ~good  # the evidence is there but its fit is not: the prior's range
        low[rest], high[rest], point[rest] = p_lo, p_hi, prior_point

    grades = kind == GRADE
    if grades.any():
        levels = np.unique(ev.slot_grade[grades])
        g_point, g_half = grade_map(a1, pair_weight, ev.pair_grade, levels)
        at = np.searchsorted(levels, np.where(grades, ev.slot_grade, levels[0]))
        gp, gh = g_point[at], g_half[at]
        put(grades, np.clip(gp - gh, 0.0, 1.0), np.maximum(np.clip(gp + gh, 0.0, 1.0), optimistic), gp)
    returned = kind == RETURNED
    if returned.any():
        lo = _line(logger, np.log(np.where(returned, ev.slot_rank, 1.0)))
        put(returned, lo, np.maximum(lo, np.broadcast_to(cand_curve[None, :], shape)))
    scored = kind == SCORE
    if scored.any():
        lo = _line(logger, np.full(shape, np.log(ev.deepest_returned + 1.0)))
        put(scored, lo, np.maximum(lo, _line(by_score, np.where(scored, ev.slot_score, 0.0))))
    prior = kind == PRIOR
    low[prior], high[prior], point[prior] = p_lo, p_hi, prior_point
    return SlotValues(point, low, high)


def rank_means(a1: NDArray[np.float64], weight: NDArray[np.float64], rank: NDArray[np.int64],
               k: int) -> NDArray[np.float64]:
    """Weighted mean of ``a1`` over the pairs at each ``rank`` 1..k (NaN with fewer than MIN_PAIRS pairs)."""
    ok = np.isfinite(a1) & (weight > 0) & (rank >= 1) & (rank <= k)
    r = rank[ok] - 1
    n = np.bincount(r, minlength=k)[:k]
    sw = np.bincount(r, weights=weight[ok], minlength=k)[:k]
    swa = np.bincount(r, weights=weight[ok] * a1[ok], minlength=k)[:k]
    return np.where((n >= MIN_PAIRS) & (sw > 0), swa / np.where(sw > 0, sw, 1.0), np.nan)


def evidence_shares(kind: NDArray[np.int64], weight: NDArray[np.float64], k: int) -> dict[str, float]:
    """Share of the candidate's top-k slots (search-weighted) resting on each kind of evidence."""
    kk = min(k, kind.shape[1])
    top = kind[:, :kk]
    w = np.broadcast_to(np.asarray(weight, dtype=np.float64)[:, None], top.shape)
    total = float(w[top >= 0].sum())
    if total <= 0:
        return {name: float("nan") for name in EVIDENCE_KINDS}
    return {name: float(w[top == i].sum()) / total for i, name in enumerate(EVIDENCE_KINDS)}


_RETURNED = """
WITH rec AS (
    SELECT user_query, query_response_hit_ids AS hits,
           row_number() OVER (PARTITION BY query_id
                              ORDER BY coalesce(len(query_response_hit_ids), 0) > 0 DESC, "timestamp" NULLS LAST,
                                       query_response_id NULLS LAST) AS rn
    FROM ubi_queries
), deep AS (
    SELECT user_query, unnest(hits) AS doc_id, generate_subscripts(hits, 1) AS rank
    FROM rec WHERE rn = 1 AND len(hits) > $k AND user_query IS NOT NULL
)
SELECT user_query, doc_id, count(*) AS n, sum(rank) AS rank_sum
FROM deep WHERE rank > $k AND doc_id IS NOT NULL AND doc_id <> '' GROUP BY ALL
"""


def returned_not_shown(con: duckdb.DuckDBPyConnection, displayed: int) -> dict[str, dict[str, float]]:
    """Per normalised query text and doc: the mean rank at which the store's hit lists returned it below rank ``displayed``.

    Each search's hit list is its earliest query record with a non-empty ``query_response_hit_ids`` (as the
    session build). A document also shown for the query is shown evidence and the caller ignores it here.
    """
    try:
        rows = con.execute(_RETURNED, {"k": int(displayed)}).fetchall()
    except duckdb.Error as exc:
        raise StoreError(f"reading the hit lists below the displayed depth failed in DuckDB: {exc}") from exc
    n: dict[tuple[str, str], float] = defaultdict(float)
    total: dict[tuple[str, str], float] = defaultdict(float)
    for text, doc, count, rank_sum in rows:
        key = (normalize_query(str(text)), str(doc))
        if key[0]:
            n[key] += float(count)
            total[key] += float(rank_sum)
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (text, doc), c in n.items():
        out[text][doc] = total[(text, doc)] / c
    return dict(out)
