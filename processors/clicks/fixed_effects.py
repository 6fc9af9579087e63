"""Position bias by the pair fixed-effects (Poisson conditional) likelihood: a kernel over click cells.

PBM with one free attractiveness per (query, doc) pair, conditioned away: given a pair's total clicks, its
clicks at the ranks it was shown at are multinomial in n_k·θ_k whatever its attractiveness (Hausman, Hall &
Griliches, Econometrica 1984). It needs nothing of the click models, so it sits below them: PBM starts from it
(``ubi_pipeline.processors.click_models.pbm``) and ``ubi propensity --method harvest`` ships it
(``ubi_pipeline.processors.propensity.harvest``, where the estimator and its measured accuracy are described).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.clicks.stats import ClickCells, StatsError


class FixedEffectsError(StatsError):
    """The log has no pair shown at two ranks and clicked, or none linked to rank 1: θ cannot be harvested."""


def connected_to_first(k: NDArray[np.int64], k2: NDArray[np.int64], max_rank: int) -> NDArray[np.bool_]:
    """Which ranks 1..K are linked to rank 1 through the rank pairs (k, k2) (union-find on K nodes)."""
    parent = list(range(max_rank + 1))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(k.tolist(), k2.tolist(), strict=True):
        parent[find(a)] = find(b)
    root = find(1)
    return np.array([find(r) == root for r in range(1, max_rank + 1)])


#: coordinate ascent stops when no θ_k/θ_1 moves by more than this (or after FE_MAX_ITER rounds)
FE_TOL = 1e-10
FE_MAX_ITER = 5000


def _fe_kernel(pair: NDArray[np.int64], rank0: NDArray[np.int64], n: NDArray[np.float64], c: NDArray[np.float64],
               k: int, max_iter: int, tol: float) -> tuple[NDArray[np.float64], int]:
    """Coordinate ascent on the Poisson conditional likelihood (see the module docstring); θ with θ_1 = 1."""
    total = np.bincount(pair, weights=c)  # C_d
    num = np.bincount(rank0, weights=c, minlength=k)  # Σ_d c_dk
    theta = np.ones(k)
    it = 0
    while it < max_iter:
        it += 1
        expected = np.bincount(pair, weights=n * theta[rank0])  # Σ_j n_dj θ_j
        den = np.bincount(rank0, weights=n * (total / expected)[pair], minlength=k)
        new = np.where(den > 0, num / np.where(den > 0, den, 1.0), theta)
        new = new / new[0]
        done = bool(np.max(np.abs(new - theta)) <= tol)
        theta = new
        if done:
            break
    return theta, it


def pair_fixed_effects(cells: ClickCells, max_rank: int | None = None, *,
                       weights: NDArray[np.float64] | None = None, max_iter: int = FE_MAX_ITER,
                       tol: float = FE_TOL) -> NDArray[np.float64]:
    """θ̂_k/θ̂_1 for k = 1..K by the Poisson conditional (pair fixed-effects) likelihood (the estimator is described in ``ubi_pipeline.processors.propensity.harvest``).

    ``weights`` (one per cell) multiplies each cell's impressions and clicks: a query drawn m times by a
    cluster bootstrap counts as m copies of its pairs, which is exactly what the conditional likelihood of
    m copies is. NaN for ranks that no clicked pair links to rank 1; raises :class:`FixedEffectsError` when no
    pair was ever shown at two ranks, or none of those was clicked.
    """
    k = cells.max_rank if max_rank is None else min(int(max_rank), cells.max_rank)
    keep = cells.rank <= k
    n = cells.impressions[keep].astype(np.float64)
    c = cells.clicks[keep].astype(np.float64)
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)[keep]
        n, c = n * w, c * w
    pair, rank0 = cells.pair[keep], cells.rank[keep] - 1
    shown = n > 0
    pair, rank0, n, c = pair[shown], rank0[shown], n[shown], c[shown]
    ranks_per_pair = np.bincount(pair, minlength=len(cells.pairs))
    clicks_per_pair = np.bincount(pair, weights=c, minlength=len(cells.pairs))
    use = (ranks_per_pair[pair] >= 2) & (clicks_per_pair[pair] > 0)
    if not use.any():
        raise FixedEffectsError(
            "no (query, doc) was shown at two different ranks and clicked, so harvesting has nothing to compare; "
            "it needs several rankers (or ranking changes over time) over the same queries"
        )
    if c[use & (rank0 == 0)].sum() <= 0:
        raise FixedEffectsError("no pair shown at rank 1 and at another rank was clicked, so θ_k/θ_1 has no "
                              "reference: harvesting needs clicks on results that were also shown at rank 1")
    _, pair_u = np.unique(pair[use], return_inverse=True)
    theta, _ = _fe_kernel(pair_u, rank0[use], n[use], c[use], k, max_iter, tol)
    # a rank is identified when some clicked pair links it to rank 1 (a pair's ranks form a clique)
    lo, hi = _pair_rank_span(pair_u, rank0[use] + 1)
    linked = connected_to_first(lo, hi, k)
    has_clicks = np.bincount(rank0[use], weights=c[use], minlength=k) > 0
    return np.where(linked & (has_clicks | (np.arange(k) == 0)), theta, np.nan)


def _pair_rank_span(pair: NDArray[np.int64], rank: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Edges (a, b) joining each pair's lowest rank to every other rank it was shown at (a spanning star)."""
    order = np.lexsort((rank, pair))
    p, r = pair[order], rank[order]
    first = np.r_[True, p[1:] != p[:-1]]
    lowest = np.maximum.accumulate(np.where(first, np.arange(len(p)), 0))
    other = ~first
    return r[lowest][other], r[other]
