"""The joint report: every system in the logs (and in run files), offline on each source, online, agreement, comparison.

:func:`build_report` is the stage: a store connection (``ubi_pipeline.store.client.open_reader``) and a
:class:`~ubi_pipeline.processors.labels.merge.LabelSet` in, one :class:`Report` out, which the renderers in ``ubi_pipeline.reports.render`` turn
into text, Markdown, JSON, HTML and dashboard rows. Nothing here prints or writes files.

Offline, per system and judgment source: the system's logged rankings (``ubi_pipeline.reports.systems``) are scored with
``ubi_pipeline.reports.metrics.compute`` against the source's grades, joined on the normalised query text. Sources:
``human`` (every human label), ``reviewed`` (reviewed implicit labels, when present), each ``implicit:<model>``
(graded rows only, so judged@k shows how sparse they are) and ``merged`` (the precedence view of
``ubi_pipeline.processors.labels.merge``, when labels of more than one kind exist). The merged view itself travels with the report:
every labelled (query, doc), the label the precedence chose and every label it has with its provenance
(:func:`ubi_pipeline.processors.labels.merge.merge_view`), and a summary of where the chosen labels came from and where sources
disagree. Each aggregate is a mean over the queries with at
least one positive label, with a bootstrap interval (t above ``resample_limit`` queries) and its query
count; queries whose labels hold no positive (labelled negatives) are counted apart, and run queries without
any label of the source are counted as unlabelled. Per query class when classes are configured (a
``query_attributes`` key, or regex rules).

Run files given beside the logs are systems too (``file_runs``), evaluated offline exactly as the logged ones
(every source, coverage, per query, comparison, gates); their query ids map to query texts by the rule of
:mod:`ubi_pipeline.reports.systems`. They have no online metrics: they are absent from ``Report.online`` (shown as "no
log", never as zero), in the offline orders but not the online ones (so not in the rank correlations), and an
online gate applies to them only when it names them (and then fails, saying why).
"""

from __future__ import annotations

import math
import re
import time
import tomllib
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from ubi_pipeline.formats.runs import Run
from ubi_pipeline.processors.clicks.identifiability import (
    UNIDENTIFIED,
    Identifiability,
    assess,
    is_position_debiased,
)
from ubi_pipeline.processors.clicks.sessions import SessionData
from ubi_pipeline.processors.counterfactual.evidence import UnseenEvidence, returned_not_shown
from ubi_pipeline.processors.counterfactual.predict import PredictionError, predict
from ubi_pipeline.processors.labels.merge import (
    DEFAULT_PRECEDENCE,
    Coverage,
    LabelSet,
    MergeSummary,
    PairLabels,
    coverage,
    label_kind,
    merge_view,
)
from ubi_pipeline.processors.propensity.randomized import SwapSessions
from ubi_pipeline.reports.agreement import Agreement, AssessorAgreement, agreement_all, assessor_agreement
from ubi_pipeline.reports.compare import Comparison, Ordering, compare_systems, ordering
from ubi_pipeline.reports.gates import GateResult, Threshold, check
from ubi_pipeline.reports.interleaving import gate_values as interleaving_gate_values
from ubi_pipeline.reports.interleaving import interleaving_results
from ubi_pipeline.reports.interleaving_outcomes import InterleavingResult
from ubi_pipeline.reports.intervals import RESAMPLE_LIMIT, Interval, mean_intervals
from ubi_pipeline.reports.metrics import MetricTable, compute
from ubi_pipeline.reports.online import DEFAULT_CLICK_ACTIONS, ONLINE_METRICS, OnlineMetrics, online_metrics
from ubi_pipeline.reports.pairs import MAX_PAIRS, PairView, Served, joint_view, pairs_of
from ubi_pipeline.reports.predicted import (
    DEFAULT_REPORT_REPLICATES,
    JOINT_METHOD,
    PREDICT_BUDGET_S,
    PredictedDifferences,
    PredictedSystem,
    budget_replicates,
    predicted_differences,
    predictions,
    run_evidence,
    shared_rankings,
)
from ubi_pipeline.reports.recommend import (
    held_out_selection,
    identifiability_notes,
    recommend,
    withhold_unidentified,
    withhold_unidentified_in,
)
from ubi_pipeline.reports.systems import (
    DEFAULT_IMPRESSION_ACTIONS,
    DEFAULT_SPLIT_KEYS,
    RankingMode,
    SearchCounts,
    SystemRun,
    classes_by_text,
    drop_searches,
    file_run,
    logged_runs_in,
    prepare_searches,
    search_counts,
)
from ubi_pipeline.reports.verdict import PairContext, Verdict, candidate_findings, decide
from ubi_pipeline.schemas.errors import InputFileError, UbiError

OTHER_CLASS = "other"
NO_LOG = "no log"  # what a run-file system shows where the logs would give a number


class ReportError(UbiError):
    """The report cannot be built as asked (no systems in the logs, an unknown source or baseline)."""


def default_metrics(k: int) -> tuple[str, ...]:
    """nDCG@k (linear gain), recall@k, MRR, P@k, MAP, judged@k."""
    return (f"ndcg@{k}", f"recall@{k}", "mrr", f"p@{k}", "map", f"judged@{k}")


@dataclass(frozen=True)
class ClassRules:
    """Query classes from regex patterns on the normalised query text: the first matching class wins."""

    rules: tuple[tuple[str, re.Pattern[str]], ...]
    path: str | None = None

    def classify(self, query: str) -> str:
        for name, pattern in self.rules:
            if pattern.search(query):
                return name
        return OTHER_CLASS


