"""The report's predictions (reports/predicted.py) on simulated logs whose exact figures are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ubi_pipeline.processors.counterfactual.predict import predict
from ubi_pipeline.processors.counterfactual.validate import exact_metrics, ranker_slots
from ubi_pipeline.processors.simulation import SimConfig, simulate
from ubi_pipeline.reports.predicted import predicted_differences, predictions, shared_rankings
from ubi_pipeline.schemas.text import normalize_query


@pytest.fixture(scope="module")
def world():
    """A PBM log of one middling ranker (σ 1.5), and two candidates: σ 0.3 (better) and σ 3.0 (worse)."""
    log = simulate(SimConfig(sessions=3000, seed=5, model="pbm", rankers=1, ranker_noise=(1.5,), epochs=3))
    truth, cat = log.truth, log.truth.catalog

    def rankings(slots: np.ndarray) -> dict[str, list[str]]:
        return {normalize_query(cat.query_texts[q]): [str(cat.doc_ids[q, j]) for j in slots[q]]
                for q in range(cat.n_queries)}

    good, bad = ranker_slots(truth, 0.3, 5), ranker_slots(truth, 3.0, 5)
    exact = {name: exact_metrics(truth, log.query, slots[log.query])["ctr@k"]
             for name, slots in (("good", good), ("bad", bad))}
    return log, {"good": rankings(good), "bad": rankings(bad)}, exact


def test_shared_rankings_keep_the_queries_every_system_ranks_and_the_log_has() -> None:
    got = shared_rankings({"a": {"x": ["1"], "y": ["2"], "z": ["3"]}, "b": {"y": ["4"], "z": ["5"]}}, {"y", "w"})
    assert got == {"a": {"y": ["2"]}, "b": {"y": ["4"]}}


def test_a_system_against_itself_differs_by_exactly_zero(world) -> None:
    log, rankings, _ = world
    pd = predicted_differences(log.patterns(), {"good": rankings["good"], "twin": rankings["good"]},
                               replicates=5, seed=1)
    assert pd is not None and len(pd.replicate_values["twin"]) == 5
    # the same resamples and the same refitted model on both sides: every replicate difference is 0
    assert pd.difference("good", "twin") == (0.0, 0.0, 0.0)


def test_points_are_predicts_own_and_the_better_ranker_is_predicted_better(world) -> None:
    log, rankings, exact = world
    patterns = log.patterns()
    pd = predicted_differences(patterns, rankings, replicates=10, seed=2)
    assert pd is not None and pd.metric == "ctr@10" and pd.method == "dr" and pd.searches == 3000
    for name, ranking in rankings.items():
        alone = predict(patterns, ranking, methods=("dr",), replicates=0)
        assert pd.values[name] == alone.figures["dr"]["ctr@k"].value
    d, lo, hi = pd.difference("bad", "good")
    # the simulator's truth: the σ 0.3 ranker's exact CTR@10 on the logged searches is well above the σ 3.0 one's
    truth_d = exact["good"] - exact["bad"]
    assert truth_d > 0.02
    assert d > 0 and 0 < lo < hi  # a percentile interval need not hold the point estimate (small n of replicates)
    assert d == pytest.approx(truth_d, abs=0.02)
    no_reps = predicted_differences(patterns, rankings, replicates=0)
    assert no_reps is not None and math.isnan(no_reps.difference("bad", "good")[1])


def test_predictions_of_run_systems_and_the_reason_when_none(world) -> None:
    log, rankings, exact = world
    out = predictions(log.patterns(), {"good": rankings["good"], "elsewhere": {"never logged": ["x"]}},
                      replicates=4, seed=0)
    assert [p.system for p in out] == ["good", "elsewhere"]
    good = out[0].prediction
    assert good is not None and good.replicates == 4 and set(good.figures) == {"dm", "ips", "snips", "dr"}
    assert good.figures["dm"]["ctr@k"].value == pytest.approx(exact["good"], abs=0.02)
    assert out[1].prediction is None and "none of the candidate's 1 queries was logged" in (out[1].error or "")


def test_budget_replicates_by_hand() -> None:
    from ubi_pipeline.reports.predicted import budget_replicates

    # 1 s per fit, 3 fits per replicate, 60 s: ⌊60 / 3⌋ = 20 replicates, below the 50 wanted
    assert budget_replicates(1.0, 3, wanted=50, budget=60.0) == 20
    assert budget_replicates(0.01, 3, wanted=50, budget=60.0) == 50  # 2,000 affordable: the 50 wanted
    assert budget_replicates(10.0, 3, wanted=50, budget=60.0) == 10  # 2 affordable: never below the floor of 10
    assert budget_replicates(10.0, 3, wanted=4, budget=60.0) == 4  # ... nor above what was wanted
    assert budget_replicates(1.0, 0, wanted=50) == 50  # nothing to fit
