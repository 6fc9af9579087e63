"""Click patterns from known parameters: the ground-truth kernel under every simulated log.

Pure numpy, no I/O. ``simulate_clicks`` draws which displayed results a user clicks under one of the classic
click models (Chuklin, Markov & de Rijke, *Click Models for Web Search*, 2015) or trust bias
(Agarwal et al., WSDM 2019); ``dedupe_patterns`` folds identical (query, ranking, clicks) sessions into
:class:`ubi_pipeline.processors.clicks.stats.SessionPatterns`. The UBI-traffic simulator (catalog, rankers, records) is built
on top of these; ``synthetic_rankings`` is only a minimal ranking generator for tests and benches.

Conventions: ``docs[s, k-1]`` is the pair id shown at rank k of session s, -1 where nothing was shown
(the list ended); per-pair arrays (``attractiveness``, ``satisfaction``, ``relevance``) are indexed by pair
id; per-rank arrays have length K. Randomness is drawn in a fixed order, so the same generator state gives
the same clicks.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ubi_pipeline.processors.clicks.stats import PairIndex, SessionPatterns
from ubi_pipeline.schemas.errors import UbiError

ClickModelName = Literal["pbm", "cascade", "dcm", "dbn", "ubm", "trust"]
CLICK_MODELS: tuple[str, ...] = ("pbm", "cascade", "dcm", "dbn", "ubm", "trust")

# ULTRA toolkit examination curve (position-bias.md), before raising to the power eta
ULTRA_THETA = (0.68, 0.61, 0.48, 0.34, 0.28, 0.20, 0.11, 0.10, 0.08, 0.06)


class ClickSimulationError(UbiError):
    """Parameters handed to the click simulator are missing, out of range or of the wrong shape."""


# --------------------------------------------------------------------------------------------------
# protocol formulas (position-bias.md, "A standard simulation protocol")


def examination_curve(max_rank: int, eta: float = 1.0, *, curve: str = "inverse") -> NDArray[np.float64]:
    """θ_k = (1/k)^η for k = 1..K (``curve="inverse"``) or the ULTRA curve^η (``curve="ultra"``, K <= 10)."""
    if max_rank < 1:
        raise ClickSimulationError(f"max_rank must be >= 1, got {max_rank}")
    if eta < 0:
        raise ClickSimulationError(f"eta must be >= 0, got {eta}")
    if curve == "inverse":
        return (1.0 / np.arange(1, max_rank + 1)) ** eta
    if curve == "ultra":
        if max_rank > len(ULTRA_THETA):
            raise ClickSimulationError(f"the ULTRA curve has {len(ULTRA_THETA)} ranks, asked for {max_rank}")
        return np.asarray(ULTRA_THETA[:max_rank], dtype=np.float64) ** eta
    raise ClickSimulationError(f"unknown examination curve {curve!r}; use 'inverse' or 'ultra'")


def click_given_grade(
    grades: ArrayLike, max_grade: int, eps_neg: float = 0.1, eps_pos: float = 1.0
) -> NDArray[np.float64]:
    """P(click | examined) = ε⁻ + (ε⁺ − ε⁻)·(2^g − 1)/(2^G − 1) for grade g on a 0..G scale."""
    g = np.asarray(grades, dtype=np.float64)
    if max_grade < 1:
        raise ClickSimulationError(f"max_grade must be >= 1, got {max_grade}")
    if g.size and (g.min() < 0 or g.max() > max_grade):
        raise ClickSimulationError(f"grades must lie in 0..{max_grade}")
    if not 0.0 <= eps_neg <= eps_pos <= 1.0:
        raise ClickSimulationError(f"need 0 <= eps_neg <= eps_pos <= 1, got {eps_neg}, {eps_pos}")
    return eps_neg + (eps_pos - eps_neg) * (2.0**g - 1.0) / (2.0**max_grade - 1.0)


def trust_bias_epsilons(max_rank: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Trust-bias click noise per rank: ε⁺_k = 1 − (k+1)/100, ε⁻_k = 0.65/k (Agarwal et al. 2019 protocol)."""
    k = np.arange(1, max_rank + 1, dtype=np.float64)
    return 1.0 - (k + 1.0) / 100.0, 0.65 / k


# --------------------------------------------------------------------------------------------------
# the kernel


