"""IPS, SNIPS and the doubly robust correction on a four-search log worked out by hand, and IPS's laws."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ubi_pipeline.processors.counterfactual.ips import (
    LoggedArrays,
    dr_metrics,
    ips_metrics,
    ips_totals,
    pair_log_counts,
)

# One query, docs a (pair 0) and b (pair 1), θ = (1, 0.5). Four logged searches:
#   [a, b] click a;  [a, b] no click;  [b, a] click a (rank 2);  [b, a] click b (rank 1)
# E_a = 1 + 1 + 0.5 + 0.5 = 3, C_a = 2;  E_b = 0.5 + 0.5 + 1 + 1 = 3, C_b = 1;  N = 4
LOG = LoggedArrays(
    query=np.zeros(4, dtype=np.int64),
    docs=np.array([[0, 1], [0, 1], [1, 0], [1, 0]]),
    clicks=np.array([[True, False], [False, False], [False, True], [True, False]]),
    weight=np.ones(4),
    pair_query=np.zeros(2, dtype=np.int64),
    n_queries=1,
)
THETA = np.array([1.0, 0.5])
RANK = np.array([1, 2])  # the candidate shows [a, b]
LENGTH = np.array([2])


def test_ips_by_hand() -> None:
    # ρ_a = θ_1·N/E_a = 4/3, ρ_b = θ_2·N/E_b = 2/3; clicks/search = (4/3·2 + 2/3·1)/4 = 10/12
    t = ips_totals(LOG, RANK, LENGTH, THETA, k=2, clip=100.0)
    m = ips_metrics(t)
    assert m["clicks_per_search"] == pytest.approx(10 / 12)
    assert m["ctr@k"] == pytest.approx(10 / 24)
    assert t.max_weight == pytest.approx(4 / 3)
    assert t.unsupported_k == 0 and t.clipped_k == 0
    # at k = 1 only a counts: (4/3·2)/4 per search over 1 shown result
    assert ips_metrics(ips_totals(LOG, RANK, LENGTH, THETA, k=1, clip=100.0))["ctr@k"] == pytest.approx(2 / 3)
    # unclipped, the control variate equals the candidate's examination (4/3·3 + 2/3·3 = 6 = 4·1.5): SNIPS = IPS
    assert ips_metrics(t, self_normalise=True)["clicks_per_search"] == pytest.approx(10 / 12)


def test_clipping_and_snips_by_hand() -> None:
    # clip 1.2 caps ρ_a: (1.2·2 + 2/3)/4 = 0.766...; a's examination (N·θ_1 = 4 of 6) was clipped
    t = ips_totals(LOG, RANK, LENGTH, THETA, k=2, clip=1.2)
    assert ips_metrics(t)["clicks_per_search"] == pytest.approx((2.4 + 2 / 3) / 4)
    assert t.clipped_k / t.exposure_k == pytest.approx(4 / 6)
    # SNIPS: supported examination 1.2·3 + 2/3·3 = 5.6 of 6
    assert ips_metrics(t, self_normalise=True)["clicks_per_search"] == pytest.approx((2.4 + 2 / 3) / 4 * 6 / 5.6)


def test_doubly_robust_by_hand() -> None:
    # a model predicting 0.5 at every logged position: Ĉ_a = Ĉ_b = 2; residuals ρ(C − Ĉ): a 0, b 2/3·(1 − 2)
    predicted = np.full((4, 2), 0.5)
    t = ips_totals(LOG, RANK, LENGTH, THETA, k=2, clip=100.0, predicted=predicted)
    assert t.residual == pytest.approx(-2 / 3)
    # DM sums (Σ_q N_q · expected clicks of the candidate) of 3.0, here the whole list is the top 2
    out = dr_metrics(t, dm_clicks_k=3.0, dm_clicks=3.0)
    assert out["clicks_per_search"] == pytest.approx((3.0 - 2 / 3) / 4)
    assert out["ctr@k"] == pytest.approx((3.0 - 2 / 3) / 8)


def test_documents_the_log_never_showed_are_unsupported() -> None:
    # candidate [c, a] where c was never logged: only a (now rank 2, ρ = 0.5·4/3) counts
    t = ips_totals(LOG, np.array([2, 0]), LENGTH, THETA, k=2, clip=100.0)
    assert t.unsupported_k / t.shown_k == pytest.approx(0.5)
    assert ips_metrics(t)["clicks_per_search"] == pytest.approx(0.5 * 4 / 3 * 2 / 4)


@settings(max_examples=60, deadline=None)
@given(
    n_queries=st.integers(1, 4),
    k=st.integers(1, 5),
    data=st.data(),
)
def test_ips_with_uniform_propensities_equals_the_logged_mean(n_queries: int, k: int, data: st.DataObject) -> None:
    """θ ≡ 1 and a candidate that reorders each query's logged list: IPS clicks/search = logged clicks/search."""
    rng = np.random.default_rng(data.draw(st.integers(0, 10_000)))
    per_query = rng.integers(1, 6, size=n_queries)  # searches per query
    query = np.repeat(np.arange(n_queries), per_query)
    # one deterministic list per query; pair ids q*k + j
    docs = (query[:, None] * k + np.arange(k)[None, :]).astype(np.int64)
    clicks = rng.random(docs.shape) < 0.4
    weight = rng.integers(1, 4, size=len(query)).astype(np.float64)
    log = LoggedArrays(query, docs, clicks, weight, np.repeat(np.arange(n_queries), k), n_queries)
    rank = np.concatenate([rng.permutation(k) + 1 for _ in range(n_queries)])
    t = ips_totals(log, rank, np.full(n_queries, k), np.ones(k), k=k, clip=1e9)
    logged_mean = float((weight * clicks.sum(axis=1)).sum() / weight.sum())
    assert ips_metrics(t)["clicks_per_search"] == pytest.approx(logged_mean)
    assert ips_metrics(t, self_normalise=True)["clicks_per_search"] == pytest.approx(logged_mean)


def test_pair_counts_summed_in_chunks_equal_one_chunk_and_a_hand_loop() -> None:
    """pair_log_counts sums its per-slot arrays a chunk of patterns at a time (the 50M report's peak): any chunk
    size gives the sums of a plain loop over every shown slot."""
    rng = np.random.default_rng(5)
    n, k, n_pairs = 50, 4, 12
    docs = rng.integers(0, n_pairs, size=(n, k))
    docs[rng.random((n, k)) < 0.2] = -1
    clicks = (rng.random((n, k)) < 0.4) & (docs >= 0)
    weight = rng.integers(1, 4, size=n).astype(np.float64)
    log = LoggedArrays(rng.integers(0, 3, size=n), docs, clicks, weight, np.arange(n_pairs) % 3, 3)
    theta = np.array([1.0, 0.6, 0.4, 0.25])
    predicted = np.where(docs >= 0, rng.random((n, k)), np.nan)
    exam, clk, pred = np.zeros(n_pairs), np.zeros(n_pairs), np.zeros(n_pairs)
    for s in range(n):
        for r in range(k):
            if docs[s, r] >= 0:
                exam[docs[s, r]] += weight[s] * theta[r]
                clk[docs[s, r]] += weight[s] * clicks[s, r]
                pred[docs[s, r]] += weight[s] * predicted[s, r]
    for chunk in (1, 7, 1000):
        got = pair_log_counts(log, theta, predicted, chunk=chunk)
        for a, b in zip(got[:3], (exam, clk, pred), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12)
