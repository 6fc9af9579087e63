"""Model selection: fit every click model on one split of the searches, score all of them on the other.

The split is by search, deterministic and independent of the data's order: a search is held out when the
first 32 bits of md5(query_id) fall below the held-out fraction of 2^32 (``ubi_pipeline.processors.clicks.sessions.holdout_flags``;
the store does the same in SQL). Every model is fitted on the training searches and scored on the held-out
ones (``click_models.evaluate``): log-likelihood and perplexity per rank, full and conditional.

The recommended model is the judgment model (``ubi_pipeline.processors.labels.implicit.JUDGMENT_MODELS``: one that gives a
relevance per pair) with the lowest mean held-out **conditional** perplexity: it measures how well a model
predicts each click given the clicks above it, which is what its relevance and examination estimates are
fitted to explain (Chuklin, Markov & de Rijke, *Click Models for Web Search*, 2015, §4.2). Global and rank
CTR are scored as baselines but never chosen. When the log cannot separate position from relevance
(``ubi_pipeline.processors.clicks.identifiability``), position-debiased models are left out of the choice: they could not grade.

COEC is fitted and scored like the others but is never a *candidate* (:data:`NOT_CANDIDATES`): its click
predictions come from a different posterior than its relevance scores (``click_models.coec``: quasi-Poisson
for the clicks, the stronger-shrinking Poisson-Gamma for the scores), so its held-out perplexity measures its
predictor, not the grades ``--model auto`` would store. Its row is still printed and recorded, marked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ubi_pipeline.processors.click_models.common import ClickModelError
from ubi_pipeline.processors.click_models.evaluate import Evaluation, evaluate
from ubi_pipeline.processors.click_models.registry import MODEL_NAMES, get_model
from ubi_pipeline.processors.clicks.identifiability import IDENTIFIED, Identifiability, is_position_debiased
from ubi_pipeline.processors.clicks.stats import SessionPatterns
from ubi_pipeline.schemas.cli_names import DEFAULT_HOLDOUT
from ubi_pipeline.schemas.errors import UbiError

#: what ``ubi select`` fits by default: every registered model
SELECT_MODELS: tuple[str, ...] = MODEL_NAMES
#: models the choice may fall on (registry names; ``dctr`` is the judgment source ``ctr``)
CHOOSABLE: tuple[str, ...] = ("dctr", "coec", "pbm", "ubm", "cascade", "dcm", "sdbn", "dbn")
#: choosable models that are never candidates for the choice, and why (recorded with every selection)
NOT_CANDIDATES: dict[str, str] = {
    "coec": ("not a candidate for auto: predictions and score are different posteriors, so its held-out "
             "perplexity measures its quasi-Poisson predictor, not the Poisson-Gamma scores it grades with"),
}
CRITERION = "conditional_perplexity_mean"
SPLIT_RULE = "held out when int(md5(query_id)[:8], 16) < fraction * 2^32"


class SelectionError(UbiError):
    """Models cannot be compared: no held-out searches, no training searches, or no model could be fitted."""


def source_name(model: str) -> str:
    """The judgment source name of a registry model (``dctr`` is shown as ``ctr``)."""
    return "ctr" if model == "dctr" else model


@dataclass(frozen=True)
class ModelScore:
    """One model's held-out figures (``evaluation`` None when it could not be fitted: ``error`` says why)."""

    model: str
    evaluation: Evaluation | None
    fit_seconds: float
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "fit_seconds": round(self.fit_seconds, 3), "error": self.error}
        if self.evaluation is not None:
            out.update({k: v for k, v in self.evaluation.as_dict().items() if k not in ("model", "sessions")})
        return out


