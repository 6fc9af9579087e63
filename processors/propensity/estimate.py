"""The propensity stage: one estimator by name, its bootstrap interval, and the evidence behind it.

Stages are functions over typed inputs: :func:`estimate_from_patterns` takes the weighted session patterns
(``ubi_pipeline.processors.clicks.sessions`` builds them from the store, ``ubi_pipeline.processors.simulation`` from known truth) and
:func:`estimate_randomized` the arms of a swap experiment. The numeric work is in ``em``, ``harvest``,
``randomized`` and ``bootstrap``.

Identifiability: EM and harvesting learn θ only from (query, doc) pairs shown at two or more ranks. With
none (one fixed ranking per query) every rank's click rate is explained by relevance alone and any curve
fits equally well, so both refuse; ranks no such pair links to rank 1 are NaN, and ranks resting on fewer
than :data:`FEW_LINKING_PAIRS` linking pairs are named in the notes.

Harvesting (``--method harvest``) is the pair fixed-effects estimator of ``harvest.pair_fixed_effects``
(PBM's per-pair attractiveness conditioned away), and its bootstrap resamples *queries* (clusters), not
sessions: a query's sessions share its pairs and rankings. On 30 simulated hard logs of 50,000 searches
(seeds 200-229, 200 replicates) its 95% percentile intervals covered the truth at 254 of 270 (rank, log)
cases (94%); on the held-out seeds 100-104 (100 replicates) 38 of 45 (84%), where AllPairs with the session
bootstrap it replaced covered 37 (82%). docs/benchmarks.md has the figures (bench/propensity_coverage.py).

Intervals: percentile bootstrap for harvesting and swaps, which are close to unbiased; for EM the basic
bootstrap interval of log θ (``bootstrap.basic_log_interval``). PBM EM fits one attractiveness per pair, and
with a few dozen impressions per pair (and attractiveness near its bound of 1 under the simulation
protocol) its θ̂_k/θ̂_1 runs high by a few percent (incidental-parameter bias: +2% to +6% at ranks 2-10 on
20 simulated logs of 5,000 sessions, about +1% at 50,000). Bootstrap replicates repeat part of that bias, so
the percentile interval moved away from the truth: it covered 124 of 180 rank-log cases (69%), the basic
interval 162 (90%; harvesting 169, 94%; ``bench/propensity_coverage.py --seeds 20``). The basic interval
still under-covers because the replicates see only about half the bias. Shrinking α towards a per-query
Beta prior (MAP-EM, 1 to 20 pseudo-impressions) made the bias worse (-13% to -40% at rank 10): rank and
relevance are confounded, the docs shown low are the less relevant ones, so pulling their α up pulls θ at
low ranks down. So the point estimate keeps its bias, and the notes quantify it whenever the bootstrap's
estimate of bias exceeds a quarter of the standard error (Efron & Tibshirani 1993, §10.3).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.clicks.identifiability import UNIDENTIFIED as _NONE
from ubi_pipeline.processors.clicks.identifiability import assess
from ubi_pipeline.processors.clicks.stats import ClickCells, SessionPatterns
from ubi_pipeline.processors.propensity.bootstrap import (
    SCHEME,
    UNITS,
    CellMap,
    basic_log_interval,
    bias_and_se,
    bootstrap,
)
from ubi_pipeline.processors.propensity.common import METHODS, PropensityError, PropensityEstimate
from ubi_pipeline.processors.propensity.em import em_ratios, replicate_ratios
from ubi_pipeline.processors.propensity.harvest import harvest_stats, pair_fixed_effects
from ubi_pipeline.processors.propensity.marginal import Refit, marginal_em
from ubi_pipeline.processors.propensity.randomized import SwapSessions, arm_counts, swap_ratios

Progress = Callable[[int], None]

#: a rank linked to the others by fewer (query, doc) pairs than this gets a note: its θ̂ rests on little
FEW_LINKING_PAIRS = 20
#: bootstrap bias below this share of the standard error is not worth a note (Efron & Tibshirani 1993, §10.3)
BIAS_NOTE_SHARE = 0.25
#: what the bootstrap resamples by default (``estimate_from_patterns(unit=...)``, ``ubi propensity --resample``)
DEFAULT_UNIT = {"em": "session", "marginal": "session", "harvest": "query"}
INTERVALS = {"em": "basic bootstrap interval of log θ (reflected around the estimate: corrects a bias the "
                   "replicates share)", "marginal": "percentile", "harvest": "percentile",
             "randomized": "percentile"}

UNIDENTIFIED = (
    "no (query, doc) was shown at two different ranks (one fixed ranking per query), so {what} cannot tell "
    "position from relevance: any examination curve explains these clicks equally well. Position bias needs the "
    "same results at different ranks: several rankers over the same queries (an A/B test or interleaving), "
    "ranking changes over time, or a randomised swap experiment (searches marked in query_attributes.randomized; "
    "then use --method randomized)"
)


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
    unit: str | None = None,
) -> PropensityEstimate:
    """θ̂_k/θ̂_1 by ``method`` (``em``, ``marginal`` or ``harvest``) with a bootstrap interval.

    ``replicates = 0`` skips the bootstrap (intervals are NaN). ``unit`` is what the bootstrap resamples:
    ``query`` (clusters: each drawn query brings all its sessions; the default for harvest) or ``session``
    (whole sessions, so the dependence between ranks of a session is kept; the default for em and marginal,
    whose coverage was measured that way). See :data:`DEFAULT_UNIT`.
    """
    if method not in ("em", "marginal", "harvest"):
        raise PropensityError(f"method {method!r} works on swap experiments or is unknown; "
                              f"from session patterns choose em, marginal or harvest (all: {', '.join(METHODS)})")
    unit = DEFAULT_UNIT[method] if unit is None else unit
    if unit not in UNITS:
        raise PropensityError(f"bootstrap unit {unit!r} is unknown; choose one of {', '.join(UNITS)}")
    if method == "marginal" and unit == "query":
        raise PropensityError("--resample query is not available for --method marginal: a query drawn twice "
                              "would put its pairs' doubled counts under one draw of the prior; use session")
    k = sessions.max_rank if max_rank is None else int(max_rank)
    if k < 2:
        raise PropensityError(f"max rank must be at least 2 to compare ranks, got {k}")
    sessions = _cut(sessions, k)
    k = sessions.max_rank
    cmap = CellMap(sessions)
    cells = cmap.cells()
    if len(cells.pair) == 0:
        raise PropensityError("the log has no displayed results: nothing to estimate position bias from")

    ident = assess(cells)  # the verdict `ubi process` and `ubi report` use too
    if ident.verdict == _NONE:
        raise PropensityError(f"identifiability: {ident.verdict}: "
                              + UNIDENTIFIED.format(what="harvesting" if method == "harvest" else "PBM EM"))
    hs = harvest_stats(cells)
    # EM gives every shown rank a number, but only ranks linked to rank 1 through shared pairs are identified
    reached = np.isin(np.arange(1, k + 1), ident.linked_ranks)

    # the replicates reach the same maximiser by a shorter route: marginal's start from the full log's estimate
    # (marginal.Refit: a few BFGS steps instead of a hundred EM iterations); EM's leave out the pairs never clicked
    # (em.replicate_ratios). Not EM from the full log's α̂: PBM EM then crawled along its flat directions and took
    # longer than from the click rates, stopping 5e-4 away (measured on 50,000 searches)
    refit: Callable[[ClickCells], NDArray[np.float64]] = pair_fixed_effects
    if method == "em":
        ratio = em_ratios(cells)
        refit = replicate_ratios
    elif method == "marginal":
        fit = marginal_em(cells)
        ratio = fit.ratio
        if replicates > 0:
            refit = Refit(cells, fit).ratios
    else:
        ratio = pair_fixed_effects(cells)

    def replicate(w: NDArray[np.int64]) -> NDArray[np.float64]:
        est = refit(cmap.cells(w))
        return est if method == "harvest" else np.where(reached, est, np.nan)

    if method != "harvest":
        ratio = np.where(reached, ratio, np.nan)
    support = _rank_support(cells, k)
    notes: list[str] = []
    if not np.isfinite(ratio).all():
        missing = [int(r) + 1 for r in np.flatnonzero(~np.isfinite(ratio))]
        notes.append(f"ranks {missing} are not identifiable: no (query, doc) links them to rank 1")
    few = [r + 1 for r in range(k) if np.isfinite(ratio[r]) and support["pairs_at_other_ranks"][r] < FEW_LINKING_PAIRS]
    if few:
        notes.append(f"ranks {few} are linked to the others by fewer than {FEW_LINKING_PAIRS} (query, doc) pairs "
                     "shown at another rank too (column 'pairs also at k'≠k'): their estimates rest on little and "
                     "lean on the model; more rankers, ranking changes over time or a swap experiment would help")
    low = high = np.full(k, np.nan)
    done = 0
    details: dict[str, object] = {}
    if replicates > 0:
        boot = bootstrap(sessions.weight, replicate, replicates=replicates, seed=seed, level=level, progress=progress,
                         clusters=sessions.query if unit == "query" else None)
        low, high, done = boot.low, boot.high, boot.replicates
        if method == "em":
            low, high = basic_log_interval(ratio, boot)
        bias, se = bias_and_se(ratio, boot)
        details["bootstrap_bias"] = [_round(x) for x in bias]
        details["bootstrap_se"] = [_round(x) for x in se]
        notes += _bias_notes(method, ratio, bias, se, boot.low, boot.high)
        if boot.failed:
            notes.append(f"{boot.failed} of {replicates} bootstrap replicates could not be fitted")
    linked = int((hs.n_pairs > 0).sum())
    details = {
        **details,
        "interval": INTERVALS[method] if replicates else "none",
        "pairs": len(sessions.pairs),
        "pairs_at_several_ranks": ident.pairs_at_several_ranks,
        "identifiability": ident.as_dict(),
        "rank_pair_support": [{"k": int(a), "k2": int(b), "pairs": int(n)}
                              for a, b, n in zip(hs.k, hs.k2, hs.n_pairs, strict=True)],
    }
    if method == "em":
        details["model"] = "pbm"
    elif method == "marginal":
        details["model"] = "pbm, attractiveness integrated out under the rank-informed empirical prior"
    else:
        details["model"] = ("pbm with one attractiveness per (query, doc) conditioned away: Poisson conditional "
                            "(pair fixed-effects) likelihood over the pairs shown at two or more ranks")
    return PropensityEstimate(method, ratio, low, high, level, done, UNITS[unit] if replicates else "none",
                              sessions.n_sessions, linked, support, details, tuple(notes))


def _round(x: float) -> float | None:
    return round(float(x), 6) if np.isfinite(x) else None


def _bias_notes(method: str, ratio: NDArray[np.float64], bias: NDArray[np.float64], se: NDArray[np.float64],
                q_low: NDArray[np.float64], q_high: NDArray[np.float64]) -> list[str]:
    """Say when the bootstrap sees a bias worth mentioning, and when the estimate lies outside its replicates."""
    notes = []
    with np.errstate(all="ignore"):
        share = np.abs(bias) / se
        rel = bias / ratio
    big = [r for r in range(1, len(ratio)) if np.isfinite(share[r]) and share[r] > BIAS_NOTE_SHARE]
    if big:
        worst = max(big, key=lambda r: abs(rel[r]))
        fix = ("the interval is reflected around the estimate (basic bootstrap), which corrects for a bias the "
               "replicates share, but the point estimate keeps it; it shrinks as the log grows (more impressions "
               "per (query, doc)), and harvesting is nearly free of it" if method == "em" else
               "the percentile interval does not correct for it; read the interval with that in mind")
        notes.append(
            f"bootstrap estimate of bias (mean of replicates − estimate) exceeds {BIAS_NOTE_SHARE:g} standard errors "
            f"at ranks {[r + 1 for r in big]} (largest {rel[worst]:+.1%} of the estimate, at rank {worst + 1}): "
            + ("PBM EM fits one attractiveness per (query, doc), and with few impressions per pair that biases "
               "θ̂_k/θ̂_1 (incidental parameters); " if method == "em" else "the estimator is biased at this size; ")
            + fix)
    outside = [r + 1 for r in range(len(ratio)) if np.isfinite(ratio[r]) and np.isfinite(q_low[r])
               and not q_low[r] - 1e-12 <= ratio[r] <= q_high[r] + 1e-12]
    if outside:
        notes.append(
            f"at ranks {outside} the estimate lies outside the central {'' if method == 'em' else 'percentile '}"
            "range of its own bootstrap replicates: the replicates are centred away from it, which a biased "
            "estimator does (each resample applies the bias again); it is not a computing error, but the estimate "
            "at those ranks is unreliable: collect more data or use --method harvest")
    return notes


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
        missing = [int(r) + 1 for r in np.flatnonzero(~np.isfinite(ratio))]
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
