"""The intervals' quantiles come from scipy.special and equal scipy.stats' (the reference), value for value.

scipy.stats takes about a second of CPU to import, paid by every `ubi process`; the click models only need
three quantile functions, which scipy.special provides from the same Boost code (beta.ppf is betaincinv,
gamma.ppf is gammaincinv, chi2.ppf(q, 2k) / 2 is gammaincinv(k, q), norm.ppf is ndtri).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from scipy import stats

from ubi_pipeline.processors.click_models.coec import poisson_ratio_interval
from ubi_pipeline.processors.click_models.common import beta_interval, wilson_interval
from ubi_pipeline.processors.click_models.priors import gamma_posterior_interval, posterior_interval

RNG = np.random.default_rng(14)
TAIL = (1.0 - 0.95) / 2.0  # CONFIDENCE 0.95, equal-tailed, computed as the models compute it (not 0.025)


def test_beta_interval_equals_scipy_stats_jeffreys_quantiles():
    n = np.concatenate([RNG.uniform(0.5, 5000, 2000), [0.0, 1.0, 3.0, 0.3]])
    s = np.concatenate([RNG.uniform(0, 1, 2000) * n[:2000], [0.0, 0.0, 3.0, 0.1]])
    lo, hi = beta_interval(s, n)
    # reference: the Jeffreys interval written with scipy.stats, and the same boundary conventions
    ref_lo = np.where(s <= 0, 0.0, stats.beta.ppf(TAIL, s + 0.5, n - s + 0.5))
    ref_hi = np.where(s >= n, 1.0, stats.beta.ppf(1 - TAIL, s + 0.5, n - s + 0.5))
    with np.errstate(invalid="ignore", divide="ignore"):
        ref_lo, ref_hi = np.fmin(ref_lo, s / n), np.fmax(ref_hi, s / n)
    ok = n > 0
    assert np.array_equal(lo[ok], ref_lo[ok]) and np.array_equal(hi[ok], ref_hi[ok])
    assert np.isnan(lo[~ok]).all() and np.isnan(hi[~ok]).all()  # n = 0: no interval


def test_posterior_intervals_equal_scipy_stats():
    m, c = RNG.uniform(0.001, 0.999, 2000), RNG.uniform(0.1, 3000, 2000)
    lo, hi = posterior_interval(m, c)
    assert np.array_equal(lo, np.fmin(stats.beta.ppf(TAIL, m * c, (1 - m) * c), m))
    assert np.array_equal(hi, np.fmax(stats.beta.ppf(1 - TAIL, m * c, (1 - m) * c), m))
    shape, rate = RNG.uniform(0.05, 500, 2000), RNG.uniform(0.1, 50, 2000)
    lo, hi = gamma_posterior_interval(shape, rate)
    assert np.array_equal(lo, stats.gamma.ppf(TAIL, shape) / rate)
    assert np.array_equal(hi, stats.gamma.ppf(1 - TAIL, shape) / rate)


def test_garwood_and_wilson_equal_scipy_stats():
    clicks = np.concatenate([RNG.integers(0, 400, 2000).astype(float), [0.0]])
    expected = RNG.uniform(0.5, 300, 2001)
    lo, hi = poisson_ratio_interval(clicks, expected)
    ref_lo = np.where(clicks > 0, stats.chi2.ppf(TAIL, 2 * np.maximum(clicks, 1e-300)) / 2, 0.0) / expected
    ref_hi = stats.chi2.ppf(1 - TAIL, 2 * clicks + 2) / 2 / expected
    np.testing.assert_allclose(lo, ref_lo, rtol=1e-14, atol=0)
    np.testing.assert_allclose(hi, ref_hi, rtol=1e-14, atol=0)
    assert lo[-1] == 0.0  # no click: the lower bound is 0
    # Wilson with z = norm.ppf(0.975) = 1.959963984540054 (scipy.stats): 3 of 10 -> (0.1078, 0.6032)
    lo, hi = wilson_interval(np.array([3.0]), np.array([10.0]))
    z = stats.norm.ppf(0.975)
    p, n = 0.3, 10.0
    centre, half = (p + z * z / (2 * n)), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert lo[0] == (centre - half) / (1 + z * z / n) and hi[0] == (centre + half) / (1 + z * z / n)
    assert round(float(lo[0]), 4) == 0.1078 and round(float(hi[0]), 4) == 0.6032


def test_fitting_a_model_does_not_import_scipy_stats():
    code = ("import sys\n"
            "import ubi_pipeline.processors.labels.implicit, ubi_pipeline.processors.clicks.sessions\n"
            "from ubi_pipeline.processors.click_models import registry\n"
            "for name in registry.MODEL_NAMES: registry.model_class(name)\n"
            "print(sorted(m for m in sys.modules if m == 'scipy.stats' or m.startswith('scipy.stats.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