def _per_pair(name: str, values: ArrayLike | None, n_pairs_needed: int) -> NDArray[np.float64]:
    if values is None:
        raise ClickSimulationError(f"this click model needs {name} (one probability per pair id)")
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or len(arr) < n_pairs_needed:
        raise ClickSimulationError(
            f"{name} must be a 1-d array with an entry for every pair id (>= {n_pairs_needed}), got shape {arr.shape}"
        )
    _check_prob(name, arr)
    return arr


def _per_rank(name: str, values: ArrayLike | float | None, k: int) -> NDArray[np.float64]:
    if values is None:
        raise ClickSimulationError(f"this click model needs {name} (one probability per rank 1..{k})")
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(k, float(arr))
    if arr.ndim != 1 or len(arr) < k:
        raise ClickSimulationError(f"{name} must have one entry per rank 1..{k}, got shape {arr.shape}")
    _check_prob(name, arr)
    return arr[:k]


def _check_prob(name: str, arr: NDArray[np.float64]) -> None:
    if arr.size and not (np.isfinite(arr).all() and arr.min() >= 0.0 and arr.max() <= 1.0):
        raise ClickSimulationError(f"{name} must hold probabilities in [0, 1]")


def _gather(values: NDArray[np.float64], docs: NDArray[np.int64]) -> NDArray[np.float64]:
    """Per-position values of per-pair ``values``; 0 where nothing was shown."""
    return np.where(docs >= 0, values[np.maximum(docs, 0)], 0.0)


def simulate_clicks(
    rng: np.random.Generator,
    docs: ArrayLike,
    *,
    model: ClickModelName | str = "pbm",
    attractiveness: ArrayLike | None = None,
    theta: ArrayLike | None = None,
    satisfaction: ArrayLike | None = None,
    gamma: float = 1.0,
    continuation: ArrayLike | float | None = None,
    ubm_gamma: ArrayLike | None = None,
    relevance: ArrayLike | None = None,
    eps_pos: ArrayLike | None = None,
    eps_neg: ArrayLike | None = None,
) -> NDArray[np.bool_]:
    """Draw clicks[n, K] for the rankings ``docs[n, K]`` (pair ids, -1 = not shown) under a known click model.

    Models and the parameters each needs (α = ``attractiveness`` per pair, θ = ``theta`` per rank):

    - ``pbm`` (position-based): P(C_k=1) = θ_k·α_d.
    - ``ubm`` (Dupret & Piwowarski, SIGIR 2008): P(C_k=1) = γ_{k,k'}·α_d with k' the rank of the previous
      click (0 = none); ``ubm_gamma[k-1, k']`` for k' < k, shape (K, K).
    - ``cascade`` (Craswell et al., WSDM 2008): scan top-down, click with prob α_d, stop at the first click.
    - ``dcm`` (Guo et al., WSDM 2009): cascade that continues after a click at rank k with λ_k
      (``continuation``, per rank or one number); no click always continues.
    - ``dbn`` (Chapelle & Zhang, WWW 2009): E_1 = 1; C_k = E_k·A_k with A_k ~ α_d; a click satisfies with
      σ_d (``satisfaction``); an unsatisfied user goes on with persistence γ (``gamma``).
    - ``trust`` (Agarwal et al., WSDM 2019): P(C_k=1) = θ_k·(ε⁺_k·R + ε⁻_k·(1−R)) with R ~ Bernoulli(r_d),
      ``relevance`` = r per pair, ``eps_pos``/``eps_neg`` per rank (see :func:`trust_bias_epsilons`).
    """
    d = np.asarray(docs)
    if d.ndim != 2 or not np.issubdtype(d.dtype, np.integer):
        raise ClickSimulationError(
            f"docs must be a 2-d integer array [sessions, ranks], got {d.dtype} {d.shape}"
        )
    d = d.astype(np.int64, copy=False)
    n, k = d.shape
    need = int(d.max()) + 1 if d.size else 0
    shown = d >= 0

    if model == "pbm":
        alpha = _gather(_per_pair("attractiveness", attractiveness, need), d)
        th = _per_rank("theta", theta, k)
        return (rng.random((n, k)) < th[None, :] * alpha) & shown
    if model == "trust":
        r = _gather(_per_pair("relevance", relevance, need), d)
        th = _per_rank("theta", theta, k)
        ep = _per_rank("eps_pos", eps_pos, k)
        en = _per_rank("eps_neg", eps_neg, k)
        is_rel = rng.random((n, k)) < r
        p = th[None, :] * np.where(is_rel, ep[None, :], en[None, :])
        return (rng.random((n, k)) < p) & shown
    if model == "ubm":
        return _simulate_ubm(rng, d, _gather(_per_pair("attractiveness", attractiveness, need), d), ubm_gamma)
    if model in ("cascade", "dcm", "dbn"):
        alpha = _gather(_per_pair("attractiveness", attractiveness, need), d)
        if model == "cascade":
            stop_after_click = np.ones((n, k))
            go_on = np.ones(k)
        elif model == "dcm":
            stop_after_click = np.broadcast_to(1.0 - _per_rank("continuation", continuation, k), (n, k))
            go_on = np.ones(k)
        else:
            if not 0.0 <= gamma <= 1.0:
                raise ClickSimulationError(f"gamma must lie in [0, 1], got {gamma}")
            stop_after_click = _gather(_per_pair("satisfaction", satisfaction, need), d)
            go_on = np.full(k, gamma)
        return _simulate_cascade_family(rng, alpha, stop_after_click, go_on, shown)
    raise ClickSimulationError(f"unknown click model {model!r}; choose one of {', '.join(CLICK_MODELS)}")


