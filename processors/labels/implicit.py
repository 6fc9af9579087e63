"""Candidate judgments: a click model's relevance estimates as graded rows with their evidence.

One row per (normalised query, doc): ``source`` ``implicit:<model>``, model version and parameters, score,
interval, support (displayed impressions, clicks, sessions; and, in ``parameters.observations``, the
model's own observations of the pair) and a grade on the human scale, or none.

The grading rule (:func:`eligible`): a pair gets a grade only when **all** hold

* it has an interval (a pair never observed under the model scores the model's prior and has none), and the
  interval is at most ``max_ci_width`` wide;
* the model observed it at least ``min_support`` times, counted the model's way
  (:attr:`RelevanceEstimate.observations`): for cascade, DCM and SDBN the impressions the model counts as
  examined (at or above the first / last click; every rank of a session without clicks), for DBN, PBM and
  UBM the expected number of examinations, for CTR and COEC every impression. A result displayed 70 times but always below the last click was never observed by DCM
  and gets no grade, whatever its prior score.

``max_ci_width`` is stated on the attractiveness scale and converted for CTR and COEC scores by the factor
their default thresholds use (``ubi_pipeline.processors.labels.grades.scale_factor``), so one setting means the same for every
model.

Grades come from :func:`ubi_pipeline.processors.labels.grades.default_mapping`, or, with human grades, from thresholds fitted on
the pairs of the calibration split (:func:`ubi_pipeline.processors.labels.grades.in_calibration_split`) and measured on the
others. Each row's ``parameters`` (as read back: ``ubi_pipeline.store.judgment_params`` merges the run-wide part, stored once
in ``judgment_runs``, with the row's own keys) records the mapping and, for pairs that have a human grade, which split
the pair fell in (``"calibration_split": "fit"`` or ``"holdout"``): reports measuring agreement must use
only the ``holdout`` pairs (or pairs absent from the qrels used).

Files: JSONL (one :class:`ubi_pipeline.schemas.judgments.Judgment` a line) and TREC qrels of the graded rows
(``query_id 0 doc_id grade``). A TREC query id is the normalised query text with ``%`` and whitespace
percent-escaped (``printer%20toner``): :func:`trec_query_id` and :func:`query_from_trec_id` invert each
other, so the file round-trips and needs no side table; doc ids are escaped the same way.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

from ubi_pipeline.formats.qrels import load_qrels
from ubi_pipeline.processors.click_models.base import ClickModel, RelevanceEstimate
from ubi_pipeline.processors.click_models.selection import (
    CHOOSABLE,
    DEFAULT_HOLDOUT,
    Selection,
    select,
)
from ubi_pipeline.processors.clicks.identifiability import (
    IDENTIFIED,
    Identifiability,
    assess,
    is_position_debiased,
)
from ubi_pipeline.processors.clicks.sessions import SessionData, applications, read_sessions
from ubi_pipeline.processors.clicks.stats import (
    ClickCells,
    SessionPatterns,
    SystemRankings,
    cells_from_sessions,
)
from ubi_pipeline.processors.labels.grades import (
    Agreement,
    GradeMapping,
    agreement,
    default_mapping,
    fit_thresholds,
    in_calibration_split,
    mapping_from_thresholds,
    scale_factor,
)
from ubi_pipeline.schemas.cli_names import AUTO, JUDGMENT_MODELS
from ubi_pipeline.schemas.errors import InputFileError, UbiError
from ubi_pipeline.schemas.judgments import Judgment, Qrel
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.store.client import load_derived_tables, reading
from ubi_pipeline.store.judgment_params import merged_from_arrow, run_id
from ubi_pipeline.store.rows import JUDGMENT_RUN_SCHEMA, JUDGMENT_SCHEMA, utcnow

SOURCE_PREFIX = "implicit:"
#: registry names shown to users under another name (the registry's ``dctr`` is "the CTR of a result")
_SOURCE_NAMES = {"dctr": "ctr"}
#: what each model's relevance score measures, for the default grade mapping (others: probability)
SCORE_KIND = {"ctr": "ctr", "coec": "ratio", "sdbn": "satisfaction", "dbn": "satisfaction"}



class JudgmentError(UbiError):
    """Judgments could not be made: unknown or unavailable model, no overlap to calibrate on, bad input."""


# ----------------------------------------------------------------------------- models


def resolve_model(name: str, prior: str | None = None) -> tuple[str, ClickModel]:
    """``(source name, new unfitted model)`` for a model name; errors say which models exist and which are missing.

    ``prior`` (``empirical``, ``pseudocount``, ``none``) goes to the model; ``None`` keeps its default.
    """
    key = name.strip().lower()
    registry = importlib.import_module("ubi_pipeline.processors.click_models.registry")
    if key in ("gctr", "rctr"):
        raise JudgmentError(f"model {name!r} cannot make judgments: it gives no per-pair relevance (one score "
                            f"for every pair, or per rank only); choose one of {', '.join(JUDGMENT_MODELS)}")
    if key not in JUDGMENT_MODELS and _SOURCE_NAMES.get(key) not in JUDGMENT_MODELS:
        raise JudgmentError(f"unknown model {name!r}; choose one of {', '.join(JUDGMENT_MODELS)}")
    try:
        model: ClickModel = registry.get_model(key) if prior is None else registry.get_model(key, prior=prior)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("ubi_pipeline.processors.click_models"):
            ready = [m for m in JUDGMENT_MODELS if model_available(m)]
            raise JudgmentError(f"click model {key!r} is not available in this build ({exc.name} is missing); "
                                f"available: {', '.join(ready) or 'none'}") from exc
        raise
    except (UbiError, TypeError) as exc:
        raise JudgmentError(str(exc)) from exc
    canonical = str(getattr(model, "name", key))
    return _SOURCE_NAMES.get(canonical, canonical), model


def model_available(name: str) -> bool:
    """Whether the module of a registered model can be imported."""
    registry = importlib.import_module("ubi_pipeline.processors.click_models.registry")
    try:
        registry.model_class(name)
    except (ModuleNotFoundError, AttributeError, UbiError):
        return False
    return True


def score_kind(source_name: str, model: object | None = None) -> str:
    """``probability``, ``ctr`` or ``ratio``: the model's own ``score_kind`` when it has one, else by name."""
    kind = getattr(model, "score_kind", None)
    return str(kind) if kind else SCORE_KIND.get(source_name, "probability")


