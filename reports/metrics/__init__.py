"""Offline metrics computed exactly as trec_eval / ranx do, vectorised over all queries at once.

Public entry: :func:`compute` (judgments + rankings + metric names -> :class:`MetricTable`). One module per
metric holds its kernel and its formula: :mod:`.precision`, :mod:`.recall`, :mod:`.rr`, :mod:`.ap`,
:mod:`.ndcg`, :mod:`.judged`. Conventions are those of ``docs/metrics.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ubi_pipeline.formats.qrels import Qrels
from ubi_pipeline.formats.runs import Run
from ubi_pipeline.reports.metrics.ap import average_precision
from ubi_pipeline.reports.metrics.judged import judged_at_k
from ubi_pipeline.reports.metrics.matrices import RankedGrades, build_ranked_grades
from ubi_pipeline.reports.metrics.names import (
    GAINS,
    KNOWN,
    MetricError,
    MetricSpec,
    parse_metric,
    parse_metrics,
)
from ubi_pipeline.reports.metrics.ndcg import exponential_gain, linear_gain, ndcg
from ubi_pipeline.reports.metrics.precision import precision
from ubi_pipeline.reports.metrics.recall import recall
from ubi_pipeline.reports.metrics.rr import reciprocal_rank
from ubi_pipeline.reports.metrics.table import Aggregate, MetricTable
from ubi_pipeline.schemas.cli_names import DEFAULT_METRICS

__all__ = [
    "DEFAULT_METRICS", "GAINS", "KNOWN", "Aggregate", "MetricError", "MetricSpec", "MetricTable", "RankedGrades", "compute",
    "parse_metric", "parse_metrics",
]

_MAX_EXP_GRADE = 1000  # 2^1000 still sums without overflow; larger grades mean a rating scale needs mapping


def _depths(specs: Sequence[MetricSpec]) -> tuple[int | None, int | None]:
    """Ranking columns and ideal columns the requested metrics need (None: all of them)."""
    depth: int | None = 0
    for s in specs:
        if s.k is None:
            depth = None
            break
        depth = max(depth or 0, s.k)
    ndcg_specs = [s for s in specs if s.measure == "ndcg"]
    ideal = None if any(s.k is None for s in ndcg_specs) else max((s.k or 0 for s in ndcg_specs), default=0)
    return depth, ideal


def _values(spec: MetricSpec, rg: RankedGrades, relevant: np.ndarray,
            gains: dict[str, tuple[np.ndarray, np.ndarray]], shown: RankedGrades) -> np.ndarray:
    """One metric's per-query values; ``gains`` caches (gains, ideal gains) per gain function.

    ``shown`` is the ranking as displayed (differs from ``rg`` only for condensed lists): judged@k always
    describes what was shown.
    """
    if spec.measure == "p":
        return precision(relevant, spec.k)  # type: ignore[arg-type]
    if spec.measure == "recall":
        return recall(relevant, rg.n_positive, spec.k)
    if spec.measure == "rr":
        return reciprocal_rank(relevant, spec.k)
    if spec.measure == "ap":
        return average_precision(relevant, rg.n_positive, spec.k)
    if spec.measure == "judged":
        return judged_at_k(shown.grades >= 0, shown.lengths, spec.k)
    if spec.measure == "ndcg":
        gain = spec.gain or "linear"
        if gain not in gains:
            fn = exponential_gain if gain == "exponential" else linear_gain
            gains[gain] = (fn(rg.grades), fn(rg.ideal))
        return ndcg(*gains[gain], spec.k)
    raise MetricError(f"unknown measure {spec.measure!r}")


def compute(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Sequence[str]],
    metrics: str | Sequence[str] | Sequence[MetricSpec],
    *,
    gain: str = "linear",
    rel_threshold: int = 1,
    complete: bool = False,
    condensed: bool = False,
) -> MetricTable:
    """Evaluate ``run`` (query_id -> ranked doc ids) against ``qrels`` (query_id -> {doc_id: grade}).

    ``metrics``: names such as ``ndcg@10,recall@10,mrr,map,p@5,judged@10`` (see :data:`KNOWN`).
    ``gain``: gain of plain ``ndcg`` (linear = trec_eval ``ndcg_cut``; exponential = 2^g-1, ranx
    ``ndcg_burges``). ``rel_threshold``: the grade from which a doc is a positive for P, recall, RR, AP and
    for telling labelled negatives apart; nDCG always uses the raw grades, as trec_eval does.
    ``complete``: also score judged queries missing from the run, as empty rankings (trec_eval ``-c``).
    ``condensed``: drop unjudged docs from each ranking before scoring (condensed lists, Sakai 2007;
    trec_eval ``-J``); judged@k still describes the ranking as returned.
    Queries are evaluated in run order. Every value lies in [0, 1].
    """
    if isinstance(rel_threshold, bool) or not isinstance(rel_threshold, int) or rel_threshold < 1:
        raise MetricError(f"rel_threshold must be a whole number >= 1 (grade 0 means 'not relevant'), got {rel_threshold!r}")
    if isinstance(metrics, str):
        specs = parse_metrics(metrics, gain=gain)
    else:
        specs = [m if isinstance(m, MetricSpec) else parse_metric(m, gain=gain) for m in metrics]
        specs = list({s.name: s for s in specs}.values())
        if not specs:
            raise MetricError(f"no metrics requested; known: {KNOWN}")
    if gain not in GAINS:
        raise MetricError(f"unknown gain {gain!r}: use 'linear' or 'exponential'")

    judged_ids = [q for q in run if q in qrels]
    unjudged = tuple(q for q in run if q not in qrels)
    missing = tuple(q for q in qrels if q not in run)
    ids = judged_ids + list(missing) if complete else judged_ids
    depth, ideal_depth = _depths(specs)
    validate = not (isinstance(qrels, Qrels) and isinstance(run, Run))
    rg = build_ranked_grades(
        qrels, run, ids, depth=depth, ideal_depth=ideal_depth, rel_threshold=rel_threshold,
        validate=validate, condensed=condensed,
    )
    shown = rg
    judged_specs = [s for s in specs if s.measure == "judged"]
    if condensed and judged_specs:
        judged_depth = None if any(s.k is None for s in judged_specs) else max(s.k or 0 for s in judged_specs)
        shown = build_ranked_grades(qrels, run, ids, depth=judged_depth, ideal_depth=0,
                                    rel_threshold=rel_threshold, validate=False)
    if any(s.gain == "exponential" for s in specs) and max(
        int(rg.grades.max(initial=0)), int(rg.ideal.max(initial=0))
    ) > _MAX_EXP_GRADE:
        raise MetricError(
            f"exponential gain needs grades <= {_MAX_EXP_GRADE}; these judgments look like a rating scale "
            f"(map ratings to grades first, e.g. --rating-map esci)"
        )
    has_positive = rg.n_positive > 0
    positives = rg.rows(has_positive)
    shown_pos, shown_neg = shown.rows(has_positive), shown.rows(~has_positive)
    gains: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    relevant = positives.grades >= rel_threshold
    values = {s.name: _values(s, positives, relevant, gains, shown_pos) for s in specs}
    negative_values = {s.name: judged_at_k(shown_neg.grades >= 0, shown_neg.lengths, s.k) for s in judged_specs}
    id_array = np.asarray(ids, dtype=object)
    negative_ids = tuple(id_array[~has_positive].tolist())
    return MetricTable(
        specs=tuple(specs),
        query_ids=tuple(id_array[has_positive].tolist()),
        values=values,
        negative_query_ids=negative_ids,
        negative_retrieved=np.fromiter((len(run.get(q, ())) for q in negative_ids), np.int64, len(negative_ids)),
        negative_values=negative_values,
        unjudged_query_ids=unjudged,
        missing_query_ids=missing,
        gain=gain,
        rel_threshold=rel_threshold,
        complete=complete,
        condensed=condensed,
    )
