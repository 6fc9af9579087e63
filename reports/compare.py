"""Is a difference between systems real? Paired comparisons against a baseline, and offline vs online order.

Each comparison pairs the per-query values of one metric of a system and of the baseline on the queries both
were evaluated on, and reports: the mean difference (system − baseline) with a percentile bootstrap
interval, the paired t-test p-value, the paired randomisation (sign-flip) test p-value (fixed seed), and the
per-query wins / losses / ties. The p-values of every comparison made in one report are Holm-adjusted
together (family = all systems × metrics × judgment sources compared). Smucker, Allan & Carterette (2007),
"A comparison of statistical significance tests for IR evaluation", CIKM, for the choice of tests.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from ubi_pipeline.reports.intervals import bootstrap_means, sign_flip_pvalues
from ubi_pipeline.schemas.errors import UbiError


class CompareError(UbiError):
    """Comparison arguments that cannot work (unknown baseline, misaligned arrays)."""


@dataclass(frozen=True)
class Comparison:
    """One system against the baseline on one metric of one judgment source."""

    system: str
    baseline: str
    metric: str
    source: str
    queries: int
    mean_system: float
    mean_baseline: float
    diff: float
    diff_low: float
    diff_high: float
    t_p: float
    randomisation_p: float
    wins: int
    losses: int
    ties: int
    t_p_holm: float = float("nan")
    randomisation_p_holm: float = float("nan")

    def significant(self, alpha: float = 0.05) -> bool:
        """Holm-adjusted randomisation p below ``alpha``."""
        return not math.isnan(self.randomisation_p_holm) and self.randomisation_p_holm < alpha


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm (1979) step-down adjustment: p'_(i) = max_{j<=i} min(1, (m − j + 1) p_(j)), in input order.

    Scand. J. Statist. 6:65. NaN p-values are left NaN and not counted in m.
    """
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = len(ok)
    if m == 0:
        return out.tolist()
    order = ok[np.argsort(p[ok], kind="stable")]
    adjusted = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(adjusted)
    return out.tolist()


def _paired(
    base_ids: Sequence[str], base_vals: NDArray, sys_ids: Sequence[str], sys_vals: NDArray
) -> tuple[NDArray, NDArray]:
    """Rows of the two value arrays ([n] or [n, m]) for the queries both have, in the system's order."""
    if len(base_ids) != len(base_vals) or len(sys_ids) != len(sys_vals):
        raise CompareError("query ids and values must have the same length")
    index = {q: i for i, q in enumerate(base_ids)}
    pairs = [(index[q], j) for j, q in enumerate(sys_ids) if q in index]
    b, s = np.asarray(base_vals, float), np.asarray(sys_vals, float)
    if not pairs:
        return b[:0], s[:0]
    bi, sj = (np.array(x, dtype=np.int64) for x in zip(*pairs, strict=True))
    return b[bi], s[sj]


def _columns(ids: Sequence[str], values: NDArray, m: int, system: str) -> NDArray:
    """Values as [n, m]: a 1-D array is one metric. A system with no evaluated query is [0, m], not an error
    (numpy cannot infer the width of an empty array, so the width comes from the metric count)."""
    v = np.asarray(values, float)
    if v.ndim == 1 and m == 1:
        v = v.reshape(-1, 1)
    if v.ndim == 1 and v.size == 0:
        v = v.reshape(0, m)
    if v.ndim != 2 or v.shape != (len(ids), m):
        raise CompareError(f"{system}: values of shape {v.shape} for {len(ids)} queries and {m} metric(s)")
    return v


def _t_pvalue(s: NDArray, b: NDArray) -> float:
    d = s - b
    if len(d) >= 2 and np.ptp(d) > 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(stats.ttest_rel(s, b).pvalue)
    if len(d) >= 1 and np.all(d == 0):
        return 1.0
    return float("nan")  # one query, or a constant non-zero difference: no variance to test against


def compare_block(
    system: str,
    baseline: str,
    source: str,
    metrics: Sequence[str],
    base: tuple[Sequence[str], NDArray],
    other: tuple[Sequence[str], NDArray],
    *,
    n_boot: int = 10_000,
    n_perm: int = 10_000,
    seed: int = 0,
    tie_tolerance: float = 1e-12,
) -> list[Comparison]:
    """Compare ``other`` with ``base`` on several metrics at once: values are [n, len(metrics)] per side.

    The bootstrap resamples and the sign patterns are shared by the metrics (one draw, one matrix product),
    and each metric gets exactly what :func:`compare_pair` would give it alone.
    """
    b, s = _paired(base[0], _columns(base[0], base[1], len(metrics), baseline),
                   other[0], _columns(other[0], other[1], len(metrics), system))
    keep = ~(np.isnan(b).any(axis=1) | np.isnan(s).any(axis=1))
    b, s = b[keep], s[keep]
    d = s - b
    n = len(d)
    cis = bootstrap_means(d, n_boot=n_boot, seed=seed)
    rand = sign_flip_pvalues(d, n_perm=n_perm, seed=seed)
    out = []
    for j, metric in enumerate(metrics):
        dj = d[:, j]
        out.append(Comparison(
            system=system, baseline=baseline, metric=metric, source=source, queries=n,
            mean_system=float(s[:, j].mean()) if n else float("nan"),
            mean_baseline=float(b[:, j].mean()) if n else float("nan"),
            diff=cis[j].value, diff_low=cis[j].low, diff_high=cis[j].high, t_p=_t_pvalue(s[:, j], b[:, j]),
            randomisation_p=float(rand[j]), wins=int((dj > tie_tolerance).sum()),
            losses=int((dj < -tie_tolerance).sum()), ties=int((np.abs(dj) <= tie_tolerance).sum()),
        ))
    return out


