"""Helpers every click model shares: input checks, per-pair support counts, intervals, clamping.

Pure numpy (and scipy.special's inverse incomplete Beta and normal quantile); no I/O. The quantiles come from
scipy.special, not scipy.stats: the same Boost functions (beta.ppf is betaincinv, norm.ppf is ndtri), and
scipy.stats costs about a second of CPU to import in every ``ubi`` process that fits a model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray
from scipy.special import betaincinv, ndtri

from ubi_pipeline.processors.clicks.stats import CELL_CHUNK_PATTERNS, ClickCells, SessionPatterns, StatsError
from ubi_pipeline.schemas.errors import UbiError

# Probabilities are clamped to [PROB_EPS, 1 - PROB_EPS] wherever a log is taken of a prediction, so that a
# pair never seen clicked (α̂ = 0) costs log2(1e-6) ≈ -20 bits on a held-out click instead of -inf.
PROB_EPS = 1e-6
CONFIDENCE = 0.95


AnyArray = NDArray[Any]  # counts or probabilities, integer or float


def weighted_count(index: AnyArray, weights: AnyArray, n: int) -> NDArray[np.float64]:
    """Σ of ``weights`` per value of ``index`` in 0..n-1 (``np.bincount`` with weights, typed as float)."""
    return np.bincount(index, weights=weights, minlength=n).astype(np.float64, copy=False)


class ClickModelError(UbiError):
    """A click model was used wrongly: predicting before fitting, or on sessions of another shape."""


def check_sessions(sessions: SessionPatterns) -> None:
    """Raise ``ClickModelError`` unless the patterns are consistent (shapes, pair ids, non-negative weights)."""
    try:
        sessions.check()
    except StatsError as exc:
        raise ClickModelError(str(exc)) from exc
    if sessions.docs.ndim != 2:
        raise ClickModelError(
            f"SessionPatterns.docs must be [patterns, ranks], got shape {sessions.docs.shape}"
        )
    if len(sessions.weight) and sessions.weight.min() < 0:
        raise ClickModelError("SessionPatterns.weight must be >= 0")
    if sessions.docs.size and sessions.docs.max() >= len(sessions.pairs):
        raise ClickModelError(
            f"SessionPatterns.docs refers to pair {int(sessions.docs.max())} but the PairIndex has "
            f"{len(sessions.pairs)} pairs"
        )


def check_cells(cells: ClickCells) -> None:
    """Raise ``ClickModelError`` unless the PBM cells are consistent."""
    try:
        cells.check()
    except StatsError as exc:
        raise ClickModelError(str(exc)) from exc
    if len(cells.pair) and (cells.pair.min() < 0 or cells.pair.max() >= len(cells.pairs)):
        raise ClickModelError(f"cell pair ids must lie in 0..{len(cells.pairs) - 1}")
    if len(cells.pair) and (cells.clicks.min() < 0 or cells.impressions.min() < 0):
        raise ClickModelError("cell counts must be >= 0")


def check_rank(fitted_k: int, sessions: SessionPatterns, model: str) -> None:
    """Predictions need sessions no deeper than the ranks the model was fitted on."""
    if sessions.max_rank > fitted_k:
        raise ClickModelError(
            f"{model} was fitted on {fitted_k} ranks but the sessions have {sessions.max_rank}; "
            f"fit on sessions at least as deep"
        )


def clamp(p: NDArray[np.float64]) -> NDArray[np.float64]:
    """Keep probabilities away from 0 and 1 (NaN stays NaN)."""
    return np.clip(p, PROB_EPS, 1.0 - PROB_EPS)


def gather(values: NDArray[np.float64], docs: NDArray[np.int64], prior: float,
           chunk: int = CELL_CHUNK_PATTERNS) -> NDArray[np.float64]:
    """Per-position values of a per-pair parameter: ``prior`` for pair ids beyond the fitted ones, NaN if unshown.

    Pair ids index the same :class:`PairIndex` the model was fitted with; ids the model never saw (beyond
    ``len(values)``, or marked NaN in ``values``) get ``prior``. Filled ``chunk`` rows at a time, so besides the
    answer only one chunk's temporaries are held (a log of 2M patterns x 10 ranks: 160 MB an array).
    """
    n = len(values)
    out = np.empty(docs.shape, dtype=np.float64)
    step = max(1, int(chunk))
    for lo in range(0, len(docs), step):
        d = docs[lo:lo + step]
        inside = (d >= 0) & (d < n)
        v = np.where(inside, values[np.clip(d, 0, max(n - 1, 0))] if n else prior, prior)
        v[np.isnan(v)] = prior
        v[d < 0] = np.nan
        out[lo:lo + step] = v
    return out


def pair_support(sessions: SessionPatterns, chunk: int = CELL_CHUNK_PATTERNS
                 ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """(impressions, clicks, sessions) per pair: shown count, clicked count, distinct sessions showing it;
    summed ``chunk`` patterns at a time (``stats.CELL_CHUNK_PATTERNS``), so the per-slot temporaries stay small."""
    n_pairs = len(sessions.pairs)
    imps = np.zeros(n_pairs)
    clk = np.zeros(n_pairs)
    ses = np.zeros(n_pairs)
    n = sessions.docs.shape[0]
    for lo in range(0, n, max(int(chunk), 1)):
        d, c = sessions.docs[lo:lo + chunk], sessions.clicks[lo:lo + chunk]
        w = np.broadcast_to(sessions.weight[lo:lo + chunk, None], d.shape)
        shown = d >= 0
        imps += np.bincount(d[shown], weights=w[shown], minlength=n_pairs)
        clk += np.bincount(d[shown & c], weights=w[shown & c], minlength=n_pairs)
        # a pair shown twice in one ranking is one session: count only its first occurrence per row
        ds = np.sort(d, axis=1)
        first = ds >= 0
        first[:, 1:] &= ds[:, 1:] != ds[:, :-1]
        ses += np.bincount(ds[first], weights=w[first], minlength=n_pairs)
    return imps.astype(np.int64), clk.astype(np.int64), ses.astype(np.int64)


def wilson_interval(
    successes: AnyArray, trials: AnyArray, confidence: float = CONFIDENCE
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Wilson score interval for a binomial proportion (Wilson 1927); NaN where there are no trials."""
    z = float(ndtri(0.5 + confidence / 2.0))
    n = np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.asarray(successes, dtype=np.float64) / n
        denom = 1.0 + z * z / n
        centre = (p + z * z / (2.0 * n)) / denom
        half = z * np.sqrt(p * (1.0 - p) / n + z * z / (4.0 * n * n)) / denom
    lo = np.where(n > 0, np.clip(centre - half, 0.0, 1.0), np.nan)
    hi = np.where(n > 0, np.clip(centre + half, 0.0, 1.0), np.nan)
    return lo, hi


