"""The click-simulation kernel: each model's click rates match its closed-form probabilities.

Statistical checks use n sessions and a tolerance of 5 binomial standard errors (sqrt(p(1-p)/n) <= 0.5/sqrt(n)),
so a correct kernel fails with probability < 1e-6 per check; the seeds are fixed anyway.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ubi_pipeline.processors.clicks.stats import PairIndex
from ubi_pipeline.processors.simulation.clicks import (
    ClickSimulationError,
    click_given_grade,
    dedupe_patterns,
    examination_curve,
    simulate_clicks,
    synthetic_rankings,
    trust_bias_epsilons,
)

N = 40_000
TOL = 5 * 0.5 / np.sqrt(N)  # 5 standard errors of a rate estimated from N sessions (0.0125)
K = 5
ALPHA = np.array([0.9, 0.2, 0.5, 0.7, 0.3])  # pair j is always shown at rank j+1 below


def _fixed_docs(n: int = N, k: int = K) -> np.ndarray:
    return np.broadcast_to(np.arange(k), (n, k)).copy()


def test_protocol_formulas() -> None:
    # θ_k = (1/k)^η: η=1 -> 1, 1/2, 1/3; η=2 -> 1, 1/4, 1/9
    assert np.allclose(examination_curve(3, 1.0), [1, 1 / 2, 1 / 3])
    assert np.allclose(examination_curve(3, 2.0), [1, 1 / 4, 1 / 9])
    assert np.allclose(examination_curve(2, 1.0, curve="ultra"), [0.68, 0.61])
    # ε⁻ + (ε⁺−ε⁻)(2^g−1)/(2^G−1), G=4, ε⁻=0.1, ε⁺=1: g=0 -> 0.1; g=2 -> 0.1+0.9*3/15 = 0.28; g=4 -> 1.0
    assert np.allclose(click_given_grade([0, 2, 4], 4), [0.1, 0.28, 1.0])
    # ε⁺_k = 1-(k+1)/100: k=1 -> 0.98, k=2 -> 0.97; ε⁻_k = 0.65/k: 0.65, 0.325
    ep, en = trust_bias_epsilons(2)
    assert np.allclose(ep, [0.98, 0.97]) and np.allclose(en, [0.65, 0.325])


def test_pbm_rates_are_theta_times_alpha() -> None:
    theta = np.array([1.0, 0.5, 0.33, 0.25, 0.2])
    c = simulate_clicks(
        np.random.default_rng(1), _fixed_docs(), model="pbm", theta=theta, attractiveness=ALPHA
    )
    assert np.abs(c.mean(axis=0) - theta * ALPHA).max() < TOL


def test_cascade_first_click_law() -> None:
    c = simulate_clicks(np.random.default_rng(2), _fixed_docs(), model="cascade", attractiveness=ALPHA)
    assert c.sum(axis=1).max() == 1  # stops at the first click
    # P(C_k=1) = α_k Π_{j<k}(1-α_j): rank 2 -> 0.2*0.1 = 0.02; rank 3 -> 0.5*0.1*0.8 = 0.04
    expected = ALPHA * np.concatenate([[1.0], np.cumprod(1 - ALPHA)[:-1]])
    assert np.abs(c.mean(axis=0) - expected).max() < TOL


def test_dcm_continuation() -> None:
    lam = np.array([0.5, 0.5, 0.5, 0.5, 0.5])
    c = simulate_clicks(
        np.random.default_rng(3), _fixed_docs(), model="dcm", attractiveness=ALPHA, continuation=lam
    )
    # examination ε_{k+1} = ε_k(1 - α_k(1-λ_k)): ε = 1, 0.55, 0.495, 0.37125, 0.2413125
    eps = np.cumprod(np.concatenate([[1.0], 1 - ALPHA[:-1] * (1 - lam[:-1])]))
    assert np.allclose(eps[:3], [1.0, 0.55, 0.495])
    assert np.abs(c.mean(axis=0) - eps * ALPHA).max() < TOL
    # λ = 1 never stops: every rank examined, clicks independent with rate α
    c1 = simulate_clicks(
        np.random.default_rng(4), _fixed_docs(), model="dcm", attractiveness=ALPHA, continuation=1.0
    )
    assert np.abs(c1.mean(axis=0) - ALPHA).max() < TOL


def test_dbn_examination_recursion() -> None:
    sigma = np.array([0.6, 0.1, 0.4, 0.9, 0.5])
    gamma = 0.8
    c = simulate_clicks(
        np.random.default_rng(5),
        _fixed_docs(),
        model="dbn",
        attractiveness=ALPHA,
        satisfaction=sigma,
        gamma=gamma,
    )
    # ε_1 = 1, ε_{k+1} = ε_k·γ·(1 - α_kσ_k): ε_2 = 0.8*(1-0.54) = 0.368
    eps = np.cumprod(np.concatenate([[1.0], gamma * (1 - ALPHA[:-1] * sigma[:-1])]))
    assert np.isclose(eps[1], 0.368)
    assert np.abs(c.mean(axis=0) - eps * ALPHA).max() < TOL
    # σ = 1, γ = 1 is the cascade model: never more than one click
    cc = simulate_clicks(
        np.random.default_rng(6),
        _fixed_docs(),
        model="dbn",
        attractiveness=ALPHA,
        satisfaction=np.ones(K),
        gamma=1.0,
    )
    assert cc.sum(axis=1).max() == 1


def test_ubm_depends_on_previous_click() -> None:
    g = np.zeros((K, K))
    g[np.tril_indices(K)] = 0.3  # examination 0.3 ...
    g[:, 0] = 1.0  # ... except before any click: always examined
    alpha = np.full(K, 0.5)
    c = simulate_clicks(
        np.random.default_rng(7), _fixed_docs(), model="ubm", attractiveness=alpha, ubm_gamma=g
    )
    # rank 1: 1*0.5 = 0.5; rank 2: no click before w.p. 0.5 -> 0.5*0.5 + 0.5*0.3*0.5 = 0.325
    assert abs(c[:, 0].mean() - 0.5) < TOL
    assert abs(c[:, 1].mean() - 0.325) < TOL
    # conditional on a click at rank 1, rank 2 is clicked w.p. γ_{2,1}α = 0.15
    assert abs(c[c[:, 0], 1].mean() - 0.15) < 2 * TOL


def test_trust_bias_rates() -> None:
    theta = examination_curve(K)
    ep, en = trust_bias_epsilons(K)
    r = np.array([1.0, 0.0, 0.5, 1.0, 0.0])
    c = simulate_clicks(
        np.random.default_rng(8),
        _fixed_docs(),
        model="trust",
        theta=theta,
        relevance=r,
        eps_pos=ep,
        eps_neg=en,
    )
    # P(C_k) = θ_k(ε⁺_k r + ε⁻_k (1-r)): rank 1 -> 0.98, rank 2 -> 0.5*0.325 = 0.1625
    expected = theta * (ep * r + en * (1 - r))
    assert np.isclose(expected[1], 0.1625)
    assert np.abs(c.mean(axis=0) - expected).max() < TOL


@pytest.mark.parametrize("model", ["pbm", "cascade", "dcm", "dbn", "ubm", "trust"])
def test_unshown_never_clicked_and_same_seed_same_clicks(model: str) -> None:
    docs = _fixed_docs(2000)
    docs[::3, 3:] = -1  # every third list ends after rank 3
    kw = dict(
        theta=np.ones(K),
        attractiveness=np.ones(K),
        satisfaction=np.zeros(K),
        gamma=1.0,
        continuation=1.0,
        ubm_gamma=np.ones((K, K)),
        relevance=np.ones(K),
        eps_pos=np.ones(K),
        eps_neg=np.ones(K),
    )
    a = simulate_clicks(np.random.default_rng(9), docs, model=model, **kw)
    b = simulate_clicks(np.random.default_rng(9), docs, model=model, **kw)
    assert a.dtype == bool and a.shape == docs.shape
    assert not a[docs < 0].any()
    assert np.array_equal(a, b)
    if model != "cascade":  # with every probability 1, every shown result is clicked
        assert a[docs >= 0].all()


def test_bad_parameters_raise() -> None:
    rng = np.random.default_rng(0)
    docs = _fixed_docs(10)
    with pytest.raises(ClickSimulationError, match="theta"):
        simulate_clicks(rng, docs, model="pbm", attractiveness=ALPHA)
    with pytest.raises(ClickSimulationError, match="every pair id"):
        simulate_clicks(rng, docs, model="pbm", theta=np.ones(K), attractiveness=ALPHA[:2])
    with pytest.raises(ClickSimulationError, match="probabilities"):
        simulate_clicks(rng, docs, model="cascade", attractiveness=ALPHA + 1)
    with pytest.raises(ClickSimulationError, match="unknown click model"):
        simulate_clicks(rng, docs, model="ccm", attractiveness=ALPHA)


def _pairs(n: int) -> PairIndex:
    return PairIndex(
        np.array(["q"] * n, dtype=object),
        np.array([f"d{i}" for i in range(n)], dtype=object),
        np.zeros(n, np.int64),
    )


def test_dedupe_exact_small_example() -> None:
    query = np.array([0, 0, 1, 0])
    docs = np.array([[0, 1], [0, 1], [2, -1], [1, 0]])
    clicks = np.array([[True, False], [True, False], [False, False], [True, False]])
    s = dedupe_patterns(_pairs(3), query, docs, clicks)
    # sessions 0 and 1 are identical -> one pattern of weight 2; sorted by (query, docs, clicks)
    assert s.weight.tolist() == [2, 1, 1]
    assert s.docs.tolist() == [[0, 1], [1, 0], [2, -1]]
    assert s.clicks.tolist() == [[True, False], [True, False], [False, False]]
    assert s.query.tolist() == [0, 0, 1]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_dedupe_is_idempotent_and_keeps_weight(n: int, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    docs = rng.integers(-1, 3, size=(n, k))
    clicks = rng.random((n, k)) < 0.5
    clicks &= docs >= 0
    s = dedupe_patterns(_pairs(3), rng.integers(0, 2, n), docs, clicks, rng.integers(1, 5, n))
    t = dedupe_patterns(s.pairs, s.query, s.docs, s.clicks, s.weight)
    assert np.array_equal(s.docs, t.docs) and np.array_equal(s.weight, t.weight)
    assert np.array_equal(s.clicks, t.clicks) and np.array_equal(s.query, t.query)
    assert len(
        {(q, *d, *c) for q, d, c in zip(s.query, map(tuple, s.docs), map(tuple, s.clicks), strict=True)}
    ) == len(s.weight)


def test_synthetic_rankings_shape_and_pairs() -> None:
    pairs, query, ranker, docs = synthetic_rankings(
        np.random.default_rng(0), 500, n_queries=7, docs_per_query=12, max_rank=10, n_rankers=3
    )
    assert docs.shape == (500, 10) and len(pairs) == 84
    # every shown pair belongs to the session's query, with no repeats inside a ranking
    assert (pairs.query_index[docs] == query[:, None]).all()
    assert all(len(set(row)) == 10 for row in docs)
    assert set(np.unique(ranker)) == {0, 1, 2}
