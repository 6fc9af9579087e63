"""Inter-assessor reliability kernels: Krippendorff's alpha over any number of assessors, with a bootstrap over
units, and a bootstrap of Cohen's quadratic-weighted kappa for two. Pure numpy, no I/O.

Krippendorff's alpha (Krippendorff 2004, *Content Analysis*, 2nd ed., ch. 11; 2011, "Computing Krippendorff's
Alpha-Reliability", Annenberg School for Communication, departmental paper 43). Reliability data: ``m`` coders x
``N`` units, missing values allowed. Only units with at least two values are pairable. With n_uc the number of
values c in unit u and m_u = Σ_c n_uc, the coincidence matrix is

    o_ck = Σ_u (n_uc · n_uk − [c = k] · n_uc) / (m_u − 1),    n_c = Σ_k o_ck,    n = Σ_c n_c,

and α = 1 − D_o / D_e = 1 − (n − 1) · Σ_ck o_ck δ²_ck / Σ_ck n_c n_k δ²_ck, with the difference function of the
metric: nominal δ² = [c ≠ k]; ordinal δ² = (Σ_{g=c..k} n_g − (n_c + n_k) / 2)²; interval δ² = (c − k)².
The report uses the interval metric on the grades 0..G-1: its δ² is the squared grade difference, the same
weighting as the quadratic-weighted kappa beside it (for two coders and many units the two nearly coincide),
and a grade scale whose steps are meant as equal (the rubric's 0-3) is read as such.

Cohen's weighted kappa (Cohen 1968) is :func:`ubi_pipeline.processors.labels.grades.quadratic_kappa_from_confusion`;
:func:`bootstrap_kappa` only resamples the units it is computed on.

Intervals: percentile bootstrap over units, each unit resampled whole with all its values (Efron & Tibshirani
1993, ch. 13), as every other interval of the report resamples its units. Hayes & Krippendorff (2007,
Communication Methods and Measures 1:77) bootstrap alpha differently, by resampling pairable values; their
interval is not this one. Replicates where the statistic is undefined (every resampled value equal: D_e = 0)
are dropped; when more than half are, no interval.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.labels.grades import confusion_matrix, quadratic_kappa_from_confusion
from ubi_pipeline.schemas.errors import UbiError

METRICS = ("nominal", "ordinal", "interval")
#: largest number of (replicate x unit) weights drawn at once
_CHUNK = 4_000_000


class ReliabilityError(UbiError):
    """Reliability data that cannot be used (a negative grade, an unknown metric, a wrong shape)."""


class Estimate(NamedTuple):
    """A statistic, its percentile bootstrap bounds (NaN: none) and the units it rests on."""

    value: float
    low: float
    high: float
    n: int


def unit_counts(data: NDArray[np.float64], n_grades: int | None = None) -> NDArray[np.float64]:
    """Per unit, how many coders gave each grade: [N units, G] from reliability data [m coders, N units]
    (NaN = missing; grades are 0..G-1)."""
    d = np.asarray(data, dtype=np.float64)
    if d.ndim != 2:
        raise ReliabilityError(f"reliability data must be [coders, units], got shape {d.shape}")
    seen = d[~np.isnan(d)]
    if seen.size and (seen.min() < 0 or np.any(seen != np.round(seen))):
        raise ReliabilityError("grades must be non-negative integers")
    g = n_grades if n_grades is not None else (int(seen.max()) + 1 if seen.size else 1)
    counts = np.zeros((d.shape[1], g))
    for row in d:
        ok = ~np.isnan(row)
        np.add.at(counts, (np.nonzero(ok)[0], row[ok].astype(np.int64)), 1.0)
    return counts


def _unit_coincidences(counts: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each pairable unit's contribution to the coincidence matrix, flattened: [N pairable, G*G]."""
    m = counts.sum(axis=1)
    c = counts[m >= 2]
    w = 1.0 / (c.sum(axis=1) - 1.0)
    outer = c[:, :, None] * c[:, None, :]
    g = counts.shape[1]
    idx = np.arange(g)
    outer[:, idx, idx] -= c
    return (outer * w[:, None, None]).reshape(len(c), g * g)


def _delta2(metric: str, n_c: NDArray[np.float64]) -> NDArray[np.float64]:
    """δ²[..., c, k] for grades 0..G-1; ``n_c`` [..., G] (used by the ordinal metric)."""
    g = n_c.shape[-1]
    i, j = np.indices((g, g))
    if metric == "nominal":
        return np.broadcast_to((i != j).astype(np.float64), (*n_c.shape[:-1], g, g))
    if metric == "interval":
        return np.broadcast_to(((i - j) ** 2).astype(np.float64), (*n_c.shape[:-1], g, g))
    if metric == "ordinal":
        cum = np.cumsum(n_c, axis=-1)  # Σ_{g<=x} n_g
        lo, hi = np.minimum(i, j), np.maximum(i, j)
        between = cum[..., hi] - cum[..., lo] + n_c[..., lo]  # Σ_{g=lo..hi} n_g
        return (between - (n_c[..., i] + n_c[..., j]) / 2.0) ** 2
    raise ReliabilityError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")


