"""Confidence intervals and resampling kernels shared by the online metrics, the offline aggregates and the
comparisons: Wilson score intervals for proportions, percentile bootstrap and Student t intervals for means,
and the paired sign-flip randomisation test. Pure numpy; every random draw comes from a seeded generator.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from ubi_pipeline.schemas.errors import UbiError

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


def _bootstrap_mean_matrix(values: NDArray[np.float64], n_boot: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """Means of ``n_boot`` resamples of the rows of ``values`` [n, m]: one index draw serves every column."""
    n, m = values.shape
    out = np.empty((n_boot, m))
    step = max(1, _CHUNK_CELLS // max(n, 1))  # depends on n only, so a column's result does not depend on m
    for start in range(0, n_boot, step):
        b = min(step, n_boot - start)
        idx = rng.integers(0, n, size=(b, n))
        for j in range(m):
            out[start : start + b, j] = values[:, j][idx].mean(axis=1)
    return out


def bootstrap_means(values: NDArray, *, confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> list[Interval]:
    """:func:`bootstrap_mean` of every column of ``values`` [n, m] with shared resamples (rows with a NaN dropped).

    Column j gets exactly the interval ``bootstrap_mean(values[:, j])`` would give on the same rows and seed.
    """
    v = np.asarray(values, float)
    if v.ndim != 2:
        raise IntervalError(f"values must be a 2-D array [n, m], got shape {v.shape}")
    if n_boot < 1:
        raise IntervalError(f"n_boot must be >= 1, got {n_boot}")
    _z(confidence)
    v = v[~np.isnan(v).any(axis=1)]
    n, m = v.shape
    if n == 0:
        return [Interval(float("nan"), float("nan"), float("nan"), 0, "bootstrap")] * m
    means = np.array([v[:, j].mean() for j in range(m)])  # per column: the same sum as a 1-D call
    if n == 1:
        return [Interval(float(x), float(x), float(x), 1, "bootstrap") for x in means]
    boot = _bootstrap_mean_matrix(v, n_boot, np.random.default_rng(seed))
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha], axis=0)
    out = []
    for j in range(m):
        if np.all(v[:, j] == v[0, j]):  # no spread: the resampled means equal the mean, up to rounding
            out.append(Interval(float(means[j]), float(means[j]), float(means[j]), n, "bootstrap"))
        else:
            out.append(Interval(float(means[j]), float(lo[j]), float(hi[j]), n, "bootstrap"))
    return out


def bootstrap_mean(values: NDArray, *, confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> Interval:
    """Mean with a percentile bootstrap interval: resample the n values with replacement ``n_boot`` times.

    Efron & Tibshirani (1993), An Introduction to the Bootstrap, ch. 13. Seeded, so the same input gives the
    same interval. NaN values are dropped; one value: the interval is the point; none: NaN.
    """
    v = np.asarray(values, float).reshape(-1, 1)
    return bootstrap_means(v, confidence=confidence, n_boot=n_boot, seed=seed)[0]


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


#: Above this many units a mean's interval is the t interval: by then the bootstrap distribution of a mean is
#: normal to within its own Monte Carlo error, and resampling n x n_boot values costs seconds per metric.
RESAMPLE_LIMIT = 5_000


def mean_intervals(values: NDArray, *, confidence: float = 0.95, n_boot: int = 2_000, seed: int = 0,
                   resample_limit: int = RESAMPLE_LIMIT) -> list[Interval]:
    """Per column of ``values`` [n, m]: :func:`bootstrap_means` up to ``resample_limit`` rows, else :func:`t_mean`."""
    v = np.asarray(values, float)
    if v.ndim != 2:
        raise IntervalError(f"values must be a 2-D array [n, m], got shape {v.shape}")
    rows = v[~np.isnan(v).any(axis=1)]
    if len(rows) > resample_limit:
        return [t_mean(rows[:, j], confidence=confidence) for j in range(v.shape[1])]
    return bootstrap_means(v, confidence=confidence, n_boot=n_boot, seed=seed)


def mean_interval(values: NDArray, *, confidence: float = 0.95, n_boot: int = 2_000, seed: int = 0,
                  resample_limit: int = RESAMPLE_LIMIT) -> Interval:
    """:func:`bootstrap_mean` up to ``resample_limit`` values, else :func:`t_mean` (``Interval.method`` says which)."""
    v = np.asarray(values, float).reshape(-1, 1)
    return mean_intervals(v, confidence=confidence, n_boot=n_boot, seed=seed, resample_limit=resample_limit)[0]


def _sign_flip_hits(d: NDArray[np.float64], n_perm: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """Per column of ``d`` [n, m]: how many random sign patterns give |mean| >= the observed |mean|."""
    n, m = d.shape
    observed = np.abs(d.mean(axis=0))
    tol = 1e-12 * np.maximum(1.0, observed)  # permutations equal to the observed mean up to rounding count
    hits = np.zeros(m, dtype=np.int64)
    step = max(1, _CHUNK_CELLS // n)
    for start in range(0, n_perm, step):
        b = min(step, n_perm - start)
        # one random bit per (permutation, query): unpacked bytes are ~5x cheaper than integers(0, 2)
        bits = np.unpackbits(rng.integers(0, 256, size=(b, (n + 7) // 8), dtype=np.uint8), axis=1)[:, :n]
        flipped = np.abs((bits.astype(np.float64) * 2.0 - 1.0) @ d) / n  # [b, m] in one BLAS call
        hits += (flipped >= observed - tol).sum(axis=0)
    return hits


def sign_flip_pvalues(diffs: NDArray, *, n_perm: int = 10_000, seed: int = 0) -> NDArray[np.float64]:
    """:func:`sign_flip_pvalue` of every column of ``diffs`` [n, m], with shared sign patterns (rows with NaN dropped)."""
    d = np.asarray(diffs, float)
    if d.ndim != 2:
        raise IntervalError(f"diffs must be a 2-D array [n, m], got shape {d.shape}")
    if n_perm < 1:
        raise IntervalError(f"n_perm must be >= 1, got {n_perm}")
    d = d[~np.isnan(d).any(axis=1)]
    n, m = d.shape
    if n == 0:
        return np.full(m, np.nan)
    p = (_sign_flip_hits(d, n_perm, np.random.default_rng(seed)) + 1) / (n_perm + 1)
    return np.where(np.all(d == 0, axis=0), 1.0, p)


def sign_flip_pvalue(diffs: NDArray, *, n_perm: int = 10_000, seed: int = 0) -> float:
    """Two-sided paired randomisation test of mean difference 0: flip the sign of each difference at random.

    p = (1 + #{|mean(s·d)| >= |mean(d)|}) / (1 + n_perm), the add-one estimate that is never 0
    (Phipson & Smyth 2010); as in Smucker, Allan & Carterette (2007), CIKM, for IR system comparisons.
    All differences 0: p = 1. NaN differences are dropped.
    """
    return float(sign_flip_pvalues(np.asarray(diffs, float).reshape(-1, 1), n_perm=n_perm, seed=seed)[0])


#: Fewest values a percentile bootstrap interval is shown for. Below it the resampled means take too few
#: distinct values for 2.5% / 97.5% percentiles to mean anything: with n = 2 they are {a, (a+b)/2, b}, so the
#: "95% interval" is the range of the data; with n = 3 each extreme has probability 1/27 > 2.5%, so again
#: the range; from n = 5 on there are 126 distinct resamples and no single one carries 2.5%.
MIN_BOOTSTRAP_N = 5


def why_no_interval(iv: Interval) -> str | None:
    """Why ``iv`` should be shown as a bare value (no bar, no bounds), or None when its interval is meaningful.

    n = 0: nothing measured; n = 1: no spread to estimate (any method gives a zero-width or undefined
    interval); a bootstrap under :data:`MIN_BOOTSTRAP_N` values (see there); bounds that are not finite.
    Wilson intervals hold from n = 1 (a proportion of one trial still has a proper score interval).
    """
    if iv.n == 0:
        return "n = 0"
    if iv.method != "wilson" and iv.n < 2:
        return "n = 1"
    if iv.method == "bootstrap" and iv.n < MIN_BOOTSTRAP_N:
        return f"n = {iv.n} < {MIN_BOOTSTRAP_N} for a bootstrap"
    if not (np.isfinite(iv.low) and np.isfinite(iv.high)):
        return "no interval"
    return None
