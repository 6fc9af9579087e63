"""The report's "Predicted online metrics": run-file systems that never served, predicted from the logs.

Each ``--run`` system of ``ubi report`` has no log of its own, so its online metrics are predicted from the
logs of the systems that did serve (:func:`ubi_pipeline.processors.counterfactual.predict.predict`: direct method, IPS,
SNIPS, doubly robust, with a bootstrap interval whose replicates refit the click model). A report carries
fewer replicates than ``ubi predict`` does by default (:data:`DEFAULT_REPORT_REPLICATES`; ``ubi report
--predict-replicates N`` changes it): every replicate refits the model once per run system.

:func:`predicted_differences` serves the joint view (``ubi_pipeline.reports.pairs``): every system, logged or not, is
predicted by one method on the queries all of them rank, and the *same* bootstrap resamples of the log are
used for every system, so a difference between two systems gets a paired interval (the model error each
resample carries is shared by both sides, as it would be in a comparison of two candidates).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

from ubi_pipeline.processors.clicks.stats import SessionPatterns
from ubi_pipeline.processors.counterfactual.evidence import UnseenEvidence
from ubi_pipeline.processors.counterfactual.predict import Prediction, PredictionError, predict
from ubi_pipeline.processors.propensity.randomized import SwapSessions
from ubi_pipeline.schemas.cli_names import DEFAULT_REPORT_REPLICATES

if TYPE_CHECKING:
    from ubi_pipeline.formats.runs import Run
    from ubi_pipeline.reports.systems import SystemRun
    from ubi_pipeline.schemas.settings import Settings

#: CPU seconds the report's bootstrap replicates may take when ``--predict-replicates`` is not given: on a large log
#: one fit takes seconds (3.5 s CPU at 200,000 searches of 2,000 queries), and every replicate fits once per system.
PREDICT_BUDGET_S = 60.0
#: ... but never fewer replicates than this, unless asked for (a 95% percentile interval needs some).
MIN_REPLICATES = 10


def budget_replicates(seconds_per_fit: float, fits_per_replicate: int, *, wanted: int = DEFAULT_REPORT_REPLICATES,
                      budget: float = PREDICT_BUDGET_S, floor: int = MIN_REPLICATES) -> int:
    """Replicates that fit ``budget`` CPU seconds: min(wanted, ⌊budget / (fit × fits per replicate)⌋), at least
    min(floor, wanted)."""
    if fits_per_replicate <= 0 or seconds_per_fit <= 0:
        return wanted
    afford = int(budget / (seconds_per_fit * fits_per_replicate))
    return max(min(wanted, afford), min(floor, wanted))


#: The method of the joint view's predicted difference: the doubly robust estimator had the lowest error with
#: an interval (prior-free) that covered every pair of ``bench/counterfactual.py`` (README).
JOINT_METHOD = "dr"


@dataclass(frozen=True)
class PredictedSystem:
    """One run-file system's prediction (or why there is none)."""

    system: str
    prediction: Prediction | None
    error: str | None = None


@dataclass
class PredictedDifferences:
    """CTR@k of every system predicted by one method on shared queries, and the paired bootstrap of each pair."""

    method: str
    metric: str  # "ctr@<k>"
    model: str
    replicates: int
    confidence: float
    queries: int  # logged queries every system ranks (the predictions rest on their searches)
    searches: int
    values: dict[str, float] = field(default_factory=dict)  # system -> predicted value
    replicate_values: dict[str, list[float]] = field(default_factory=dict)  # system -> value per replicate
    prior_share: dict[str, float] = field(default_factory=dict)

    def difference(self, reference: str, challenger: str) -> tuple[float, float, float]:
        """(challenger − reference, low, high): the point difference and the percentile interval of the
        paired replicates (NaN bounds without replicates)."""
        d = self.values[challenger] - self.values[reference]
        reps = np.asarray(self.replicate_values[challenger], float) - np.asarray(self.replicate_values[reference], float)
        reps = reps[np.isfinite(reps)]
        if not len(reps):
            return d, float("nan"), float("nan")
        tail = (1.0 - self.confidence) / 2.0
        lo, hi = np.quantile(reps, [tail, 1.0 - tail])
        return d, float(lo), float(hi)


def run_evidence(grades: Mapping[str, Mapping[str, float]], returned: Mapping[str, Mapping[str, float]],
                 run: Run, system: SystemRun) -> UnseenEvidence:
    """What values a run system's documents the log never showed, as ``ubi predict`` and ``ubi report`` both read
    it: the human ``grades``, the store's hit lists below the displayed depth (``returned``) and the run's own
    scores, keyed by the system's normalised query texts."""
    scores = {system.query_of[qid]: dict(zip(run[qid], run.scores[qid], strict=False))
              for qid in system.run if run.scores.get(qid)}
    return UnseenEvidence(grades=grades, returned=returned, scores=scores)


