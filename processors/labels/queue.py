"""The review queue: which (query, document) pairs a person should grade next, and why.

Human time is the scarce resource of the label lifecycle, so the queue spends it where a grade changes most:

1. **A held-out sample first** (``held_out`` items): a stratified random sample of the pairs, the same for a given
   ``seed``, that measures how far each implicit and model source (and each assessor) agrees with people. Strata
   are the query's frequency band (``head``/``torso``/``tail``: the thirds of the distinct queries' counts) crossed
   with the pair's suggested grade (the median of its implicit sources' grades, ``ungraded`` when none has one:
   a model judge grading queued pairs never moves the sample it is measured on); each
   stratum gets an equal share of ``held_out`` pairs (a stratum with fewer pairs gives its rest to the others, the
   strata taken in a seeded random order), so rare high grades are measured as well as the many zeros. The page shows these pairs blind
   (no evidence), so the agreement measured on them is not anchored on what a source suggested.
2. **Then the remaining pairs, most useful first**: where the sources disagree most (the range of the grades the
   implicit and model sources and existing human grades give the pair), then the widest confidence interval (in
   bands of 0.1 on the attractiveness scale, the widest of the pair's sources; a pair no source has an interval
   for comes after every pair that has one), then the most frequent query (``ubi_queries`` counts), then the exact
   width, query and doc id (so the order is total and reproducible).

Each pair wants ``assessors_per_pair`` grades; an assessor is never served a pair they already graded (under any
source) or skipped. :func:`build_queue` is pure over typed rows; :class:`Queue` holds who graded what while a page
serves it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.judgments import MODEL_PREFIX

#: Frequency bands of the held-out strata, from the least to the most frequent third of the queries.
BANDS = ("tail", "torso", "head")
#: Width of the interval bands the order compares before query frequency.
WIDTH_BAND = 0.1


class QueueError(UbiError):
    """A review queue cannot be built (bad limits)."""


class Candidate(NamedTuple):
    """One stored candidate judgment of a pair (a ``judgments`` row: ``implicit:*`` or ``model:*``)."""

    query: str
    doc_id: str
    source: str
    score: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    impressions: int | None = None
    clicks: int | None = None
    sessions: int | None = None
    grade: int | None = None


class HumanGrade(NamedTuple):
    """One stored human grade (a ``human_judgments`` row)."""

    query: str
    doc_id: str
    assessor: str
    grade: int
    source: str = "human"


Pair = tuple[str, str]


@dataclass(frozen=True)
class QueueItem:
    """A pair in the queue, with its evidence and why it is where it is."""

    query: str
    doc_id: str
    position: int  # 0-based place in the queue
    held_out: bool
    reason: str  # shown on the page
    evidence: tuple[Candidate, ...]
    frequency: int  # searches of the query (ubi_queries)
    disagreement: int  # range of the grades the pair has (sources and people), 0 with fewer than two
    width: float | None  # widest interval of its sources, None when none has one
    stratum: str | None = None  # "<band>/<suggested grade>" for held-out pairs

    @property
    def pair(self) -> Pair:
        return (self.query, self.doc_id)


def _suggested(grades: list[int]) -> int | None:
    """The median of the sources' grades, halves rounded up; None without grades."""
    if not grades:
        return None
    g = sorted(grades)  # a handful of sources: plain Python is faster here than np.median per pair
    mid = len(g) // 2
    median = g[mid] if len(g) % 2 else (g[mid - 1] + g[mid]) / 2
    return int(math.floor(median + 0.5))


def _bands(freqs: Mapping[str, int], queries: Iterable[str]) -> dict[str, str]:
    """Each query's frequency band: the thirds of the distinct queries' counts (ties share the lower band)."""
    qs = sorted(set(queries))
    counts = np.array([freqs.get(q, 0) for q in qs], dtype=np.float64)
    if not len(counts):
        return {}
    low, high = np.quantile(counts, [1 / 3, 2 / 3])
    return {q: BANDS[0] if c <= low else BANDS[1] if c <= high else BANDS[2] for q, c in zip(qs, counts, strict=True)}