def _alpha_from_coincidences(o: NDArray[np.float64], metric: str) -> NDArray[np.float64]:
    """α per coincidence matrix, ``o`` [..., G, G]; NaN where D_e = 0 (one value only)."""
    n_c = o.sum(axis=-1)
    n = n_c.sum(axis=-1)
    d2 = _delta2(metric, n_c)
    observed = (o * d2).sum(axis=(-2, -1))
    expected = (n_c[..., :, None] * n_c[..., None, :] * d2).sum(axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(expected > 0, 1.0 - (n - 1.0) * observed / expected, np.nan)


def krippendorff_alpha(data: NDArray[np.float64], metric: str = "interval", n_grades: int | None = None) -> float:
    """Krippendorff's alpha of reliability data [coders, units] (NaN = missing), module docstring formula.
    NaN when fewer than one pairable unit or every value is the same."""
    if metric not in METRICS:
        raise ReliabilityError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    per_unit = _unit_coincidences(unit_counts(data, n_grades))
    if len(per_unit) == 0:
        return float("nan")
    g = int(round(np.sqrt(per_unit.shape[1])))
    return float(_alpha_from_coincidences(per_unit.sum(axis=0).reshape(g, g), metric))


def _resampled_sums(per_unit: NDArray[np.float64], n_boot: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """Σ over ``n_boot`` resamples (with replacement) of the rows of ``per_unit`` [N, K]: [n_boot, K]."""
    n = len(per_unit)
    out = np.empty((n_boot, per_unit.shape[1]))
    step = max(1, _CHUNK // max(n, 1))
    for start in range(0, n_boot, step):
        b = min(step, n_boot - start)
        idx = rng.integers(0, n, size=(b, n))  # n draws with replacement per replicate
        # how often each unit was drawn, per replicate, in one bincount over (replicate, unit) cells
        weights = np.bincount((np.arange(b)[:, None] * n + idx).ravel(), minlength=b * n).reshape(b, n)
        out[start:start + b] = weights.astype(np.float64) @ per_unit
    return out


def _bounds(values: NDArray[np.float64], confidence: float) -> tuple[float, float]:
    ok = values[~np.isnan(values)]
    if len(ok) * 2 < len(values) or len(ok) == 0:
        return float("nan"), float("nan")
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(ok, [tail, 1.0 - tail])
    return float(lo), float(hi)


def bootstrap_alpha(data: NDArray[np.float64], *, metric: str = "interval", n_grades: int | None = None,
                    n_boot: int = 2_000, confidence: float = 0.95, seed: int = 0) -> Estimate:
    """:func:`krippendorff_alpha` with a percentile bootstrap interval over the pairable units (seeded)."""
    if metric not in METRICS:
        raise ReliabilityError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    per_unit = _unit_coincidences(unit_counts(data, n_grades))
    n = len(per_unit)
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    g = int(round(np.sqrt(per_unit.shape[1])))
    value = float(_alpha_from_coincidences(per_unit.sum(axis=0).reshape(g, g), metric))
    if n < 2 or n_boot < 1:
        return Estimate(value, float("nan"), float("nan"), n)
    sums = _resampled_sums(per_unit, n_boot, np.random.default_rng(seed)).reshape(n_boot, g, g)
    lo, hi = _bounds(_alpha_from_coincidences(sums, metric), confidence)
    return Estimate(value, lo, hi, n)


def kappa_batch(observed: NDArray[np.float64]) -> NDArray[np.float64]:
    """:func:`~ubi_pipeline.processors.labels.grades.quadratic_kappa_from_confusion` of each confusion matrix
    of ``observed`` [B, G, G] at once (the same formula, vectorised for bootstrap replicates); NaN where undefined."""
    o = np.asarray(observed, dtype=np.float64)
    g = o.shape[-1]
    if g < 2:
        return np.full(o.shape[0], np.nan)
    total = o.sum(axis=(1, 2))
    i, j = np.indices((g, g))
    w = (i - j) ** 2 / (g - 1) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = o.sum(axis=2)[:, :, None] * o.sum(axis=1)[:, None, :] / total[:, None, None]
        denom = (w * expected).sum(axis=(1, 2))
        out = 1.0 - (w * o).sum(axis=(1, 2)) / denom
    return np.where((total > 0) & (denom > 0), out, np.nan)


def bootstrap_kappa(a: NDArray[np.int64], b: NDArray[np.int64], n_grades: int, *, n_boot: int = 2_000,
                    confidence: float = 0.95, seed: int = 0) -> Estimate:
    """Quadratic-weighted Cohen's kappa of two assessors on the units both graded (Cohen 1968; the kernel
    :func:`~ubi_pipeline.processors.labels.grades.quadratic_kappa_from_confusion`), with a percentile bootstrap
    interval over those units (seeded)."""
    x = np.asarray(a, dtype=np.int64)
    y = np.asarray(b, dtype=np.int64)
    if x.shape != y.shape:
        raise ReliabilityError(f"the two assessors' grades differ in length ({x.shape} and {y.shape})")
    if x.size and (x.min() < 0 or y.min() < 0):
        raise ReliabilityError("grades must be non-negative integers")
    n = int(x.size)
    value = quadratic_kappa_from_confusion(confusion_matrix(x, y, n_grades)) if n else float("nan")
    if n < 2 or n_boot < 1:
        return Estimate(value, float("nan"), float("nan"), n)
    one_hot = np.zeros((n, n_grades * n_grades))
    one_hot[np.arange(n), x * n_grades + y] = 1.0
    sums = _resampled_sums(one_hot, n_boot, np.random.default_rng(seed)).reshape(n_boot, n_grades, n_grades)
    kappas = kappa_batch(sums)
    lo, hi = _bounds(kappas, confidence)
    return Estimate(value, lo, hi, n)
