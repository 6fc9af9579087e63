"""Judgments between files and the store: export stored labels, import a human qrels file.

Export (:func:`export_judgments`) writes the graded labels of one source of the store (``human``,
``reviewed``, one ``reviewed:<src>`` or ``implicit:<model>``, ``implicit`` when the store holds one model, or ``merged``, the precedence view of
:mod:`ubi_pipeline.processors.labels.merge`) in a judgment format of :mod:`ubi_pipeline.formats.qrels`:

- ``jsonl``: one query a line with its text; the stored ``query_id`` when the query has exactly one (else the
  text); ``assessor`` / ``rubric`` / ``judged_at`` when every human label of the query agrees on it (JSONL holds
  them per query; queries whose labels differ are counted in :attr:`ExportSummary.mixed_provenance`).
- ``trec``: ``query_id 0 doc_id grade`` with the query text as id, ``%`` and whitespace percent-escaped
  (``red%20shoes``), as ``ubi process --out x.trec`` writes them, so the import below reads the text back.
- ``workbench``: the Search Relevance Workbench judgment JSON, grades turned into ratings by a stated
  :class:`~ubi_pipeline.formats.qrels.RatingMap` (default ESCI: 0 -> "0.000", 1 -> "1.000", 2 -> "10.000", 3 -> "100.000").

The query text written is the wording the judgments were made on when the store kept it (a Workbench
file's query is its ``query_id``) and the normalised text otherwise.

Import (:func:`import_human`) validates a JSONL, TREC or Workbench file with :func:`ubi_pipeline.formats.qrels.load_qrels`
(nothing skipped or coerced), gives every query its text (the file's; else a query set mapping ids to
texts; else the id itself, percent-decoded for TREC), and stores the judgments in ``human_judgments`` as
source ``human`` with their provenance (assessor, date and rubric from the file, else from the command line,
and the file as origin), through ``ubi_pipeline.store.client.load_derived``: directly, or through the running
collector that holds the store.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from ubi_pipeline.formats.qrels import (
    ESCI_RATINGS,
    Qrels,
    QrelsError,
    RatingMap,
    format_qrels,
    load_qrels,
    load_queryset,
    workbench_safe,
)
from ubi_pipeline.processors.labels.implicit import query_from_trec_id, trec_query_id
from ubi_pipeline.processors.labels.merge import (
    AGGREGATE_RULE,
    DEFAULT_PRECEDENCE,
    KINDS,
    PERSON_KINDS,
    Label,
    LabelSet,
    label_kind,
    labels_from_store,
)
from ubi_pipeline.schemas.errors import StoreError, UbiError
from ubi_pipeline.schemas.judgments import model_source_problem
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.store.client import load_derived, reading
from ubi_pipeline.store.rows import HUMAN_JUDGMENT_SCHEMA, JUDGMENT_SCHEMA, utcnow

HUMAN_SOURCE = "human"


class JudgmentIOError(UbiError):
    """Judgments cannot be exported or imported as asked (unknown source, nothing to export)."""


def source_name(spec: str) -> str:
    """``human``, ``reviewed``, ``implicit``, ``merged`` or an exact source; a bare model name means
    ``implicit:<name>`` (``pbm`` -> ``implicit:pbm``)."""
    text = spec.strip()
    if not text:
        raise JudgmentIOError("--source is empty; give human, merged, implicit:<model> or reviewed:<source>")
    if text in (*KINDS, "merged") or ":" in text:
        return text
    return f"implicit:{text}"


# ------------------------------------------------------------------------------------------------ export


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote."""

    source: str
    format: str
    queries: int
    judgments: int
    chosen_by_source: dict[str, int]  # where the exported labels came from (several sources for merged)
    mixed_provenance: int  # JSONL: queries whose labels differ in assessor, rubric or date (left out)
    rating_map: str | None = None
    aggregated: int = 0  # pairs whose grade is the aggregate of several assessors' (merge.AGGREGATE_RULE)
    aggregate_rule: str = AGGREGATE_RULE

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _display_text(query: str, labels: Sequence[Label]) -> str:
    """The wording judged when kept (a stored query_id that normalises to the query), else the query."""
    wordings = Counter(lab.query_id for lab in labels if lab.query_id and normalize_query(lab.query_id) == query)
    return min(wordings, key=lambda w: (-wordings[w], w)) if wordings else query


