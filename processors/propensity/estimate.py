"""The propensity stage: one estimator by name, its bootstrap interval, and the evidence behind it.

Stages are functions over typed inputs: :func:`estimate_from_patterns` takes the weighted session patterns
(``processors.sessions`` builds them from the store, ``processors.simulation`` from known truth) and
:func:`estimate_randomized` the arms of a swap experiment. The numeric work is in ``em``, ``harvest``,
``randomized`` and ``bootstrap``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from processors.propensity.bootstrap import SCHEME, CellMap, bootstrap
from processors.propensity.common import METHODS, PropensityError, PropensityEstimate
from processors.propensity.em import em_ratios
from processors.propensity.harvest import allpairs_from_stats, harvest_stats
from processors.propensity.randomized import SwapSessions, arm_counts, swap_ratios
from processors.stats import ClickCells, SessionPatterns

Progress = Callable[[int], None]


def _cut(sessions: SessionPatterns, max_rank: int) -> SessionPatterns:
    """Patterns restricted to ranks 1..max_rank (identical weights; patterns may repeat, which is harmless)."""
    if max_rank >= sessions.max_rank:
        return sessions
    return SessionPatterns(sessions.pairs, sessions.query, sessions.docs[:, :max_rank].copy(),
                           sessions.clicks[:, :max_rank].copy(), sessions.weight)


def _rank_support(cells: ClickCells, k: int) -> dict[str, list[int]]:
    imps = np.bincount(cells.rank - 1, weights=cells.impressions, minlength=k)[:k]
    clicks = np.bincount(cells.rank - 1, weights=cells.clicks, minlength=k)[:k]
    ranks_per_pair = np.bincount(cells.pair, minlength=len(cells.pairs))
    multi = ranks_per_pair[cells.pair] >= 2
    linked = np.bincount(cells.rank[multi] - 1, minlength=k)[:k]
    return {"impressions": [int(x) for x in imps], "clicks": [int(x) for x in clicks],
            "pairs_at_other_ranks": [int(x) for x in linked]}


def estimate_from_patterns(
    sessions: SessionPatterns,
    method: str = "em",
    *,
    max_rank: int | None = None,
    replicates: int = 200,
    seed: int = 0,
    level: float = 0.95,
    progress: Progress | None = None,
) -> PropensityEstimate:
    """θ̂_k/θ̂_1 by ``method`` (``em`` or ``harvest``) with a percentile bootstrap over sessions.

    ``replicates = 0`` skips the bootstrap (intervals are NaN). The interval resamples whole sessions
    (multinomial counts over the distinct patterns), so it carries the dependence between ranks of a session.
    """
    if method not in ("em", "harvest"):
        raise PropensityError(f"method {method!r} works on swap experiments or is unknown; "
                              f"from session patterns choose em or harvest (all: {', '.join(METHODS)})")
    k = sessions.max_rank if max_rank is None else int(max_rank)
    if k < 2:
        raise PropensityError(f"max rank must be at least 2 to compare ranks, got {k}")
    sessions = _cut(sessions, k)
    k = sessions.max_rank
    cmap = CellMap(sessions)
    cells = cmap.cells()
    if len(cells.pair) == 0:
        raise PropensityError("the log has no displayed results: nothing to estimate position bias from")

    def stat(cells_b: ClickCells) -> NDArray[np.float64]:
        if method == "em":
            return em_ratios(cells_b)
        return allpairs_from_stats(harvest_stats(cells_b))

    hs = harvest_stats(cells)
    ratio = stat(cells)
    notes: list[str] = []
    if not np.isfinite(ratio).all():
        missing = [r + 1 for r in np.flatnonzero(~np.isfinite(ratio))]
        notes.append(f"ranks {missing} are not identifiable: no (query, doc) links them to rank 1")
    low = high = np.full(k, np.nan)
    done = 0
    if replicates > 0:
        boot = bootstrap(sessions.weight, lambda w: stat(cmap.cells(w)), replicates=replicates, seed=seed,
                         level=level, progress=progress)
        low, high, done = boot.low, boot.high, boot.replicates
        if boot.failed:
            notes.append(f"{boot.failed} of {replicates} bootstrap replicates could not be fitted")
    linked = int((hs.n_pairs > 0).sum())
    details = {
        "pairs": len(sessions.pairs),
        "pairs_at_several_ranks": int((np.bincount(cells.pair, minlength=len(cells.pairs)) >= 2).sum()),
        "rank_pair_support": [{"k": int(a), "k2": int(b), "pairs": int(n)}
                              for a, b, n in zip(hs.k, hs.k2, hs.n_pairs, strict=True)],
    }
    if method == "em":
        details["model"] = "pbm"
    else:
        details["weighting"] = "harmonic mean of the pair's impressions at the two ranks"
    return PropensityEstimate(method, ratio, low, high, level, done, SCHEME if replicates else "none",
                              sessions.n_sessions, linked, _rank_support(cells, k), details, tuple(notes))


def estimate_randomized(
    swaps: SwapSessions,
    *,
    max_rank: int | None = None,
    replicates: int = 200,
    seed: int = 0,
    level: float = 0.95,
    progress: Progress | None = None,
) -> PropensityEstimate:
    """θ̂_k/θ̂_1 from a randomised swap experiment (see ``randomized``), bootstrapped over its searches."""
    swaps.check()
    k = swaps.max_rank if max_rank is None else min(int(max_rank), swaps.max_rank)
    if k < 2:
        raise PropensityError(f"max rank must be at least 2 to compare ranks, got {k}")
    keep_arm = (swaps.arms.max(axis=1) <= k) if len(swaps.arms) else np.zeros(0, dtype=bool)
    rows = keep_arm[swaps.arm] if len(swaps.arm) else np.zeros(0, dtype=bool)
    swaps = SwapSessions(swaps.arms, swaps.arm[rows], swaps.clicks[rows, :k], swaps.weight[rows])
    if swaps.weight.sum() <= 0:
        raise PropensityError("no searches of a swap experiment within the ranks asked for")
    counts = arm_counts(swaps)
    ratio, used, control = swap_ratios(counts)
    low = high = np.full(k, np.nan)
    done, notes = 0, []
    if replicates > 0:
        boot = bootstrap(swaps.weight, lambda w: swap_ratios(arm_counts(swaps, w))[0], replicates=replicates,
                         seed=seed, level=level, progress=progress)
        low, high, done = boot.low, boot.high, boot.replicates
        if boot.failed:
            notes.append(f"{boot.failed} of {replicates} bootstrap replicates had an arm without clicks")
    if not np.isfinite(ratio).all():
        missing = [r + 1 for r in np.flatnonzero(~np.isfinite(ratio))]
        notes.append(f"ranks {missing} have no swap arm linking them to rank 1")
    # per rank k: searches of the arm that moved rank 1's doc to k (k = 1: the control), clicks at k there
    arm_searches = [0] * k
    arm_clicks = [0] * k
    for a, (i, j) in enumerate(counts.arms.tolist()):
        if i == 1 and 1 <= j <= k:
            arm_searches[j - 1] += int(counts.searches[a])
            arm_clicks[j - 1] += int(counts.clicks[a, j - 1])
    experiment = int(counts.searches[counts.arms[:, 0] > 0].sum())
    details = {
        "control": control,
        "experiment_searches": experiment,
        "unmarked_searches": int(counts.searches[counts.arms[:, 0] == 0].sum()),
        "arms": [{"ranks": [int(i), int(j)], "searches": int(n)} for (i, j), n in
                 zip(counts.arms.tolist(), counts.searches, strict=True) if n > 0],
    }
    support = {"arm_searches": arm_searches, "arm_clicks_at_rank": arm_clicks}
    sessions = experiment if control != "unmarked searches" else int(counts.searches.sum())
    return PropensityEstimate("randomized", ratio, low, high, level, done, SCHEME if replicates else "none",
                              sessions, used, support, details, tuple(notes))
