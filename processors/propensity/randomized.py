"""Position bias from randomised swap interventions (Joachims, Swaminathan & Schnabel, WSDM 2017).

A share of searches swaps the result at rank i with the one at rank j (rank-1 swaps: i = 1; RandPair,
Wang et al. WSDM 2018: any pair), and the log marks those searches in ``query_attributes``, e.g.
``{"randomized": {"method": "swap", "ranks": [1, 4]}}``; ``ranks: [1, 1]`` marks a search of the
experiment's control arm (nothing moved). Because the swap is random, the documents a swap arm shows at
rank i and j are, on average, those the control arm shows at j and i. With CTR_a(k) the click rate at rank k
in arm a and R_i, R_j the mean attractiveness of the documents the ranker puts at i and j:

    E[CTR_ij(j)] + E[CTR_0(j)] = θ_j·(R_i + R_j),   E[CTR_ij(i)] + E[CTR_0(i)] = θ_i·(R_i + R_j)

so θ_j/θ_i = (CTR_ij(j) + CTR_0(j)) / (CTR_ij(i) + CTR_0(i)). Using both arms at both ranks uses every
click of the experiment and needs no knowledge of the original ranking. Arms of several pivots are chained
to θ_k/θ_1 by weighted least squares on the log ratios (weights: inverse delta-method variances).
The control is the marked no-swap arm when the log has one, else the unmarked searches (arm (0, 0)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.propensity.common import PropensityError


@dataclass(frozen=True)
class SwapSessions:
    """Searches of a swap experiment by arm: arm ``a`` swapped ranks ``arms[a]`` (1-based).

    ``arms[a] == (k, k)`` marks a control arm (in the experiment, nothing moved); ``(0, 0)`` holds unmarked
    searches, a fallback control. ``arm[s]`` is the arm of search pattern s, ``clicks[s, k-1]`` whether rank k
    was clicked, ``weight[s]`` how many searches had that pattern.
    """

    arms: NDArray[np.int64]  # [A, 2]
    arm: NDArray[np.int64]  # [n]
    clicks: NDArray[np.bool_]  # [n, K]
    weight: NDArray[np.int64]  # [n]

    @property
    def max_rank(self) -> int:
        return int(self.clicks.shape[1])

    def check(self) -> None:
        if self.arms.ndim != 2 or self.arms.shape[1] != 2:
            raise PropensityError(f"SwapSessions.arms must be [arms, 2], got {self.arms.shape}")
        n = len(self.arm)
        if self.clicks.shape[0] != n or len(self.weight) != n:
            raise PropensityError("SwapSessions.arm, clicks and weight need one row per search pattern")
        if n and (self.arm.min() < 0 or self.arm.max() >= len(self.arms)):
            raise PropensityError(f"SwapSessions.arm must index arms 0..{len(self.arms) - 1}")
        if self.arms.size and (self.arms.min() < 0 or self.arms.max() > self.max_rank):
            raise PropensityError(f"swapped ranks must lie in 1..{self.max_rank} (0 only for unmarked searches)")


@dataclass(frozen=True)
class ArmCounts:
    """Searches and clicks per rank in each arm (after weighting)."""

    arms: NDArray[np.int64]  # [A, 2]
    searches: NDArray[np.float64]  # [A]
    clicks: NDArray[np.float64]  # [A, K]


def arm_counts(s: SwapSessions, weight: NDArray[Any] | None = None) -> ArmCounts:
    """Sum searches and per-rank clicks by arm (``weight`` overrides the pattern weights: bootstrap)."""
    w = s.weight.astype(np.float64) if weight is None else np.asarray(weight, dtype=np.float64)
    a = len(s.arms)
    searches = np.bincount(s.arm, weights=w, minlength=a).astype(np.float64)
    clicks = np.zeros((a, s.max_rank))
    for k in range(s.max_rank):
        clicks[:, k] = np.bincount(s.arm, weights=w * s.clicks[:, k], minlength=a)
    return ArmCounts(s.arms, searches, clicks)


def _control(c: ArmCounts) -> tuple[NDArray[np.float64], float, str]:
    """Control click rates per rank, the number of control searches, and which control was used."""
    marked = (c.arms[:, 0] == c.arms[:, 1]) & (c.arms[:, 0] > 0) & (c.searches > 0)
    if marked.any():
        n = float(c.searches[marked].sum())
        return c.clicks[marked].sum(axis=0) / n, n, "marked control arm"
    unmarked = (c.arms[:, 0] == 0) & (c.searches > 0)
    if unmarked.any():
        n = float(c.searches[unmarked].sum())
        return c.clicks[unmarked].sum(axis=0) / n, n, "unmarked searches"
    raise PropensityError(
        "the swap experiment has no control: mark no-swap searches of the experiment with "
        '{"randomized": {"method": "swap", "ranks": [1, 1]}}, or keep unmarked searches in the log'
    )


def swap_ratios(c: ArmCounts) -> tuple[NDArray[np.float64], int, str]:
    """θ̂_k/θ̂_1 from arm counts; returns (ratios, number of swap arms used, control used)."""
    k_max = c.clicks.shape[1]
    ctrl, _, control = _control(c)
    rows, y, w = [], [], []
    for a, (i, j) in enumerate(c.arms.tolist()):
        if i == j or i == 0 or c.searches[a] <= 0:
            continue
        i, j = min(i, j), max(i, j)
        rate = c.clicks[a] / c.searches[a]
        num, den = rate[j - 1] + ctrl[j - 1], rate[i - 1] + ctrl[i - 1]
        if num <= 0 or den <= 0:
            continue
        # clicks behind each side, for the delta-method variance of log(num/den)
        n_num = c.clicks[a, j - 1] + ctrl[j - 1] * c.searches[a]
        n_den = c.clicks[a, i - 1] + ctrl[i - 1] * c.searches[a]
        rows.append((i, j))
        y.append(np.log(num / den))
        w.append(1.0 / (1.0 / max(n_num, 1e-9) + 1.0 / max(n_den, 1e-9)))
    if not rows:
        raise PropensityError(
            "no randomised swap arm with clicks: the log needs searches marked "
            '{"randomized": {"method": "swap", "ranks": [1, k]}} (see `ubi simulate --randomize`)'
        )
    design = np.zeros((len(rows) + 1, k_max))
    for r, (i, j) in enumerate(rows):
        design[r, j - 1] += 1.0
        design[r, i - 1] -= 1.0
    design[-1, 0] = 1.0  # log θ_1 = 0
    weights = np.sqrt(np.append(w, max(sum(w), 1.0)))
    sol, *_ = np.linalg.lstsq(design * weights[:, None], np.append(y, 0.0) * weights, rcond=None)
    reached = np.zeros(k_max, dtype=bool)
    reached[0] = True
    changed = True
    while changed:  # ranks linked to rank 1 through some arm
        changed = False
        for i, j in rows:
            if reached[i - 1] != reached[j - 1]:
                reached[i - 1] = reached[j - 1] = True
                changed = True
    return np.where(reached, np.exp(sol - sol[0]), np.nan), len(rows), control


def randomized_ratios(s: SwapSessions) -> NDArray[np.float64]:
    """θ̂_k/θ̂_1 for k = 1..K from a randomised swap experiment (Joachims et al., WSDM 2017)."""
    s.check()
    return swap_ratios(arm_counts(s))[0]
