"""Simulated click logs shared by bench/click_models.py and bench/perplexity.py (not a bench itself)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.clicks.stats import SessionPatterns
from ubi_pipeline.processors.simulation.clicks import (
    click_given_grade,
    dedupe_patterns,
    examination_curve,
    simulate_clicks,
    synthetic_rankings,
)

MAX_GRADE = 4
GRADE_SHARES = np.array([0.45, 0.25, 0.15, 0.10, 0.05])  # most results are poor, few perfect


def simulate_log(
    n_sessions: int,
    *,
    model: str,
    seed: int = 0,
    n_queries: int = 1000,
    docs_per_query: int = 20,
    max_rank: int = 10,
    n_rankers: int = 3,
) -> tuple[SessionPatterns, dict[str, NDArray[np.float64]]]:
    """Rankings by noisy rankers over graded docs, clicks from ``model``, deduplicated; plus the truth.

    Attractiveness follows the position-bias.md protocol: ε⁻ + (ε⁺ − ε⁻)(2^g − 1)/(2^G − 1), ε⁻ = 0.1,
    ε⁺ = 1, G = 4; θ_k = 1/k; DBN satisfaction σ = 0.2 + 0.6·g/G and persistence γ = 0.9.
    """
    rng = np.random.default_rng(seed)
    n_pairs = n_queries * docs_per_query
    grades = rng.choice(MAX_GRADE + 1, size=n_pairs, p=GRADE_SHARES).astype(np.float64)
    pairs, query, ranker, docs = synthetic_rankings(
        rng,
        n_sessions,
        n_queries=n_queries,
        docs_per_query=docs_per_query,
        max_rank=max_rank,
        n_rankers=n_rankers,
        relevance=grades,
    )
    alpha = click_given_grade(grades, MAX_GRADE)
    sigma = 0.2 + 0.6 * grades / MAX_GRADE
    theta = examination_curve(max_rank, 1.0)
    clicks = simulate_clicks(
        rng, docs, model=model, attractiveness=alpha, theta=theta, satisfaction=sigma, gamma=0.9
    )
    truth = {"grades": grades, "alpha": alpha, "sigma": sigma, "theta": theta,
             # the distinct (query, ranker, list) shown: which system showed which ranking (priors.SystemRankings)
             "rankings": np.unique(np.column_stack([query, ranker, docs]), axis=0)}
    return dedupe_patterns(pairs, query, docs, clicks), truth