def _meta(labels: Sequence[Label]) -> tuple[dict[str, Any], bool]:
    """Per-query provenance for JSONL when every human label agrees; (meta, whether some was left out)."""
    people = [lab for lab in labels if lab.kind in PERSON_KINDS]
    if not people:
        return {}, False
    meta: dict[str, Any] = {}
    mixed = False
    for key in ("assessor", "rubric", "judged_at"):
        values = {getattr(lab, key) for lab in people}
        if len(values) == 1:
            value = values.pop()
            if value not in (None, ""):
                meta[key] = value
        else:
            mixed = True
    return meta, mixed


def _one_model(labels: LabelSet) -> None:
    """``implicit`` names the store's one click model; with several it is ambiguous (:class:`JudgmentIOError`).

    A judgment file holds one grade per (query, doc), and models estimate the same pairs: taking, pair by pair,
    whichever model sorts first would give a file of no model at all, so the user names the model, or asks for
    that per-pair choice explicitly with ``merged`` and a precedence.
    """
    models = sorted({lab.source for labs in labels.by_pair.values() for lab in labs
                     if lab.grade is not None and label_kind(lab.source) == "implicit"})
    if len(models) > 1:
        names = [m.split(":", 1)[1] for m in models]
        raise JudgmentIOError(
            f"--source implicit is ambiguous: the store holds graded judgments of {len(models)} click models "
            f"({', '.join(models)}) and a judgment file holds one grade per (query, doc); name one "
            f"(--source {names[0]}), or choose per pair with --source merged --precedence {','.join(models)}")


def stored_qrels(
    con: duckdb.DuckDBPyConnection, source: str = HUMAN_SOURCE, *, precedence: Sequence[str] = DEFAULT_PRECEDENCE,
    trec_ids: bool = False, assessor: str | None = None,
) -> tuple[Qrels, dict[str, int], int]:
    """The graded labels of ``source`` in the store as :class:`Qrels`, the labels per source and the
    mixed-provenance queries (:func:`_stored_qrels`)."""
    qrels, by_source, mixed, _aggregated = _stored_qrels(con, source, precedence=precedence, trec_ids=trec_ids,
                                                         assessor=assessor)
    return qrels, by_source, mixed


def _stored_qrels(
    con: duckdb.DuckDBPyConnection, source: str, *, precedence: Sequence[str], trec_ids: bool, assessor: str | None,
) -> tuple[Qrels, dict[str, int], int, int]:
    """The graded labels of ``source`` in the store as :class:`Qrels` (ids: stored query_id or text, or the
    percent-escaped text with ``trec_ids``), with the count of labels per source and of mixed-provenance queries.

    A pair several assessors graded gets their aggregate (:func:`ubi_pipeline.processors.labels.merge.aggregate_grades`);
    with ``assessor``, person-made labels of other assessors are left out first (that one assessor's grades).
    """
    stored = labels_from_store(con)
    if assessor is not None:
        who = assessor.strip()
        stored = [lab for lab in stored if lab.kind not in PERSON_KINDS or (lab.assessor or "") == who]
    labels = LabelSet().add(stored)
    src = source_name(source)
    if src == "implicit":
        _one_model(labels)
    chosen = labels.choose(precedence if src == "merged" else (src,))
    if not chosen:
        present = labels.sources()
        ungraded = " (its rows have no grade: too little support; only graded rows are exported)" if src in present else ""
        raise JudgmentIOError(f"the store holds no graded judgment of source {src!r}{ungraded}; sources present: "
                              f"{', '.join(present) or 'none'}")
    by_query: dict[str, list[Label]] = defaultdict(list)
    for (query, _doc), lab in sorted(chosen.items()):
        by_query[query].append(lab)
    # a stored query_id names a query in JSONL only when it is that query's one id and no other query's
    ids_of = {q: {lab.query_id for lab in labs} for q, labs in by_query.items()}
    id_users = Counter(i for ids in ids_of.values() for i in ids if i)
    shown = {q: _display_text(q, labs) for q, labs in by_query.items()}
    all_texts = set(shown.values())  # distinct, since each normalises to its own query
    grades: dict[str, dict[str, int]] = {}
    texts: dict[str, str] = {}
    meta: dict[str, dict[str, Any]] = {}
    mixed = 0
    for query, labs in by_query.items():
        text = shown[query]
        only = next(iter(ids_of[query])) if len(ids_of[query]) == 1 else None
        if trec_ids:
            qid = trec_query_id(text)  # injective, so distinct texts stay distinct ids
        elif only and id_users[only] == 1 and (only == text or only not in all_texts):
            qid = only
        else:
            qid = text
        grades[qid] = {lab.doc_id: int(lab.grade) for lab in labs}  # type: ignore[arg-type]
        texts[qid] = text
        info, was_mixed = _meta(labs)
        mixed += was_mixed
        if info:
            meta[qid] = info
    by_source = Counter(lab.source for lab in chosen.values())
    order = {s: i for i, s in enumerate(labels.sources())}
    aggregated = sum(1 for lab in chosen.values() if lab.parameters and lab.parameters.get("aggregate"))
    return (Qrels(grades=grades, texts=texts, meta=meta, path=None, format=None),
            {s: by_source[s] for s in sorted(by_source, key=lambda s: order[s])}, mixed, aggregated)