# ----------------------------------------------------------------------------- grading


def eligible(estimate: RelevanceEstimate, *, min_support: float, max_ci_width: float | None,
             kind: str = "probability", grade_max: int = 3) -> np.ndarray:
    """Pairs that may get a grade: a finite score, an interval, and enough observations under the model.

    All three must hold: the interval exists (finite bounds) and is at most ``max_ci_width`` wide (on the
    attractiveness scale, converted by :func:`ubi_pipeline.processors.labels.grades.scale_factor` for ``kind``; ``None``: any
    width), and the model's own observations of the pair (:meth:`RelevanceEstimate.support`: examined
    impressions, not merely displayed ones) reach ``min_support``. A pair without an interval is never
    graded: its score is a prior or rests on nothing the model observed.
    """
    score = np.asarray(estimate.score, dtype=np.float64)
    lo = np.asarray(estimate.ci_low, dtype=np.float64)
    hi = np.asarray(estimate.ci_high, dtype=np.float64)
    ok = np.isfinite(score) & np.isfinite(lo) & np.isfinite(hi) & (estimate.support() >= min_support)
    if max_ci_width is not None:
        ok &= (hi - lo) <= max_ci_width * scale_factor(kind, grade_max)
    return np.asarray(ok, dtype=bool)


def check_limits(min_support: float, max_ci_width: float | None) -> tuple[int, float | None]:
    """Validated (min_support, max_ci_width); raises :class:`JudgmentError` saying what is allowed."""
    if isinstance(min_support, bool) or not float(min_support).is_integer() or min_support < 0:
        raise JudgmentError(f"minimum support must be a whole number of observations >= 0 (--min-support / "
                            f"UBI_MIN_SUPPORT), got {min_support!r}")
    if max_ci_width is not None and not (np.isfinite(max_ci_width) and max_ci_width > 0):
        raise JudgmentError(f"maximum interval width must be a number > 0 on the attractiveness scale (--max-ci-width"
                            f" / UBI_MAX_CI_WIDTH; 1 lets every interval through), got {max_ci_width!r}")
    return int(min_support), None if max_ci_width is None else float(max_ci_width)


@dataclass(frozen=True)
class CalibrationReport:
    """How the grade mapping was fitted on human grades, and how well it agrees on held-out pairs."""

    qrels: str
    fraction: float
    human_pairs: int  # graded pairs in the qrels file
    overlap: int  # of those, pairs with an implicit score
    overlap_eligible: int  # ... with enough support and a narrow enough interval (the ones used)
    mapping: GradeMapping
    default: GradeMapping
    fit: Agreement  # calibrated mapping on the calibration split (optimistic: it was fitted there)
    holdout: Agreement  # calibrated mapping on the held-out split: the number to quote
    holdout_default: Agreement  # default mapping on the same held-out pairs, for comparison

    def as_dict(self) -> dict[str, Any]:
        return {
            "qrels": self.qrels, "fraction": self.fraction, "human_pairs": self.human_pairs, "overlap": self.overlap,
            "overlap_eligible": self.overlap_eligible, "mapping": self.mapping.as_dict(),
            "default": self.default.as_dict(), "fit": self.fit.as_dict(), "holdout": self.holdout.as_dict(),
            "holdout_default": self.holdout_default.as_dict(),
        }


