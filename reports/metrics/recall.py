"""Recall at k over the labelled positives."""

from __future__ import annotations

import numpy as np

from ubi_pipeline.reports.metrics.matrices import check_k, check_matrix
from ubi_pipeline.reports.metrics.names import MetricError


def _recall(relevant: np.ndarray, n_positive: np.ndarray, k: int | None) -> np.ndarray:
    return relevant[:, :k].sum(axis=1) / n_positive


def recall(relevant: np.ndarray, n_positive: np.ndarray, k: int | None = None) -> np.ndarray:
    r"""Per-query recall at ``k``: :math:`R@k = |\text{top-}k \cap \text{positives}| / |\text{positives}|`.

    ``n_positive`` counts every judged doc with grade >= threshold, ranked or not: absence of a judgment is
    not proof of irrelevance, so recall is over the labelled positives (trec_eval ``recall_k``, ranx
    ``recall@k``). Every query must have at least one positive (labelled negatives are reported apart).
    ``k=None`` uses the whole ranking. Citation: Manning et al., *Introduction to IR* (2008), §8.3.
    """
    check_k(k)
    rel = check_matrix("relevant", relevant).astype(bool, copy=False)
    npos = np.asarray(n_positive)
    if npos.shape != (rel.shape[0],) or (npos < 1).any():
        raise MetricError("n_positive must hold one count >= 1 per query (labelled negatives have no recall)")
    return _recall(rel, npos, k)