def export_judgments(
    con: duckdb.DuckDBPyConnection,
    format: str,
    *,
    source: str = HUMAN_SOURCE,
    precedence: Sequence[str] = DEFAULT_PRECEDENCE,
    rating_map: RatingMap = ESCI_RATINGS,
    name: str = "Judgments",
    description: str | None = None,
    assessor: str | None = None,
) -> tuple[str, ExportSummary]:
    """The graded labels of ``source`` serialised as ``format`` (``jsonl``, ``trec`` or ``workbench``)."""
    src = source_name(source)
    qrels, by_source, mixed, aggregated = _stored_qrels(con, src, precedence=precedence, trec_ids=format == "trec",
                                                        assessor=assessor)
    if src not in (HUMAN_SOURCE, "merged"):
        # a JSONL line says whose grades it holds when they are not people's, so that a model's or a click
        # model's file cannot come back in as human grades unnoticed (import_human refuses it)
        for qid in qrels.grades:
            qrels.meta.setdefault(qid, {})["source"] = src
    # the Workbench refuses " \ < > in a description (ubi_pipeline.formats.qrels.workbench_text_problem): no ">" here
    what = (f"source {src}" + (f", precedence {' then '.join(precedence)}" if src == "merged" else "")
            + (f", assessor {assessor}" if assessor is not None else ""))
    body = format_qrels(qrels, format, rating_map=rating_map, name=name,
                        description=description or workbench_safe(f"Exported by ubi-pipeline from {what}"))
    summary = ExportSummary(src, format, len(qrels), qrels.n_judgments(), by_source,
                            mixed if format == "jsonl" else 0,
                            rating_map.describe() if format == "workbench" else None,
                            aggregated=aggregated)
    return body, summary


# ------------------------------------------------------------------------------------------------ import


@dataclass(frozen=True)
class ImportResult:
    """What an import read and stored."""

    path: str
    format: str
    queries: int
    judgments: int
    replaced: int  # stored human labels of the same (query, doc, assessor) that these judgments replaced
    removed: int  # with replace: stored human labels of the same assessors on other pairs that were deleted
    unmatched_queries: int | None  # imported query texts the logs never saw (None: the store has no log)
    rating_map: str | None
    table: pa.Table
    assessors: list[str] = field(default_factory=list)  # who judged ('' = unnamed)
    source: str = HUMAN_SOURCE  # human, or model:<name> (stored in the judgments table)
    other_assessors: int = 0  # stored labels of other assessors on the imported pairs, kept beside them

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "table"}


