"""Interleaving outcomes: credit from clicks, per-search and per-query preference, sign test and bootstrap.

Team-draft credit (Radlinski, Kurup & Joachims, CIKM 2008): each click on an interleaved result counts for the
ranker whose team contributed it (``ubi_pipeline.schemas.interleaving``). Per search, the challenger *wins* with more
credited clicks, *loses* with fewer and *ties* with as many (at least one click); searches without a credited
click carry no preference and are counted apart. Over searches:

    win_rate   = wins / (wins + losses)                                (0.5: no preference)
    preference = (wins + ties/2) / (wins + losses + ties) − 1/2        (Δ_AB, Chapelle et al., TOIS 2012)

The sign test is the exact two-sided binomial test of wins against losses at p = 1/2 (ties dropped); the
interval of ``win_rate`` is a percentile bootstrap over searches. Per query, the outcomes of its searches are
averaged and the sign of the mean is the query's preference (win / loss / tie), with the same test over
queries, so one frequent query cannot decide alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray
from scipy.stats import binomtest

from ubi_pipeline.schemas.errors import UbiError


class InterleavingStatsError(UbiError):
    """Interleaving outcomes asked for with impossible settings."""


class InterleavedSearch(NamedTuple):
    """One interleaved search: its query, the team of each shown doc, and the docs clicked."""

    query_id: str
    query: str
    rankers: tuple[str, str]  # (reference, challenger)
    teams: Mapping[str, str]
    clicked: frozenset[str]


def credit(teams: Mapping[str, str], clicked: Iterable[str], rankers: Sequence[str]) -> tuple[int, int]:
    """Credited clicks of (reference, challenger): distinct clicked docs each team contributed."""
    got = [0, 0]
    for doc in set(clicked):
        team = teams.get(doc)
        if team == rankers[0]:
            got[0] += 1
        elif team == rankers[1]:
            got[1] += 1
    return got[0], got[1]


def outcomes(credits: NDArray[np.int64]) -> NDArray[np.int64]:
    """Per search: +1 challenger wins, −1 loses, 0 tie; ``credits`` is [n, 2] (reference, challenger)."""
    return np.sign(credits[:, 1] - credits[:, 0]).astype(np.int64)


def win_rate(out: NDArray[np.int64]) -> float:
    """wins / (wins + losses); NaN without a decided search."""
    w, lo = int((out > 0).sum()), int((out < 0).sum())
    return w / (w + lo) if w + lo else float("nan")


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided binomial test of wins vs losses at p = 1/2 (ties left out); 1.0 when nothing is decided."""
    n = wins + losses
    return float(binomtest(wins, n, 0.5).pvalue) if n else 1.0


def bootstrap_win_rate(out: NDArray[np.int64], *, n_boot: int = 2000, confidence: float = 0.95,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile interval of ``win_rate`` over searches resampled with replacement (vectorised counts)."""
    if n_boot < 1 or not 0 < confidence < 1:
        raise InterleavingStatsError(f"need n_boot >= 1 and 0 < confidence < 1, got {n_boot}, {confidence}")
    n = len(out)
    if n == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng([seed, 0x17])
    counts = rng.multinomial(n, _shares(out), size=n_boot)  # [B, 3]: losses, ties, wins per replicate
    decided = counts[:, 0] + counts[:, 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = counts[:, 2] / decided
    rates = rates[decided > 0]
    if not len(rates):
        return float("nan"), float("nan")
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(rates, [tail, 1.0 - tail])
    return float(lo), float(hi)


def _shares(out: NDArray[np.int64]) -> NDArray[np.float64]:
    """Shares of losses, ties, wins (resampling searches is resampling these three outcomes)."""
    n = len(out)
    return np.array([(out < 0).sum(), (out == 0).sum(), (out > 0).sum()], dtype=np.float64) / n


@dataclass(frozen=True)
class Tally:
    """Wins, losses and ties of the challenger at one level (searches or queries) with its tests."""

    wins: int
    losses: int
    ties: int
    win_rate: float
    ci_low: float
    ci_high: float
    preference: float
    p_value: float

    @property
    def n(self) -> int:
        return self.wins + self.losses + self.ties


def tally(out: NDArray[np.int64], *, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0) -> Tally:
    """:class:`Tally` of outcomes in {−1, 0, +1}."""
    w, lo, t = int((out > 0).sum()), int((out < 0).sum()), int((out == 0).sum())
    n = w + lo + t
    low, high = bootstrap_win_rate(out, n_boot=n_boot, confidence=confidence, seed=seed)
    pref = (w + t / 2.0) / n - 0.5 if n else float("nan")
    return Tally(w, lo, t, win_rate(out), low, high, pref, sign_test(w, lo))


@dataclass(frozen=True)
class InterleavingResult:
    """One interleaving experiment: the challenger (second ranker) against the reference (first)."""

    experiment: str  # "<challenger>-vs-<reference>"
    reference: str
    challenger: str
    searches: int  # interleaved searches
    searches_without_clicks: int
    credited_clicks: tuple[int, int]  # (reference, challenger)
    by_search: Tally
    by_query: Tally
    queries: int
    systems: tuple[str, ...] = ()  # the logged systems whose searches were interleaved
    per_query: list[dict[str, object]] = field(default_factory=list)  # query, searches, wins, losses, ties


def analyse(searches: Sequence[InterleavedSearch], *, n_boot: int = 2000, confidence: float = 0.95,
            seed: int = 0) -> list[InterleavingResult]:
    """One :class:`InterleavingResult` per (reference, challenger) pair among ``searches``."""
    groups: dict[tuple[str, str], list[InterleavedSearch]] = {}
    for s in searches:
        groups.setdefault(tuple(s.rankers), []).append(s)  # type: ignore[arg-type]
    results = []
    for (ref, chal), group in sorted(groups.items()):
        cr = np.array([credit(s.teams, s.clicked, (ref, chal)) for s in group], dtype=np.int64).reshape(-1, 2)
        clicked = cr.sum(axis=1) > 0
        out = outcomes(cr[clicked])
        queries = [s.query for s, c in zip(group, clicked, strict=True) if c]
        by_q: dict[str, list[int]] = {}
        for q, o in zip(queries, out.tolist(), strict=True):
            by_q.setdefault(q, []).append(o)
        q_out = np.array([int(np.sign(np.mean(v))) for v in by_q.values()], dtype=np.int64)
        per_query = [{"query": q, "searches": len(v), "wins": v.count(1), "losses": v.count(-1), "ties": v.count(0)}
                     for q, v in sorted(by_q.items())]
        results.append(InterleavingResult(
            experiment=f"{chal}-vs-{ref}", reference=ref, challenger=chal, searches=len(group),
            searches_without_clicks=int((~clicked).sum()),
            credited_clicks=(int(cr[:, 0].sum()), int(cr[:, 1].sum())),
            by_search=tally(out, n_boot=n_boot, confidence=confidence, seed=seed),
            by_query=tally(q_out, n_boot=n_boot, confidence=confidence, seed=seed),
            queries=len(by_q), per_query=per_query,
        ))
    return results
