"""Validation on the simulator: log ranker A, predict ranker B from A's log alone, compare with B's exact figures.

The truth is known exactly: a list's expected metrics follow from the generating θ and α (PBM) or α
(cascade: DBN with σ = γ = 1), evaluated on A's logged query distribution. B is also *simulated* (the same
click kernel, queries drawn from that distribution) so that its observed figures can be set beside the exact
ones. Used by ``bench/counterfactual.py`` and by a smaller test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.counterfactual.direct import (
    aggregate,
    dbn_position_probs,
    pbm_position_probs,
    query_metrics,
)
from ubi_pipeline.processors.counterfactual.predict import Prediction, predict
from ubi_pipeline.processors.simulation import SimConfig, Truth, simulate
from ubi_pipeline.processors.simulation.clicks import simulate_clicks
from ubi_pipeline.schemas.text import normalize_query


def exact_metrics(truth: Truth, query: NDArray[np.int64], slots: NDArray[np.int64], k: int = 10) -> dict[str, float]:
    """Exact expected metrics of the lists ``slots[i]`` shown for ``query[i]`` (one row per search)."""
    alpha = truth.attractiveness[query[:, None], slots]
    if truth.config.model == "pbm":
        if truth.theta is None:
            raise ValueError("internal: a PBM truth without theta")
        probs = pbm_position_probs(truth.theta, alpha)
    elif truth.config.model == "cascade":
        probs = dbn_position_probs(alpha, np.ones_like(alpha), 1.0)
    elif truth.config.model == "dbn" and truth.satisfaction is not None:
        probs = dbn_position_probs(alpha, truth.satisfaction[query[:, None], slots], truth.config.dbn_gamma)
    else:
        raise ValueError(f"exact metrics need a pbm, cascade or dbn truth, got {truth.config.model}")
    return aggregate(query_metrics(probs, k), np.ones(len(query)))


def ranker_slots(truth: Truth, noise: float, seed: int) -> NDArray[np.int64]:
    """[Q, K] doc slots of a ranker that sorts each query's docs by grade + N(0, noise²) (the simulator's rule)."""
    grades = truth.catalog.grades
    rng = np.random.default_rng([seed, 0xB0B])
    score = grades + rng.normal(0.0, noise, size=grades.shape)
    return np.argsort(-score, axis=1, kind="stable")[:, : truth.config.max_rank].astype(np.int64)


def _observed(clicks: NDArray[np.bool_], k: int) -> dict[str, float]:
    first = np.where(clicks.any(axis=1), clicks.argmax(axis=1) + 1, 0)
    return {"ctr@k": float(clicks[:, :k].mean()), "clicks_per_search": float(clicks.sum(axis=1).mean()),
            "abandonment": float((first == 0).mean()),
            "rr_first_click": float(np.where(first > 0, 1.0 / np.maximum(first, 1), 0.0).mean())}


@dataclass
class PairResult:
    """One (A, B) pair: B's prediction from A's log, B's exact and simulated figures, A's exact and logged ones."""

    model: str
    seed: int
    noise_a: float
    noise_b: float
    prediction: Prediction
    exact_b: dict[str, float]
    observed_b: dict[str, float]
    exact_a: dict[str, float]
    observed_a: dict[str, float]
    notes: dict[str, float] = field(default_factory=dict)


def run_pair(
    model: str,
    seed: int,
    noise_a: float,
    noise_b: float,
    *,
    sessions: int = 4000,
    epochs: int = 3,
    randomize: float = 0.1,
    eps_minus: float = 0.1,
    eps_plus: float = 1.0,
    click_model: str = "auto",
    replicates: int = 100,
    use_swaps: bool = True,
    k: int = 10,
    prior: str | None = None,
    unseen: str = "deep",
) -> PairResult:
    """Log A (``epochs`` ranking changes, a ``randomize`` share of rank-1 swaps), predict B, measure B.

    ``prior``: the click model's prior keyword (``ubi_pipeline.processors.click_models.priors``; None: ``predict``'s default);
    ``unseen``: what documents A never showed rest on (``predict``'s ``unseen``).
    """
    cfg = SimConfig(sessions=sessions, seed=seed, model=model, rankers=1, ranker_noise=(noise_a,), epochs=epochs,
                    randomize=randomize, eps_minus=eps_minus, eps_plus=eps_plus)
    log = simulate(cfg)
    truth, cat = log.truth, log.truth.catalog
    b = ranker_slots(truth, noise_b, seed)
    rankings = {normalize_query(cat.query_texts[q]): [str(cat.doc_ids[q, j]) for j in b[q]]
                for q in range(cat.n_queries)}
    swaps = log.swap_sessions() if use_swaps and randomize > 0 else None
    pred = predict(log.patterns(), rankings, model=click_model, k=k, replicates=replicates, seed=seed, swaps=swaps,
                   model_options=None if prior is None else {"prior": prior}, unseen=unseen)
    exact_b = exact_metrics(truth, log.query, b[log.query], k)
    exact_a = exact_metrics(truth, log.query, log.slots, k)
    # B served: the same number of searches, queries drawn from A's logged distribution, the same click kernel
    rng = np.random.default_rng([seed, 0xB5E])
    q_b = rng.choice(log.query, size=sessions)
    docs = q_b[:, None] * cat.docs_per_query + b[q_b]
    flat = truth.attractiveness.reshape(-1)
    clicks = (simulate_clicks(rng, docs, model="pbm", attractiveness=flat, theta=truth.theta) if model == "pbm"
              else simulate_clicks(rng, docs, model="cascade", attractiveness=flat))
    return PairResult(model, seed, noise_a, noise_b, pred, exact_b, _observed(clicks, k), exact_a,
                      _observed(log.clicks, k))
