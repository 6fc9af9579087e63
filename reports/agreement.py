"""How far implicit labels can be trusted: agreement with human grades on the pairs both have; and how far the
human grades themselves agree (:func:`assessor_agreement`).

For each implicit source, on the (query, doc) pairs that have both a human grade and a graded label of the
source: quadratic-weighted Cohen's kappa, Spearman and Kendall (tau-b) correlation, the confusion matrix and
the number of pairs. Reviewed labels are not human grades here (they started as the implicit label, so they
would flatter it).

Calibration: when a source's grade mapping was fitted on human-labelled pairs, agreement on those pairs says
nothing. The processors mark such rows in the ``judgments`` table's ``parameters`` JSON with
``"calibration_split": "fit"`` (held-out pairs: ``"holdout"``) or ``"used_for_calibration": true``; those
pairs are left out and counted in ``excluded_calibration``.

Among assessors: per couple of assessors, Cohen's kappa with quadratic weights on the pairs both graded; over all
of them, Krippendorff's alpha with the interval metric (the squared grade difference, as the quadratic kappa);
each with a percentile bootstrap interval over (query, doc) units, shown only where n allows
(``ubi_pipeline.reports.intervals.why_no_interval``); kernels in ``ubi_pipeline.processors.labels.reliability``.
The human grade the sources above are measured on is the assessors' aggregate (``merge.aggregate_grades``),
so the assessors' own agreement is the ceiling to read a source's against. Disputed pairs: grades
:data:`DISPUTE_SPAN` or more apart, the widest :data:`DISPUTED_SHOWN` listed.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ubi_pipeline.processors.labels.grades import confusion_matrix, quadratic_kappa_from_confusion
from ubi_pipeline.processors.labels.merge import (
    AGGREGATE_RULE,
    Label,
    LabelSet,
    aggregate_grades,
)
from ubi_pipeline.processors.labels.reliability import bootstrap_alpha, bootstrap_kappa
from ubi_pipeline.reports.intervals import Interval
from ubi_pipeline.schemas.errors import UbiError


class AgreementError(UbiError):
    """Grades that cannot be compared (negative, different lengths)."""


@dataclass
class Agreement:
    """Agreement of one implicit or model source with the human grades. ``confusion[h][i]``: human h, source i."""

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
    """Agreement of ``source`` (``implicit:<model>`` or ``model:<name>``) with the human grades in ``labels``."""
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
    """:func:`agreement` for every implicit source and every model source (``model:<name>``) present: a model
    judge is measured on the human grades exactly as a click model is."""
    return {s: agreement(labels, s, n_grades=n_grades) for s in labels.sources()
            if s.startswith(("implicit:", "model:"))}


# ------------------------------------------------------------------------------------------ among assessors

#: the alpha metric the report gives (``ubi_pipeline.processors.labels.reliability``: interval, the squared grade
#: difference, the same weighting as the quadratic kappa)
ALPHA_METRIC = "interval"
#: a pair is disputed when its assessors' grades span at least this many grades (0 and 2, 1 and 3: one says
#: partly relevant or better where another says irrelevant; neighbours are the usual noise of a 0-3 scale)
DISPUTE_SPAN = 2
#: disputed pairs listed in the report (the widest first); the count of all is given beside them
DISPUTED_SHOWN = 20
UNNAMED = "(unnamed)"


@dataclass(frozen=True)
class KappaPair:
    """Quadratic-weighted Cohen's kappa of two assessors on the (query, doc) pairs both graded."""

    assessor_a: str
    assessor_b: str
    kappa: Interval  # n: pairs both graded; bootstrap over them


@dataclass(frozen=True)
class DisputedPair:
    """One (query, doc) whose assessors' grades span :data:`DISPUTE_SPAN` or more."""

    query: str
    doc_id: str
    grades: dict[str, int]  # assessor -> grade
    aggregate: int  # the merged human grade (ubi_pipeline.processors.labels.merge.aggregate_grades)
    notes: dict[str, str]  # assessor -> note, where given