def load_class_rules(path: str | Path) -> ClassRules:
    """Read ``[classes]`` of a TOML file: ``brand = "^(nike|adidas)\\\\b"``, in order; unmatched: ``other``."""
    p = str(path)
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputFileError(p, None, f"cannot read the classes file: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise InputFileError(p, int(m.group(1)) if m else None, f"malformed TOML: {exc}") from exc
    table = doc.get("classes")
    if not isinstance(table, dict) or not table or set(doc) - {"classes"}:
        raise InputFileError(p, None, 'expected one [classes] table of name = "regex", e.g. brand = "^nike"')
    rules = []
    for name, pattern in table.items():
        if not isinstance(pattern, str):
            raise InputFileError(p, None, f"class {name!r}: the pattern must be a string, got {pattern!r}")
        try:
            rules.append((name, re.compile(pattern)))
        except re.error as exc:
            raise InputFileError(p, None, f"class {name!r}: bad regular expression {pattern!r}: {exc}") from exc
    return ClassRules(tuple(rules), p)


@dataclass
class ReportConfig:
    """Everything that shapes a report; the CLI fills it from flags and ``Settings``."""

    k: int = 10
    metrics: tuple[str, ...] | None = None  # None: default_metrics(k)
    gain: str = "linear"
    rel_threshold: int = 1
    mode: RankingMode = "modal"
    split_keys: tuple[str, ...] = DEFAULT_SPLIT_KEYS
    class_key: str | None = None
    class_rules: ClassRules | None = None
    sources: tuple[str, ...] | None = None  # implicit / reviewed sources to evaluate (None: all found)
    precedence: tuple[str, ...] = DEFAULT_PRECEDENCE
    baseline: str | None = None
    position_base: int = 0
    position_base_by_application: Mapping[str, int] = field(default_factory=dict)
    click_actions: tuple[str, ...] = DEFAULT_CLICK_ACTIONS
    impression_actions: tuple[str, ...] = DEFAULT_IMPRESSION_ACTIONS
    reformulation_window_s: float = 60.0
    max_client_queries_per_minute: float = 60.0  # above: a bot-like client, warned about
    max_rank: int = 10
    grade_max: int = 3
    confidence: float = 0.95
    n_boot: int = 2_000
    n_perm: int = 10_000
    resample_limit: int = RESAMPLE_LIMIT  # above: t intervals for means (comparisons always bootstrap)
    seed: int = 0
    #: counterfactual predictions (run systems' section, the joint view): bootstrap replicates, click model
    predict_replicates: int | None = None  # None: DEFAULT_REPORT_REPLICATES within PREDICT_BUDGET_S of CPU
    predict_model: str = "pbm"

    @property
    def metric_names(self) -> tuple[str, ...]:
        return tuple(m.strip().lower() for m in (self.metrics or default_metrics(self.k)))


@dataclass
class SystemSummary:
    """What the logs hold for one system; a run-file system has no log, so its log counts are None."""

    name: str
    searches: int | None
    queries: int  # distinct queries with a known ranking
    unranked_searches: int | None
    zero_result_searches: int | None
    searches_with_several_rankings: int | None
    duplicate_hits: int | None
    unstable_queries: int | None  # queries shown with more than one ranking (mode ``modal``)
    mean_modal_share: float
    kind: str = "logs"  # logs | run
    origin: str | None = None  # the run file of a run system

    @property
    def from_run(self) -> bool:
        return self.kind == "run"


@dataclass
class OfflineResult:
    """One system scored against one judgment source."""

    system: str
    source: str
    metrics: tuple[str, ...]
    query_ids: list[str]  # evaluated queries (at least one positive), run order
    queries: list[str]  # their normalised text
    classes: list[str | None]
    per_query: dict[str, list[float]]
    aggregate: dict[str, Interval]
    negatives: list[dict[str, Any]]  # labelled negatives: query, retrieved, judged@k
    unlabelled_queries: int
    run_queries: int
    per_class: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)

    @property
    def n_queries(self) -> int:
        return len(self.query_ids)


@dataclass
class Report:
    """The joint report (see the module docstring); every renderer reads only this."""

    created_at: datetime
    config: ReportConfig
    systems: list[SystemSummary]
    sources: list[str]
    label_counts: dict[str, dict[str, int]]
    offline: list[OfflineResult]
    coverage: list[Coverage]
    online: dict[str, OnlineMetrics]
    agreement: dict[str, Agreement]
    comparisons: list[Comparison]
    orderings: list[Ordering]
    gates: list[GateResult] = field(default_factory=list)
    propensity: dict[str, Any] | None = None
    # the merged view with provenance: every labelled (query, doc), its chosen label and all its labels
    label_pairs: list[PairLabels] = field(default_factory=list)
    merge: MergeSummary | None = None
    notes: list[str] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)
    #: data-quality warnings, shown first in every format (events without a query record, bots, ordinals)
    warnings: list[str] = field(default_factory=list)
    identifiability: dict[str, Any] | None = None  # ubi_pipeline.processors.clicks.identifiability verdict of the logged sessions
    recommendation: dict[str, Any] | None = None  # ubi_pipeline.reports.recommend: the implicit source to trust, and why
    interleaving: list[InterleavingResult] = field(default_factory=list)  # ubi_pipeline.reports.interleaving
    #: run-file systems' online metrics predicted from the logs (ubi_pipeline.reports.predicted)
    predicted: list[PredictedSystem] = field(default_factory=list)
    predicted_differences: PredictedDifferences | None = None  # the joint view's predicted CTR@k per system
    pairs: list[PairView] = field(default_factory=list)  # the joint view (ubi_pipeline.reports.pairs)
    verdict: Verdict | None = None  # first in every format (ubi_pipeline.reports.verdict)
    #: agreement among the people who graded (ubi_pipeline.reports.agreement.assessor_agreement); None: no pair has two
    assessors: AssessorAgreement | None = None

    @property
    def run_systems(self) -> list[str]:
        """Systems read from run files (no online metrics)."""
        return [s.name for s in self.systems if s.from_run]

    def offline_for(self, system: str, source: str) -> OfflineResult | None:
        for r in self.offline:
            if r.system == system and r.source == source:
                return r
        return None

    def gate_values(self) -> dict[str, dict[str, tuple[float, int | None]]]:
        """Every aggregate a gate can name: ``SOURCE/METRIC`` and ``online/NAME`` per system."""
        out: dict[str, dict[str, tuple[float, int | None]]] = {s.name: {} for s in self.systems}
        for r in self.offline:
            for metric, iv in r.aggregate.items():
                out[r.system][f"{r.source}/{metric}"] = (iv.value, iv.n)
        for system, om in self.online.items():
            for metric, iv in om.metrics.items():
                out.setdefault(system, {})[f"online/{metric}"] = (iv.value, iv.n)
        for system, values in interleaving_gate_values(self.interleaving).items():
            out.setdefault(system, {}).update(values)
        return out

    @property
    def failed_gates(self) -> list[GateResult]:
        return [g for g in self.gates if not g.passed]


