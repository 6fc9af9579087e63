"""From relevance scores to grades on the human scale: default mappings, calibration, agreement.

A mapping is a list of increasing thresholds t_1 < ... < t_G: grade(s) = #{g : s >= t_g}, so scores below
t_1 get 0 and scores at or above t_G get G (the top grade). Pure numpy (scipy for Spearman); no I/O.

Default thresholds, per kind of score (``docs/position-bias.md``, "A standard simulation protocol"):

* ``probability`` (attractiveness of PBM, UBM, cascade, DCM): invert the simulation's grade -> click curve
  a(g) = ε⁻ + (ε⁺ − ε⁻)(2^g − 1)/(2^G − 1) with ε⁻ = 0.1, ε⁺ = 1, rounding in grade space:
  t_g = a(g − 1/2). For G = 3: 0.1533, 0.3350, 0.6988.
* ``satisfaction`` (α·σ of DBN and SDBN, the chance that an examined result satisfies): the simulator's DBN
  draws attractiveness a(g) as above and satisfaction s(g) = (2^g − 1)/(2^G − 1) (the same gain without
  the click noise: grade 0 never satisfies), so grade g produces α·σ = a(g)·s(g): 0, 0.0327, 0.2082, 1 for
  G = 3. Rounding in grade space as above, t_g = a(g − 1/2)·s(g − 1/2). For G = 3: 0.1533 x 0.0592 =
  0.0091, 0.3351 x 0.2612 = 0.0875, 0.6987 x 0.6653 = 0.4649. (Attractiveness thresholds on an α·σ score
  put almost every pair at grade 0 or 1: σ < 1 shrinks every score.)
* ``ctr`` (raw per-pair CTR = examination x attractiveness): the probability thresholds times the mean
  examination of ranks 1..10 under θ_k = 1/k (η = 1), H_10/10 = 0.2929. For G = 3: 0.0449, 0.0981, 0.2047.
* ``ratio`` (COEC = clicks / expected clicks ≈ α / ᾱ): the probability thresholds divided by the mean
  attractiveness a(g) over uniformly spread grades 0..G (0.4536 for G = 3). For G = 3: 0.3379, 0.7388, 1.5405.

These defaults rest on the simulation protocol's assumptions; calibrate on human grades where you have them
(:func:`fit_thresholds`): ordinal quantile matching, then coordinate ascent on quadratic-weighted kappa.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.schemas.errors import UbiError

EPS_MINUS = 0.1
EPS_PLUS = 1.0
#: mean examination of ranks 1..10 when θ_k = 1/k: H_10 / 10
MEAN_EXAMINATION_TOP10 = float(np.sum(1.0 / np.arange(1, 11)) / 10)
SCORE_KINDS = ("probability", "satisfaction", "ctr", "ratio")


class GradeError(UbiError):
    """A grade mapping cannot be built or fitted (unknown score kind, too few human-graded pairs)."""


@dataclass(frozen=True)
class GradeMapping:
    """Increasing score thresholds t_1..t_G: grade = number of thresholds the score reaches."""

    kind: str
    thresholds: tuple[float, ...]
    calibrated: bool = False
    method: str = "default"

    @property
    def grade_max(self) -> int:
        return len(self.thresholds)

    def grade(self, scores: NDArray[np.float64]) -> NDArray[np.int64]:
        """Grades 0..G per score; -1 where the score is NaN."""
        return apply_thresholds(np.asarray(scores, dtype=np.float64), np.asarray(self.thresholds, dtype=np.float64))

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "thresholds": [float(t) for t in self.thresholds], "calibrated": self.calibrated,
                "method": self.method}


def simulation_curve(grade: NDArray[Any] | float, grade_max: int,
                     eps_minus: float = EPS_MINUS, eps_plus: float = EPS_PLUS) -> NDArray[np.float64]:
    """Click probability given examination for grade g: ε⁻ + (ε⁺ − ε⁻)(2^g − 1)/(2^G − 1)."""
    g = np.asarray(grade, dtype=np.float64)
    return eps_minus + (eps_plus - eps_minus) * (np.exp2(g) - 1.0) / (2.0**grade_max - 1.0)


def satisfaction_curve(grade: NDArray[Any] | float, grade_max: int) -> NDArray[np.float64]:
    """α·σ the simulator's DBN gives grade g: a(g)·(2^g − 1)/(2^G − 1) (see the module docstring)."""
    g = np.asarray(grade, dtype=np.float64)
    return simulation_curve(g, grade_max) * (np.exp2(g) - 1.0) / (2.0**grade_max - 1.0)


def scale_factor(kind: str, grade_max: int = 3) -> float:
    """How much a score of this kind stretches the attractiveness scale (1 for probabilities).

    Used to state limits once, on the attractiveness scale, for every kind (e.g. the widest interval).
    α·σ is a probability on [0, 1] spanning 0..1 over the grades as attractiveness spans 0.1..1: factor 1.
    """
    if kind in ("probability", "satisfaction"):
        return 1.0
    if kind == "ctr":
        return MEAN_EXAMINATION_TOP10
    if kind == "ratio":
        return 1.0 / float(simulation_curve(np.arange(grade_max + 1), grade_max).mean())
    raise GradeError(f"unknown score kind {kind!r}; expected one of {', '.join(SCORE_KINDS)}")


