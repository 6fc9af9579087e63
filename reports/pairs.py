"""The joint view: for a pair of systems, every kind of evidence on which is better, side by side.

One :class:`PairView` per pair (reference, challenger); each :class:`Line` is a difference *challenger minus
reference* with its interval and the number of units it rests on:

- human-label offline difference: the main offline metric (nDCG@k) on human labels, paired over the queries
  both systems were evaluated on, percentile bootstrap of the mean difference (``ubi_pipeline.reports.compare``);
- implicit-label offline difference: the same on the recommended implicit source (else the first one);
- predicted online difference: CTR@k of both systems predicted from the log by one counterfactual method on
  the queries every system ranks, paired bootstrap over the same resamples (``ubi_pipeline.reports.predicted``);
- observed online difference (A/B): logged CTR@k of the two, only when they are an A/B comparison: both served
  the same application's traffic over overlapping time on queries they share (:func:`ab_comparability`; two
  shops with different queries are not an experiment, whatever their CTRs); the interval is the MOVER
  difference of the two independent Wilson intervals (Newcombe, Stat. Med. 1998, method 10; Zou & Donner,
  Stat. Med. 2008): L = d − √((p₂ − l₂)² + (u₁ − p₁)²), U = d + √((u₂ − p₂)² + (p₁ − l₁)²) for d = p₂ − p₁;
- interleaving preference: the challenger's win rate over searches with a winner, minus ½, with the
  bootstrap interval of the win rate shifted alike (``ubi_pipeline.reports.interleaving_outcomes``).

The lines are on different scales (an nDCG difference, a CTR difference, a win rate), so only their signs
are compared: the pair *agrees* when every line with a figure points the same way (an exact tie points
nowhere). A line whose interval holds 0 is still counted by its sign, and its "excludes 0" says no. A line
resting on fewer than :data:`~ubi_pipeline.reports.intervals.MIN_BOOTSTRAP_N` units has no interval and no
"excludes 0" (a bootstrap of one query is the query itself); which system wins, and how firmly, is
:mod:`ubi_pipeline.reports.verdict`'s to say.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from ubi_pipeline.reports.compare import compare_pair
from ubi_pipeline.reports.interleaving_outcomes import InterleavingResult
from ubi_pipeline.reports.intervals import MIN_BOOTSTRAP_N, Interval
from ubi_pipeline.reports.online import OnlineMetrics
from ubi_pipeline.reports.predicted import PredictedDifferences

#: The evidence lines of a pair, in table order.
EVIDENCE = ("human offline", "implicit offline", "predicted online", "observed online (A/B)", "interleaving")
TIE = 1e-12


@dataclass(frozen=True)
class Line:
    """One kind of evidence on a pair: challenger − reference, its interval, its n, or why there is none."""

    evidence: str  # one of EVIDENCE
    measure: str  # what is differenced, e.g. "human/ndcg@10", "ctr@10 (dr, predicted)", "win rate − 1/2"
    diff: float = float("nan")
    low: float = float("nan")
    high: float = float("nan")
    n: int | None = None
    unit: str = ""  # what n counts: queries, searches, searches with a winner
    interval: str = ""  # how the interval was made
    missing: str | None = None  # why there is no figure

    @property
    def sign(self) -> int:
        """+1 the challenger is ahead, −1 behind, 0 tied or no figure."""
        if not math.isfinite(self.diff) or abs(self.diff) <= TIE:
            return 0
        return 1 if self.diff > 0 else -1

    @property
    def clear(self) -> bool | None:
        """Whether the interval excludes 0 (None without an interval, or on fewer than ``MIN_BOOTSTRAP_N`` units)."""
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return None
        if self.n is not None and self.n < MIN_BOOTSTRAP_N:
            return None
        return self.low > 0 or self.high < 0


@dataclass(frozen=True)
class PairView:
    """Every line of evidence on one pair of systems and whether their signs agree."""

    reference: str
    challenger: str
    lines: tuple[Line, ...]

    @property
    def signs(self) -> dict[str, int]:
        return {ln.evidence: ln.sign for ln in self.lines if math.isfinite(ln.diff)}

    @property
    def agree(self) -> bool | None:
        """True when every line that points somewhere points the same way (an exact tie points nowhere and
        breaks nothing); False when two point opposite ways; None with fewer than two lines that point."""
        pointing = [s for s in self.signs.values() if s != 0]
        if len(set(pointing)) > 1:
            return False
        return True if len(pointing) >= 2 else None

    def verdict(self) -> str:
        """One sentence: which way each line points and whether they agree."""
        signs = self.signs
        if not signs:
            return "no evidence on this pair"
        ahead = [e for e, s in signs.items() if s > 0]
        behind = [e for e, s in signs.items() if s < 0]
        tied = [e for e, s in signs.items() if s == 0]
        tie = f" ({', '.join(tied)}: a tie)" if tied else ""
        if self.agree is None:
            return f"one line only has a direction ({', '.join(ahead + behind) or 'none'}){tie}"
        if self.agree:
            who = self.challenger if ahead else self.reference
            return f"agree in sign: all {len(ahead) + len(behind)} lines with a direction favour {who}{tie}"
        return (f"disagree in sign: {', '.join(ahead)} favour {self.challenger}; {', '.join(behind)} favour "
                f"{self.reference}{tie}")


def mover_difference(reference: Interval, challenger: Interval) -> tuple[float, float, float]:
    """challenger − reference with the MOVER interval of two independent intervals (module docstring)."""
    p1, l1, u1 = reference.value, reference.low, reference.high
    p2, l2, u2 = challenger.value, challenger.low, challenger.high
    d = p2 - p1
    low = d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
    high = d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    return d, low, high


def ranker_system(ranker: str, systems: Sequence[str]) -> str | None:
    """The system an interleaving ranker name stands for: the system of that name, else the one logged system
    split out by that ranker (``app/ranker=NAME``), else None."""
    if ranker in systems:
        return ranker
    hits = [s for s in systems if s.rsplit("=", 1)[-1] == ranker and "=" in s]
    return hits[0] if len(hits) == 1 else None


def offline_line(evidence: str, source: str | None, metric: str,
                 per_text: Mapping[str, tuple[list[str], np.ndarray]], reference: str, challenger: str, *,
                 n_boot: int, seed: int, why_none: str) -> Line:
    """The paired offline difference on ``source`` (``per_text[system]``: query texts and values)."""
    measure = f"{source}/{metric}" if source else metric
    if source is None:
        return Line(evidence, measure, missing=why_none)
    if reference not in per_text or challenger not in per_text:
        missing = [s for s in (reference, challenger) if s not in per_text]
        return Line(evidence, measure, missing=f"no {source} labels on {', '.join(missing)}'s queries")
    c = compare_pair(challenger, reference, metric, source, per_text[reference], per_text[challenger],
                     n_boot=n_boot, n_perm=1, seed=seed)
    if c.queries == 0:
        return Line(evidence, measure, n=0, unit="queries", missing="no query evaluated for both")
    if c.queries < MIN_BOOTSTRAP_N:
        return Line(evidence, measure, c.diff, n=c.queries, unit="queries",
                    interval=f"no interval: {c.queries} quer{'y' if c.queries == 1 else 'ies'} < {MIN_BOOTSTRAP_N}")
    return Line(evidence, measure, c.diff, c.diff_low, c.diff_high, c.queries, "queries",
                "paired bootstrap over queries")


def predicted_line(pred: PredictedDifferences | None, reference: str, challenger: str, why_none: str) -> Line:
    if pred is None or reference not in pred.values or challenger not in pred.values:
        return Line("predicted online", "ctr (predicted)", missing=why_none)
    d, lo, hi = pred.difference(reference, challenger)
    share = max(pred.prior_share.get(reference, 0.0), pred.prior_share.get(challenger, 0.0))
    how = f"paired, {pred.replicates} log resamples, {pred.model} refitted; ≤ {share * 100:.0f}% on the prior"
    return Line("predicted online", f"{pred.metric} ({pred.method}, predicted)", d, lo, hi, pred.searches,
                "logged searches", how)


@dataclass(frozen=True)
class Served:
    """What one logged system served: its application(s), the time span of its searches, its query count."""

    applications: tuple[str, ...]
    first: datetime | None
    last: datetime | None
    queries: int


def _span(s: Served) -> str:
    if s.first is None or s.last is None:
        return "no timestamps"
    return f"{s.first:%Y-%m-%d %H:%M} to {s.last:%Y-%m-%d %H:%M}"


def ab_comparability(reference: str, challenger: str, served: Mapping[str, Served],
                     shared_queries: Mapping[frozenset[str], int]) -> tuple[bool, str]:
    """Whether two logged systems form an A/B comparison, and the sentence that says which and how many, or why not.

    Both must have served one and the same application, over time spans that overlap, and share at least one
    query (normalised text). Anything else compares different traffic, not different rankers.
    """
    a, b = served.get(reference), served.get(challenger)
    if a is None or b is None:
        absent = [s for s, v in ((reference, a), (challenger, b)) if v is None]
        return False, f"{' and '.join(absent)} never served (no log)"
    if len(a.applications) != 1 or a.applications != b.applications:
        return False, (f"not an A/B comparison: different applications ({reference}: "
                       f"{', '.join(a.applications) or 'none'}; {challenger}: {', '.join(b.applications) or 'none'})")
    app = a.applications[0]
    if a.first is None or a.last is None or b.first is None or b.last is None:
        return False, "not an A/B comparison: no timestamps show that the two served at the same time"
    start, end = max(a.first, b.first), min(a.last, b.last)
    if start > end:
        return False, (f"not an A/B comparison: they served {app} at different times ({reference}: {_span(a)}; "
                       f"{challenger}: {_span(b)})")
    shared = shared_queries.get(frozenset((reference, challenger)), 0)
    if shared == 0:
        return False, f"not an A/B comparison: no query in common ({reference}: {a.queries}, {challenger}: {b.queries})"
    return True, (f"A/B: both served {app} from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}, on {shared} shared "
                  f"quer{'y' if shared == 1 else 'ies'}")


def observed_line(online: Mapping[str, OnlineMetrics], metric: str, reference: str, challenger: str,
                  comparable: tuple[bool, str] | None = None) -> Line:
    """The logged difference, when the two are an A/B comparison (``comparable``: :func:`ab_comparability`;
    None: not checked, as for a caller without the log's spans)."""
    absent = [s for s in (reference, challenger) if s not in online]
    if absent:
        return Line("observed online (A/B)", metric,
                    missing=f"{' and '.join(absent)} never served (no log)")
    if comparable is not None and not comparable[0]:
        return Line("observed online (A/B)", metric, missing=comparable[1])
    a, b = online[reference].metrics.get(metric), online[challenger].metrics.get(metric)
    if a is None or b is None or not (math.isfinite(a.value) and math.isfinite(b.value)):
        return Line("observed online (A/B)", metric, missing=f"no {metric} for both")
    d, lo, hi = mover_difference(a, b)
    how = "MOVER of the two Wilson intervals" + (f"; {comparable[1]}" if comparable is not None else "")
    return Line("observed online (A/B)", metric, d, lo, hi, online[reference].searches + online[challenger].searches,
                "searches", how)


def interleaving_line(results: Sequence[InterleavingResult], systems: Sequence[str], reference: str,
                      challenger: str) -> Line:
    measure = "win rate − 1/2"
    for r in results:
        ref, cha = ranker_system(r.reference, systems), ranker_system(r.challenger, systems)
        if {ref, cha} != {reference, challenger}:
            continue
        t = r.by_search
        flip = ref != reference  # the experiment ran the other way round: its challenger is our reference
        d, lo, hi = t.win_rate - 0.5, t.ci_low - 0.5, t.ci_high - 0.5
        if flip:
            d, lo, hi = -d, -hi, -lo
        n = t.wins + t.losses
        if n < MIN_BOOTSTRAP_N:
            return Line("interleaving", measure, d, n=n, unit="searches with a winner",
                        interval=f"no interval: {n} searches with a winner < {MIN_BOOTSTRAP_N} ({r.experiment})")
        return Line("interleaving", measure, d, lo, hi, n, "searches with a winner",
                    f"bootstrap of the win rate ({r.experiment})")
    return Line("interleaving", measure, missing="not interleaved against each other")


#: At most this many pairs get a table (every pair of up to five systems).
MAX_PAIRS = 10


def pairs_of(systems: Sequence[str], baseline: str | None, limit: int = MAX_PAIRS) -> list[tuple[str, str]]:
    """(reference, challenger) pairs: the baseline against every other system first, then every other pair
    in system order (the earlier system the reference), ``limit`` pairs at most."""
    out: list[tuple[str, str]] = []
    if baseline is not None and baseline in systems:
        out += [(baseline, s) for s in systems if s != baseline]
    rest = [s for s in systems if s != baseline]
    out += [(a, b) for i, a in enumerate(rest) for b in rest[i + 1:]]
    return out[:limit]


def joint_view(
    systems: Sequence[str],
    *,
    baseline: str | None,
    metric: str,
    k: int,
    human: Mapping[str, tuple[list[str], np.ndarray]],
    implicit_source: str | None,
    implicit: Mapping[str, tuple[list[str], np.ndarray]],
    predicted: PredictedDifferences | None,
    predicted_missing: str,
    online: Mapping[str, OnlineMetrics],
    interleaving: Sequence[InterleavingResult],
    has_human: bool,
    n_boot: int = 2000,
    seed: int = 0,
    served: Mapping[str, Served] | None = None,
    shared_queries: Mapping[frozenset[str], int] | None = None,
) -> list[PairView]:
    """One :class:`PairView` per pair of ``systems`` (see the module docstring). ``served`` and ``shared_queries``
    (per logged system, and per pair of them) decide which pairs are an A/B comparison; without them every pair of
    logged systems is taken as one (for callers that know it is)."""
    out = []
    for ref, cha in pairs_of(systems, baseline):
        comparable = (ab_comparability(ref, cha, served, shared_queries or {}) if served is not None
                      and ref in online and cha in online else None)
        lines = (
            offline_line("human offline", "human" if has_human else None, metric, human, ref, cha,
                         n_boot=n_boot, seed=seed, why_none="no human labels"),
            offline_line("implicit offline", implicit_source, metric, implicit, ref, cha, n_boot=n_boot, seed=seed,
                         why_none="no implicit labels"),
            predicted_line(predicted, ref, cha, predicted_missing),
            observed_line(online, f"ctr@{k}", ref, cha, comparable),
            interleaving_line(interleaving, systems, ref, cha),
        )
        out.append(PairView(ref, cha, lines))
    return out