def calibrate(estimate: RelevanceEstimate, ok: np.ndarray, human: Mapping[tuple[str, str], int], *, kind: str,
              grade_max: int, fraction: float, qrels_name: str = "") -> tuple[GradeMapping, CalibrationReport, np.ndarray]:
    """Fit thresholds on the calibration split of the human-graded eligible pairs; measure on the rest.

    Returns the mapping, the report and, per pair, ``"fit"``, ``"holdout"`` or ``""`` (no human grade).
    """
    bad = [(q, d, g) for (q, d), g in human.items() if not 0 <= g <= grade_max]
    if bad:
        q, d, g = bad[0]
        raise JudgmentError(f"{qrels_name}: human grade {g} of ({q!r}, {d!r}) is outside 0..{grade_max}; "
                            "set UBI_GRADE_MAX to the top grade of your scale or map the grades first")
    queries, docs = estimate.pairs.queries, estimate.pairs.doc_ids
    grades = np.full(len(docs), -1, dtype=np.int64)
    for i, (q, d) in enumerate(zip(queries, docs, strict=True)):
        grades[i] = human.get((q, d), -1)
    has_human = grades >= 0
    used = has_human & ok
    split = np.full(len(docs), "", dtype=object)
    fit_idx = np.array([i for i in np.flatnonzero(used) if in_calibration_split(queries[i], docs[i], fraction)],
                       dtype=np.int64)
    hold_idx = np.setdiff1d(np.flatnonzero(used), fit_idx)
    split[fit_idx] = "fit"
    split[hold_idx] = "holdout"
    if len(fit_idx) < 2:
        raise JudgmentError(
            f"{qrels_name}: only {len(fit_idx)} human-graded pair(s) fall in the calibration split "
            f"({int(has_human.sum())} of {len(human)} human pairs have an implicit score, {int(used.sum())} with "
            "enough support); calibration needs at least 2. Check that the qrels use the same query text "
            "(normalised) and doc ids, lower --min-support, or raise UBI_CALIBRATION_FRACTION.")
    score = np.asarray(estimate.score, dtype=np.float64)
    thresholds = fit_thresholds(score[fit_idx], grades[fit_idx], grade_max)
    mapping = mapping_from_thresholds(kind, thresholds, method="quantile+qwk")
    default = default_mapping(kind, grade_max)
    report = CalibrationReport(
        qrels=qrels_name, fraction=fraction, human_pairs=len(human), overlap=int(has_human.sum()),
        overlap_eligible=int(used.sum()), mapping=mapping, default=default,
        fit=agreement(score[fit_idx], grades[fit_idx], mapping),
        holdout=agreement(score[hold_idx], grades[hold_idx], mapping),
        holdout_default=agreement(score[hold_idx], grades[hold_idx], default),
    )
    return mapping, report, split


# ----------------------------------------------------------------------------- rows


def _json_number(x: float) -> str:
    if not np.isfinite(x):
        return "null"
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _nan_to_null(a: np.ndarray) -> pa.Array:
    a = np.asarray(a, dtype=np.float64)
    return pa.array(a, pa.float64(), mask=~np.isfinite(a))


class JudgmentRows(NamedTuple):
    """What one estimate stores: its ``judgments`` rows and the ``judgment_runs`` row they refer to."""

    rows: pa.Table  # schema JUDGMENT_SCHEMA, one per pair, sorted by pair
    runs: pa.Table  # schema JUDGMENT_RUN_SCHEMA, one row


