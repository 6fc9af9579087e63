"""Average precision (its mean over queries is MAP)."""

from __future__ import annotations

import numpy as np

from ubi_pipeline.reports.metrics.matrices import check_k, check_matrix
from ubi_pipeline.reports.metrics.names import MetricError


def _average_precision(relevant: np.ndarray, n_positive: np.ndarray, k: int | None) -> np.ndarray:
    top = relevant[:, :k]
    hits = np.cumsum(top, axis=1, dtype=np.int64)
    precision_at_rank = hits / np.arange(1, top.shape[1] + 1)
    return np.where(top, precision_at_rank, 0.0).sum(axis=1) / n_positive


def average_precision(relevant: np.ndarray, n_positive: np.ndarray, k: int | None = None) -> np.ndarray:
    r"""Per-query average precision: :math:`AP = \frac{1}{|\text{positives}|}\sum_{i:\,rel_i} P@i`.

    The sum runs over the ranks i (<= k when given) that hold a positive; positives never ranked count 0,
    because the denominator is the number of all labelled positives (trec_eval ``map`` / ``map_cut_k``,
    ranx ``map@k``). Citation: Buckley & Voorhees, *Evaluating evaluation measure stability*, SIGIR 2000;
    Manning et al., *Introduction to IR* (2008), §8.4.
    """
    check_k(k)
    rel = check_matrix("relevant", relevant).astype(bool, copy=False)
    npos = np.asarray(n_positive)
    if npos.shape != (rel.shape[0],) or (npos < 1).any():
        raise MetricError("n_positive must hold one count >= 1 per query (labelled negatives have no AP)")
    return _average_precision(rel, npos, k)