def _with_texts(qrels: Qrels, queries: Mapping[str, str] | None, queries_path: str | None) -> Qrels:
    """Every query gets a text: its own, else the query set's, else its id (percent-decoded in TREC)."""
    name = qrels.path or "<qrels>"
    texts = dict(qrels.texts)
    seen: dict[str, tuple[str, int | None]] = {}
    for query_id in qrels.grades:
        line = qrels.lines.get(query_id)
        if query_id not in texts:
            if queries is not None:
                if query_id not in queries:
                    raise QrelsError(name, line, f"query {query_id!r} is not in the query set {queries_path}; "
                                                 f"add it there (query_id and query text)")
                texts[query_id] = queries[query_id]
            elif qrels.format == "trec":
                try:
                    texts[query_id] = query_from_trec_id(query_id)
                except UnicodeDecodeError as exc:
                    raise QrelsError(name, line, f"query id {query_id!r} is not valid percent-escaped UTF-8; "
                                                 f"give --queries FILE to map ids to texts") from exc
            else:
                texts[query_id] = query_id
        key = normalize_query(texts[query_id])
        if not key:
            raise QrelsError(name, line, f"query {query_id!r} has an empty text; give it one (--queries FILE)")
        if key in seen:
            other, other_line = seen[key]
            where = f" on line {other_line}" if other_line is not None else ""
            raise QrelsError(name, line, f"query {query_id!r} has the text {key!r} of query {other!r}{where}; "
                                         f"judgments are joined by normalised text, so merge the two")
        seen[key] = (query_id, line)
    return replace(qrels, texts=texts)


def read_human_file(
    path: str | Path,
    *,
    format: str = "auto",
    rating_map: RatingMap = ESCI_RATINGS,
    assessor: str | None = None,
    rubric: str | None = None,
    queries: str | Path | None = None,
) -> tuple[Qrels, pa.Table]:
    """Validate a judgments file into ``human_judgments`` rows (source ``human``); the first problem raises."""
    qrels = load_qrels(path, format=format, rating_map=rating_map)
    id_texts = None
    if queries is not None:
        id_texts = {q.query_id: q.query for q in load_queryset(queries)}
    qrels = _with_texts(qrels, id_texts, None if queries is None else str(queries))
    origin = str(Path(path).resolve())  # the provenance must still name the file when read from elsewhere
    rows = [
        {
            "query_id": j.query_id, "query": j.query, "doc_id": j.doc_id, "grade": j.grade, "source": HUMAN_SOURCE,
            "assessor": j.assessor or (assessor.strip() if assessor and assessor.strip() else ""),
            "judged_at": j.judged_at, "rubric": j.rubric or rubric or None, "origin": origin,
        }
        for j in qrels.human_judgments(source=HUMAN_SOURCE)
    ]
    return qrels, pa.Table.from_pylist(rows, schema=HUMAN_JUDGMENT_SCHEMA)


def _stored_state(db: Path) -> tuple[set[tuple[str, str, str]], set[str] | None]:
    """Stored human (query, doc, assessor) keys and the normalised logged query texts (None: no query records)."""
    if not db.exists():
        return set(), None
    with reading(db) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        keys: set[tuple[str, str, str]] = set()
        if "human_judgments" in tables:
            keys = {(q, d, a) for q, d, a in con.execute(
                "SELECT query, doc_id, assessor FROM human_judgments WHERE source = ?", [HUMAN_SOURCE]).fetchall()}
        logged = None
        if "ubi_queries" in tables:
            raw = [r[0] for r in con.execute("SELECT DISTINCT user_query FROM ubi_queries").fetchall()]
            logged = {normalize_query(t) for t in raw if t} or None
    return keys, logged


