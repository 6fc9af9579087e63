"""Interleaved simulated traffic: no preference between equal rankers, a clear one for a better ranker."""

from __future__ import annotations

import numpy as np

from processors.counterfactual.validate import ranker_slots
from processors.interleaving import outcomes, sign_test, win_rate
from processors.simulation import SimConfig, simulate
from processors.simulation.interleaved import simulate_interleaved


def _truth():  # type: ignore[no-untyped-def]
    return simulate(SimConfig(sessions=1, seed=2)).truth


def test_equal_rankers_no_preference_and_credits_follow_teams() -> None:
    truth = _truth()
    rng = np.random.default_rng(0)
    base = ranker_slots(truth, 1.0, 7)
    query = rng.integers(0, truth.catalog.n_queries, size=3000)
    il = simulate_interleaved(truth, base, base.copy(), query, rng)
    # identical lists: every draft shows the ranker's list itself, teams split it 5/5
    assert (il.slots == base[query]).all()
    assert ((il.team == 0).sum(axis=1) == 5).all()
    cr = il.credits()
    assert cr.sum() == il.clicks.sum()
    out = outcomes(cr)
    assert abs(win_rate(out) - 0.5) < 0.05  # the team a result lands in is a coin flip: no preference
    assert sign_test(int((out > 0).sum()), int((out < 0).sum())) > 0.01


def test_a_better_challenger_wins() -> None:
    truth = _truth()
    rng = np.random.default_rng(1)
    base, better = ranker_slots(truth, 2.0, 3), ranker_slots(truth, 0.3, 4)
    query = rng.integers(0, truth.catalog.n_queries, size=2000)
    out = outcomes(simulate_interleaved(truth, base, better, query, rng).credits())
    wins, losses = int((out > 0).sum()), int((out < 0).sum())
    assert wins / (wins + losses) > 0.6
    assert sign_test(wins, losses) < 1e-6
