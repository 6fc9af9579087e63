"""Confidence intervals and resampling kernels shared by the online metrics, the offline aggregates and the
comparisons: Wilson score intervals for proportions, percentile bootstrap and Student t intervals for means,
and the paired sign-flip randomisation test. Pure numpy; every random draw comes from a seeded generator.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from schemas.errors import UbiError

#: Largest number of resampled values held in memory at once (B x n is processed in chunks below this).
_CHUNK_CELLS = 4_000_000


class IntervalError(UbiError):
    """Bad arguments to an interval (negative counts, a confidence level outside (0, 1), ...)."""


class Interval(NamedTuple):
    """A point estimate with its interval; ``n`` is how many units (searches, queries) it rests on."""

    value: float
    low: float
    high: float
    n: int
    method: str


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise IntervalError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    return float(stats.norm.ppf(0.5 + confidence / 2.0))


def _wilson(successes: NDArray[np.float64], n: NDArray[np.float64], z: float) -> tuple[NDArray, NDArray, NDArray]:
    with np.errstate(invalid="ignore", divide="ignore"):
        p = successes / n
        z2 = z * z
        denom = 1.0 + z2 / n
        centre = (p + z2 / (2.0 * n)) / denom
        half = z / denom * np.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n))
    return p, np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)


def wilson(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval of a proportion ``successes / n``.

    centre = (p + z²/2n) / (1 + z²/n),  half = z / (1 + z²/n) · sqrt(p(1-p)/n + z²/4n²);
    E. B. Wilson (1927), JASA 22:209; recommended over the Wald interval by Brown, Cai & DasGupta (2001),
    Statistical Science 16:101. ``n = 0`` gives NaN everywhere (nothing to estimate).
    """
    if n < 0 or successes < 0 or successes > n:
        raise IntervalError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, "wilson")
    p, lo, hi = _wilson(np.array([successes], float), np.array([n], float), _z(confidence))
    return Interval(float(p[0]), float(lo[0]), float(hi[0]), int(n), "wilson")


def wilson_arrays(successes: NDArray, n: NDArray, confidence: float = 0.95) -> tuple[NDArray, NDArray, NDArray]:
    """Vectorised :func:`wilson`: (p, low, high) arrays; NaN where ``n == 0``."""
    s = np.asarray(successes, float)
    m = np.asarray(n, float)
    if (s < 0).any() or (s > m).any():
        raise IntervalError("need 0 <= successes <= n in every cell")
    return _wilson(s, m, _z(confidence))


def _bootstrap_means(values: NDArray[np.float64], n_boot: int, rng: np.random.Generator) -> NDArray[np.float64]:
    n = len(values)
    out = np.empty(n_boot)
    step = max(1, _CHUNK_CELLS // max(n, 1))
    for start in range(0, n_boot, step):
        b = min(step, n_boot - start)
        idx = rng.integers(0, n, size=(b, n))
        out[start : start + b] = values[idx].mean(axis=1)
    return out


def bootstrap_mean(values: NDArray, *, confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> Interval:
    """Mean with a percentile bootstrap interval: resample the n values with replacement ``n_boot`` times.

    Efron & Tibshirani (1993), An Introduction to the Bootstrap, ch. 13. Seeded, so the same input gives the
    same interval. Fewer than 2 values: the interval is the point itself (n = 1) or NaN (n = 0).
    """
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if n_boot < 1:
        raise IntervalError(f"n_boot must be >= 1, got {n_boot}")
    _z(confidence)
    if len(v) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, "bootstrap")
    mean = float(v.mean())
    if len(v) == 1 or np.all(v == v[0]):
        return Interval(mean, mean, mean, len(v), "bootstrap")
    means = _bootstrap_means(v, n_boot, np.random.default_rng(seed))
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return Interval(mean, float(lo), float(hi), len(v), "bootstrap")


def t_mean(values: NDArray, *, confidence: float = 0.95) -> Interval:
    """Mean with a Student t interval: mean ± t_{n-1} · s / sqrt(n) (Student 1908)."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, "t")
    mean = float(v.mean())
    if len(v) == 1:
        return Interval(mean, float("nan"), float("nan"), 1, "t")
    half = float(stats.t.ppf(0.5 + confidence / 2.0, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
    return Interval(mean, mean - half, mean + half, len(v), "t")


def sign_flip_pvalue(diffs: NDArray, *, n_perm: int = 10_000, seed: int = 0) -> float:
    """Two-sided paired randomisation test of mean difference 0: flip the sign of each difference at random.

    p = (1 + #{|mean(s·d)| >= |mean(d)|}) / (1 + n_perm), the add-one estimate that is never 0
    (Phipson & Smyth 2010); as in Smucker, Allan & Carterette (2007), CIKM, for IR system comparisons.
    """
    d = np.asarray(diffs, float)
    d = d[~np.isnan(d)]
    if len(d) == 0:
        return float("nan")
    if n_perm < 1:
        raise IntervalError(f"n_perm must be >= 1, got {n_perm}")
    observed = abs(d.mean())
    if np.all(d == 0):
        return 1.0
    rng = np.random.default_rng(seed)
    n = len(d)
    hits = 0
    step = max(1, _CHUNK_CELLS // n)
    # a tiny tolerance so that permutations equal to the observed mean up to rounding count as "as extreme"
    tol = 1e-12 * max(1.0, observed)
    for start in range(0, n_perm, step):
        b = min(step, n_perm - start)
        signs = rng.integers(0, 2, size=(b, n)) * 2 - 1
        hits += int((np.abs((signs * d).mean(axis=1)) >= observed - tol).sum())
    return (hits + 1) / (n_perm + 1)