def load_swap_experiment(con: duckdb.DuckDBPyConnection, settings: Settings, k: int) -> SwapSessions | None:
    """The log's randomised swap experiment, or None when no search is marked randomised."""
    from ubi_pipeline.processors.propensity.common import PropensityError
    from ubi_pipeline.processors.propensity.load import load_swaps

    try:
        swaps, _ = load_swaps(con, settings, k)
    except PropensityError:
        return None
    return swaps


def predictions(
    patterns: SessionPatterns,
    rankings: Mapping[str, Mapping[str, Sequence[str]]],
    *,
    evidence: Mapping[str, UnseenEvidence] | None = None,
    replicates: int = DEFAULT_REPORT_REPLICATES,
    **options: Any,
) -> list[PredictedSystem]:
    """Every method's prediction of each system of ``rankings`` (system -> query text -> doc ids), its documents
    the log never showed valued from ``evidence[system]`` when given (human grades, the hit lists below the
    display, the run's scores: ``ubi_pipeline.processors.counterfactual.evidence``). ``options`` (model, k,
    confidence, seed, swaps) go to :func:`ubi_pipeline.processors.counterfactual.predict.predict` as they are."""
    out = []
    for system, ranking in rankings.items():
        try:
            pred = predict(patterns, ranking, replicates=replicates, evidence=(evidence or {}).get(system), **options)
        except PredictionError as exc:
            out.append(PredictedSystem(system, None, str(exc)))
            continue
        out.append(PredictedSystem(system, pred))
    return out


def shared_rankings(rankings: Mapping[str, Mapping[str, Sequence[str]]],
                    logged_texts: set[str]) -> dict[str, dict[str, Sequence[str]]]:
    """Each system's rankings cut to the logged query texts that every system ranks."""
    texts = set(logged_texts)
    for ranking in rankings.values():
        texts &= set(ranking)
    return {system: {t: ranking[t] for t in sorted(texts)} for system, ranking in rankings.items()}


def predicted_differences(
    patterns: SessionPatterns,
    rankings: Mapping[str, Mapping[str, Sequence[str]]],
    *,
    model: str = "pbm",
    method: str = JOINT_METHOD,
    k: int = 10,
    replicates: int = DEFAULT_REPORT_REPLICATES,
    confidence: float = 0.95,
    seed: int = 0,
    swaps: SwapSessions | None = None,
    evidence: Mapping[str, UnseenEvidence] | None = None,
) -> PredictedDifferences | None:
    """CTR@k of every system of ``rankings`` by ``method``, on the same logged queries and the same resamples.

    ``rankings`` should already be cut to shared queries (:func:`shared_rankings`). Each replicate draws the
    log's searches with replacement once (multinomial over the weighted patterns, as ``predict`` does) and
    predicts every system on that one resample with the model refitted, so ``difference`` is paired; a system's
    documents the log never showed are valued from ``evidence[system]`` when given. None when no system can be
    predicted (no shared logged query).
    """
    if not rankings or not any(rankings.values()):
        return None
    metric = "ctr@k"

    def once(pats: SessionPatterns) -> dict[str, Prediction]:
        return {s: predict(pats, r, model=model, methods=(method,), k=k, replicates=0, seed=seed, swaps=swaps,
                           evidence=(evidence or {}).get(s)) for s, r in rankings.items()}

    try:
        point = once(patterns)
    except PredictionError:
        return None
    first = next(iter(point.values()))
    out = PredictedDifferences(method=method, metric=f"ctr@{k}", model=first.model, replicates=replicates,
                               confidence=confidence, queries=first.covered_queries, searches=first.searches)
    out.values = {s: p.figures[method][metric].value for s, p in point.items()}
    # the share of each top k resting on the click model's prior only (no human grade, hit list or score for it)
    out.prior_share = {s: p.evidence_shares.get("prior", p.prior_share) for s, p in point.items()}
    out.replicate_values = {s: [] for s in point}
    rng = np.random.default_rng([seed, 0x7A1])
    n = patterns.n_sessions
    weights = patterns.weight / n
    for _ in range(replicates):
        wb = rng.multinomial(n, weights)
        keep = wb > 0
        boot = SessionPatterns(patterns.pairs, patterns.query[keep], patterns.docs[keep], patterns.clicks[keep],
                               wb[keep].astype(np.int64))
        try:
            preds = once(boot)
        except PredictionError:  # a resample without any searches of the shared queries: no value
            for s in out.replicate_values:
                out.replicate_values[s].append(float("nan"))
            continue
        for s, p in preds.items():
            out.replicate_values[s].append(p.figures[method][metric].value)
    return out