def build_judgments(estimate: RelevanceEstimate, *, source: str, model_version: str | None, mapping: GradeMapping,
                    ok: np.ndarray, parameters: dict[str, Any] | None = None, split: np.ndarray | None = None,
                    created_at: datetime | None = None) -> JudgmentRows:
    """The ``judgments`` rows of one estimate, one per pair, sorted by pair, and the run row they share.

    The run-wide parameters (the model's, the grade mapping, ``parameters``) are one ``judgment_runs`` row;
    each pair's own row keeps ``calibration_split`` (when it has one) and ``observations`` in its ``parameters``
    and the run's ``run_id`` (``ubi_pipeline.store.judgment_params``: read back, a row's dict is the run's keys then its own).
    """
    n = len(estimate.pairs)
    score = np.asarray(estimate.score, dtype=np.float64)
    grade = mapping.grade(score)
    graded = ok & (grade >= 0)
    base = {"model": estimate.parameters, "grade_mapping": mapping.as_dict(), **(parameters or {})}
    run_text = orjson.dumps(base, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()
    rid = run_id(run_text)
    if split is None:
        split = np.full(n, "", dtype=object)
    # three distinct heads but for the per-row support: splice the number in (in Arrow: each distinct support value
    # is formatted once, so no Python loop runs over the rows)
    splits = ("", "fit", "holdout")
    heads = pa.array(['{"observations":', '{"calibration_split":"fit","observations":',
                      '{"calibration_split":"holdout","observations":'], pa.string())
    split_code = np.zeros(n, dtype=np.int64)
    for code, s in enumerate(splits[1:], start=1):
        split_code[np.asarray(split, dtype=object) == s] = code
    obs = np.round(np.asarray(estimate.support(), dtype=np.float64), 3)
    values, which = np.unique(obs, return_inverse=True)
    numbers = pa.array([_json_number(v) for v in values], pa.string())
    params = pc.binary_join_element_wise(heads.take(pa.array(split_code)), numbers.take(pa.array(which.ravel())),
                                         "}", "")
    now = created_at or utcnow()
    rows = pa.table({
        "query": pa.array(estimate.pairs.queries, pa.string()),
        "doc_id": pa.array(estimate.pairs.doc_ids, pa.string()),
        "source": pa.array([source] * n, pa.string()),
        "model_version": pa.array([model_version] * n, pa.string()),
        "parameters": params,
        "score": _nan_to_null(score),
        "ci_low": _nan_to_null(estimate.ci_low),
        "ci_high": _nan_to_null(estimate.ci_high),
        "impressions": pa.array(np.asarray(estimate.impressions, dtype=np.int64)),
        "clicks": pa.array(np.asarray(estimate.clicks, dtype=np.int64)),
        "sessions": pa.array(np.asarray(estimate.sessions, dtype=np.int64)),
        "grade": pa.array(grade.astype(np.int32), pa.int32(), mask=~graded),
        "created_at": pa.array([now] * n, pa.timestamp("us")),
        "run_id": pa.array([rid] * n, pa.string()),
    }, schema=JUDGMENT_SCHEMA)
    runs = pa.table({"source": [source], "run_id": [rid], "parameters": [run_text],
                     "created_at": pa.array([now], pa.timestamp("us"))}, schema=JUDGMENT_RUN_SCHEMA)
    return JudgmentRows(rows, runs)


@dataclass(frozen=True)
class JudgmentRun:
    """One model's judgments with how they were made."""

    source: str  # implicit:<model>
    model: str
    kind: str
    table: pa.Table  # judgments rows (schema JUDGMENT_SCHEMA): each pair's own parameters and its run_id
    runs: pa.Table  # the judgment_runs rows they refer to (schema JUDGMENT_RUN_SCHEMA): the run-wide parameters
    mapping: GradeMapping
    min_support: int
    max_ci_width: float | None
    calibration: CalibrationReport | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    identifiability: Identifiability | None = None
    withheld_unidentified: int = 0  # pairs that would have been graded but for the identifiability verdict

    @property
    def graded(self) -> int:
        return int(self.table.column("grade").is_valid().to_numpy(zero_copy_only=False).sum())

    def judgments(self) -> Iterator[Judgment]:
        """The rows as :class:`Judgment` records (parameters merged: the run's, then the pair's own)."""
        yield from iter_judgments(self.table, self.runs)

    def summary(self) -> dict[str, Any]:
        grades = self.table.column("grade").drop_null().to_numpy()
        return {
            "source": self.source, "model": self.model, "score_kind": self.kind, "pairs": self.table.num_rows,
            "graded": self.graded, "grade_counts": {str(g): int(c) for g, c in
                                                    zip(*np.unique(grades, return_counts=True), strict=True)},
            "min_support": self.min_support, "max_ci_width": self.max_ci_width, "mapping": self.mapping.as_dict(),
            "calibration": self.calibration.as_dict() if self.calibration else None,
            "identifiability": self.identifiability.as_dict() if self.identifiability else None,
            "position_debiased": is_position_debiased(self.model),
            "withheld_unidentified": self.withheld_unidentified,
        }


def make_judgments(data: SessionData | SessionPatterns, model_name: str, settings: Settings | None = None, *,
                   human: Mapping[tuple[str, str], int] | None = None, qrels_name: str = "",
                   min_support: int | None = None, max_ci_width: float | None = None,
                   created_at: datetime | None = None, source: str | None = None,
                   extra_parameters: dict[str, Any] | None = None, prior: str | None = None,
                   systems: SystemRankings | None = None) -> JudgmentRun:
    """Fit ``model_name`` on the sessions, grade its relevance estimates, and calibrate when ``human`` is given.

    ``source`` overrides the stored source (default ``implicit:<model>``); ``extra_parameters`` are added to
    every row's parameters (``--model auto`` records its selection there); ``prior`` chooses the click model's
    prior (default: the model's own, the empirical one); ``systems`` (which system showed which ranking,
    ``ubi_pipeline.processors.clicks.system_rankings``) goes to the models whose prior takes it (PBM, UBM).
    """
    settings = settings or Settings()
    patterns = data.patterns if isinstance(data, SessionData) else data
    support, width = check_limits(settings.min_support if min_support is None else min_support,
                                  settings.max_ci_width if max_ci_width is None else max_ci_width)
    source_name, model = resolve_model(model_name, prior)
    model.fit(patterns, systems)
    estimate = model.relevance()
    kind = score_kind(source_name, model)
    ok = eligible(estimate, min_support=support, max_ci_width=width, kind=kind, grade_max=settings.grade_max)
    cells = data.cells if isinstance(data, SessionData) else cells_from_sessions(patterns)
    ident, ok, withheld = identifiable_only(source_name, cells, ok)
    report = None
    split = None
    if human is not None:
        mapping, report, split = calibrate(estimate, ok, human, kind=kind, grade_max=settings.grade_max,
                                           fraction=settings.calibration_fraction, qrels_name=qrels_name)
    else:
        mapping = default_mapping(kind, settings.grade_max)
    params = {"min_support": support, "max_ci_width": width, "max_rank": patterns.max_rank,
              "identifiability": identifiability_parameters(ident, source_name), **(extra_parameters or {})}
    source = source or SOURCE_PREFIX + source_name
    built = build_judgments(estimate, source=source, model_version=str(getattr(model, "version", "")) or None,
                            mapping=mapping, ok=ok, parameters=params, split=split, created_at=created_at)
    return JudgmentRun(source, source_name, kind, built.rows, built.runs, mapping, support, width, report, params,
                       ident, withheld)


def identifiable_only(source_name: str, cells: ClickCells, ok: np.ndarray) -> tuple[Identifiability, np.ndarray, int]:
    """The log's identifiability verdict, and ``ok`` without the pairs a position-debiased source may not grade.

    Raw CTR is kept as it is; a position-debiased source (``ubi_pipeline.processors.clicks.identifiability.POSITION_DEBIASED``)
    grades only pairs shown at a rank linked to rank 1 (none when the log is ``unidentified``). Returns the
    verdict, the new mask and how many pairs it withheld.
    """
    ident = assess(cells)
    if not is_position_debiased(source_name) or ident.verdict == IDENTIFIED:
        return ident, ok, 0
    keep = ok & ident.gradable(cells)
    return ident, keep, int(ok.sum() - keep.sum())


def identifiability_parameters(ident: Identifiability, source_name: str) -> dict[str, Any]:
    """What each judgment row records about the verdict (the full evidence is in the run summary)."""
    out: dict[str, Any] = {"verdict": ident.verdict, "pairs_at_several_ranks": ident.pairs_at_several_ranks,
                           "linked_ranks": list(ident.linked_ranks), "unlinked_ranks": list(ident.unlinked_ranks),
                           "position_debiased": is_position_debiased(source_name)}
    if out["position_debiased"] and ident.verdict != IDENTIFIED:
        out["note"] = ("position and relevance cannot be separated in this log" if ident.verdict != "partial" else
                       f"position and relevance are separable only at ranks {list(ident.linked_ranks)}") + \
                      "; pairs outside them get no grade from this source"
    return out


# ----------------------------------------------------------------------------- storage


def store_judgments(db: Path | str, table: pa.Table, source: str, *, runs: pa.Table,
                    settings: Settings | None = None) -> tuple[int, bool]:
    """Replace the stored rows of ``source`` with ``table`` and the ``runs`` they refer to; returns (rows written,
    stale rows removed).

    One transaction when the file is free, else through the running collector that holds it, runs first
    (``ubi_pipeline.store.client.load_derived_tables``): rows of pairs absent from this run go, and so do runs of the source
    no row refers to any more.
    """
    counts = load_derived_tables(db, [("judgment_runs", runs, None), ("judgments", table, source)], settings)
    return counts[1], True


@dataclass(frozen=True)
class ProcessResult:
    """What :func:`process` did: the sessions it fitted on, the judgments, where they went."""

    data: SessionData
    run: JudgmentRun
    stored: int | None  # rows stored (None: not stored)
    stale_rows_removed: bool | None  # False when a running collector could only insert or replace
    out: Path | None
    out_format: str | None
    rows_written: int | None
    selections: tuple[Selection, ...] = ()  # --model auto: one per application

    def summary(self) -> dict[str, Any]:
        return {
            **self.run.summary(), "selections": [s.as_dict() for s in self.selections], "stored": self.stored, "stale_rows_removed": self.stale_rows_removed,
            "out": str(self.out) if self.out else None, "out_format": self.out_format,
            "rows_written": self.rows_written, "sessions": self.data.filters.as_dict(),
            "quality": self.data.quality.as_dict(),
        }


def process(db: Path | str, model_name: str, settings: Settings | None = None, *, calibrate_with: Path | None = None,
            store: bool = True, out: Path | None = None, out_format: str | None = None,
            min_support: int | None = None, max_ci_width: float | None = None,
            max_rank: int | None = None, progress: Callable[[str], None] | None = None,
            prior: str | None = None, sessions: Callable[[], SessionData] | None = None) -> ProcessResult:
    """The ``ubi process`` stage: sessions from the store, one model's judgments, stored and/or written.

    ``out_format`` is ``jsonl`` or ``trec`` (default: ``trec`` for .trec/.qrels/.txt files, else ``jsonl``);
    ``progress`` is told what each step is doing; ``prior`` is the click model's prior (default: empirical). ``sessions``
    builds the session statistics another way (``ubi_pipeline.processors.clicks.spark_sessions`` on a Parquet folder); by default
    they are read from ``db`` with DuckDB.
    """
    settings = settings or Settings()
    say = progress or (lambda _: None)
    if out_format is not None and out is None:
        raise JudgmentError(f"--format {out_format} says how to write the --out file, but no --out FILE was given")
    if out_format is not None and out_format not in ("jsonl", "trec"):
        raise JudgmentError(f"unknown output format {out_format!r}; expected jsonl or trec")
    check_limits(settings.min_support if min_support is None else min_support,
                 settings.max_ci_width if max_ci_width is None else max_ci_width)
    auto = model_name.strip().lower() == AUTO
    # fail on a bad name or prior before reading the store (auto: any model checks the prior)
    resolve_model("pbm" if auto else model_name, prior)
    human = load_human_grades(calibrate_with) if calibrate_with else None
    say(f"building sessions from {db}")
    selections: list[Selection] = []
    if auto and sessions is not None:
        raise JudgmentError("--model auto fits per application from the DuckDB reader; it does not run on "
                            "sessions built elsewhere (--engine spark): name a model")
    if auto:
        data, run, selections = auto_judgments(db, settings, human=human, qrels_name=str(calibrate_with or ""),
                                               min_support=min_support, max_ci_width=max_ci_width,
                                               max_rank=max_rank, progress=say, prior=prior)
    else:
        # the systems that showed each ranking, for the PBM/UBM prior, from the same session build (one read of
        # ubi_queries); sessions built elsewhere (Spark) come without them and the prior says so in its parameters
        # ("system_features": "not given ...")
        wants = resolve_model(model_name, prior)[1].uses_systems
        data = sessions() if sessions is not None else read_sessions(db, settings, max_rank=max_rank, systems=wants)
        systems = data.systems if sessions is None and wants else None
        say(f"fitting {model_name} on {data.filters.sessions:,} sessions ({data.patterns.docs.shape[0]:,} patterns)")
        run = make_judgments(data, model_name, settings, human=human, qrels_name=str(calibrate_with or ""),
                             min_support=min_support, max_ci_width=max_ci_width, prior=prior, systems=systems)
    stored = replaced = None
    if store:
        say(f"storing {run.table.num_rows:,} judgments")
        stored, replaced = store_judgments(db, run.table, run.source, runs=run.runs, settings=settings)
    fmt = written = None
    if out is not None:
        say(f"writing {out}")
        fmt = out_format or ("trec" if Path(out).suffix.lower() in (".trec", ".qrels", ".txt") else "jsonl")
        if fmt not in ("jsonl", "trec"):
            raise JudgmentError(f"unknown output format {fmt!r}; expected jsonl or trec")
        written = write_trec(run.table, out) if fmt == "trec" else write_jsonl(run.table, out, run.runs)
    return ProcessResult(data, run, stored, replaced, Path(out) if out else None, fmt, written, tuple(selections))


def auto_judgments(db: Path | str, settings: Settings, *, human: Mapping[tuple[str, str], int] | None = None,
                   qrels_name: str = "", min_support: int | None = None, max_ci_width: float | None = None,
                   max_rank: int | None = None, holdout: float | None = None,
                   progress: Callable[[str], None] | None = None,
                   prior: str | None = None) -> tuple[SessionData, JudgmentRun, list[Selection]]:
    """``--model auto``: per application, choose a model by held-out conditional perplexity, then judge with it.

    Each application's searches are split by query_id hash (``ubi_pipeline.processors.click_models.selection``); every judgment model
    is fitted on the training part and scored on the held-out part; the winner is refitted on all of that
    application's searches and its rows (source ``implicit:auto``) record the choice and every model's
    figures in ``parameters.selection``. A (query, doc) pair seen in several applications keeps the row of
    the application that displayed it most. Returns the whole log's sessions (for the summary), the run and
    the selections.
    """
    say = progress or (lambda _m: None)
    fraction = DEFAULT_HOLDOUT if holdout is None else holdout
    with reading(db) as con:
        apps = applications(con)
    # which system showed which ranking comes with each session build (ubi_pipeline.processors.clicks.system_rankings)
    whole = read_sessions(db, settings, max_rank=max_rank, holdout=fraction, systems=len(apps) <= 1)
    per_app: list[tuple[str | None, SessionData]] = []
    if len(apps) <= 1:
        per_app.append((apps[0] if apps else None, whole))
    else:
        for app in apps:
            say(f"building sessions of application {app or '(none)'}")
            part = read_sessions(db, settings, max_rank=max_rank, holdout=fraction, application=app, systems=True)
            if part.patterns.n_sessions:
                per_app.append((app, part))
    runs: list[JudgmentRun] = []
    selections: list[Selection] = []
    for app, data in per_app:
        train, test = data.split()
        ident = assess(data.cells)
        options = {m: {"prior": prior} for m in CHOOSABLE} if prior is not None else None
        # every search's rankings and systems, the held-out ones' too: they are the prior's covariates, and the
        # refit on all searches below sees them all; only the held-out clicks are predicted (priors.prior_features)
        sel = select(train, test, models=CHOOSABLE, identifiability=ident, holdout=fraction, application=app,
                     progress=say, model_options=options, systems=data.systems)
        if sel.best is None:
            raise JudgmentError(f"--model auto: no model could be fitted on application {app!r}: "
                                + "; ".join(f"{s.model}: {s.error}" for s in sel.scores if s.error))
        selections.append(sel)
        say(f"{app or 'log'}: {sel.why()}; fitting {sel.best} on all {data.patterns.n_sessions:,} searches")
        runs.append(make_judgments(data, sel.best, settings, human=human, qrels_name=qrels_name,
                                   min_support=min_support, max_ci_width=max_ci_width, source=SOURCE_PREFIX + AUTO,
                                   extra_parameters={"selection": sel.parameters()}, prior=prior,
                                   systems=data.systems))
    if not runs:
        raise JudgmentError("--model auto: no application has sessions to fit on")
    first = runs[0]
    table = _one_row_per_pair(pa.concat_tables([r.table for r in runs])) if len(runs) > 1 else first.table
    run = JudgmentRun(SOURCE_PREFIX + AUTO, AUTO, first.kind, table, _runs_used(table, [r.runs for r in runs]),
                      first.mapping, first.min_support,
                      first.max_ci_width, first.calibration if len(runs) == 1 else None,
                      {**first.parameters, "selections": [s.as_dict() for s in selections]},
                      first.identifiability if len(runs) == 1 else None,
                      sum(r.withheld_unidentified for r in runs))
    return whole, run, selections


def _runs_used(table: pa.Table, runs: list[pa.Table]) -> pa.Table:
    """The run rows ``table``'s rows refer to, each once (two applications' runs may be the same document)."""
    used = set(table.column("run_id").unique().to_pylist())
    every = pa.concat_tables(runs)
    seen: set[str] = set()
    keep = []
    for i, rid in enumerate(every.column("run_id").to_pylist()):
        if rid in used and rid not in seen:
            seen.add(rid)
            keep.append(i)
    return every.take(pa.array(keep, pa.int64()))


def _one_row_per_pair(table: pa.Table) -> pa.Table:
    """Keep, per (query, doc), the row with the most impressions (ties: the first), sorted by (query, doc)."""
    keys = list(zip(table.column("query").to_pylist(), table.column("doc_id").to_pylist(), strict=True))
    imps = table.column("impressions").to_pylist()
    best: dict[tuple[str, str], int] = {}
    for i, key in enumerate(keys):
        j = best.get(key)
        if j is None or imps[i] > imps[j]:
            best[key] = i
    order = [best[k] for k in sorted(best)]
    return table.take(pa.array(order, pa.int64()))


# ----------------------------------------------------------------------------- files

_ESCAPE = re.compile(r"[%\s]")


def trec_query_id(text: str) -> str:
    """A whitespace-free id for a query text (or doc id): ``%`` and whitespace percent-escaped (UTF-8)."""
    if not text:
        raise JudgmentError("cannot write an empty query or doc id to TREC qrels")
    return _ESCAPE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), text)