def _simulate_ubm(
    rng: np.random.Generator, d: NDArray[np.int64], alpha: NDArray[np.float64], ubm_gamma: ArrayLike | None
) -> NDArray[np.bool_]:
    n, k = d.shape
    if ubm_gamma is None:
        raise ClickSimulationError(
            "ubm needs ubm_gamma[k-1, k'] (rank k, previous click rank k' < k), shape (K, K)"
        )
    g = np.asarray(ubm_gamma, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] < k or g.shape[1] < k:
        raise ClickSimulationError(f"ubm_gamma must have shape (K, K) = ({k}, {k}) or larger, got {g.shape}")
    _check_prob("ubm_gamma", g[:k, :k][np.tril_indices(k)])
    u = rng.random((n, k))
    clicks = np.zeros((n, k), dtype=bool)
    prev = np.zeros(n, dtype=np.int64)  # rank of the previous click, 0 = none yet
    for j in range(k):  # loop over ranks only; every session advances together
        c = (u[:, j] < g[j, prev] * alpha[:, j]) & (d[:, j] >= 0)
        clicks[:, j] = c
        prev = np.where(c, j + 1, prev)
    return clicks


def _simulate_cascade_family(
    rng: np.random.Generator,
    alpha: NDArray[np.float64],
    stop_after_click: NDArray[np.float64],
    go_on: NDArray[np.float64],
    shown: NDArray[np.bool_],
) -> NDArray[np.bool_]:
    """Top-down scan: click with α; after a click stop with ``stop_after_click``; else continue with ``go_on``."""
    n, k = alpha.shape
    u_click, u_stop, u_go = rng.random((n, k)), rng.random((n, k)), rng.random((n, k))
    clicks = np.zeros((n, k), dtype=bool)
    examining = np.ones(n, dtype=bool)
    for j in range(k):
        examining &= shown[:, j]  # a list that ended cannot be scanned further
        c = examining & (u_click[:, j] < alpha[:, j])
        clicks[:, j] = c
        stopped = c & (u_stop[:, j] < stop_after_click[:, j])
        examining &= ~stopped & (u_go[:, j] < go_on[j])
    return clicks


# --------------------------------------------------------------------------------------------------
# deduplication and a minimal ranking generator