def compare_pair(
    system: str,
    baseline: str,
    metric: str,
    source: str,
    base: tuple[Sequence[str], NDArray],
    other: tuple[Sequence[str], NDArray],
    *,
    n_boot: int = 10_000,
    n_perm: int = 10_000,
    seed: int = 0,
    tie_tolerance: float = 1e-12,
) -> Comparison:
    """Compare ``other`` (query ids, values) with ``base`` on their common queries, for one metric."""
    return compare_block(system, baseline, source, [metric], base, other, n_boot=n_boot, n_perm=n_perm, seed=seed,
                         tie_tolerance=tie_tolerance)[0]


def with_holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The same comparisons with Holm-adjusted t and randomisation p-values over the whole family."""
    t_adj = holm([c.t_p for c in comparisons])
    r_adj = holm([c.randomisation_p for c in comparisons])
    return [replace(c, t_p_holm=t, randomisation_p_holm=r) for c, t, r in zip(comparisons, t_adj, r_adj, strict=True)]


def compare_systems(
    per_query: Mapping[str, Mapping[tuple[str, str], tuple[Sequence[str], NDArray]]],
    baseline: str,
    *,
    n_boot: int = 10_000,
    n_perm: int = 10_000,
    seed: int = 0,
) -> list[Comparison]:
    """Every other system against ``baseline``, for every (source, metric) both have; Holm over all of them.

    ``per_query[system][(source, metric)] = (query_ids, values)``. Metrics of one source that share their
    query ids are compared in one block (shared resamples, see :func:`compare_block`).
    """
    if baseline not in per_query:
        known = ", ".join(sorted(per_query)) or "none"
        raise CompareError(f"baseline system {baseline!r} is not among the systems found in the logs ({known})")
    out = []
    for system in sorted(per_query):
        if system == baseline:
            continue
        keys = sorted(k for k in per_query[baseline] if k in per_query[system])
        for source in dict.fromkeys(src for src, _ in keys):
            metrics = [m for src, m in keys if src == source]
            b_ids, s_ids = per_query[baseline][(source, metrics[0])][0], per_query[system][(source, metrics[0])][0]
            shared = all(list(per_query[baseline][(source, m)][0]) == list(b_ids)
                         and list(per_query[system][(source, m)][0]) == list(s_ids) for m in metrics)
            groups = [metrics] if shared else [[m] for m in metrics]
            for group in groups:
                b_vals = np.column_stack([np.asarray(per_query[baseline][(source, m)][1], float) for m in group])
                s_vals = np.column_stack([np.asarray(per_query[system][(source, m)][1], float) for m in group])
                ids_b, ids_s = per_query[baseline][(source, group[0])][0], per_query[system][(source, group[0])][0]
                out += compare_block(system, baseline, source, group, (ids_b, b_vals), (ids_s, s_vals),
                                     n_boot=n_boot, n_perm=n_perm, seed=seed)
    return with_holm(out)


@dataclass(frozen=True)
class Ordering:
    """Systems ordered by an offline and by an online metric, and how well the two orders agree.

    Each order holds every system that has a finite value of its metric (a system without logs is in the
    offline order only); the correlations rest on ``common``, the systems in both (``systems`` of them).
    """

    offline_metric: str
    online_metric: str
    offline_order: list[str]
    online_order: list[str]
    systems: int
    kendall: float
    spearman: float
    common: list[str] = field(default_factory=list)
    #: queries the offline values were averaged over (those every ordered system was evaluated on), and
    #: why there is no offline order when the systems share none
    offline_queries: int | None = None
    offline_note: str | None = None


def ordering(
    offline: Mapping[str, float],
    online: Mapping[str, float],
    *,
    offline_metric: str,
    online_metric: str,
    online_higher_is_better: bool = True,
) -> Ordering:
    """Best-first orders of the systems by each metric and Kendall tau-b / Spearman between the two scores.

    Each order ranks every system with a finite value of that metric, so a system missing on one side
    still shows where it stands on the other. The correlations are computed on the systems with a finite
    value on both sides only; with fewer than two they are NaN, and with two they can only be +1 or -1
    (say so when reporting).
    """
    sign = 1.0 if online_higher_is_better else -1.0
    off_ok = sorted(s for s, v in offline.items() if math.isfinite(v))
    on_ok = sorted(s for s, v in online.items() if math.isfinite(v))
    common = sorted(set(off_ok) & set(on_ok))
    off_order = sorted(off_ok, key=lambda s: (-offline[s], s))
    on_order = sorted(on_ok, key=lambda s: (-sign * online[s], s))
    if len(common) >= 2:
        x = np.array([offline[s] for s in common])
        y = sign * np.array([online[s] for s in common])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tau = float(stats.kendalltau(x, y).statistic)
            rho = float(stats.spearmanr(x, y).statistic)
    else:
        tau = rho = float("nan")
    return Ordering(offline_metric, online_metric, off_order, on_order, len(common), tau, rho, common)
