"""Held-out evaluation of click models: log-likelihood and perplexity per rank, full and conditional.

Perplexity at rank k over N held-out sessions (Dupret & Piwowarski 2008; Chuklin, Markov & de Rijke 2015, §4.2):

    p_k = 2^( −(1/N_k) Σ_s w_s log₂ P(C_k = c_k^s) )

with N_k the (weighted) sessions showing a result at rank k. 1 is perfect; predicting 0.5 everywhere gives 2.
*Full* perplexity uses the unconditional ``click_probs``; *conditional* perplexity uses
``conditional_click_probs`` (given the observed clicks above). The log-likelihood of a session is
Σ_k ln P(C_k = c_k | C_<k), i.e. from the conditional probabilities. Every probability is clamped into
[1e-6, 1 − 1e-6] before taking a log (``common.PROB_EPS``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.base import ClickModel
from ubi_pipeline.processors.click_models.common import ClickModelError, check_sessions, clamp
from ubi_pipeline.processors.clicks.stats import SessionPatterns


@dataclass(frozen=True)
class Evaluation:
    """How well a fitted model predicts held-out sessions."""

    model: str
    sessions: int
    log_likelihood: float  # Σ_s w_s ln P(clicks of s), natural log
    log_likelihood_per_session: float
    perplexity: NDArray[np.float64]  # per rank 1..K, full; NaN where no result was shown
    perplexity_mean: float
    conditional_perplexity: NDArray[np.float64]
    conditional_perplexity_mean: float

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-friendly numbers."""
        return {
            "model": self.model,
            "sessions": self.sessions,
            "log_likelihood": self.log_likelihood,
            "log_likelihood_per_session": self.log_likelihood_per_session,
            "perplexity": [None if np.isnan(x) else float(x) for x in self.perplexity],
            "perplexity_mean": self.perplexity_mean,
            "conditional_perplexity": [
                None if np.isnan(x) else float(x) for x in self.conditional_perplexity
            ],
            "conditional_perplexity_mean": self.conditional_perplexity_mean,
        }


def _log2_prob_of_observed(
    probs: NDArray[np.float64], clicks: NDArray[np.bool_], shown: NDArray[np.bool_]
) -> NDArray[np.float64]:
    p = clamp(np.where(shown, probs, 0.5))
    return np.where(shown, np.where(clicks, np.log2(p), np.log2(1.0 - p)), 0.0)


def perplexity_per_rank(
    probs: NDArray[np.float64],
    clicks: NDArray[np.bool_],
    weight: NDArray[np.float64],
    shown: NDArray[np.bool_],
) -> NDArray[np.float64]:
    """p_k = 2^(−Σ_s w_s log₂ P(C_k = c_k^s) / Σ_s w_s) over sessions showing rank k; NaN where none did."""
    lg = _log2_prob_of_observed(probs, clicks, shown)
    w = np.asarray(weight, dtype=np.float64)[:, None]
    n_k = (w * shown).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_k > 0, 2.0 ** (-(w * lg).sum(axis=0) / n_k), np.nan)


def log_likelihood(
    conditional_probs: NDArray[np.float64],
    clicks: NDArray[np.bool_],
    weight: NDArray[np.float64],
    shown: NDArray[np.bool_],
) -> float:
    """Σ_s w_s Σ_k ln P(C_k = c_k^s | clicks above), natural log."""
    lg = _log2_prob_of_observed(conditional_probs, clicks, shown)
    return float((np.asarray(weight, dtype=np.float64) * lg.sum(axis=1)).sum() * np.log(2.0))


def evaluate(model: ClickModel, sessions: SessionPatterns) -> Evaluation:
    """Log-likelihood and full/conditional perplexity per rank of a fitted ``model`` on ``sessions``."""
    check_sessions(sessions)
    shown = sessions.docs >= 0
    full = model.click_probs(sessions)
    cond = model.conditional_click_probs(sessions)
    if full.shape != shown.shape or cond.shape != shown.shape:
        raise ClickModelError(
            f"{model.name} returned probabilities of shape {full.shape}, expected {shown.shape}"
        )
    if np.isnan(full[shown]).any() or np.isnan(cond[shown]).any():
        raise ClickModelError(f"{model.name} returned NaN for a shown result")
    w = sessions.weight.astype(np.float64)
    ppl = perplexity_per_rank(full, sessions.clicks, w, shown)
    cppl = perplexity_per_rank(cond, sessions.clicks, w, shown)
    ll = log_likelihood(cond, sessions.clicks, w, shown)
    n = sessions.n_sessions
    return Evaluation(
        model=model.name,
        sessions=n,
        log_likelihood=ll,
        log_likelihood_per_session=ll / n if n else float("nan"),
        perplexity=ppl,
        perplexity_mean=float(np.nanmean(ppl)) if (~np.isnan(ppl)).any() else float("nan"),
        conditional_perplexity=cppl,
        conditional_perplexity_mean=float(np.nanmean(cppl)) if (~np.isnan(cppl)).any() else float("nan"),
    )


def split_sessions(
    sessions: SessionPatterns, test_fraction: float, rng: np.random.Generator
) -> tuple[SessionPatterns, SessionPatterns]:
    """Random session-level train/test split of weighted patterns (each session independently, binomially).

    Both halves keep the same :class:`PairIndex`, so pair ids mean the same thing; patterns whose weight
    drops to 0 on one side are left out of it.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ClickModelError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    test_w = rng.binomial(sessions.weight, test_fraction)
    train_w = sessions.weight - test_w

    def part(w: NDArray[np.int64]) -> SessionPatterns:
        keep = w > 0
        return SessionPatterns(
            sessions.pairs,
            sessions.query[keep],
            sessions.docs[keep],
            sessions.clicks[keep],
            w[keep].astype(np.int64),
        )

    return part(train_w), part(test_w)