def import_human(db: str | Path, path: str | Path, *, replace_all: bool = False, **read_options: Any) -> ImportResult:
    """Validate ``path`` with :func:`read_human_file` (``read_options``: its format, rating_map, assessor, rubric
    and queries) and store it in ``human_judgments`` (source ``human``), one row per (query, doc, assessor).

    A stored label of the same (query, doc) *and assessor* is replaced; other assessors' labels of the pair are
    kept beside it (counted in ``other_assessors``). With ``replace_all`` every other stored ``human`` label of
    the file's assessors goes too (one transaction), so the file becomes those assessors' whole human set;
    other assessors' labels stay. Works while a collector holds ``db``.
    """
    qrels, table = read_human_file(path, **read_options)
    for qid, info in qrels.meta.items():
        named = info.get("source")
        if named and named != HUMAN_SOURCE:
            hint = (f"import it with --source {named}" if named.startswith("model:") else
                    "these are not grades people gave blind (implicit ones come from `ubi process`, reviewed ones "
                    "from `ubi review import`)")
            raise JudgmentIOError(f"{path}:{qrels.lines.get(qid, '?')}: query {qid!r} names source {named!r}, "
                                  f"not human: {hint}")
    rating_map: RatingMap = read_options.get("rating_map", ESCI_RATINGS)
    stored, logged = _stored_state(Path(db))
    new = set(zip(table.column("query").to_pylist(), table.column("doc_id").to_pylist(),
                  table.column("assessor").to_pylist(), strict=True))
    replaced = len(new & stored)
    assessors = {a for _q, _d, a in new}
    removed = sum(1 for key in stored - new if key[2] in assessors) if replace_all else 0
    pairs = {(q, d) for q, d, _a in new}
    others = sum(1 for q, d, a in stored if (q, d) in pairs and a not in assessors)
    try:
        load_derived(db, "human_judgments", table, replace_source=HUMAN_SOURCE if replace_all else None)
    except duckdb.Error as exc:
        raise StoreError(f"{db}: could not store the judgments of {path}: {exc}") from exc
    unmatched = None
    if logged is not None:
        unmatched = len({q for q, _d, _a in new} - logged)
    return ImportResult(
        path=str(path), format=str(qrels.format), queries=len(qrels), judgments=table.num_rows, replaced=replaced,
        removed=removed, unmatched_queries=unmatched, assessors=sorted(assessors), other_assessors=others,
        rating_map=rating_map.describe() if qrels.format == "workbench" else None, table=table,
    )


def import_model(db: str | Path, path: str | Path, source: str, *, replace_all: bool = False,
                 **read_options: Any) -> ImportResult:
    """Validate ``path`` as :func:`read_human_file` does and store its grades as *model* judgments: rows of the
    ``judgments`` table with source ``model:<name>`` (never ``human_judgments``), so they are measured against
    held-out human grades like an implicit source and chosen only where a precedence names them.

    The file's provenance goes to ``parameters`` (``origin``, ``assessor`` when given, ``rubric``, ``imported``).
    A stored row of the same (query, doc, source) is replaced; with ``replace_all`` the source's other rows go
    too (one transaction).
    """
    problem = model_source_problem(source)
    if problem:
        raise JudgmentIOError(f"--source {source!r}: {problem} (model judgments are imported as model:<name>)")
    qrels, table = read_human_file(path, **read_options)
    rating_map: RatingMap = read_options.get("rating_map", ESCI_RATINGS)
    db_path = Path(db)
    stored: set[tuple[str, str]] = set()
    if db_path.exists():
        with reading(db_path) as con:
            if con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'judgments'"
                           ).fetchall()[0][0]:
                stored = {(q, d) for q, d in con.execute(
                    "SELECT query, doc_id FROM judgments WHERE source = ?", [source]).fetchall()}
    now = utcnow()
    rows = []
    for r in table.to_pylist():
        params = {"origin": r["origin"], "imported": True, "query_id": r["query_id"]}
        for key in ("assessor", "rubric"):
            if r[key]:
                params[key] = r[key]
        rows.append({"query": r["query"], "doc_id": r["doc_id"], "source": source, "model_version": source[6:],
                     "parameters": orjson.dumps(params).decode(), "score": float(r["grade"]), "grade": r["grade"],
                     "created_at": r["judged_at"] or now})
    model_table = pa.Table.from_pylist(rows, schema=JUDGMENT_SCHEMA)
    new = {(r["query"], r["doc_id"]) for r in rows}
    try:
        load_derived(db, "judgments", model_table, replace_source=source if replace_all else None)
    except duckdb.Error as exc:
        raise StoreError(f"{db}: could not store the model judgments of {path}: {exc}") from exc
    return ImportResult(
        path=str(path), format=str(qrels.format), queries=len(qrels), judgments=model_table.num_rows,
        replaced=len(new & stored), removed=len(stored - new) if replace_all else 0, unmatched_queries=None,
        rating_map=rating_map.describe() if qrels.format == "workbench" else None, table=model_table,
        source=source,
    )