def _sample(strata: Mapping[str, list[int]], n: int, rng: np.random.Generator) -> list[tuple[int, str]]:
    """Equal shares of ``n`` per stratum (rests passed on, strata in a seeded order, so that a sample smaller than
    the strata count draws its strata at random), each drawn without replacement."""
    names = sorted(strata)
    names = [names[i] for i in rng.permutation(len(names))]
    pools = {s: list(rng.permutation(strata[s])) for s in names}
    taken: dict[str, int] = dict.fromkeys(names, 0)
    left = min(n, sum(len(p) for p in pools.values()))
    while left > 0:
        open_ = [s for s in names if taken[s] < len(pools[s])]
        share = max(1, left // len(open_))
        for s in open_:
            k = min(share, len(pools[s]) - taken[s], left)
            taken[s] += k
            left -= k
            if left == 0:
                break
    out = [(int(i), s) for s in names for i in pools[s][:taken[s]]]
    # the sample's own order: shuffled, so an assessor who stops early has graded every stratum alike
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def _seen(n: int) -> str:
    return f"query seen {n:,} time{'' if n == 1 else 's'}"


def _fmt_grades(evidence: Iterable[Candidate], humans: Iterable[HumanGrade]) -> str:
    parts = [f"{c.source} {c.grade}" for c in evidence if c.grade is not None]
    parts += [f"{h.assessor or 'unnamed'} {h.grade}" for h in humans]
    return ", ".join(parts)


def build_queue(candidates: Iterable[Candidate], humans: Iterable[HumanGrade], frequencies: Mapping[str, int], *,
                held_out: int = 50, seed: int = 0) -> list[QueueItem]:
    """Order every pair that has a candidate judgment for review (see the module's docstring for the order)."""
    if held_out < 0:
        raise QueueError(f"held-out sample size {held_out} must be >= 0")
    by_pair: dict[Pair, list[Candidate]] = defaultdict(list)
    for c in candidates:
        by_pair[(c.query, c.doc_id)].append(c)
    human_by_pair: dict[Pair, list[HumanGrade]] = defaultdict(list)
    for h in humans:
        human_by_pair[(h.query, h.doc_id)].append(h)
    pairs = sorted(by_pair)
    evid = [tuple(sorted(by_pair[p], key=lambda c: c.source)) for p in pairs]
    n = len(pairs)
    freq = np.array([frequencies.get(q, 0) for q, _ in pairs], dtype=np.int64)
    disagreement = np.zeros(n, dtype=np.int64)
    width = np.full(n, np.nan)
    for i, p in enumerate(pairs):
        source_grades = [c.grade for c in evid[i] if c.grade is not None]
        grades = source_grades + [h.grade for h in human_by_pair.get(p, ())]
        if len(grades) >= 2:
            disagreement[i] = max(grades) - min(grades)
        widths = [c.ci_high - c.ci_low for c in evid[i] if c.ci_low is not None and c.ci_high is not None]
        if widths:
            width[i] = max(widths)

    # strata by the implicit sources' grades only: a model judge's grades of queued pairs (``ubi judge``) must not
    # move the sample the model is then measured on, nor the one people are already grading
    bands = _bands(frequencies, (q for q, _ in pairs))
    strata: dict[str, list[int]] = defaultdict(list)
    for i, (q, _) in enumerate(pairs):
        g = _suggested([c.grade for c in evid[i] if c.grade is not None and not c.source.startswith(MODEL_PREFIX)])
        strata[f"{bands[q]}/{'ungraded' if g is None else f'grade {g}'}"].append(i)
    sample = _sample(strata, held_out, np.random.default_rng(seed))
    in_sample = {i for i, _ in sample}

    rest = np.array([i for i in range(n) if i not in in_sample], dtype=np.int64)
    has_w = ~np.isnan(width[rest])
    band = np.where(has_w, np.floor(np.nan_to_num(width[rest], nan=0.0) / WIDTH_BAND + 1e-9), -1.0)
    exact = np.where(has_w, np.nan_to_num(width[rest], nan=0.0), -1.0)
    # np.lexsort sorts by the last key first; ties fall to the pair's place in `pairs`, i.e. query then doc id
    order = rest[np.lexsort((-exact, -freq[rest], -band, -disagreement[rest]))] if len(rest) else rest

    # plain Python numbers from here on: formatting numpy scalars costs more than the whole order
    freq_l, dis_l = freq.tolist(), disagreement.tolist()
    width_l: list[float | None] = [None if math.isnan(w) else w for w in width.tolist()]
    items: list[QueueItem] = []
    for i, stratum in sample:
        q, d = pairs[i]
        items.append(QueueItem(q, d, len(items), True, f"held-out sample ({stratum}, {_seen(freq_l[i])}): "
                               "graded blind to measure how well each source and assessor agrees with people",
                               evid[i], freq_l[i], dis_l[i], width_l[i], stratum))
    for i in order.tolist():
        q, d = pairs[i]
        why = []
        if dis_l[i] > 0:
            why.append(f"grades differ by {dis_l[i]} ({_fmt_grades(evid[i], human_by_pair.get((q, d), ()))})")
        w = width_l[i]
        why.append("no source has an interval" if w is None else f"interval {w:.2f} wide")
        why.append(_seen(freq_l[i]))
        items.append(QueueItem(q, d, len(items), False, "; ".join(why), evid[i], freq_l[i], dis_l[i], w))
    return items


@dataclass
class Queue:
    """The ordered items and who graded (or skipped) which pair, as a page serves them."""

    items: list[QueueItem]
    assessors_per_pair: int = 1
    graded: dict[Pair, set[str]] = field(default_factory=dict)
    skipped: dict[str, set[Pair]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.assessors_per_pair < 1:
            raise QueueError(f"assessors per pair {self.assessors_per_pair} must be >= 1")
        self._index = {it.pair: it for it in self.items}

    @classmethod
    def of(cls, items: list[QueueItem], humans: Iterable[HumanGrade], assessors_per_pair: int = 1) -> Queue:
        """A queue whose pairs already count the stored human grades (any source, any assessor)."""
        graded: dict[Pair, set[str]] = defaultdict(set)
        for h in humans:
            graded[(h.query, h.doc_id)].add(h.assessor)
        return cls(items, assessors_per_pair, dict(graded))

    def item(self, pair: Pair) -> QueueItem | None:
        return self._index.get(pair)

    def next_for(self, assessor: str) -> QueueItem | None:
        """The first item that wants more grades and this assessor has neither graded nor skipped."""
        skipped = self.skipped.get(assessor, set())
        for it in self.items:
            who = self.graded.get(it.pair, ())
            if len(who) < self.assessors_per_pair and assessor not in who and it.pair not in skipped:
                return it
        return None

    def record(self, pair: Pair, assessor: str) -> None:
        self.graded.setdefault(pair, set()).add(assessor)

    def forget(self, pair: Pair, assessor: str) -> None:
        self.graded.get(pair, set()).discard(assessor)

    def skip(self, pair: Pair, assessor: str) -> None:
        self.skipped.setdefault(assessor, set()).add(pair)

    def unskip(self, pair: Pair, assessor: str) -> None:
        self.skipped.get(assessor, set()).discard(pair)

    def progress(self, assessor: str) -> dict[str, int]:
        """What this assessor graded and skipped among the queue's pairs, and what is left for them."""
        done = sum(1 for it in self.items if assessor in self.graded.get(it.pair, ()))
        skipped = len(self.skipped.get(assessor, set()))
        left = sum(1 for it in self.items
                   if len(who := self.graded.get(it.pair, ())) < self.assessors_per_pair and assessor not in who
                   and it.pair not in self.skipped.get(assessor, set()))
        return {"graded": done, "skipped": skipped, "left": left, "pairs": len(self.items)}
