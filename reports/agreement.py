"""How far implicit labels can be trusted: agreement with human grades on the pairs both have.

For each implicit source, on the (query, doc) pairs that have both a human grade and a graded label of the
source: quadratic-weighted Cohen's kappa, Spearman and Kendall (tau-b) correlation, the confusion matrix and
the number of pairs. Reviewed labels are not human grades here (they started as the implicit label, so they
would flatter it).

Calibration: when a source's grade mapping was fitted on human-labelled pairs, agreement on those pairs says
nothing. The processors mark such rows in the ``judgments`` table's ``parameters`` JSON with
``"calibration_split": "fit"`` (held-out pairs: ``"holdout"``) or ``"used_for_calibration": true``; those
pairs are left out and counted in ``excluded_calibration``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ubi_pipeline.processors.labels.grades import confusion_matrix, quadratic_kappa_from_confusion
from ubi_pipeline.processors.labels.merge import Label, LabelSet
from ubi_pipeline.schemas.errors import UbiError


class AgreementError(UbiError):
    """Grades that cannot be compared (negative, different lengths)."""


@dataclass
class Agreement:
    """Agreement of one implicit source with the human grades. ``confusion[h][i]``: human h, implicit i."""

    source: str
    pairs: int
    excluded_calibration: int
    kappa: float
    spearman: float
    spearman_p: float
    kendall: float
    kendall_p: float
    grades: list[int]
    confusion: list[list[int]]


def _used_for_calibration(lab: Label) -> bool:
    p = lab.parameters or {}
    return p.get("calibration_split") == "fit" or p.get("used_for_calibration") is True


def agreement(labels: LabelSet, source: str, *, n_grades: int | None = None) -> Agreement:
    """Agreement of ``source`` (``implicit:<model>``) with the human grades in ``labels``."""
    human = labels.qrels("human")
    hs: list[int] = []
    cs: list[int] = []
    excluded = 0
    for (query, doc), labs in labels.by_pair.items():
        h = human.get(query, {}).get(doc)
        if h is None:
            continue
        for lab in labs:
            if lab.source != source or lab.grade is None:
                continue
            if _used_for_calibration(lab):
                excluded += 1
                continue
            hs.append(h)
            cs.append(int(lab.grade))
            break
    a, b = np.array(hs, dtype=np.int64), np.array(cs, dtype=np.int64)
    g = n_grades if n_grades is not None else (int(max(a.max(), b.max())) + 1 if a.size else 1)
    conf = confusion_matrix(a, b, g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input: scipy warns and returns NaN, which we report
        if len(a) >= 2:
            rho, rho_p = stats.spearmanr(a, b)
            tau, tau_p = stats.kendalltau(a, b)
        else:
            rho = rho_p = tau = tau_p = float("nan")
    return Agreement(
        source=source, pairs=len(a), excluded_calibration=excluded, kappa=quadratic_kappa_from_confusion(conf),
        spearman=float(rho), spearman_p=float(rho_p), kendall=float(tau), kendall_p=float(tau_p),
        grades=list(range(g)), confusion=conf.tolist(),
    )


def agreement_all(labels: LabelSet, *, n_grades: int | None = None) -> Mapping[str, Agreement]:
    """:func:`agreement` for every implicit source present."""
    return {s: agreement(labels, s, n_grades=n_grades) for s in labels.sources() if s.startswith("implicit:")}
