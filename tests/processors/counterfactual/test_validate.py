"""The bench's protocol on one (A, B) pair: B predicted from A's log alone, against B's exact figures."""

from __future__ import annotations

import numpy as np
import pytest

from ubi_pipeline.processors.counterfactual.direct import aggregate, pbm_position_probs, query_metrics
from ubi_pipeline.processors.counterfactual.validate import exact_metrics, run_pair
from ubi_pipeline.processors.simulation import SimConfig, simulate


def test_exact_metrics_by_hand() -> None:
    truth = simulate(SimConfig(sessions=1, seed=0)).truth
    slots = np.arange(10)[None, :]
    got = exact_metrics(truth, np.array([0]), slots)
    alpha = truth.attractiveness[0, :10]
    # PBM truth: clicks per search = Σ_k θ_k α_k with θ_k = 1/k
    assert got["clicks_per_search"] == pytest.approx(float((alpha / np.arange(1, 11)).sum()))
    same = aggregate(query_metrics(pbm_position_probs(truth.theta, alpha[None, :]), 10), np.ones(1))
    assert got == pytest.approx(same)


def test_a_worse_logger_predicts_a_better_ranker() -> None:
    r = run_pair("pbm", 6, 1.5, 0.3, sessions=4000, replicates=20)
    assert abs(r.observed_b["ctr@k"] - r.exact_b["ctr@k"]) < 0.01  # the exact figure is what B's users do
    assert r.prediction.prior_share < 0.1
    for method in ("dm", "dr"):
        f = r.prediction.figures[method]["ctr@k"]
        assert f.value == pytest.approx(r.exact_b["ctr@k"], abs=0.01), method
        assert f.bound_low <= r.exact_b["ctr@k"] <= f.bound_high, method
        # the calibrated interval lies inside the prior-free one and, here, still holds the truth
        assert f.bound_low <= f.cal_low <= f.cal_high <= f.bound_high, method
        assert f.cal_low <= r.exact_b["ctr@k"] <= f.cal_high, method
        assert f.value > r.observed_a["ctr@k"]  # B is better than A, and predicted so
