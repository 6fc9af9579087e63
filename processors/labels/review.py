"""The review round trip: candidate judgments out to assessors as CSV/JSONL, their grades back as human judgments.

Export writes, per query of a query set, the candidates of one implicit source with their evidence (score,
interval, support) and suggested grade, and empty ``grade``, ``assessor``, ``judged_at``, ``rubric`` and
``notes`` columns. A ``blind`` export leaves out the evidence, the suggested grade and the source, so assessors grade
from scratch.

Import reads the file back. Rows with an empty ``grade`` were not reviewed and are skipped (counted). A row
whose ``source`` names an implicit source becomes a human judgment with source ``reviewed:<that source>``
(e.g. ``reviewed:implicit:pbm``: a person checked a candidate); a row without a source (a blind export, or a
sheet the assessors filled in themselves) becomes source ``human``. Assessor and rubric come from the row when
filled in, else from the command line, so one sheet may hold several assessors' grades of one pair (one row
each; the same assessor twice on a pair is an error). The ``notes`` column (or ``note``) is stored as the
grade's ``note``. The judging date comes from the row's ``judged_at`` (or ``date``)
column when filled in (ISO 8601 date or date-time; an offset is converted, naive is UTC; stored as naive
UTC), else from ``--date``, else it is the import time.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from ubi_pipeline.formats.qrels import load_queryset
from ubi_pipeline.processors.labels.implicit import SOURCE_PREFIX, trec_query_id
from ubi_pipeline.schemas.errors import InputFileError, StoreError, UbiError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.schemas.ubi import parse_timestamp
from ubi_pipeline.store.client import load_derived
from ubi_pipeline.store.rows import HUMAN_JUDGMENT_SCHEMA, utcnow

REVIEW_COLUMNS = ("query_id", "query", "doc_id", "source", "score", "ci_low", "ci_high", "impressions", "clicks",
                  "sessions", "suggested_grade", "grade", "assessor", "judged_at", "rubric", "notes")
BLIND_COLUMNS = ("query_id", "query", "doc_id", "source", "grade", "assessor", "judged_at", "rubric", "notes")
#: longest note a grade keeps (the ``human_judgments.note`` column's limit)
NOTE_MAX = 2048
#: columns a reviewed file may give the judging date in (the first filled in wins)
DATE_COLUMNS = ("judged_at", "date")


class ReviewError(UbiError):
    """A review export cannot be made (no such source, no judgments)."""


def _file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    raise ReviewError(f"{path}: cannot tell the format from the extension; use .csv or .jsonl")


def read_query_set(path: Path | str) -> list[str]:
    """The normalised queries of a query set file (:func:`ubi_pipeline.formats.qrels.load_queryset`: JSONL, a
    Search Relevance Workbench query set, or plain text with one query a line), duplicates removed, order kept."""
    return list(dict.fromkeys(normalize_query(q.query) for q in load_queryset(path).queries))


def resolve_source(con: duckdb.DuckDBPyConnection, source: str | None) -> str:
    """The implicit source to export: as given (``pbm`` means ``implicit:pbm``), or the only one stored."""
    # candidates come from click models; a model judge's rows (model:<name>) are not candidates to review
    stored = [r[0] for r in con.execute(
        "SELECT DISTINCT source FROM judgments WHERE source LIKE 'implicit:%' ORDER BY 1").fetchall()]
    if source:
        full = source if source.startswith(SOURCE_PREFIX) else SOURCE_PREFIX + source
        if full not in stored:
            raise ReviewError(f"no judgments of source {full!r} in the store; stored: {', '.join(stored) or 'none'} "
                              "(run `ubi process --model ...` first)")
        return full
    if len(stored) == 1:
        return str(stored[0])
    if not stored:
        raise ReviewError("the store has no judgments; run `ubi process` first")
    raise ReviewError(f"several sources are stored ({', '.join(stored)}); choose one with --source")


def export_candidates(con: duckdb.DuckDBPyConnection, source: str, *, queries: Sequence[str] | None = None,
                      top: int | None = None, per_query: int | None = 20) -> tuple[list[dict[str, Any]], list[str]]:
    """Candidate rows for review, and the requested queries that have none.

    ``queries``: these normalised queries, in this order; else the ``top`` queries with the most sessions
    (the largest ``sessions`` count over their docs). Within a query: by score, highest first, then doc id;
    at most ``per_query`` docs (all when ``None``).
    """
    if queries is None:
        n = top if top is not None else 20
        queries = [r[0] for r in con.execute(
            "SELECT query FROM judgments WHERE source = ? GROUP BY query ORDER BY max(sessions) DESC, query LIMIT ?",
            [source, n]).fetchall()]
    con.register("_review_q", pa.table({"query": pa.array(list(queries), pa.string()),
                                        "ord": pa.array(range(len(queries)), pa.int64())}))
    try:
        rows = con.sql("""
            SELECT j.query, j.doc_id, j.source, j.score, j.ci_low, j.ci_high, j.impressions, j.clicks, j.sessions,
                   j.grade AS suggested_grade
            FROM judgments j JOIN _review_q q USING (query)
            WHERE j.source = $source
            QUALIFY $per IS NULL OR row_number() OVER (PARTITION BY j.query ORDER BY j.score DESC NULLS LAST, j.doc_id) <= $per
            ORDER BY q.ord, j.score DESC NULLS LAST, j.doc_id""",
            params={"source": source, "per": per_query}).to_arrow_table().to_pylist()
    finally:
        con.unregister("_review_q")
    found = {r["query"] for r in rows}
    for r in rows:
        r["query_id"] = trec_query_id(r["query"])
    return rows, [q for q in queries if q not in found]


def write_review(rows: Iterable[dict[str, Any]], path: Path | str, *, blind: bool = False) -> int:
    """Write review rows as CSV or JSONL (by extension) with empty grade/assessor/rubric/notes columns."""
    p = Path(path)
    fmt = _file_format(p)
    columns = BLIND_COLUMNS if blind else REVIEW_COLUMNS
    n = 0
    out_rows = []
    for r in rows:
        row = {c: r.get(c) for c in columns}
        for c in ("grade", "assessor", "judged_at", "rubric", "notes"):
            row[c] = None
        if blind:
            row["source"] = None
        out_rows.append(row)
        n += 1
    if fmt == "csv":
        with open(p, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(columns)
            for row in out_rows:
                w.writerow(["" if row[c] is None else row[c] for c in columns])
    else:
        with open(p, "wb") as f:
            for row in out_rows:
                f.write(orjson.dumps(row) + b"\n")
    return n


@dataclass(frozen=True)
class ReviewImport:
    """What a reviewed file held."""

    table: pa.Table  # human_judgments rows (schema HUMAN_JUDGMENT_SCHEMA)
    rows: int  # data rows in the file
    skipped_ungraded: int  # rows left without a grade
    reviewed: int  # rows with source reviewed:<implicit source>
    human: int  # rows with source human


def _records(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    if _file_format(path) == "csv":
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in ("query", "doc_id", "grade") if c not in header]
            if missing:
                raise InputFileError(str(path), 1, f"header lacks column(s) {', '.join(missing)}; "
                                     "expected the columns `ubi review export` writes")
            for row in reader:
                if None in row:
                    raise InputFileError(str(path), reader.line_num, "more fields than header columns")
                yield reader.line_num, row
        return
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                raise InputFileError(str(path), number, "blank line; expected one JSON object per line")
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise InputFileError(str(path), number, f"malformed JSON: {exc.msg} (column {exc.colno})") from exc
            if not isinstance(obj, dict):
                raise InputFileError(str(path), number, "expected a JSON object")
            yield number, obj


def _text(value: Any, path: Path, line: int, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputFileError(str(path), line, f"'{name}' must be a string, got {type(value).__name__}")
    return value.strip()


def parse_date(value: Any) -> datetime:
    """A judging date as naive UTC: ISO 8601 date (midnight UTC) or date-time (offset converted, naive = UTC)."""
    expected = f"expected an ISO 8601 date such as 2025-03-01 or 2025-03-01T14:30:00Z, got {str(value)[:60]!r}"
    if not isinstance(value, datetime | str):
        raise ValueError(expected)
    try:
        aware = parse_timestamp(value.strip() if isinstance(value, str) else value)
    except ValueError as exc:
        raise ValueError(expected) from exc
    return aware.astimezone(UTC).replace(tzinfo=None)


def _row_date(rec: dict[str, Any], path: Path, line: int) -> datetime | None:
    for name in DATE_COLUMNS:
        value = rec.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        try:
            return parse_date(value)
        except ValueError as exc:
            raise InputFileError(str(path), line, f"'{name}': {exc}") from exc
    return None


def read_review(path: Path | str, *, assessor: str, rubric: str | None = None, grade_max: int = 3,
                now: datetime | None = None, judged_at: datetime | None = None) -> ReviewImport:
    """Validate a reviewed file into ``human_judgments`` rows; the first bad row raises naming file and line.

    Judging date per row: its ``judged_at``/``date`` column, else ``judged_at`` (``--date``), else ``now``
    (default: the import time).
    """
    p = Path(path)
    if not p.exists():
        raise InputFileError(str(p), None, "no such file")
    if not assessor or not assessor.strip():
        raise ReviewError("--assessor is required: who graded these rows")
    judged = judged_at if judged_at is not None else (now or utcnow())
    out: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, str, str], int] = {}
    n = skipped = 0
    for line, rec in _records(p):
        n += 1
        raw_grade = rec.get("grade")
        if raw_grade is None or (isinstance(raw_grade, str) and not raw_grade.strip()):
            skipped += 1
            continue
        if isinstance(raw_grade, bool) or not (
            (isinstance(raw_grade, int)) or (isinstance(raw_grade, str) and re.fullmatch(r"\s*\d+\s*", raw_grade))
        ):
            raise InputFileError(str(p), line, f"grade {raw_grade!r} is not a non-negative integer")
        grade = int(raw_grade)
        if grade > grade_max:
            raise InputFileError(str(p), line, f"grade {grade} is above the top grade {grade_max} "
                                 "(set UBI_GRADE_MAX if your scale is larger)")
        query = normalize_query(_text(rec.get("query"), p, line, "query"))
        if not query:
            raise InputFileError(str(p), line, "'query' is empty")
        doc_id = _text(rec.get("doc_id"), p, line, "doc_id")
        if not doc_id:
            raise InputFileError(str(p), line, "'doc_id' is empty")
        src = _text(rec.get("source"), p, line, "source")
        if src and not src.startswith(SOURCE_PREFIX):
            raise InputFileError(str(p), line, f"source {src!r} is not an implicit source ('{SOURCE_PREFIX}<model>'); "
                                 "leave it empty for grades made from scratch")
        source = f"reviewed:{src}" if src else "human"
        who = _text(rec.get("assessor"), p, line, "assessor") or assessor.strip()
        key = (query, doc_id, source, who)
        if key in seen:
            raise InputFileError(str(p), line, f"({query!r}, {doc_id!r}) already graded by {who!r} on line {seen[key]}")
        seen[key] = line
        note = _text(rec.get("notes"), p, line, "notes") or _text(rec.get("note"), p, line, "note")
        if len(note) > NOTE_MAX:
            raise InputFileError(str(p), line, f"note of {len(note):,} characters; at most {NOTE_MAX:,} are kept")
        out.append({
            "query_id": trec_query_id(query), "query": query, "doc_id": doc_id, "grade": grade, "source": source,
            "assessor": who,
            "judged_at": _row_date(rec, p, line) or judged,
            "rubric": _text(rec.get("rubric"), p, line, "rubric") or rubric or None,
            "origin": str(p), "note": note or None,
        })
    table = pa.Table.from_pylist(out, schema=HUMAN_JUDGMENT_SCHEMA)
    reviewed = sum(1 for r in out if r["source"] != "human")
    return ReviewImport(table, n, skipped, reviewed, len(out) - reviewed)


def import_review(db: Path | str, path: Path | str, *, assessor: str, rubric: str | None = None,
                  judged_at: datetime | None = None, settings: Settings | None = None) -> ReviewImport:
    """Validate a reviewed file and load it into ``human_judgments``, one row per (query, doc, source, assessor):
    re-importing replaces the same assessor's rows and never another's."""
    settings = settings or Settings()
    result = read_review(path, assessor=assessor, rubric=rubric, grade_max=settings.grade_max, judged_at=judged_at)
    if result.table.num_rows:
        try:
            load_derived(db, "human_judgments", result.table)
        except duckdb.Error as exc:
            raise StoreError(f"{db}: could not store the reviewed judgments: {exc}") from exc
    return result
