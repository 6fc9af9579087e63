"""Click logs for the click-model tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import numpy as np

from ubi_pipeline.processors.clicks.stats import PairIndex, SessionPatterns
from ubi_pipeline.processors.simulation.clicks import dedupe_patterns, simulate_clicks, synthetic_rankings


def make_pairs(n: int) -> PairIndex:
    """n pairs of one query: doc ids d0..d{n-1}."""
    return PairIndex(
        queries=np.array(["q"] * n, dtype=object),
        doc_ids=np.array([f"d{i}" for i in range(n)], dtype=object),
        query_index=np.zeros(n, dtype=np.int64),
    )


def simulate(
    model: str,
    seed: int,
    n_sessions: int = 50_000,
    n_queries: int = 50,
    docs_per_query: int = 20,
    **params: object,
) -> tuple[SessionPatterns, np.ndarray]:
    """Clicks from ``model`` over rankings by 3 noisy rankers (so pairs appear at several ranks).

    Attractiveness α = 0.1 + 0.8·u with u ~ U(0, 1) per pair, which also drives the rankers; returns the
    deduplicated patterns and the true α.
    """
    rng = np.random.default_rng(seed)
    u = rng.random(n_queries * docs_per_query)
    pairs, query, _, docs = synthetic_rankings(
        rng, n_sessions, n_queries=n_queries, docs_per_query=docs_per_query, relevance=u
    )
    alpha = 0.1 + 0.8 * u
    clicks = simulate_clicks(rng, docs, model=model, attractiveness=alpha, **params)  # type: ignore[arg-type]
    return dedupe_patterns(pairs, query, docs, clicks), alpha


def random_log(rng: np.random.Generator, n: int, k: int, n_pairs: int) -> SessionPatterns:
    """A small arbitrary log: random rankings (possibly ending early), random clicks, random weights."""
    docs = rng.integers(0, n_pairs, size=(n, k))
    length = rng.integers(1, k + 1, size=n)
    docs[np.arange(k)[None, :] >= length[:, None]] = -1
    clicks = (rng.random((n, k)) < rng.random()) & (docs >= 0)
    return SessionPatterns(
        make_pairs(n_pairs), np.zeros(n, dtype=np.int64), docs, clicks, rng.integers(1, 6, size=n)
    )




def unseen_positions(model, test):
    """Where held-out patterns ``test`` show a pair ``model`` has no α for (no training ranking showed it):
    the [n, K] mask and each such position's rank and query. Written here apart from the models' own
    ``priors.unseen_positions``, so the tests that use it check the models' choice of positions too."""
    shown = test.docs >= 0
    unseen = np.zeros(test.docs.shape, dtype=bool)
    for i, j in zip(*np.nonzero(shown), strict=True):
        doc = test.docs[i, j]
        unseen[i, j] = doc >= len(model.alpha) or np.isnan(model.alpha[doc])
    rows, cols = np.nonzero(unseen)
    return unseen, cols + 1, test.query[rows]


def rankings_shown_in(systems, patterns):
    """The rows of ``systems`` (``priors.SystemRankings``) whose (query, ranking) ``patterns`` show: the systems of
    those searches only, as ``traffic.system_rankings(searches=mask)`` would give for the same mask."""
    from ubi_pipeline.processors.clicks.stats import SystemRankings

    width = systems.docs.shape[1]
    shown = {(int(q), tuple(int(x) for x in d[:width])) for q, d in zip(patterns.query, patterns.docs, strict=True)}
    keep = np.array([(int(q), tuple(int(x) for x in d)) in shown for q, d in zip(systems.query, systems.docs,
                                                                                strict=True)], dtype=bool)
    return SystemRankings(systems.names, systems.query[keep], systems.system[keep], systems.docs[keep])
