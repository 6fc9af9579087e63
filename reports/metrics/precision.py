"""Precision at k."""

from __future__ import annotations

import numpy as np

from ubi_pipeline.reports.metrics.matrices import check_k, check_matrix


def _precision(relevant: np.ndarray, k: int) -> np.ndarray:
    return relevant[:, :k].sum(axis=1) / k


def precision(relevant: np.ndarray, k: int) -> np.ndarray:
    r"""Per-query precision at ``k``: :math:`P@k = |\text{top-}k \cap \text{positives}| / k`.

    ``relevant`` is a boolean [queries, ranks] matrix (rank i+1 holds a positive, i.e. a doc with
    grade >= threshold; False past the end of the ranking). The denominator is k even when fewer than k
    docs were ranked, as trec_eval ``P_k`` and ranx ``precision@k`` do.
    Citation: Manning, Raghavan & Schütze, *Introduction to Information Retrieval* (2008), §8.4.
    """
    check_k(k, required=True)
    return _precision(check_matrix("relevant", relevant).astype(bool, copy=False), int(k))