def default_mapping(kind: str, grade_max: int = 3) -> GradeMapping:
    """The documented default thresholds for a kind of score (see the module docstring)."""
    if grade_max < 1:
        raise GradeError(f"grade_max must be at least 1, got {grade_max}")
    midpoints = np.arange(grade_max) + 0.5
    if kind == "satisfaction":
        t = satisfaction_curve(midpoints, grade_max)
    else:
        t = simulation_curve(midpoints, grade_max) * scale_factor(kind, grade_max)
    return GradeMapping(kind, tuple(float(x) for x in t))


def apply_thresholds(scores: NDArray[np.float64], thresholds: NDArray[np.float64]) -> NDArray[np.int64]:
    """Grade = #{g : score >= t_g}; -1 for NaN scores."""
    g = np.searchsorted(thresholds, scores, side="right").astype(np.int64)
    return np.where(np.isnan(scores), -1, g)


def confusion_matrix(rows: NDArray[np.int64], cols: NDArray[np.int64], n_classes: int) -> NDArray[np.int64]:
    """Counts ``m[r][c]`` of the pairs (rows[k], cols[k]); grades are 0..n_classes-1. Pure numpy kernel."""
    r = np.asarray(rows, dtype=np.int64)
    c = np.asarray(cols, dtype=np.int64)
    return np.bincount(r * n_classes + c, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def quadratic_kappa_from_confusion(observed: NDArray[np.int64]) -> float:
    """Cohen's weighted kappa with quadratic weights from a square confusion matrix O (Cohen 1968,
    Psychological Bulletin 70:213): κ = 1 − Σ w·O / Σ w·E, w_ij = (i−j)²/(n−1)², E = outer(row totals,
    column totals) / N the matrix expected by chance.

    NaN when there are no pairs, fewer than two grades, or E puts all mass on the diagonal (both raters
    constant on the same grade): kappa is undefined there. Pure numpy kernel shared by processors and reports.
    """
    o = np.asarray(observed, dtype=np.float64)
    n = o.shape[0]
    total = float(o.sum())
    if total == 0.0 or n < 2:
        return float("nan")
    expected = np.outer(o.sum(axis=1), o.sum(axis=0)) / total
    i, j = np.indices((n, n))
    w = (i - j) ** 2 / (n - 1) ** 2
    denom = float((w * expected).sum())
    if denom == 0.0:
        return float("nan")
    return 1.0 - float((w * o).sum()) / denom


def quadratic_weighted_kappa(a: NDArray[np.int64], b: NDArray[np.int64], n_classes: int | None = None) -> float:
    """Cohen's kappa with quadratic weights of two ratings of the same items: κ = 1 − Σ w_ij O_ij / Σ w_ij E_ij,
    w_ij = (i−j)² / (G−1)², O their confusion matrix, E = outer(row totals, column totals) / N the one expected
    by chance (Cohen 1968, Psychological Bulletin 70:213; kernel :func:`quadratic_kappa_from_confusion`).

    Grades are 0..G-1, G = ``n_classes`` or max + 1. NaN when there are no pairs or a single grade; raises
    :class:`GradeError` when the two differ in length or hold a negative grade.
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if a.shape != b.shape:
        raise GradeError(f"the two ratings differ in length ({a.shape} and {b.shape}): kappa compares the same items")
    if a.size and (a.min() < 0 or b.min() < 0):
        raise GradeError("grades must be non-negative integers")
    g = n_classes if n_classes is not None else (int(max(a.max(), b.max())) + 1 if a.size else 0)
    return quadratic_kappa_from_confusion(confusion_matrix(a, b, g))


def confusion(predicted: NDArray[np.int64], human: NDArray[np.int64], n_classes: int) -> list[list[int]]:
    """Counts [human grade][predicted grade]."""
    return confusion_matrix(human, predicted, n_classes).astype(int).tolist()


def spearman(x: NDArray[np.float64], y: NDArray[np.float64]) -> float:
    """Spearman rank correlation (ties averaged); NaN for fewer than 2 pairs or a constant side."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    from scipy.stats import spearmanr  # only with human grades: scipy.stats is slow to import

    return float(spearmanr(x, y).statistic)


def _quantile_thresholds(scores: NDArray[np.float64], human: NDArray[np.int64], grade_max: int) -> NDArray[np.float64]:
    """Thresholds that give the scores the same grade distribution as the human grades (ordinal quantiles)."""
    s = np.sort(scores)
    n = len(s)
    counts = np.bincount(human, minlength=grade_max + 1)
    cum = np.cumsum(counts)[:-1]  # pairs with human grade <= g, for g = 0..G-1
    t = np.empty(grade_max)
    for g, c in enumerate(cum):
        if c <= 0:
            t[g] = s[0]  # nobody below: every score reaches t
        elif c >= n:
            t[g] = s[-1] + max(abs(s[-1]), 1.0)  # everybody below: no score reaches t
        else:
            t[g] = (s[c - 1] + s[c]) / 2.0
    return np.maximum.accumulate(t)


def fit_thresholds(scores: NDArray[np.float64], human: NDArray[np.int64], grade_max: int, *,
                   max_candidates: int = 256, max_sweeps: int = 20) -> NDArray[np.float64]:
    """Thresholds maximising quadratic-weighted kappa against human grades 0..G.

    Start from ordinal quantile matching (same grade distribution as the humans), then coordinate ascent:
    move one threshold at a time to the candidate cut (midpoints between distinct scores, at most
    ``max_candidates`` quantiles of them) that raises kappa most while keeping the order; stop when a sweep
    changes nothing. Deterministic; ties keep the current threshold.
    """
    scores = np.asarray(scores, dtype=np.float64)
    human = np.asarray(human, dtype=np.int64)
    if len(scores) != len(human) or len(scores) == 0:
        raise GradeError("fit_thresholds needs as many human grades as scores, and at least one of each")
    if human.min() < 0 or human.max() > grade_max:
        raise GradeError(f"human grades must lie in 0..{grade_max}")
    t = _quantile_thresholds(scores, human, grade_max)
    u = np.unique(scores)
    mids = (u[:-1] + u[1:]) / 2.0
    if len(mids) > max_candidates:
        mids = np.unique(np.quantile(mids, np.linspace(0, 1, max_candidates)))
    lo_sentinel = u[0] - max(abs(u[0]), 1.0)
    hi_sentinel = u[-1] + max(abs(u[-1]), 1.0)
    candidates = np.concatenate([[lo_sentinel], mids, [hi_sentinel]])
    k = grade_max + 1
    best = quadratic_weighted_kappa(apply_thresholds(scores, t), human, k)
    best = -np.inf if np.isnan(best) else best
    for _ in range(max_sweeps):
        changed = False
        for g in range(grade_max):
            lo = t[g - 1] if g > 0 else -np.inf
            hi = t[g + 1] if g + 1 < grade_max else np.inf
            for c in candidates[(candidates >= lo) & (candidates <= hi)]:
                if c == t[g]:
                    continue
                trial = t.copy()
                trial[g] = c
                kappa = quadratic_weighted_kappa(apply_thresholds(scores, trial), human, k)
                if not np.isnan(kappa) and kappa > best + 1e-12:
                    best, t, changed = kappa, trial, True
        if not changed:
            break
    return t


def in_calibration_split(query: str, doc_id: str, fraction: float) -> bool:
    """Whether (query, doc) belongs to the calibration split: SHA-256 of ``query\\x1fdoc_id`` below ``fraction``.

    Deterministic and independent of run, model and data size, so reports can recompute it.
    """
    digest = hashlib.sha256(f"{query}\x1f{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < fraction


@dataclass(frozen=True)
class Agreement:
    """Agreement between grades from a mapping and human grades on one set of pairs."""

    pairs: int
    kappa: float  # quadratic-weighted Cohen's kappa, predicted grade vs human grade
    spearman: float  # score vs human grade (independent of the mapping)
    exact: float  # share of pairs with the same grade
    confusion: list[list[int]] = field(default_factory=list)  # [human][predicted]

    def as_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if np.isnan(x) else round(float(x), 6)

        return {"pairs": self.pairs, "kappa": num(self.kappa), "spearman": num(self.spearman),
                "exact": num(self.exact), "confusion": self.confusion}


def agreement(scores: NDArray[np.float64], human: NDArray[np.int64], mapping: GradeMapping) -> Agreement:
    """Kappa, Spearman, exact agreement and confusion of ``mapping`` on these pairs."""
    scores = np.asarray(scores, dtype=np.float64)
    human = np.asarray(human, dtype=np.int64)
    k = mapping.grade_max + 1
    pred = mapping.grade(scores)
    n = len(scores)
    return Agreement(
        pairs=n,
        kappa=quadratic_weighted_kappa(pred, human, k),
        spearman=spearman(scores, human.astype(np.float64)),
        exact=float(np.mean(pred == human)) if n else float("nan"),
        confusion=confusion(pred, human, k) if n else [],
    )


def mapping_from_thresholds(kind: str, thresholds: Sequence[float] | NDArray[np.float64], *, method: str) -> GradeMapping:
    """A calibrated mapping from fitted thresholds."""
    return GradeMapping(kind, tuple(float(x) for x in thresholds), calibrated=True, method=method)


def default_rubric_text(grade_max: int) -> str:
    """The rubric when no --rubric file is given, for people (`ubi review serve`) and model judges (`ubi judge`)
    alike, so that both grade under one text (one digest): the ESCI-style scale of docs/metrics.md, 0..grade_max."""
    if grade_max == 3:
        lines = ["3  exact: the document is what the query asks for",
                 "2  substitute: it would do, though it is not exactly what was asked for",
                 "1  complement: related, useful next to what was asked for",
                 "0  irrelevant: unrelated to the query"]
    else:
        lines = [f"{grade_max}  the best answer to the query", "...", "0  irrelevant: unrelated to the query"]
    return "Grade how well the document answers the query.\n\n" + "\n".join(lines)