@dataclass(frozen=True)
class AssessorAgreement:
    """Agreement among the people who graded: per assessor their count, per couple of assessors Cohen's kappa
    (quadratic weights), over all of them Krippendorff's alpha (:data:`ALPHA_METRIC` metric), each with a
    percentile bootstrap interval over (query, doc) units, and the disputed pairs."""

    assessors: dict[str, int]  # assessor -> graded pairs
    pairs_graded: int  # pairs with at least one assessor
    pairs_several: int  # pairs with two or more: the units alpha rests on
    alpha: Interval
    alpha_metric: str
    kappas: list[KappaPair]
    disputed: list[DisputedPair]  # at most DISPUTED_SHOWN, widest first
    disputed_total: int
    dispute_span: int
    aggregate_rule: str


def _assessor_grades(labels: LabelSet) -> dict[tuple[str, str], dict[str, tuple[int, str | None]]]:
    """Per (query, doc), each assessor's grade (and note): person-made labels (``human`` first, else a
    ``reviewed:*``), one per assessor, '' named :data:`UNNAMED`."""
    out: dict[tuple[str, str], dict[str, tuple[int, str | None]]] = {}
    for pair, labs in labels.by_pair.items():
        # most pairs of a large log have implicit labels only: a string test, not label_kind, on each
        people = [x for x in labs if x.grade is not None and (x.source == "human" or x.source.startswith("reviewed:"))]
        if not people:
            continue
        per: dict[str, tuple[int, str | None]] = {}
        for lab in sorted(people, key=lambda x: (x.source != "human", x.source)):
            per.setdefault(lab.assessor or UNNAMED, (int(lab.grade), lab.note))  # type: ignore[arg-type]
        if per:
            out[pair] = per
    return out


def assessor_agreement(labels: LabelSet, *, n_grades: int, n_boot: int = 2_000, confidence: float = 0.95,
                       seed: int = 0) -> AssessorAgreement | None:
    """Agreement among assessors (see :class:`AssessorAgreement`); None when no pair has two assessors."""
    by_pair = _assessor_grades(labels)
    several = {p: g for p, g in by_pair.items() if len(g) >= 2}
    if not several:
        return None
    counts: dict[str, int] = defaultdict(int)
    for grades in by_pair.values():
        for who in grades:
            counts[who] += 1
    names = sorted(counts)
    units = sorted(several)
    col = {who: i for i, who in enumerate(names)}
    data = np.full((len(names), len(units)), np.nan)
    for u, pair in enumerate(units):
        for who, (grade, _note) in several[pair].items():
            data[col[who], u] = grade
    est = bootstrap_alpha(data, metric=ALPHA_METRIC, n_grades=n_grades, n_boot=n_boot, confidence=confidence,
                          seed=seed)
    alpha = Interval(est.value, est.low, est.high, est.n, "bootstrap")
    kappas = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            both = ~np.isnan(data[col[a]]) & ~np.isnan(data[col[b]])
            if not both.any():
                continue
            k = bootstrap_kappa(data[col[a], both].astype(np.int64), data[col[b], both].astype(np.int64), n_grades,
                                n_boot=n_boot, confidence=confidence, seed=seed)
            kappas.append(KappaPair(a, b, Interval(k.value, k.low, k.high, k.n, "bootstrap")))
    disputed = []
    for pair, grades in several.items():
        values = [g for g, _n in grades.values()]
        if max(values) - min(values) >= DISPUTE_SPAN:
            disputed.append(DisputedPair(pair[0], pair[1], {w: g for w, (g, _n) in sorted(grades.items())},
                                         aggregate_grades(values),
                                         {w: n for w, (_g, n) in sorted(grades.items()) if n}))
    disputed.sort(key=lambda d: (-(max(d.grades.values()) - min(d.grades.values())), -len(d.grades), d.query,
                                 d.doc_id))
    return AssessorAgreement(
        assessors={w: counts[w] for w in names}, pairs_graded=len(by_pair),
        pairs_several=len(several), alpha=alpha, alpha_metric=ALPHA_METRIC, kappas=kappas,
        disputed=disputed[:DISPUTED_SHOWN], disputed_total=len(disputed), dispute_span=DISPUTE_SPAN,
        aggregate_rule=AGGREGATE_RULE,
    )
