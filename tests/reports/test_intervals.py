"""Wilson, bootstrap and t intervals: known values and laws."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from ubi_pipeline.reports.intervals import (
    IntervalError,
    bootstrap_mean,
    bootstrap_means,
    sign_flip_pvalue,
    sign_flip_pvalues,
    t_mean,
    wilson,
    wilson_arrays,
)


def test_wilson_known_values():
    # Brown, Cai & DasGupta (2001) / any Wilson calculator: 0 of 10 -> [0, 0.277533]; 5 of 10 -> [0.236593, 0.763407]
    z0 = wilson(0, 10)
    assert (z0.value, z0.low) == (0.0, 0.0) and z0.high == pytest.approx(0.277533, abs=1e-6)
    half = wilson(5, 10)
    assert half.low == pytest.approx(0.236593, abs=1e-6) and half.high == pytest.approx(0.763407, abs=1e-6)
    assert np.isnan(wilson(0, 0).value)
    with pytest.raises(IntervalError):
        wilson(3, 2)
    with pytest.raises(IntervalError):
        wilson(1, 2, confidence=1.0)
    p, lo, hi = wilson_arrays(np.array([0, 5]), np.array([10, 10]))
    assert lo[1] == pytest.approx(half.low) and hi[0] == pytest.approx(z0.high)


@given(st.integers(0, 200), st.integers(1, 200))
def test_wilson_contains_the_proportion(s, n):
    s = min(s, n)
    iv = wilson(s, n)
    assert 0.0 <= iv.low <= iv.value + 1e-12 and iv.value - 1e-12 <= iv.high <= 1.0


def test_bootstrap_is_seeded_and_brackets_the_mean():
    v = np.random.default_rng(0).normal(0.5, 0.1, 200)
    a = bootstrap_mean(v, seed=7, n_boot=3000)
    b = bootstrap_mean(v, seed=7, n_boot=3000)
    assert a == b and a.low < a.value < a.high and a.n == 200
    # for a normal sample of 200 the percentile bootstrap is close to the t interval
    t = t_mean(v)
    ref = stats.t.interval(0.95, 199, loc=v.mean(), scale=stats.sem(v))
    assert (t.low, t.high) == pytest.approx(ref)
    assert abs(a.low - t.low) < 0.005 and abs(a.high - t.high) < 0.005
    assert bootstrap_mean(np.array([0.3])).low == 0.3
    assert np.isnan(bootstrap_mean(np.array([])).value)
    with pytest.raises(IntervalError):
        bootstrap_mean(v, n_boot=0)


def test_column_batches_equal_single_columns():
    v = np.random.default_rng(1).normal(0, 1, (300, 4))
    batch = bootstrap_means(v, n_boot=700, seed=3)
    assert [bootstrap_mean(v[:, j], n_boot=700, seed=3) for j in range(4)] == batch
    ps = sign_flip_pvalues(v, n_perm=900, seed=3)
    assert [sign_flip_pvalue(v[:, j], n_perm=900, seed=3) for j in range(4)] == ps.tolist()
