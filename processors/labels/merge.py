"""Judgments merged with provenance: every label kept, one precedence view on top, coverage per system.

A (query, doc) pair may carry several labels: human ones (from a qrels file or the ``human_judgments``
table: assessor, date, rubric, origin), reviewed implicit ones (``reviewed:<source>``, a person confirmed or
changed a candidate judgment) and implicit ones (``implicit:<model>`` from the ``judgments`` table: model
version, support counts, interval; a grade only when the support sufficed). Nothing here overwrites a label:
:class:`LabelSet` keeps all of them, and :meth:`LabelSet.merged` picks, per pair, the label that ranks first
under a precedence list (default ``human > reviewed > implicit``). Entries of the list are label *kinds*
(``human``, ``reviewed``, ``implicit``) or exact sources (``implicit:pbm``); a label ranks at the first entry
that names its source or its kind; labels no entry names are kept but never chosen. Ties within an entry:
labels from the qrels file given on the command line before those from the store, then the most recently
judged, then the source name, so the choice is deterministic.

Several assessors: a person-made source (``human``, ``reviewed:<src>``) may hold one label per assessor for a
pair. The label chosen for such a pair is their aggregate (:func:`aggregate_grades`, rule
:data:`AGGREGATE_RULE`): the lower median of the assessors' grades, i.e. the highest grade that a strict
majority of them gave at least. It stays on the grade scale (a mean of 1 and 2 is no grade anyone gave), one
outlying assessor cannot move it, and a tie between two halves goes to the lower grade: a document is credited
with a grade only when more than half the people who saw it granted that much. The aggregate label carries
the spread in ``parameters`` (``assessors``, ``grade_min``, ``grade_max``, ``grades`` per assessor), so every
reader of one grade per pair (qrels, metrics, agreement, predict) sees the aggregate, and only the
inter-assessor agreement (``ubi_pipeline.reports.agreement``) reads the per-assessor rows.

Model labels (``model:<name>``, an LLM's or any other model's proposals, stored in the ``judgments`` table)
are their own kind: no default precedence names them, so they are measured and shown but never chosen unless
a precedence names them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import duckdb

from ubi_pipeline.schemas.cli_names import DEFAULT_PRECEDENCE
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.judgments import HumanJudgment
from ubi_pipeline.store.judgment_params import read_judgments

KINDS = ("human", "reviewed", "implicit", "model")
#: kinds whose labels people made: several assessors of one pair are aggregated, never picked between
PERSON_KINDS = ("human", "reviewed")
#: how the grades of several assessors of one pair become one (module docstring)
AGGREGATE_RULE = "median_low"


class MergeError(UbiError):
    """A precedence list or label that cannot be used (unknown kind, a negative grade)."""


class Label(NamedTuple):
    """One label of one (query, doc) with where it came from. ``grade`` is None for ungraded implicit rows."""

    query: str
    doc_id: str
    grade: int | None
    source: str  # human | reviewed:<src> | implicit:<model> | model:<name>
    origin: str | None = None  # file, "store", ...
    query_id: str | None = None
    assessor: str | None = None
    judged_at: datetime | None = None
    rubric: str | None = None
    model_version: str | None = None
    score: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    impressions: int | None = None
    clicks: int | None = None
    sessions: int | None = None
    parameters: Mapping[str, Any] | None = None
    note: str | None = None  # the assessor's explanation of the grade

    @property
    def kind(self) -> str:
        return label_kind(self.source)

    @property
    def from_file(self) -> bool:
        return self.origin is not None and not self.origin.startswith("store")

    def provenance(self) -> dict[str, Any]:
        """The label as a JSON-ready dict, without empty fields."""
        out = {k: v for k, v in self._asdict().items() if v is not None and k not in ("query", "doc_id")}
        if isinstance(self.judged_at, datetime):
            out["judged_at"] = self.judged_at.isoformat()
        out["kind"] = self.kind
        return out


def label_kind(source: str) -> str:
    """``human`` | ``reviewed`` | ``implicit`` | ``model`` from a source name (``reviewed:ctr`` -> ``reviewed``)."""
    head = source.split(":", 1)[0]
    if head not in KINDS:
        raise MergeError(f"label source {source!r}: expected 'human', 'reviewed:<source>', 'implicit:<model>' "
                         "or 'model:<name>'")
    return head


def aggregate_grades(grades: Sequence[int]) -> int:
    """The lower median of several assessors' grades of one pair (:data:`AGGREGATE_RULE`): sorted g,
    g[(n - 1) // 2]; the highest grade that more than half of the assessors gave at least. [1, 2] -> 1,
    [0, 1, 3] -> 1, [2, 2, 3, 3] -> 2."""
    if not grades:
        raise MergeError("no grades to aggregate")
    return sorted(grades)[(len(grades) - 1) // 2]


def aggregate_label(labels: Sequence[Label]) -> Label:
    """One label for several assessors' labels of one pair and source: the aggregate grade, the latest date,
    the rubric when all share it, and the spread in ``parameters``."""
    first = labels[0]
    if len(labels) == 1:
        return first
    grades = [int(lab.grade) for lab in labels]  # type: ignore[arg-type]
    dates = [lab.judged_at for lab in labels if isinstance(lab.judged_at, datetime)]
    rubrics = {lab.rubric for lab in labels}
    by_assessor = {lab.assessor or "": int(lab.grade) for lab in labels}  # type: ignore[arg-type]
    return first._replace(
        grade=aggregate_grades(grades), assessor=None, note=None, judged_at=max(dates) if dates else None,
        rubric=rubrics.pop() if len(rubrics) == 1 else None,
        parameters={"aggregate": AGGREGATE_RULE, "assessors": len(labels), "grade_min": min(grades),
                    "grade_max": max(grades), "grades": dict(sorted(by_assessor.items()))},
    )


class MergedLabel(NamedTuple):
    """The label the precedence chose for one pair, and every label the pair has (chosen one included)."""

    query: str
    doc_id: str
    grade: int
    source: str
    labels: tuple[Label, ...]


def _check_precedence(precedence: Sequence[str]) -> tuple[str, ...]:
    if not precedence:
        raise MergeError("the precedence list is empty; give e.g. human,reviewed,implicit")
    for entry in precedence:
        label_kind(entry)  # raises on anything that is neither a kind nor a source
    if len(set(precedence)) != len(precedence):
        raise MergeError(f"precedence {','.join(precedence)} names an entry twice")
    return tuple(precedence)


@dataclass
class LabelSet:
    """Every label of every pair, grouped by (query, doc). Labels are appended, never replaced."""

    by_pair: dict[tuple[str, str], list[Label]] = field(default_factory=lambda: defaultdict(list))

    def add(self, labels: Iterable[Label]) -> LabelSet:
        for lab in labels:
            label_kind(lab.source)
            if lab.grade is not None and lab.grade < 0:
                raise MergeError(f"label {lab.source} for ({lab.query!r}, {lab.doc_id!r}) has grade {lab.grade} < 0")
            self.by_pair[(lab.query, lab.doc_id)].append(lab)
        return self

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_pair.values())

    def sources(self) -> list[str]:
        """Every source present, humans first, then reviewed, then implicit, each sorted."""
        found = {lab.source for labs in self.by_pair.values() for lab in labs}
        return sorted(found, key=lambda s: (KINDS.index(label_kind(s)), s))

    def qrels(self, source: str) -> dict[str, dict[str, int]]:
        """Graded labels of one source, or of one kind (``human``), as qrels keyed by query text.

        When a kind has several labels for one pair (a file and the store disagree), the same tie rules as
        :meth:`merged` pick one.
        """
        chosen = self._choose((source,))
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for (query, doc), lab in chosen.items():
            out[query][doc] = int(lab.grade)  # type: ignore[arg-type]
        return dict(out)

    def merged(self, precedence: Sequence[str] = DEFAULT_PRECEDENCE) -> dict[tuple[str, str], MergedLabel]:
        """Per pair, the graded label ranking first under ``precedence``; pairs with none are absent."""
        chosen = self._choose(_check_precedence(precedence))
        return {
            pair: MergedLabel(pair[0], pair[1], int(lab.grade), lab.source, tuple(self.by_pair[pair]))  # type: ignore[arg-type]
            for pair, lab in chosen.items()
        }

    def choose(self, precedence: Sequence[str] = DEFAULT_PRECEDENCE) -> dict[tuple[str, str], Label]:
        """Per pair, the graded label itself (provenance and all) ranking first under ``precedence``."""
        return self._choose(_check_precedence(precedence))

    def merged_qrels(self, precedence: Sequence[str] = DEFAULT_PRECEDENCE) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for (query, doc), lab in self._choose(_check_precedence(precedence)).items():
            out[query][doc] = int(lab.grade)  # type: ignore[arg-type]
        return dict(out)

    def _choose(self, precedence: Sequence[str]) -> dict[tuple[str, str], Label]:
        prio = {entry: i for i, entry in enumerate(precedence)}

        def tie(lab: Label) -> tuple[Any, ...]:
            ts = lab.judged_at.timestamp() if isinstance(lab.judged_at, datetime) else float("-inf")
            return (0 if lab.from_file else 1, -ts, lab.source, lab.origin or "")

        out: dict[tuple[str, str], Label] = {}
        for pair, labs in self.by_pair.items():
            best: Label | None = None
            best_rank = 0
            for lab in labs:
                if lab.grade is None:
                    continue
                rank = prio.get(lab.source)
                if rank is None:
                    rank = prio.get(lab.source.partition(":")[0])
                    if rank is None:
                        continue
                if best is None or rank < best_rank or (rank == best_rank and tie(lab) < tie(best)):
                    best, best_rank = lab, rank
            if best is not None and (best.source == "human" or best.source.startswith("reviewed:")):  # PERSON_KINDS
                # every assessor of the chosen source (and side: the file, or the store) counts, not the latest
                peers = [lab for lab in labs if lab.grade is not None and lab.source == best.source
                         and lab.from_file == best.from_file]
                if len(peers) > 1:
                    best = aggregate_label(peers)
            if best is not None:
                out[pair] = best
        return out


class PairLabels(NamedTuple):
    """One (query, doc) in the merged view: the label the precedence chose (None when no label it names has
    a grade) beside every label the pair has, and whether graded labels of the pair disagree."""

    query: str
    doc_id: str
    chosen: Label | None
    labels: tuple[Label, ...]
    conflict: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the chosen grade and source (with the assessors' spread when it is their aggregate), then
        every label with its provenance."""
        out: dict[str, Any] = {
            "query": self.query,
            "doc_id": self.doc_id,
            "grade": None if self.chosen is None else self.chosen.grade,
            "source": None if self.chosen is None else self.chosen.source,
            "conflict": self.conflict,
            "labels": [{**lab.provenance(), "grade": lab.grade} for lab in self.labels],
        }
        params = self.chosen.parameters if self.chosen is not None else None
        if params and params.get("aggregate"):
            out["aggregate"] = dict(params)
        return out


@dataclass(frozen=True)
class MergeSummary:
    """What the precedence did over all pairs: where each chosen label came from, and where sources disagree.

    A pair is a conflict when two of its graded labels differ, from two sources or from one source read
    twice (a qrels file and the store), or when one source's assessors differ; ``conflicts_by_sources`` counts
    each pair once per disagreeing couple, named ``"A vs B"`` in :meth:`LabelSet.sources` order (each side the
    aggregate of its assessors, :func:`aggregate_label`), or ``"A: assessors differ"``.
    """

    precedence: tuple[str, ...]
    pairs: int
    chosen_by_source: dict[str, int]
    unresolved: int  # pairs with no graded label the precedence names: absent from the merged view
    several_sources: int  # pairs with labels of more than one source
    conflicts: int
    conflicts_by_sources: dict[str, int]


def _couple(a: Label, b: Label) -> str:
    """How a disagreement between two labels of one pair is counted: by source, by origin when one source was
    read twice (a file and the store), and one name for the assessors of one source who differ."""
    if a.source != b.source:
        return f"{a.source} vs {b.source}"
    if a.origin == b.origin or (not a.from_file and not b.from_file and a.assessor != b.assessor):
        return f"{a.source}: assessors differ"
    return f"{a.source} ({a.origin or 'unknown origin'}) vs {b.source} ({b.origin or 'unknown origin'})"


def merge_view(labels: LabelSet, precedence: Sequence[str] = DEFAULT_PRECEDENCE) -> tuple[list[PairLabels], MergeSummary]:
    """Every pair with its chosen label and all its labels (sorted by query, doc), and the summary of the merge."""
    prec = _check_precedence(precedence)
    chosen = labels.choose(prec)
    order = {s: i for i, s in enumerate(labels.sources())}
    pairs: list[PairLabels] = []
    by_source: dict[str, int] = defaultdict(int)
    by_couple: dict[str, int] = defaultdict(int)
    several = conflicts = 0
    for pair in sorted(labels.by_pair):
        labs = tuple(labels.by_pair[pair])
        pick = chosen.get(pair)
        if pick is not None:
            by_source[pick.source] += 1
        if len({lab.source for lab in labs}) > 1:
            several += 1
        # one source's assessors are compared among themselves; across sources, each side is its assessors'
        # aggregate (the grade the merge and the reports use), so that three assessors who differ among themselves
        # do not make a model or click model "disagree with human" on a pair whose merged grade it matches
        groups: dict[tuple[str, bool], list[Label]] = defaultdict(list)
        for lab in labs:
            if lab.grade is not None:
                groups[(lab.source, lab.from_file)].append(lab)
        couples: set[str] = set()
        for group in groups.values():
            if len({lab.grade for lab in group}) > 1:
                couples.add(_couple(group[0], group[1]) if len(group) == 2 else f"{group[0].source}: assessors differ")
        graded = sorted((aggregate_label(g) for g in groups.values()), key=lambda lab: (order[lab.source], lab.origin or ""))
        for i, a in enumerate(graded):
            for b in graded[i + 1:]:
                if a.grade != b.grade:
                    couples.add(_couple(a, b))
        for couple in couples:
            by_couple[couple] += 1
        conflicts += bool(couples)
        pairs.append(PairLabels(pair[0], pair[1], pick, labs, bool(couples)))
    summary = MergeSummary(
        precedence=prec, pairs=len(pairs),
        chosen_by_source={s: by_source[s] for s in sorted(by_source, key=lambda s: order[s])},
        unresolved=len(pairs) - len(chosen), several_sources=several, conflicts=conflicts,
        conflicts_by_sources=dict(sorted(by_couple.items(), key=lambda kv: (-kv[1], kv[0]))),
    )
    return pairs, summary


def labels_from_human(records: Iterable[HumanJudgment]) -> list[Label]:
    """Labels from human judgment records (``ubi_pipeline.formats.qrels.Qrels.human_judgments()``: keyed by query text)."""
    return [
        Label(r.query, r.doc_id, r.grade, r.source, origin=r.origin or "file", query_id=r.query_id,
              assessor=r.assessor, judged_at=r.judged_at, rubric=r.rubric)
        for r in records
    ]


def labels_from_store(con: duckdb.DuckDBPyConnection) -> list[Label]:
    """Every row of ``human_judgments`` and ``judgments`` as labels (tables missing: none).

    A judgment's ``parameters`` is the merged dict of ``ubi_pipeline.store.judgment_params`` (its run's keys, then its own),
    with the run-wide part parsed once per run and shared between the rows' dicts: read it, do not change it.
    At 20M events a run has about 400,000 judgments, and 1.3 KB of run-wide parameters parsed row by row took
    more memory than everything else ``ubi report`` reads. So rows whose stored parameters are the same text
    share one dict (``read_judgments(..., share=True)``: a run's rows differ only in ``observations``), and the
    values most rows repeat (query text, source, model version, creation time) are one object each: at 5M
    events 2.0 KB a label before, about 0.6 KB after.
    """
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    out: list[Label] = []
    if "human_judgments" in tables:
        for query, doc, grade, source, qid, assessor, judged_at, rubric, origin, note in con.execute(
            "SELECT query, doc_id, grade, source, query_id, assessor, judged_at, rubric, origin, note "
            "FROM human_judgments ORDER BY query, doc_id, source, assessor"
        ).fetchall():
            out.append(Label(query, doc, grade, source, origin="store" if origin is None else f"store:{origin}",
                             query_id=qid, assessor=assessor or None, judged_at=judged_at, rubric=rubric,
                             note=note or None))
    same: dict[Any, Any] = {}  # one object per distinct query text, source, version, time (equal values)
    one = same.setdefault
    for (query, doc, grade, source, version, score, lo, hi, imps, clicks, sessions, created,
         parameters) in read_judgments(con, _LABEL_COLUMNS, share=True):
        out.append(Label(one(query, query), doc, grade, one(source, source), origin="store",
                         model_version=one(version, version), score=score, ci_low=lo, ci_high=hi, impressions=imps,
                         clicks=clicks, sessions=sessions, parameters=parameters, judged_at=one(created, created)))
    return out


_LABEL_COLUMNS = ("query", "doc_id", "grade", "source", "model_version", "score", "ci_low", "ci_high", "impressions",
                  "clicks", "sessions", "created_at")


# ------------------------------------------------------------------------------------------ coverage


class Coverage(NamedTuple):
    """How much of one system's logged top k one source has labelled.

    ``judged_at_k`` is the mean, over every query of the system's run (labelled or not), of the fraction
    of its top k (its whole ranking when shorter, as ir_measures' Judged@k) that has a label of the source
    (0 for an empty ranking);
    ``queries_labelled`` counts the run's queries with at least one label of the source.
    """

    system: str
    source: str
    k: int
    queries: int
    queries_labelled: int
    judged_at_k: float


def _judged_fraction(ranking: Sequence[str], judged: Mapping[str, int] | None, k: int) -> float:
    top = list(ranking[:k])
    if not top or not judged:
        return 0.0
    # as ir_measures' Judged@k: the fraction of the docs actually in the top k (a short list can be fully judged)
    return sum(1 for d in top if d in judged) / len(top)


def coverage(
    runs: Mapping[str, tuple[Mapping[str, Sequence[str]], Mapping[str, str]]],
    qrels_by_source: Mapping[str, Mapping[str, Mapping[str, int]]],
    k: int,
) -> list[Coverage]:
    """judged@k per system and source. ``runs[system] = (run, query_of)``, run keyed by query id."""
    if k < 1:
        raise MergeError(f"k must be >= 1, got {k}")
    out = []
    for system, (run, query_of) in runs.items():
        for source, qrels in qrels_by_source.items():
            fracs = []
            labelled = 0
            for qid, ranking in run.items():
                judged = qrels.get(query_of.get(qid, qid))
                if judged:
                    labelled += 1
                fracs.append(_judged_fraction(ranking, judged, k))
            mean = sum(fracs) / len(fracs) if fracs else float("nan")
            out.append(Coverage(system, source, k, len(run), labelled, mean))
    return out
