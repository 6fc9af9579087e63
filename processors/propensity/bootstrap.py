"""Bootstrap confidence intervals over sessions, on deduplicated session patterns.

Resampling N sessions with replacement from a log whose distinct patterns have counts w_1..w_n is a
multinomial draw: w* ~ Multinomial(N, w/N) (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993).
This is the exact session bootstrap, done in O(patterns) per replicate instead of O(sessions).

Sessions of one query are not independent evidence about θ: they share the query's (query, doc) pairs,
their attractiveness and the rankings that placed them, and the interventions harvesting learns from are
whole queries shown differently by different rankers. Resampling sessions treats every search as a new draw
and so understates the spread when queries differ (and collapses it when a query's searches repeat). The
*cluster* bootstrap resamples queries instead: G queries drawn with replacement from the G observed, each
drawn query bringing all its sessions (Davison & Hinkley, *Bootstrap Methods and their Application*, 1997,
§3.8; Cameron, Gelbach & Miller, Review of Economics and Statistics, 2008). With pattern counts w and
m ~ Multinomial(G, 1/G) per query, a replicate's counts are w_s·m_{q(s)}: again O(patterns).

Intervals: :func:`bootstrap` gives the percentile interval [q_{a/2}, q_{1−a/2}] of the replicates. For an
estimator that is biased at the log's size the replicates carry the bias again (they centre near θ̂ + b,
not θ̂), so the percentile interval sits near θ + 2b and can even exclude θ̂ itself. :func:`basic_log_interval`
reflects the replicates around the estimate instead, on the log scale of a ratio:
[θ̂²/q_{1−a/2}, θ̂²/q_{a/2}] (the basic bootstrap interval of log θ; Davison & Hinkley, *Bootstrap Methods
and their Application*, 1997, §5.2), which removes a bias the replicates share to first order.
:func:`bias_and_se` gives the bootstrap estimate of bias, mean(θ*) − θ̂, and the standard error.

:class:`CellMap` makes the replicates cheap for the cell-based estimators: the (pair, rank) cell of every
shown position of every pattern is found once, so each replicate's cells are two ``bincount``s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.clicks.stats import ClickCells, SessionPatterns
from ubi_pipeline.processors.propensity.common import PropensityError

SCHEME = "multinomial resampling of sessions (counts of distinct session patterns)"
QUERY_SCHEME = "multinomial resampling of queries (clusters: each drawn query brings all its sessions)"
#: what ``bootstrap(unit=...)`` resamples, and the scheme name each records
UNITS = {"session": SCHEME, "query": QUERY_SCHEME}


@dataclass(frozen=True)
class BootstrapResult:
    """Percentile intervals per rank, and the replicates behind them ([replicates, K], NaN = failed)."""

    low: NDArray[np.float64]
    high: NDArray[np.float64]
    samples: NDArray[np.float64]
    failed: int  # replicates where the estimator raised (e.g. a resample left a rank without data)
    level: float

    @property
    def replicates(self) -> int:
        return int(self.samples.shape[0]) - self.failed


def resample_weights(weights: NDArray[np.int64], rng: np.random.Generator) -> NDArray[np.int64]:
    """One bootstrap replicate of pattern counts: Multinomial(N, w/N) with N = Σ w."""
    w = np.asarray(weights, dtype=np.float64)
    total = int(w.sum())
    if total <= 0:
        raise PropensityError("cannot bootstrap an empty log (no sessions)")
    return rng.multinomial(total, w / w.sum()).astype(np.int64)


def resample_clusters(weights: NDArray[np.int64], cluster: NDArray[np.int64], rng: np.random.Generator
                      ) -> NDArray[np.int64]:
    """One cluster-bootstrap replicate: G clusters drawn with replacement, w_s·m_{cluster(s)} per pattern.

    ``cluster`` numbers each pattern's cluster (its query); clusters with no sessions are not drawn.
    """
    w = np.asarray(weights, dtype=np.int64)
    if int(w.sum()) <= 0:
        raise PropensityError("cannot bootstrap an empty log (no sessions)")
    present, idx = np.unique(np.asarray(cluster)[w > 0], return_inverse=True)
    draws = rng.multinomial(len(present), np.full(len(present), 1.0 / len(present)))
    m = np.zeros(len(w), dtype=np.int64)
    m[w > 0] = draws[idx]
    return w * m


def bootstrap(
    weights: NDArray[np.int64],
    statistic: Callable[[NDArray[np.int64]], NDArray[np.float64]],
    *,
    replicates: int = 200,
    seed: int = 0,
    level: float = 0.95,
    progress: Callable[[int], None] | None = None,
    clusters: NDArray[np.int64] | None = None,
) -> BootstrapResult:
    """Percentile bootstrap of a per-rank ``statistic(pattern_weights)`` over sessions, or over ``clusters``.

    ``statistic`` gets resampled pattern counts and returns one number per rank (NaN where undefined); a
    replicate on which it raises :class:`PropensityError` is counted as failed and left out. With
    ``clusters`` (one cluster number per pattern, e.g. its query) whole clusters are resampled
    (:func:`resample_clusters`) instead of sessions.
    """
    if replicates < 1:
        raise PropensityError(f"bootstrap replicates must be at least 1, got {replicates}")
    if not 0.0 < level < 1.0:
        raise PropensityError(f"confidence level must lie in (0, 1), got {level}")
    if clusters is not None and len(clusters) != len(weights):
        raise PropensityError(f"cluster bootstrap needs one cluster per pattern: {len(clusters)} clusters for "
                              f"{len(weights)} patterns")
    rng = np.random.default_rng([seed, 0xB007])
    samples: NDArray[np.float64] | None = None
    failed = 0
    for b in range(replicates):
        w = resample_weights(weights, rng) if clusters is None else resample_clusters(weights, clusters, rng)
        try:
            est = np.asarray(statistic(w), dtype=np.float64)
        except PropensityError:
            failed += 1
        else:
            if samples is None:
                samples = np.full((replicates, len(est)), np.nan)
            samples[b] = est
        if progress:
            progress(b + 1)
    if samples is None:
        raise PropensityError("every bootstrap replicate failed; the log is too small to estimate position bias")
    tail = (1.0 - level) / 2.0 * 100.0
    with np.errstate(all="ignore"):
        enough = (np.isfinite(samples).sum(axis=0) >= 2)
        low = np.where(enough, np.nanpercentile(np.where(enough, samples, 0.0), tail, axis=0), np.nan)
        high = np.where(enough, np.nanpercentile(np.where(enough, samples, 0.0), 100.0 - tail, axis=0), np.nan)
    return BootstrapResult(low, high, samples, failed, level)


def basic_log_interval(estimate: NDArray[np.float64], boot: BootstrapResult
                       ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Basic bootstrap interval of log θ, exponentiated: [θ̂²/q_{1−a/2}, θ̂²/q_{a/2}] (percentile where q_{a/2} <= 0)."""
    est = np.asarray(estimate, dtype=np.float64)
    usable = (est > 0) & (boot.low > 0) & (boot.high > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        low = np.where(usable, est * est / np.where(usable, boot.high, 1.0), boot.low)
        high = np.where(usable, est * est / np.where(usable, boot.low, 1.0), boot.high)
    return low, high


def bias_and_se(estimate: NDArray[np.float64], boot: BootstrapResult) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Bootstrap estimate of bias, mean(θ*) − θ̂, and standard error, std(θ*), per rank (NaN with < 2 replicates)."""
    s = boot.samples
    ok = np.isfinite(s).sum(axis=0) >= 2
    with np.errstate(all="ignore"):
        mean = np.where(ok, np.nanmean(np.where(ok, s, 0.0), axis=0), np.nan)
        se = np.where(ok, np.nanstd(np.where(ok, s, 0.0), axis=0, ddof=1), np.nan)
    return mean - np.asarray(estimate, dtype=np.float64), se


class CellMap:
    """Where each shown position of each pattern lands among the PBM cells, for fast re-aggregation."""

    def __init__(self, sessions: SessionPatterns) -> None:
        n, k = sessions.docs.shape
        shown = sessions.docs >= 0
        self.sessions = sessions
        self.pattern = np.broadcast_to(np.arange(n)[:, None], (n, k))[shown]
        rank = np.broadcast_to(np.arange(1, k + 1), (n, k))[shown]
        pair = sessions.docs[shown]
        self.clicked = sessions.clicks[shown].astype(np.float64)
        uniq, self.cell = np.unique(pair * (k + 1) + rank, return_inverse=True)
        self.pair = (uniq // (k + 1)).astype(np.int64)
        self.rank = (uniq % (k + 1)).astype(np.int64)
        self.max_rank = k

    def cells(self, weights: NDArray[np.int64] | None = None) -> ClickCells:
        """PBM cells of the patterns under ``weights`` (default: the observed counts)."""
        w = (self.sessions.weight if weights is None else weights)[self.pattern].astype(np.float64)
        m = len(self.pair)
        imps = np.bincount(self.cell, weights=w, minlength=m).astype(np.int64)
        clicks = np.bincount(self.cell, weights=w * self.clicked, minlength=m).astype(np.int64)
        keep = imps > 0
        return ClickCells(self.sessions.pairs, self.pair[keep], self.rank[keep], imps[keep], clicks[keep],
                          self.max_rank)