def query_from_trec_id(query_id: str) -> str:
    """Inverse of :func:`trec_query_id`."""
    return unquote(query_id, errors="strict")


def iter_judgments(table: pa.Table, runs: pa.Table | None = None) -> Iterator[Judgment]:
    """The rows of an in-memory ``judgments`` table as :class:`Judgment` records, parameters merged with
    ``runs`` (``ubi_pipeline.store.judgment_params``; rows without a ``run_id`` carry their whole parameters)."""
    params = merged_from_arrow(table, runs)
    for batch in table.drop_columns(["run_id"] if "run_id" in table.column_names else []).to_batches(10_000):
        for row in batch.to_pylist():
            row["parameters"] = next(params) or {}
            yield Judgment(**row)


def write_jsonl(table: pa.Table, path: Path | str, runs: pa.Table | None = None) -> int:
    """One :class:`Judgment` per line, in table order (parameters merged with ``runs``); returns the number of lines."""
    n = 0
    with open(path, "wb") as f:
        for j in iter_judgments(table, runs):
            f.write(j.model_dump_json().encode() + b"\n")
            n += 1
    return n


def read_jsonl(path: Path | str) -> list[Judgment]:
    """Judgments written by :func:`write_jsonl`; any bad line raises ``InputFileError`` naming the line."""
    out: list[Judgment] = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                raise InputFileError(str(path), number, "blank line; expected one judgment (JSON object) per line")
            try:
                out.append(Judgment.model_validate_json(line))
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                loc = ".".join(str(p) for p in first["loc"])
                raise InputFileError(str(path), number, f"{loc}: {first['msg']}" if loc else first["msg"]) from exc
    return out


