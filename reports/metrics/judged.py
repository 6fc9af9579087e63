"""Judged@k: how much of the top of a ranking has any judgment."""

from __future__ import annotations

import numpy as np

from ubi_pipeline.reports.metrics.matrices import check_k, check_matrix
from ubi_pipeline.reports.metrics.names import MetricError


def _judged(judged: np.ndarray, lengths: np.ndarray, k: int | None) -> np.ndarray:
    top = judged[:, :k]
    shown = lengths if k is None else np.minimum(lengths, k)
    count = top.sum(axis=1)
    return np.divide(count, shown, out=np.zeros(count.shape, dtype=np.float64), where=shown > 0)


def judged_at_k(judged: np.ndarray, lengths: np.ndarray, k: int | None = None) -> np.ndarray:
    r"""Per-query judged@k = |judged docs in the top k| / min(k, ranking length); 0 for an empty ranking.

    A doc counts as judged with any grade, 0 included. The denominator is what was ranked, so a short,
    fully judged list scores 1 (ir_measures ``Judged@k``, after OpenNIR). Report it beside every metric
    computed on sparse judgments: a low value means the other numbers rest on guesses about unjudged docs.
    Citation: MacAvaney et al., *OpenNIR* (WSDM 2020 demo); Sakai, *Alternatives to bpref*, SIGIR 2007.
    """
    check_k(k)
    mask = check_matrix("judged", judged).astype(bool, copy=False)
    lens = np.asarray(lengths)
    if lens.shape != (mask.shape[0],):
        raise MetricError("lengths must hold one ranking length per query")
    return _judged(mask, lens, k)
