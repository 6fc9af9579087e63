"""Position bias (propensity) estimation: θ_k/θ_1 per rank with bootstrap intervals.

Estimators (``docs/position-bias.md``): PBM EM (``em``), PBM by marginal likelihood (``marginal``),
intervention harvesting over rankers (``harvest``: the pair fixed-effects likelihood, with AllPairs beside
it) and randomised swaps (``randomized``); ``bootstrap`` resamples sessions or whole queries, ``plot``
draws the curve, ``estimate`` ties them together. The estimators load lazily (scipy, matplotlib and the
click models are only imported when used).
"""

from __future__ import annotations

from typing import Any

from ubi_pipeline.processors.propensity.common import METHODS, PropensityError, PropensityEstimate
from ubi_pipeline.processors.propensity.randomized import SwapSessions

_LAZY = {
    "estimate_from_patterns": "ubi_pipeline.processors.propensity.estimate",
    "estimate_randomized": "ubi_pipeline.processors.propensity.estimate",
    "plot_curve": "ubi_pipeline.processors.propensity.plot",
}

__all__ = ["METHODS", "PropensityError", "PropensityEstimate", "SwapSessions", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ubi_pipeline.processors.propensity' has no attribute {name!r}")