def _stored_implicit_sources(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The implicit sources of the store's ``judgments`` table (a fixed, quoted name), in name order."""
    if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'judgments'").fetchall()[0][0]:
        return []
    return [r[0] for r in con.execute(
        "SELECT DISTINCT source FROM \"judgments\" WHERE source LIKE 'implicit:%' ORDER BY source").fetchall()]


def _evaluation_sources(labels: LabelSet, wanted: Sequence[str] | None) -> list[str]:
    present = labels.sources()
    kinds = {label_kind(s) for s in present}
    out = ["human"] if "human" in kinds else []
    extra = [s for s in present if label_kind(s) != "human"]
    if wanted is not None:
        unknown = [s for s in wanted if s not in present and s not in ("human", "merged", "reviewed")]
        if unknown:
            raise ReportError(f"source(s) {', '.join(unknown)} have no labels; found: {', '.join(present) or 'none'}")
        extra = [s for s in extra if s in wanted]
    if any(label_kind(s) == "reviewed" for s in extra):
        out.append("reviewed")
    out += [s for s in extra if label_kind(s) == "implicit"]
    out += [s for s in extra if label_kind(s) == "model"]  # measured like implicit ones, never recommended
    if len(kinds) > 1:
        out.append("merged")
    return out


def _qrels_for(labels: LabelSet, source: str, precedence: Sequence[str]) -> dict[str, dict[str, int]]:
    if source == "merged":
        return labels.merged_qrels(precedence)
    return labels.qrels(source)


def _class_of(run: SystemRun, qid: str, config: ReportConfig) -> str | None:
    if config.class_rules is not None:
        return config.class_rules.classify(run.query_of[qid])
    if config.class_key is not None:
        return run.query_class.get(qid) or "(none)"
    return None


def _offline(run: SystemRun, source: str, qrels: Mapping[str, Mapping[str, int]], config: ReportConfig) -> OfflineResult:
    q_qrels = {qid: qrels[text] for qid, text in run.query_of.items() if text in qrels}
    table: MetricTable = compute(q_qrels, run.run, list(config.metric_names), gain=config.gain,
                                 rel_threshold=config.rel_threshold)
    ids = list(table.query_ids)
    per_query = {m: table.values[m].tolist() for m in table.metrics}
    matrix = np.column_stack([table.values[m] for m in table.metrics]) if ids else np.empty((0, len(table.metrics)))
    intervals = mean_intervals(matrix, confidence=config.confidence, n_boot=config.n_boot, seed=config.seed,
                               resample_limit=config.resample_limit)
    aggregate = dict(zip(table.metrics, intervals, strict=True))
    classes = [_class_of(run, q, config) for q in ids]
    negatives = [{"query": run.query_of[row["query_id"]], **row} for row in table.negatives_per_query()]
    res = OfflineResult(
        system=run.system, source=source, metrics=table.metrics, query_ids=ids,
        queries=[run.query_of[q] for q in ids], classes=classes, per_query=per_query, aggregate=aggregate,
        negatives=negatives, unlabelled_queries=len(table.unjudged_query_ids), run_queries=run.n_queries,
    )
    if any(c is not None for c in classes):
        by_class: dict[str, list[int]] = defaultdict(list)
        for i, c in enumerate(classes):
            by_class[str(c)].append(i)
        res.per_class = {
            c: {m: (float(np.mean(np.asarray(per_query[m])[idx])), len(idx)) for m in table.metrics}
            for c, idx in sorted(by_class.items())
        }
    return res


def _per_text(result: OfflineResult, metric: str) -> tuple[list[str], np.ndarray]:
    """Per-query values keyed by query text (mode ``each`` averages the searches of one text)."""
    texts, inverse = np.unique(np.asarray(result.queries, dtype=object), return_inverse=True)
    values = np.asarray(result.per_query[metric], dtype=float)
    means = np.bincount(inverse, weights=values, minlength=len(texts)) / np.bincount(inverse, minlength=len(texts))
    return texts.tolist(), means


def _summaries(counts: Mapping[str, SearchCounts], runs: Mapping[str, SystemRun]) -> list[SystemSummary]:
    out = []
    for name, run in sorted(runs.items()):
        c = counts.get(name, SearchCounts(0, 0, 0, 0))
        shares = list(run.modal_share.values())
        out.append(SystemSummary(
            name=name, searches=c.searches, queries=len({run.query_of[q] for q in run.run}),
            unranked_searches=run.unranked_searches,
            zero_result_searches=c.zero_result,
            searches_with_several_rankings=c.several_rankings,
            duplicate_hits=c.duplicate_hits,
            unstable_queries=sum(1 for v in run.distinct_rankings.values() if v > 1),
            mean_modal_share=float(np.mean(shares)) if shares else math.nan,
        ))
    return out


def _run_summaries(runs: Mapping[str, SystemRun]) -> list[SystemSummary]:
    return [
        SystemSummary(name=name, searches=None, queries=run.n_queries, unranked_searches=None,
                      zero_result_searches=None, searches_with_several_rankings=None, duplicate_hits=None,
                      unstable_queries=None, mean_modal_share=math.nan, kind="run", origin=run.origin)
        for name, run in runs.items()
    ]


def query_id_texts(labels: LabelSet) -> dict[str, set[str]]:
    """Normalised query text(s) of each human judgment ``query_id``: labels from a file before the store's.

    A file given on the command line is what the user evaluates against now, so when it names a query id
    the store's older texts for that id are ignored (the same preference :mod:`ubi_pipeline.processors.labels.merge` applies).
    """
    from_file: dict[str, set[str]] = defaultdict(set)
    from_store: dict[str, set[str]] = defaultdict(set)
    for labs in labels.by_pair.values():
        for lab in labs:
            if lab.query_id is not None and lab.kind == "human":
                (from_file if lab.from_file else from_store)[lab.query_id].add(lab.query)
    return {**from_store, **from_file}


def _file_systems(
    file_runs: Sequence[tuple[str, Run]], logged: Mapping[str, SystemRun], labels: LabelSet,
    class_of_text: Mapping[str, str | None], queryset: Mapping[str, Collection[str]] | None = None,
) -> dict[str, SystemRun]:
    # a judgment's query id first, then the query set's (the order `ubi judgments import` reads them in)
    texts = {**(queryset or {}), **query_id_texts(labels)}
    out: dict[str, SystemRun] = {}
    for name, run in file_runs:
        where = run.path or "a run"
        if name in logged:
            raise ReportError(f"{where}: system name {name!r} is already a system of the logs; name the run "
                              f"another way with --run FILE=NAME")
        if name in out:
            raise ReportError(f"{where}: system name {name!r} is already used by {out[name].origin or 'another run'}; "
                              f"name the runs apart with --run FILE=NAME")
        out[name] = file_run(name, run, texts, class_of_text)
    return out


def _run_notes(systems: Mapping[str, SystemRun], labels: LabelSet) -> list[str]:
    """Warn when a run's query ids mostly miss every judged query: a query-id mismatch, not a bad ranker."""
    judged = {query for query, _doc in labels.by_pair}
    notes = []
    for name, run in systems.items():
        missing = sum(1 for text in run.query_of.values() if text not in judged)
        if missing:
            hint = (" (none matched: a run query id must be a judgments query_id or the query text itself)"
                    if missing == run.n_queries else "")
            notes.append(f"run {name} ({run.origin}): {missing} of {run.n_queries} query ids match no judged "
                         f"query{hint}")
    return notes


def _gate_thresholds(thresholds: Sequence[Threshold], logged: Sequence[str],
                     interleaved: Sequence[str] = ()) -> list[Threshold]:
    """Online gates without a system list apply to the logged systems only: a run file has no log.

    With no logged system at all the gate is left to fail on the run systems: a gate must be able to fail.
    Interleaving gates without a system list apply to the systems whose searches were interleaved (when any).
    """
    out = []
    for t in thresholds:
        if t.systems is None and t.metric.startswith("online/") and logged:
            t = replace(t, systems=tuple(logged))
        elif t.systems is None and t.metric.startswith("interleaving/") and interleaved:
            t = replace(t, systems=tuple(interleaved))
        out.append(t)
    return out


def _label_counts(labels: LabelSet) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for source in labels.sources():
        labs = [lab for ls in labels.by_pair.values() for lab in ls if lab.source == source]
        # pairs, not rows: several assessors' rows of one pair are one pair (the labels are the rows)
        out[source] = {
            "pairs": len({(lab.query, lab.doc_id) for lab in labs}),
            "graded_pairs": len({(lab.query, lab.doc_id) for lab in labs if lab.grade is not None}),
            "labels": len(labs),
            "graded": sum(1 for lab in labs if lab.grade is not None),
            "queries": len({lab.query for lab in labs}),
        }
    return out


def _orphan_notes(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute(
        "SELECT coalesce(application, '(no application)'), count(*), count(DISTINCT query_id) FROM ubi_events "
        "WHERE query_id IS NULL OR query_id NOT IN (SELECT query_id FROM ubi_queries) GROUP BY 1 ORDER BY 1"
    ).fetchall()
    return [
        f"{app}: {n} events ({q} query ids) have no query record, so no system or ranking; left out"
        for app, n, q in rows
    ]


def _shared_offline(results: Sequence[OfflineResult], metric: str) -> tuple[dict[str, float], int | None, str | None]:
    """Each evaluated system's mean of ``metric`` over the queries all of them were evaluated on.

    Returns (values, shared query count, why there is no order). One evaluated system keeps its own mean
    (an order of one, said as such); several sharing no query get no values and a sentence naming them.
    """
    evaluated = [r for r in results if r.n_queries > 0]
    if not evaluated:
        return {}, None, None
    if len(evaluated) == 1:
        r = evaluated[0]
        return {r.system: r.aggregate[metric].value}, len(set(r.queries)), None
    per_text = {r.system: dict(zip(*_per_text(r, metric), strict=True)) for r in evaluated}
    shared = set.intersection(*(set(v) for v in per_text.values()))
    if not shared:
        sizes = ", ".join(f"{r.system} ({len(per_text[r.system])})" for r in evaluated)
        return {}, 0, f"not ordered: the systems share no evaluated query ({sizes} queries each)"
    texts = sorted(shared)
    return {s: float(np.mean([v[t] for t in texts])) for s, v in per_text.items()}, len(texts), None


def _bot_warnings(con: duckdb.DuckDBPyConnection, max_per_minute: float, *, filtered: bool = False) -> list[str]:
    """Clients whose logged searches exceed ``max_per_minute`` in some 60 s window (as ``ubi process`` filters)."""
    rows = con.execute("""
        SELECT count(*), coalesce(sum(n), 0), coalesce(max(peak), 0) FROM (
            SELECT client_id, count(*) AS n, max(w) AS peak FROM (
                SELECT client_id, count(*) OVER (PARTITION BY client_id ORDER BY ts
                       RANGE BETWEEN CURRENT ROW AND INTERVAL 60 SECOND FOLLOWING) AS w
                FROM (SELECT client_id, min("timestamp") AS ts FROM ubi_queries
                      WHERE client_id IS NOT NULL AND "timestamp" IS NOT NULL GROUP BY client_id, query_id)
            ) GROUP BY client_id
        ) WHERE peak > $max""", {"max": float(max_per_minute)}).fetchall()
    clients, searches, peak = (int(x) for x in rows[0])
    if not clients:
        return []
    where = ("left out of the online metrics, as `ubi process` leaves them out of the judgments" if filtered else
             "the online metrics here include them (no sessions were read); `ubi process` filters them")
    return [f"{clients} client(s) sent more than {max_per_minute:g} searches in a minute (peak {peak}; {searches} "
            f"searches in all): bots? {where[0].upper() + where[1:]}"]


_SERVED = """
SELECT system, list(DISTINCT coalesce(application, '(no application)')), min(ts), max(ts), count(DISTINCT query)
FROM _ubi_searches WHERE system IS NOT NULL GROUP BY system
"""
_SHARED_QUERIES = """
WITH q AS (SELECT DISTINCT system, query FROM _ubi_searches WHERE system IS NOT NULL AND coalesce(query, '') <> '')
SELECT a.system, b.system, count(*) FROM q a JOIN q b ON a.query = b.query AND a.system < b.system GROUP BY ALL
"""


def _served(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, Served], dict[frozenset[str], int]]:
    """What each logged system served (application, time span, queries) and the queries each pair shares: what
    decides which pairs are an A/B comparison (``ubi_pipeline.reports.pairs.ab_comparability``)."""
    served = {system: Served(tuple(sorted(apps)), first, last, int(n))
              for system, apps, first, last, n in con.execute(_SERVED).fetchall()}
    shared = {frozenset((a, b)): int(n) for a, b, n in con.execute(_SHARED_QUERIES).fetchall()}
    return served, shared


def _rankings_by_text(run: SystemRun) -> dict[str, list[str]]:
    """A system's ranking per normalised query text (the first of its rows for a text, in run order)."""
    out: dict[str, list[str]] = {}
    for qid, docs in run.run.items():
        out.setdefault(run.query_of[qid], list(docs))
    return out


def _interleaved_systems(interleaved: Sequence[InterleavingResult]) -> set[str]:
    """Logged systems whose searches were interleaved: a mix of two rankers, not one ranker to pair or predict."""
    return {s for r in interleaved for s in r.systems}


def ruled_out(model: str, ident: Identifiability | None) -> str | None:
    """Why the identifiability verdict rules out predictions by click model ``model`` (None: it does not).

    Every model ``ubi predict`` offers separates position from relevance (its IPS propensities come from the PBM
    fit), so on a log where no (query, doc) pair was shown at two ranks its predictions rest on nothing."""
    if ident is None or ident.verdict != UNIDENTIFIED:
        return None
    if model != "auto" and not is_position_debiased(model):
        return None
    return (f"{model} is not identified on this log (no (query, doc) pair was shown at two ranks, so position "
            "cannot be told apart from relevance): no prediction rests on it")


def _unseen_evidence(con: duckdb.DuckDBPyConnection, file_runs: Sequence[tuple[str, Run]],
                     from_files: Mapping[str, SystemRun], labels: LabelSet,
                     sessions: SessionData | None) -> dict[str, UnseenEvidence]:
    """What values each run system's documents the log never showed, as ``ubi predict`` reads it: the human
    grades, the store's hit lists below the displayed depth, and the run's own scores."""
    if sessions is None:
        return {}
    grades = labels.qrels("human")
    returned = returned_not_shown(con, sessions.patterns.max_rank)
    return {name: run_evidence(grades, returned, run, from_files[name]) for name, run in file_runs
            if name in from_files}


def _predictions(
    runs: Mapping[str, SystemRun], from_files: Mapping[str, SystemRun], interleaved: Sequence[InterleavingResult],
    sessions: SessionData | None, swaps: SwapSessions | None, cfg: ReportConfig, step: Callable[[str], None],
    ident: Identifiability | None = None, evidence: Mapping[str, UnseenEvidence] | None = None,
) -> tuple[list[PredictedSystem], PredictedDifferences | None, list[str], int | None]:
    """The run systems' predicted online metrics, every pairable system's predicted CTR@k (ubi_pipeline.reports.predicted),
    notes, and the bootstrap replicates used (``cfg.predict_replicates``, else the budget's count). None of them
    when the identifiability verdict rules the click model out (:func:`ruled_out`)."""
    if sessions is None or sessions.patterns.n_sessions == 0:
        why = ["run systems: the store holds no logged sessions to predict their online metrics from"]
        return [], None, why if from_files else [], cfg.predict_replicates
    veto = ruled_out(cfg.predict_model, ident)
    if veto is not None:
        return [], None, [f"predictions: {veto}"], cfg.predict_replicates
    from ubi_pipeline.processors.counterfactual.predict import query_texts

    patterns = sessions.patterns
    mixed = _interleaved_systems(interleaved)
    in_pairs = {s for pair in pairs_of([n for n in runs if n not in mixed], cfg.baseline) for s in pair}
    pairable = {n: _rankings_by_text(r) for n, r in runs.items() if n in in_pairs}  # only what a table shows
    notes: list[str] = []
    replicates = cfg.predict_replicates
    if replicates is None:  # the default: as many as PREDICT_BUDGET_S of CPU allow, up to the default count
        replicates = DEFAULT_REPORT_REPLICATES
        first = next(iter(from_files.values()), None) or next(iter(runs.values()), None)
        fits = len(from_files) + (len(pairable) if len(pairable) >= 2 else 0)
        if first is not None and fits:
            started = time.process_time()
            try:
                predict(patterns, _rankings_by_text(first), model=cfg.predict_model, k=cfg.k, replicates=0,
                        seed=cfg.seed, swaps=swaps)
            except PredictionError:
                pass
            per_fit = time.process_time() - started
            replicates = budget_replicates(per_fit, fits)
            if replicates < DEFAULT_REPORT_REPLICATES:
                notes.append(f"predictions: {replicates} bootstrap replicates, not {DEFAULT_REPORT_REPLICATES}, to stay "
                             f"near {PREDICT_BUDGET_S:g} s of CPU (one fit took {per_fit:.1f} s, {fits} fits per "
                             "replicate); --predict-replicates N asks for N")
    predicted: list[PredictedSystem] = []
    if from_files:
        step("predicted online metrics of the run systems")
        predicted = predictions(patterns, {n: _rankings_by_text(r) for n, r in from_files.items()},
                                model=cfg.predict_model, k=cfg.k, replicates=replicates,
                                confidence=cfg.confidence, seed=cfg.seed, swaps=swaps, evidence=evidence)
    notes += [f"run {p.system}: no prediction ({p.error})" for p in predicted if p.prediction is None]
    pred_diff = None
    if len(pairable) >= 2:
        step("predicted differences for the joint view")
        shared = shared_rankings(pairable, {t for t in query_texts(patterns) if t})
        pred_diff = predicted_differences(patterns, shared, model=cfg.predict_model, method=JOINT_METHOD, k=cfg.k,
                                          replicates=replicates, confidence=cfg.confidence,
                                          seed=cfg.seed, swaps=swaps, evidence=evidence)
        if pred_diff is None:
            notes.append("joint view: no logged query is ranked by every system, so no predicted difference")
    return predicted, pred_diff, notes, replicates


def _joint(
    runs: Mapping[str, SystemRun], interleaved: Sequence[InterleavingResult], offline: Sequence[OfflineResult],
    sources: Sequence[str], rec: Any, online: Mapping[str, OnlineMetrics],
    pred_diff: PredictedDifferences | None, sessions: SessionData | None, cfg: ReportConfig,
    served: Mapping[str, Served] | None = None, shared_queries: Mapping[frozenset[str], int] | None = None,
    veto: str | None = None,
) -> tuple[list[PairView], list[str]]:
    """The joint view over the systems that are one ranker each (ubi_pipeline.reports.pairs), and a note when cut short."""
    mixed = _interleaved_systems(interleaved)
    systems = [s for s in runs if s not in mixed]
    total = len(systems) * (len(systems) - 1) // 2
    notes = [f"joint view: {MAX_PAIRS} of the {total} pairs of systems shown (the baseline's first)"] if total > MAX_PAIRS else []
    main = next((m for m in cfg.metric_names if m.startswith("ndcg")), cfg.metric_names[0])
    implicit = [s for s in sources if s.startswith("implicit:")]
    chosen = rec.source if rec is not None and getattr(rec, "source", None) in implicit else None
    implicit_source = chosen or (implicit[0] if implicit else None)

    def per_text(source: str | None) -> dict[str, tuple[list[str], np.ndarray]]:
        return {r.system: _per_text(r, main) for r in offline if r.source == source and r.n_queries > 0}

    why = ("no logged sessions to predict from" if sessions is None or sessions.patterns.n_sessions == 0
           else veto or "no logged query is ranked by both")
    pairs = joint_view(systems, baseline=cfg.baseline, metric=main, k=cfg.k, human=per_text("human"),
                       implicit_source=implicit_source, implicit=per_text(implicit_source),
                       predicted=pred_diff, predicted_missing=why, online=online, interleaving=interleaved,
                       has_human="human" in sources, n_boot=cfg.n_boot, seed=cfg.seed, served=served,
                       shared_queries=shared_queries)
    return pairs, notes


def _pair_contexts(pairs: Sequence[PairView], runs: Mapping[str, SystemRun],
                   human: Mapping[str, Mapping[str, int]], pred: PredictedDifferences | None,
                   k: int) -> dict[tuple[str, str], PairContext]:
    """Per pair: the queries both rank, their top-k (query, doc) pairs without a human grade there, and the larger
    share of the two top k on the model's prior (what ``ubi_pipeline.reports.verdict`` says would decide it)."""
    out = {}
    by_text = {name: _rankings_by_text(runs[name]) for name in {s for p in pairs for s in (p.reference, p.challenger)}
               if name in runs}
    for p in pairs:
        a, b = by_text.get(p.reference, {}), by_text.get(p.challenger, {})
        shared = set(a) & set(b)
        unjudged = sum(len((set(a[t][:k]) | set(b[t][:k])) - set(human.get(t, {}))) for t in shared)
        share = 0.0
        if pred is not None:
            share = max(pred.prior_share.get(p.reference, 0.0), pred.prior_share.get(p.challenger, 0.0))
        out[(p.reference, p.challenger)] = PairContext(len(shared), unjudged, share, k)
    return out


def build_report(
    con: duckdb.DuckDBPyConnection,
    labels: LabelSet | Callable[[], LabelSet],
    config: ReportConfig | None = None,
    *,
    thresholds: Sequence[Threshold] = (),
    propensity: dict[str, Any] | None = None,
    inputs: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    file_runs: Sequence[tuple[str, Run]] = (),
    warnings: Sequence[str] = (),
    sessions: SessionData | None = None,
    swaps: SwapSessions | None = None,
    queryset: Mapping[str, Collection[str]] | None = None,
) -> Report:
    """Build the joint report from a store connection and the labels (see the module docstring).

    ``file_runs`` are ``(system name, run)`` pairs evaluated beside the logged systems. ``warnings`` (data
    quality the caller found, such as ordinal bases) come first in :attr:`Report.warnings`, before events
    without a query record and bot-like clients.
    ``progress`` is called with the name of each step as it starts (the CLI shows it).
    ``sessions`` (``ubi_pipeline.processors.clicks.sessions.load_sessions`` with a ``holdout``) give the identifiability verdict
    and the held-out comparison behind the recommended source (``ubi_pipeline.reports.recommend``), and the logs that the
    run systems' online metrics and the joint view's predicted differences are predicted from
    (``ubi_pipeline.reports.predicted``); without them the report has none of these. ``swaps``: the log's randomised
    swap experiment, when it has one (IPS then takes its propensities from it). ``queryset``: normalised query
    text per query-set id, for run files keyed by those ids (``ubi report --queries``).

    ``labels`` may be a function that reads them: it is called once the steps that need the connection's
    search tables (systems, online metrics, interleaving, warnings) are done and those tables are dropped, so
    the labels and DuckDB's temp tables are never held at once (at 50M events about 1M labels beside a full
    pool); such labels are the report's own, and grades the identifiability verdict withholds are removed
    from them in place instead of from a copy.
    """
    step = progress or (lambda _name: None)
    cfg = config or ReportConfig()
    if cfg.k < 1:
        raise ReportError(f"k must be >= 1, got {cfg.k}")
    ident = assess(sessions.cells) if sessions is not None and len(sessions.cells.pair) else None
    early = None
    if callable(labels) and sessions is not None:
        # the recommendation's held-out fits, before the runs and the labels are held (they are the report's
        # heaviest Python step); the stored implicit sources are all it needs to know of the labels
        step("recommended source: held-out fits")
        stored = _stored_implicit_sources(con)
        early = held_out_selection([s for s in stored if cfg.sources is None or s in cfg.sources], sessions, ident)
    step("systems and logged rankings")
    # the searches stay in DuckDB (at 20M events 1.7M rows of 20-doc rankings, ~1.5 GB as Arrow): runs, counts
    # and classes are computed there, under the connection's memory limit
    n_searches = prepare_searches(con, split_keys=cfg.split_keys, class_key=cfg.class_key,
                                  impression_actions=cfg.impression_actions)
    if n_searches == 0 and not file_runs:
        drop_searches(con)
        raise ReportError("the store holds no query records, so no system to report on; ingest UBI queries first "
                          "(or give run files with --run)")
    logged = logged_runs_in(con, cfg.mode)
    counts = search_counts(con)
    class_of_text = classes_by_text(con) if n_searches else {}
    # every step that reads the search tables runs before the labels are read (none of them needs a label)
    step("online metrics")
    online = online_metrics(
        con, k=cfg.k, position_base=cfg.position_base, position_base_by_application=cfg.position_base_by_application,
        click_actions=cfg.click_actions, impression_actions=cfg.impression_actions,
        reformulation_window_s=cfg.reformulation_window_s, max_rank=cfg.max_rank, confidence=cfg.confidence,
        n_boot=cfg.n_boot, seed=cfg.seed, resample_limit=cfg.resample_limit,
        excluded=sessions.dropped if sessions is not None else None,
    )
    step("interleaving")
    interleaved, interleaving_notes = interleaving_results(con, cfg.click_actions, n_boot=cfg.n_boot,
                                                           confidence=cfg.confidence, seed=cfg.seed)
    store_warnings = [*_orphan_notes(con), *_bot_warnings(con, cfg.max_client_queries_per_minute,
                                                          filtered=sessions is not None)]
    served, shared_queries = _served(con) if n_searches else ({}, {})
    drop_searches(con)
    owned = callable(labels)
    if callable(labels):
        step("labels")
        labels = labels()
    withheld: dict[str, int] = {}
    if ident is not None:
        if owned:
            withheld = withhold_unidentified_in(labels, ident)
        else:
            kept, withheld = withhold_unidentified((lab for ls in labels.by_pair.values() for lab in ls), ident)
            if withheld:
                labels = LabelSet().add(kept)
    from_files = _file_systems(file_runs, logged, labels, class_of_text, queryset)
    # logged systems sorted by name, then run files in the order given: every table keeps this order
    runs = {**dict(sorted(logged.items())), **from_files}
    step("merged view of the labels")
    label_pairs, merge = merge_view(labels, cfg.precedence)
    step("offline metrics")
    sources = _evaluation_sources(labels, cfg.sources)
    qrels_by_source = {s: _qrels_for(labels, s, cfg.precedence) for s in sources}
    offline = [
        _offline(runs[system], source, qrels_by_source[source], cfg)
        for system in runs for source in sources
    ]
    cov = coverage({n: (r.run, r.query_of) for n, r in runs.items()}, qrels_by_source, cfg.k)
    step("agreement")
    grades_seen = [lab.grade for ls in labels.by_pair.values() for lab in ls if lab.grade is not None]
    n_grades = max([cfg.grade_max, *grades_seen]) + 1
    agree = dict(agreement_all(labels, n_grades=n_grades)) if "human" in sources else {}
    if cfg.sources is not None:
        agree = {s: a for s, a in agree.items() if s in sources}
    among = assessor_agreement(labels, n_grades=n_grades, n_boot=cfg.n_boot, confidence=cfg.confidence, seed=cfg.seed)

    comparisons: list[Comparison] = []
    if cfg.baseline is not None:
        step("comparison with the baseline")
        if cfg.baseline not in runs:
            raise ReportError(f"baseline {cfg.baseline!r} is not a system of these logs or run files; systems: "
                              f"{', '.join(runs)}")
        per_query: dict[str, dict[tuple[str, str], tuple[list[str], np.ndarray]]] = defaultdict(dict)
        for r in offline:
            for m in r.metrics:
                if not m.startswith("judged"):  # coverage, not quality: kept out of the Holm family
                    per_query[r.system][(r.source, m)] = _per_text(r, m)
        for system in runs:
            per_query.setdefault(system, {})
        comparisons = compare_systems(per_query, cfg.baseline, n_boot=cfg.n_boot, n_perm=cfg.n_perm, seed=cfg.seed)

    orderings = []
    # each order holds every system with that metric (a run file is in the offline order only); the rank
    # correlation rests on the systems in both, which needs a logged system at least. The offline values
    # are means over the queries every evaluated system shares, never over different query sets.
    if logged and len(runs) >= 2:
        main = next((m for m in cfg.metric_names if m.startswith("ndcg")), cfg.metric_names[0])
        for source in sources:
            off, n_shared, why = _shared_offline([r for r in offline if r.source == source], main)
            for name, higher in ONLINE_METRICS:
                if name not in ("ctr@k", "rr_first_click"):
                    continue
                key = f"ctr@{cfg.k}" if name == "ctr@k" else name
                on = {s: om.metrics[key].value for s, om in online.items()}
                o = ordering(off, on, offline_metric=f"{source}/{main}", online_metric=f"online/{key}",
                             online_higher_is_better=higher)
                orderings.append(replace(o, offline_queries=n_shared, offline_note=why))

    rec = None
    if sessions is not None:
        step("recommended source")
        rec = recommend((lab for ls in labels.by_pair.values() for lab in ls), sources, sessions, ident, agree,
                        selection=early)
    evidence = _unseen_evidence(con, file_runs, from_files, labels, sessions) if from_files else None
    predicted, pred_diff, pred_notes, replicates = _predictions(runs, from_files, interleaved, sessions, swaps, cfg,
                                                                step, ident, evidence)
    cfg = replace(cfg, predict_replicates=replicates)  # what the sections say they rest on
    step("joint view")
    pairs, pair_notes = _joint(runs, interleaved, offline, sources, rec, online, pred_diff, sessions, cfg, served,
                               shared_queries, ruled_out(cfg.predict_model, ident))
    id_notes = identifiability_notes(ident, sources, withheld) if ident is not None else []
    # against the logged systems that are one ranker each: an interleaved system is a mix of two (as in the pairs)
    mixed = _interleaved_systems(interleaved)
    single = {s: om for s, om in online.items() if s not in mixed}
    candidates = [f for ps in predicted if ps.prediction is not None
                  for f in candidate_findings(ps.system, ps.prediction, single, cfg.k)]
    contexts = _pair_contexts(pairs, runs, qrels_by_source.get("human", {}), pred_diff, cfg.k)
    veto = ruled_out(cfg.predict_model, ident) if sessions is not None else None
    rec_dict = rec.as_dict() if rec is not None else None
    verdict = decide(pairs, contexts, candidates, rec_dict,
                     [f"predictions of the run systems: {veto}; interleaving them or an A/B test would decide"]
                     if veto is not None and from_files else [])
    report = Report(
        created_at=datetime.now(UTC).replace(microsecond=0), config=cfg,
        systems=_summaries(counts, logged) + _run_summaries(from_files),
        sources=sources, label_counts=_label_counts(labels), offline=offline, coverage=cov, online=online,
        agreement=agree, comparisons=comparisons, orderings=orderings, propensity=propensity,
        label_pairs=label_pairs, merge=merge,
        notes=_run_notes(from_files, labels) + id_notes + interleaving_notes + pred_notes + pair_notes,
        inputs=dict(inputs or {}),
        warnings=[*warnings, *store_warnings],
        identifiability=ident.as_dict() if ident is not None else None,
        recommendation=rec_dict,
        interleaving=interleaved, predicted=predicted, predicted_differences=pred_diff, pairs=pairs, verdict=verdict,
        assessors=among,
    )
    if thresholds:
        with_interleaving = sorted({s for r in interleaved for s in (r.systems or ("(interleaving)",))})
        gates = check(_gate_thresholds(thresholds, sorted(logged), with_interleaving), report.gate_values())
        report.gates = [
            replace(g, reason=f"a run file has no online metrics ({NO_LOG})")
            if g.system in from_files and g.metric.startswith("online/") else g
            for g in gates
        ]
    return report