@dataclass(frozen=True)
class Selection:
    """Every model's held-out figures on one log, and the model chosen among the judgment models."""

    application: str | None
    train_sessions: int
    test_sessions: int
    holdout: float
    scores: tuple[ModelScore, ...]
    best: str | None  # registry name, None when no choosable model was fitted
    excluded: dict[str, str] = field(default_factory=dict)  # choosable models left out, and why
    identifiability: str | None = None  # the log's verdict (ubi_pipeline.processors.clicks.identifiability), when given

    def score(self, model: str) -> ModelScore | None:
        return next((s for s in self.scores if s.model == model), None)

    @property
    def candidates(self) -> list[str]:
        """The models the choice was made among (registry names, in the order fitted): choosable, not excluded."""
        return [s.model for s in self.scores if s.model in CHOOSABLE and s.model not in self.excluded]

    def ranking(self) -> list[ModelScore]:
        """Fitted models, best held-out conditional perplexity first."""
        ok = [s for s in self.scores if s.evaluation is not None]
        return sorted(ok, key=lambda s: (s.evaluation.conditional_perplexity_mean, s.model))  # type: ignore[union-attr]

    def why(self) -> str:
        """Why the best model was chosen, in figures."""
        if self.best is None:
            return "no model that gives per-pair relevance could be fitted"
        best = self.score(self.best)
        order = [s for s in self.ranking() if s.model in CHOOSABLE and s.model not in self.excluded]
        runner = next((s for s in order if s.model != self.best), None)
        ev = best.evaluation if best else None
        if ev is None:  # the best model is always a fitted one; this only keeps the types honest
            return ""
        text = (f"{source_name(self.best)} has the lowest held-out conditional perplexity "
                f"({ev.conditional_perplexity_mean:.4f}")
        if runner is not None and runner.evaluation is not None:
            text += f"; next {source_name(runner.model)} {runner.evaluation.conditional_perplexity_mean:.4f}"
        text += f") on {self.test_sessions:,} held-out searches"
        if self.excluded:
            text += "; not considered: " + ", ".join(f"{source_name(m)} ({why})" for m, why in self.excluded.items())
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "application": self.application, "train_sessions": self.train_sessions,
            "test_sessions": self.test_sessions, "holdout": self.holdout, "split": SPLIT_RULE,
            "criterion": CRITERION, "best": source_name(self.best) if self.best else None, "why": self.why(),
            "candidates": [source_name(m) for m in self.candidates],
            "excluded": {source_name(m): w for m, w in self.excluded.items()},
            "identifiability": self.identifiability,
            "models": [{**s.as_dict(), "model": source_name(s.model), "candidate": s.model in self.candidates,
                        "not_a_candidate": self._not_candidate(s.model)} for s in self.scores],
        }

    def parameters(self) -> dict[str, Any]:
        """The compact record a judgment row keeps: the choice, the criterion and every model's figures."""
        return {
            "application": self.application, "chosen": source_name(self.best) if self.best else None,
            "criterion": CRITERION, "split": SPLIT_RULE, "holdout": self.holdout,
            "train_sessions": self.train_sessions, "test_sessions": self.test_sessions,
            "held_out": {source_name(s.model): {
                "conditional_perplexity": round(s.evaluation.conditional_perplexity_mean, 6),
                "perplexity": round(s.evaluation.perplexity_mean, 6),
                "log_likelihood_per_session": round(s.evaluation.log_likelihood_per_session, 6)}
                for s in self.scores if s.evaluation is not None},
            "candidates": [source_name(m) for m in self.candidates],
            "excluded": {source_name(m): w for m, w in self.excluded.items()},
        }

    def _not_candidate(self, model: str) -> str | None:
        """Why ``model`` was not a candidate (None when it was one)."""
        if model in self.excluded:
            return self.excluded[model]
        if model not in CHOOSABLE:
            return "baseline: no per-pair relevance to grade with"
        return None


def exclusions(models: Sequence[str], identifiability: Identifiability | None = None) -> dict[str, str]:
    """The choosable models among ``models`` that the choice leaves out, and why: the models that are never
    candidates (:data:`NOT_CANDIDATES`) and, on a log that cannot separate position from relevance, the
    position-debiased ones (both reasons, joined, when both apply)."""
    out: dict[str, list[str]] = {}
    for name in CHOOSABLE:
        if name not in models:
            continue
        if identifiability is not None and identifiability.verdict != IDENTIFIED and is_position_debiased(
                source_name(name)):
            out.setdefault(name, []).append(f"position not identifiable here ({identifiability.verdict})")
        if name in NOT_CANDIDATES:
            out.setdefault(name, []).append(NOT_CANDIDATES[name])
    return {m: "; ".join(why) for m, why in out.items()}


def select(train: SessionPatterns, test: SessionPatterns, *, models: Sequence[str] = SELECT_MODELS,
           identifiability: Identifiability | None = None, holdout: float = DEFAULT_HOLDOUT,
           application: str | None = None, progress: Callable[[str], None] | None = None,
           model_options: dict[str, dict[str, Any]] | None = None, systems: Any = None) -> Selection:
    """Fit each of ``models`` on ``train``, evaluate on ``test`` and choose (see the module docstring).

    ``train`` and ``test`` must share one :class:`~ubi_pipeline.processors.clicks.stats.PairIndex` (pairs of the held-out searches
    that training never saw get each model's prior). ``model_options`` maps a model to constructor options.
    ``systems`` (``SystemRankings``) goes to every model's fit (those whose prior takes it use it); given
    for every search (``--model auto`` does), the held-out searches' rankings enter the prior's features too
    (``priors.prior_features``): what a search showed is known before its clicks, and only clicks are held out.
    """
    if train.n_sessions == 0:
        raise SelectionError("no training searches: every search fell in the held-out split; lower --holdout")
    if test.n_sessions == 0:
        raise SelectionError("no held-out searches: the log is too small for this held-out fraction; raise --holdout")
    if train.pairs is not test.pairs and len(train.pairs) != len(test.pairs):
        raise SelectionError("training and held-out sessions must share one pair index")
    say = progress or (lambda _m: None)
    scores: list[ModelScore] = []
    for name in models:
        say(f"fitting {name} on {train.n_sessions:,} searches")
        t0 = time.perf_counter()
        try:
            model = get_model(name, **(model_options or {}).get(name, {})).fit(train, systems)
            fitted = time.perf_counter() - t0
            ev = evaluate(model, test)
        except (ClickModelError, FloatingPointError, ValueError) as exc:
            scores.append(ModelScore(name, None, time.perf_counter() - t0, str(exc)))
            continue
        scores.append(ModelScore(name, ev, fitted))
    excluded = exclusions(models, identifiability)
    candidates = [(s.evaluation.conditional_perplexity_mean, s.model) for s in scores
                  if s.model in CHOOSABLE and s.model not in excluded and s.evaluation is not None
                  and np.isfinite(s.evaluation.conditional_perplexity_mean)]
    best = min(candidates)[1] if candidates else None
    return Selection(application, train.n_sessions, test.n_sessions, holdout, tuple(scores), best, excluded,
                     identifiability.verdict if identifiability is not None else None)
