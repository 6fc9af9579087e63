"""Normalised discounted cumulative gain, linear (trec_eval) or exponential (Burges) gain."""

from __future__ import annotations

import numpy as np

from ubi_pipeline.reports.metrics.matrices import check_k, check_matrix


def discounts(depth: int) -> np.ndarray:
    """Rank discounts ``1 / log2(i + 1)`` for ranks i = 1..depth."""
    return 1.0 / np.log2(np.arange(2, depth + 2, dtype=np.float64))


def linear_gain(grades: np.ndarray) -> np.ndarray:
    """Gain = grade (unjudged, padding and negative codes gain 0): trec_eval ``ndcg_cut``, ranx ``ndcg``."""
    return np.maximum(grades, 0).astype(np.float64)


def exponential_gain(grades: np.ndarray) -> np.ndarray:
    """Gain = 2^grade - 1 (unjudged gains 0): Burges et al. 2005, ranx ``ndcg_burges``, OpenSearch SRW."""
    return np.exp2(np.maximum(grades, 0).astype(np.float64)) - 1.0


def _dcg(gains: np.ndarray, k: int | None) -> np.ndarray:
    top = gains[:, :k]
    # A row-wise sum, not a BLAS matmul: BLAS may round a row differently depending on where it sits in
    # the matrix, and a query's value must not depend on which other queries are evaluated with it.
    return (top * discounts(top.shape[1])).sum(axis=1)


def _ndcg(gains: np.ndarray, ideal_gains: np.ndarray, k: int | None) -> np.ndarray:
    ideal = _dcg(ideal_gains, k)
    dcg = _dcg(gains, k)
    return np.divide(dcg, ideal, out=np.zeros_like(dcg), where=ideal > 0)


def ndcg(gains: np.ndarray, ideal_gains: np.ndarray, k: int | None = None) -> np.ndarray:
    r"""Per-query nDCG@k = DCG@k / IDCG@k with :math:`DCG@k = \sum_{i=1}^{k} gain_i / \log_2(i+1)`.

    ``gains``: [queries, ranks] gain of the doc at each rank (0 when unjudged). ``ideal_gains``: the gains
    of **all** the query's judged docs sorted descending, ranked or not, so IDCG is the best DCG any ranking
    could reach (trec_eval ``ndcg_cut``; ranx ``ndcg`` with linear gain, ``ndcg_burges`` with exponential).
    A query whose ideal DCG is 0 scores 0. ``k=None`` uses the whole ranking and all judgments.
    Citations: Järvelin & Kekäläinen, *Cumulated gain-based evaluation of IR techniques*, TOIS 2002;
    Burges et al., *Learning to rank using gradient descent*, ICML 2005 (exponential gain).
    """
    check_k(k)
    g = check_matrix("gains", gains)
    ig = check_matrix("ideal_gains", ideal_gains, g.shape[0])
    return _ndcg(g.astype(np.float64, copy=False), ig.astype(np.float64, copy=False), k)