def beta_interval(
    successes: AnyArray, trials: AnyArray, confidence: float = CONFIDENCE
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Equal-tailed Jeffreys interval: Beta(s + ½, n − s + ½) quantiles; accepts fractional (effective) counts.

    EM models use it on *effective* counts, e.g. successes = α̂·n_eff with n_eff the expected number of
    examinations of the pair. This ignores the uncertainty of the examination parameters (they rest on all
    pairs' data, so it is small next to a single pair's) and is an approximation, not a bootstrap.
    """
    n = np.maximum(np.asarray(trials, dtype=np.float64), 0.0)
    s = np.clip(np.asarray(successes, dtype=np.float64), 0.0, n)
    tail = (1.0 - confidence) / 2.0
    with np.errstate(invalid="ignore"):
        lo = betaincinv(s + 0.5, n - s + 0.5, tail)
        hi = betaincinv(s + 0.5, n - s + 0.5, 1.0 - tail)
    lo = np.where(s <= 0, 0.0, lo)  # Jeffreys convention: the bound at an observed 0 or n is the boundary
    hi = np.where(s >= n, 1.0, hi)
    # with under one effective success (or failure) the equal-tailed interval can miss s/n itself; widen it
    with np.errstate(invalid="ignore", divide="ignore"):
        p_hat = s / n
    lo, hi = np.fmin(lo, p_hat), np.fmax(hi, p_hat)
    return np.where(n > 0, lo, np.nan), np.where(n > 0, hi, np.nan)


def safe_div(num: AnyArray, den: AnyArray, fill: float = np.nan) -> NDArray[np.float64]:
    """num/den elementwise, ``fill`` where den == 0."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.full(np.broadcast(num, den).shape, fill, dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out


def bernoulli_loglik(p: AnyArray, clicks: AnyArray, trials: AnyArray) -> float:
    """Σ c·ln p + (n − c)·ln(1 − p) over cells; terms with a zero count contribute 0 even at p ∈ {0, 1}."""
    c = np.asarray(clicks, dtype=np.float64)
    nc = np.asarray(trials, dtype=np.float64) - c
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(c > 0, c * np.log(np.where(c > 0, p, 1.0)), 0.0)
        b = np.where(nc > 0, nc * np.log1p(-np.where(nc > 0, p, 0.0)), 0.0)
    return float(a.sum() + b.sum())


class EmRun(NamedTuple):
    """Result of :func:`squarem` or :func:`plain_em`: final parameters, log-likelihood of every accepted point, EM steps used."""

    params: NDArray[np.float64]
    log_likelihood: list[float]
    iterations: int
    converged: bool


def squarem(
    step: Callable[[NDArray[np.float64]], tuple[float, NDArray[np.float64]]],
    x0: NDArray[np.float64],
    max_iter: int,
    tol: float,
    lower: float = 0.0,
    upper: float = 1.0,
) -> EmRun:
    """EM accelerated by squared extrapolation (SQUAREM, scheme S3; Varadhan & Roland, Scand. J. Stat. 2008).

    ``step(x)`` returns (log-likelihood at x, one EM update of x). Each cycle takes two EM steps x → x1 → x2,
    extrapolates x' = x − 2a·r + a²·v (r = x1 − x, v = x2 − x1 − r, a = −‖r‖/‖v‖ ≤ −1), clipped into
    [lower, upper], and keeps x' only if its log-likelihood is not below that of x1; otherwise it falls
    back to x2. So the log-likelihood of the accepted points never decreases (the EM guarantee is kept),
    while EM's slow crawl along flat directions is cut by a large factor. Stops when one plain EM step
    gains less than ``tol`` relative, or after ``max_iter`` EM steps.
    """
    x = x0.astype(np.float64).copy()
    trace: list[float] = []
    steps = 0
    while True:
        ll_x, x1 = step(x)
        steps += 1
        trace.append(ll_x)
        if steps >= max_iter:
            return EmRun(x, trace, steps, False)
        ll_1, x2 = step(x1)
        steps += 1
        trace.append(ll_1)
        if abs(ll_1 - ll_x) <= tol * max(abs(ll_x), 1e-300):
            return EmRun(x1, trace, steps, True)
        if steps >= max_iter:
            return EmRun(x1, trace, steps, False)
        r = x1 - x
        v = x2 - x1 - r
        # einsum, not r @ r: the BLAS dot runs threaded, and on a busy machine its threads waiting for each other
        # made these two sums most of a PBM fit's time (0.95 s of CPU per fit on 50,000 searches, 0.23 s without)
        rr, vv = float(np.einsum("i,i->", r, r)), float(np.einsum("i,i->", v, v))
        a = -np.sqrt(rr / vv) if vv > 0 else -1.0
        if a > -1.0:  # no extrapolation beyond the plain double step
            x = x2
            continue
        xp = np.clip(x - 2.0 * a * r + a * a * v, lower, upper)
        ll_p, x3 = step(xp)
        steps += 1
        if np.isfinite(ll_p) and ll_p >= ll_1:
            trace.append(ll_p)
            if steps >= max_iter:
                return EmRun(xp, trace, steps, False)
            x = x3
        else:
            if steps >= max_iter:
                return EmRun(x1, trace, steps, False)
            x = x2


def plain_em(
    step: Callable[[NDArray[np.float64]], tuple[float, NDArray[np.float64]]],
    x0: NDArray[np.float64],
    max_iter: int,
    tol: float,
) -> EmRun:
    """Unaccelerated EM with the same contract as :func:`squarem` (the returned point has the last logged LL)."""
    x = x0.astype(np.float64).copy()
    trace: list[float] = []
    for steps in range(1, max_iter + 1):
        ll, nxt = step(x)
        trace.append(ll)
        if len(trace) > 1 and abs(trace[-1] - trace[-2]) <= tol * max(abs(trace[-2]), 1e-300):
            return EmRun(x, trace, steps, True)
        if steps < max_iter:
            x = nxt
    return EmRun(x, trace, max_iter, False)
