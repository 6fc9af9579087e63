"""ubi_pipeline.processors.click_models.common.gather: per-position values of a per-pair parameter, filled in row chunks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ubi_pipeline.processors.click_models.common import gather


def _whole(values: np.ndarray, docs: np.ndarray, prior: float) -> np.ndarray:
    """The rule in one pass over the whole array: NaN where nothing is shown, ``prior`` for ids the model never
    fitted (beyond ``values`` or NaN there), else the pair's value."""
    out = np.full(docs.shape, np.nan)
    for idx in np.ndindex(docs.shape):
        d = int(docs[idx])
        if d < 0:
            continue
        v = values[d] if d < len(values) else np.nan
        out[idx] = prior if np.isnan(v) else v
    return out


@settings(max_examples=60)
@given(st.integers(0, 8), st.integers(1, 40), st.integers(1, 5), st.integers(1, 9), st.integers(0, 10**6))
def test_gather_in_chunks_is_the_rule(n_values: int, rows: int, k: int, chunk: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.random(n_values)
    values[rng.random(n_values) < 0.2] = np.nan  # pairs the fit marked unseen
    docs = rng.integers(-1, n_values + 3, size=(rows, k))  # -1: no doc there; ids past n_values: new pairs
    got = gather(values, docs, 0.25, chunk=chunk)
    np.testing.assert_array_equal(got, _whole(values, docs, 0.25))
    np.testing.assert_array_equal(got, gather(values, docs, 0.25, chunk=10**9))
