"""What every propensity estimator returns, and the error it raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.schemas.cli_names import PROPENSITY_METHODS
from ubi_pipeline.schemas.errors import UbiError

#: the estimators (defined in ubi_pipeline.schemas.cli_names so that the parser needs no numpy)
METHODS = PROPENSITY_METHODS


class PropensityError(UbiError):
    """Position bias cannot be estimated from these data (says what is missing and how to get it)."""


@dataclass(frozen=True)
class PropensityEstimate:
    """θ̂_k/θ̂_1 for ranks 1..K with bootstrap intervals and the evidence the estimate rests on.

    ``ratio[k-1]`` is θ̂_k/θ̂_1 (so ``ratio[0] == 1``); NaN where the data cannot identify a rank.
    ``support`` holds per-rank counts (lists of K numbers) and ``details`` method-specific figures.
    """

    method: str
    ratio: NDArray[np.float64]
    ci_low: NDArray[np.float64]
    ci_high: NDArray[np.float64]
    level: float
    replicates: int  # bootstrap replicates that produced an estimate (0: no interval)
    scheme: str  # how sessions were resampled
    sessions: int  # searches the estimate rests on
    rank_pairs: int  # rank pairs (k, k') with evidence linking them
    support: dict[str, list[int]] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def max_rank(self) -> int:
        return len(self.ratio)

    def relative_error(self, truth: NDArray[np.float64]) -> float:
        """Mean over ranks 2..K of |θ̂_k/θ̂_1 − θ_k/θ_1| / (θ_k/θ_1) (ranks without an estimate are skipped)."""
        t = np.asarray(truth, dtype=float)[: self.max_rank]
        t = t / t[0]
        err = np.abs(self.ratio[1:] - t[1:]) / t[1:]
        return float(np.nanmean(err)) if np.isfinite(err).any() else float("nan")

    def to_json(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if not np.isfinite(x) else round(float(x), 6)

        return {
            "method": self.method,
            "ranks": [
                {"rank": k + 1, "ratio": num(self.ratio[k]), "ci_low": num(self.ci_low[k]),
                 "ci_high": num(self.ci_high[k]), **{name: vals[k] for name, vals in self.support.items()}}
                for k in range(self.max_rank)
            ],
            "level": self.level,
            "bootstrap": {"replicates": self.replicates, "scheme": self.scheme},
            "sessions": self.sessions,
            "rank_pairs": self.rank_pairs,
            "details": self.details,
            "notes": list(self.notes),
        }