def write_trec(table: pa.Table, path: Path | str) -> int:
    """TREC qrels of the graded rows (``query_id 0 doc_id grade``), sorted; ids via :func:`trec_query_id`."""
    graded = table.filter(table.column("grade").is_valid())
    rows = sorted(
        (trec_query_id(q), trec_query_id(d), int(g))
        for q, d, g in zip(graded.column("query").to_pylist(), graded.column("doc_id").to_pylist(),
                           graded.column("grade").to_pylist(), strict=True)
    )
    with open(path, "w", encoding="utf-8") as f:
        for q, d, g in rows:
            f.write(f"{q} 0 {d} {g}\n")
    return len(rows)


def _decoded(path: str, line: int | None, trec_id: str) -> str:
    try:
        return query_from_trec_id(trec_id)
    except UnicodeDecodeError as exc:
        raise InputFileError(path, line, f"id {trec_id!r} is not valid percent-escaped UTF-8: {exc}") from exc


def read_trec(path: Path | str) -> list[Qrel]:
    """TREC qrels (``query_id iteration doc_id grade``) with ids decoded by :func:`query_from_trec_id`.

    Read by the one qrels reader (:func:`ubi_pipeline.formats.qrels.load_qrels`, strict: four fields, a non-negative
    integer grade, no (query, doc) twice, at least one judgment; errors name file and line); this only
    decodes the percent-escaped ids our own :func:`write_trec` writes.
    """
    qrels = load_qrels(path, format="trec")
    name = str(path)
    return [
        Qrel(_decoded(name, qrels.lines.get(q.query_id), q.query_id), _decoded(name, qrels.lines.get(q.query_id), q.doc_id),
             q.grade)
        for q in qrels.records()
    ]


def load_human_grades(path: Path | str) -> dict[tuple[str, str], int]:
    """Human grades keyed by (normalised query text, doc id), from any qrels file :func:`ubi_pipeline.formats.qrels.load_qrels`
    reads (JSONL, TREC or Workbench; ``docs/metrics.md``), validated there (errors name file and line).

    Query text: the file's ``query`` field when it has one, else the query id decoded with
    :func:`query_from_trec_id` (so our own TREC output round-trips); TREC doc ids are decoded the same way.
    """
    name = str(path)
    qrels = load_qrels(path)
    trec = qrels.format == "trec"
    out: dict[tuple[str, str], int] = {}
    for query_id, docs in qrels.grades.items():
        line = qrels.lines.get(query_id)
        text = qrels.texts.get(query_id)
        query = normalize_query(text if text is not None else _decoded(name, line, query_id))
        if not query:
            raise InputFileError(name, line, f"query {query_id!r} decodes to empty text; give a \"query\" field")
        for doc_id, grade in docs.items():
            doc = _decoded(name, line, doc_id) if trec else doc_id
            if out.get((query, doc), grade) != grade:
                raise InputFileError(name, line, f"doc {doc!r} of query {query!r} graded twice differently")
            out[(query, doc)] = grade
    return out
