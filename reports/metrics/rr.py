"""Reciprocal rank of the first positive (its mean over queries is MRR)."""

from __future__ import annotations

import numpy as np

from ubi_pipeline.reports.metrics.matrices import check_k, check_matrix


def _reciprocal_rank(relevant: np.ndarray, k: int | None) -> np.ndarray:
    top = relevant[:, :k]
    if top.shape[1] == 0:
        return np.zeros(top.shape[0])
    first = top.argmax(axis=1)  # index of the first True (0 when there is none; masked below)
    return np.where(top.any(axis=1), 1.0 / (first + 1), 0.0)


def reciprocal_rank(relevant: np.ndarray, k: int | None = None) -> np.ndarray:
    r"""Per-query reciprocal rank: :math:`RR = 1 / \text{rank of the first positive}`, 0 when none is ranked.

    With ``k`` only the top k count (``rr@k``). MRR is the mean over queries (trec_eval ``recip_rank``,
    ranx ``mrr``). Citation: Voorhees, *The TREC-8 Question Answering Track Report* (1999).
    """
    check_k(k)
    return _reciprocal_rank(check_matrix("relevant", relevant).astype(bool, copy=False), k)