def dedupe_patterns(
    pairs: PairIndex,
    query: ArrayLike,
    docs: ArrayLike,
    clicks: ArrayLike,
    weight: ArrayLike | None = None,
) -> SessionPatterns:
    """Fold identical (query, ranking, click pattern) sessions into weighted :class:`SessionPatterns`.

    Patterns come out sorted by (query, ranking, clicks); applying it again to its own output changes nothing.
    """
    q = np.asarray(query, dtype=np.int64)
    d = np.asarray(docs, dtype=np.int64)
    c = np.asarray(clicks, dtype=bool)
    w = np.ones(len(q), dtype=np.int64) if weight is None else np.asarray(weight, dtype=np.int64)
    if d.ndim != 2 or d.shape != c.shape:
        raise ClickSimulationError(f"docs {d.shape} and clicks {c.shape} must be equal 2-d shapes")
    if not (len(q) == len(w) == d.shape[0]):
        raise ClickSimulationError(
            f"query ({len(q)}) and weight ({len(w)}) need one entry per session ({d.shape[0]})"
        )
    n, k = d.shape
    if k > 62:
        raise ClickSimulationError(f"at most 62 ranks can be deduplicated, got {k}")
    if n == 0:
        return SessionPatterns(pairs, q, d.reshape(0, k), c.reshape(0, k), w)
    mask = (c.astype(np.int64) << np.arange(k, dtype=np.int64)).sum(axis=1)
    key = np.empty((n, k + 2), dtype=np.int64)
    key[:, 0] = q
    key[:, 1 : k + 1] = d
    key[:, k + 1] = mask
    order = np.lexsort(key.T[::-1])  # rows by (query, docs..., mask)
    sk = key[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (sk[1:] != sk[:-1]).any(axis=1)
    starts = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    wsum = np.bincount(group, weights=w[order], minlength=len(starts)).astype(np.int64)
    u = sk[starts]
    out = SessionPatterns(
        pairs=pairs,
        query=u[:, 0].copy(),
        docs=u[:, 1 : k + 1].copy(),
        clicks=((u[:, k + 1 : k + 2] >> np.arange(k, dtype=np.int64)) & 1).astype(bool),
        weight=wsum,
    )
    out.check()
    return out


def synthetic_rankings(
    rng: np.random.Generator,
    n_sessions: int,
    *,
    n_queries: int = 100,
    docs_per_query: int = 20,
    max_rank: int = 10,
    n_rankers: int = 3,
    noise: tuple[float, ...] | None = None,
    relevance: NDArray[np.float64] | None = None,
) -> tuple[PairIndex, NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Rankings of ``n_sessions`` searches over ``n_queries`` x ``docs_per_query`` pairs by noisy rankers.

    Pair ``q*docs_per_query + j`` is doc j of query q. Each ranker sorts a query's docs by ``relevance`` plus
    Gaussian noise (ranker r uses ``noise[r]``, default 0.5, 1.0, 2.0, ...) once; each session picks a query
    uniformly and a ranker uniformly and shows its top K. Returns (pairs, query[n], ranker[n], docs[n, K]).
    Several rankers put the same pair at different ranks, which is what makes position bias identifiable.
    """
    if max_rank > docs_per_query:
        raise ClickSimulationError(f"max_rank ({max_rank}) cannot exceed docs_per_query ({docs_per_query})")
    n_pairs = n_queries * docs_per_query
    rel = rng.random(n_pairs) if relevance is None else np.asarray(relevance, dtype=np.float64)
    if rel.shape != (n_pairs,):
        raise ClickSimulationError(f"relevance needs one entry per pair ({n_pairs}), got {rel.shape}")
    sd = noise if noise is not None else tuple(0.5 * 2.0**r for r in range(n_rankers))
    if len(sd) != n_rankers:
        raise ClickSimulationError(f"noise needs one entry per ranker ({n_rankers}), got {len(sd)}")
    base = rel.reshape(n_queries, docs_per_query)
    spread = base.std() if base.std() > 0 else 1.0
    tops = np.empty((n_rankers, n_queries, max_rank), dtype=np.int64)
    for r in range(n_rankers):
        score = base + rng.normal(0.0, sd[r] * spread, size=base.shape)
        order = np.argsort(-score, axis=1, kind="stable")[:, :max_rank]
        tops[r] = order + (np.arange(n_queries) * docs_per_query)[:, None]
    query = rng.integers(0, n_queries, size=n_sessions)
    ranker = rng.integers(0, n_rankers, size=n_sessions)
    pairs = PairIndex(
        queries=np.array([f"q{i}" for i in np.repeat(np.arange(n_queries), docs_per_query)], dtype=object),
        doc_ids=np.array([f"d{j}" for j in np.arange(n_pairs)], dtype=object),
        query_index=np.repeat(np.arange(n_queries, dtype=np.int64), docs_per_query),
    )
    return pairs, query.astype(np.int64), ranker.astype(np.int64), tops[ranker, query]
