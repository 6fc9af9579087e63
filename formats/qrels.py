"""Human judgments (qrels) and query sets: strict loaders and exporters for every format users bring.

Judgment formats (``docs/metrics.md``):

- ``jsonl``: one query a line, ``{"query_id": "q01", "query": "...", "relevant": {"doc": 2}}``; optional
  ``assessor``, ``judged_at`` and ``rubric`` keep the provenance of a human label; ``source`` names labels that
  are not people's (``model:gpt-4o-mini``, ``implicit:pbm``), as ``ubi judgments export`` writes them.
- ``trec``: TREC qrels, ``query_id iteration doc_id grade`` (whitespace separated; iteration is ignored).
- ``workbench``: the OpenSearch Search Relevance Workbench (SRW) judgment JSON,
  ``{"judgmentRatings": [{"query": ..., "ratings": [{"docId": ..., "rating": "1.000"}]}]}``. SRW has no query
  ids, so the query text is the query id. Ratings are strings on the producer's scale and become grades
  through a stated :class:`RatingMap`; the default, :data:`ESCI_RATINGS`, maps the ESCI labels
  0 -> 0 (irrelevant), 1 -> 1 (complement), 10 -> 2 (substitute), 100 -> 3 (exact).

Query-set formats: ``jsonl`` (``{"query_id": ..., "query": ..., "frequency": n}``) and the SRW query set
(``{"name", "description", "sampling", "querySetQueries": [{"queryText": ...}]}``).

Every problem is a :class:`QrelsError` naming the file and the line: a malformed judgment must never
quietly change a score, so nothing is skipped, coerced or de-duplicated behind the user's back.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from json import decoder as json_decoder
from json import scanner as json_scanner
from pathlib import Path
from typing import Any, Literal

from ubi_pipeline.schemas.cli_names import QRELS_FORMATS, QUERYSET_FORMATS
from ubi_pipeline.schemas.errors import InputFileError, UbiError
from ubi_pipeline.schemas.judgments import HumanJudgment, Qrel
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.schemas.ubi import parse_timestamp

QrelsFormat = Literal["jsonl", "trec", "workbench"]
QuerySetFormat = Literal["jsonl", "workbench"]

_JSONL_KEYS = frozenset({"query_id", "query", "relevant", "assessor", "judged_at", "rubric", "source"})
_WB_ENTRY_KEYS = frozenset({"query", "ratings"})
_WB_RATING_KEYS = frozenset({"docId", "rating"})
_QS_JSONL_KEYS = frozenset({"query_id", "query", "frequency", "reference_answer"})
_QS_WB_KEYS = frozenset({"queryText", "referenceAnswer"})
_DIGITS = re.compile(r"[0-9]+")


class QrelsError(InputFileError):
    """A judgments or query-set file is malformed; the message names the file, the line and the fix."""


# --------------------------------------------------------------------------------------------------------
# Rating scales
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RatingMap:
    """A stated mapping from a producer's rating strings (SRW ``"10.000"``) to our integer grades.

    ``table`` pairs exact rating values with grades; ``None`` means "ratings are whole numbers and are the
    grade" (``"2.000"`` -> 2). Ratings are compared as exact decimals, so ``"10"``, ``"10.0"`` and
    ``"10.000"`` are the same rating and ``"9.999"`` is not.
    """

    name: str
    table: tuple[tuple[Decimal, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.table is None:
            return
        seen: set[Decimal] = set()
        for rating, grade in self.table:
            if rating in seen:
                raise ValueError(f"rating map {self.name!r}: rating {rating} is mapped twice")
            if isinstance(grade, bool) or not isinstance(grade, int) or grade < 0:
                raise ValueError(f"rating map {self.name!r}: grade {grade!r} must be a non-negative integer")
            seen.add(rating)

    @classmethod
    def parse(cls, spec: str) -> RatingMap:
        """``esci``, ``integer``, or explicit pairs ``rating:grade,...`` such as ``0:0,1:1,10:2,100:3``."""
        text = spec.strip()
        if text.lower() in _NAMED_MAPS:
            return _NAMED_MAPS[text.lower()]
        pairs: list[tuple[Decimal, int]] = []
        for part in text.split(","):
            rating_text, sep, grade_text = part.partition(":")
            rating = _decimal(rating_text.strip()) if sep else None
            if rating is None or not _DIGITS.fullmatch(grade_text.strip()):
                raise ValueError(
                    f"rating map {spec!r}: expected 'esci', 'integer' or pairs like '0:0,1:1,10:2,100:3' "
                    f"(rating:grade, grade a non-negative integer); cannot read {part.strip()!r}"
                )
            pairs.append((rating, int(grade_text)))
        return cls(name=text, table=tuple(pairs))

    def describe(self) -> str:
        """Human-readable statement of the mapping, e.g. ``esci (0->0, 1->1, 10->2, 100->3)``."""
        if self.table is None:
            return f"{self.name} (whole-number ratings are the grade)"
        body = ", ".join(f"{_plain(r)}->{g}" for r, g in self.table)
        return f"{self.name} ({body})"

    def grade(self, rating: Any) -> int:
        """The grade of one rating; ``ValueError`` saying why when the rating is not on this scale."""
        value = _rating_value(rating)
        if self.table is None:
            if value != value.to_integral_value():
                raise ValueError(
                    f"rating {rating!r} is not a whole number; the 'integer' rating map needs whole numbers "
                    f"(give an explicit map such as --rating-map '0:0,0.5:1,1:2')"
                )
            return int(value)
        for known, grade in self.table:
            if value == known:
                return grade
        raise ValueError(f"rating {rating!r} is not in the rating map {self.describe()}; give a map that covers it")

    def rating(self, grade: int) -> str:
        """The SRW rating string written for ``grade`` (the smallest rating that maps to it), e.g. ``"10.000"``."""
        if self.table is None:
            return f"{grade}.000"
        candidates = sorted(r for r, g in self.table if g == grade)
        if not candidates:
            raise ValueError(f"grade {grade} has no rating in the rating map {self.describe()}")
        return f"{candidates[0]:.3f}"


ESCI_RATINGS = RatingMap(
    "esci", ((Decimal(0), 0), (Decimal(1), 1), (Decimal(10), 2), (Decimal(100), 3))
)  # ESCI labels as SRW stores them: irrelevant 0, complement 1, substitute 10, exact 100
INTEGER_RATINGS = RatingMap("integer", None)
_NAMED_MAPS = {"esci": ESCI_RATINGS, "integer": INTEGER_RATINGS}


def _decimal(text: str) -> Decimal | None:
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() and value >= 0 else None


def _rating_value(rating: Any) -> Decimal:
    if isinstance(rating, bool) or not isinstance(rating, str | int | float):
        raise ValueError(f"rating {rating!r} must be a string such as \"1.000\"")
    value = _decimal(str(rating).strip())
    if value is None:
        raise ValueError(f"rating {rating!r} is not a finite non-negative number")
    return value


def _plain(value: Decimal) -> str:
    return format(value.normalize(), "f")


# --------------------------------------------------------------------------------------------------------
# Loaded judgments
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Qrels(Mapping[str, dict[str, int]]):
    """Loaded judgments: a mapping ``query_id -> {doc_id: grade}`` that also keeps text and provenance.

    ``texts`` holds each query's text when the file has it; ``lines`` the line each query starts on (so
    later stages can still point at the file); ``meta`` per-query ``assessor`` / ``judged_at`` / ``rubric``.
    """

    grades: dict[str, dict[str, int]]
    texts: dict[str, str] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: str | None = None
    format: str | None = None

    def __getitem__(self, query_id: str) -> dict[str, int]:
        return self.grades[query_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.grades)

    def __len__(self) -> int:
        return len(self.grades)

    def records(self) -> Iterator[Qrel]:
        """Every judgment as a :class:`ubi_pipeline.schemas.judgments.Qrel`, in file order."""
        for query_id, docs in self.grades.items():
            for doc_id, grade in docs.items():
                yield Qrel(query_id, doc_id, grade)

    def n_judgments(self) -> int:
        """Number of (query, doc) judgments."""
        return sum(len(docs) for docs in self.grades.values())

    def labelled_negatives(self, rel_threshold: int = 1) -> list[str]:
        """Queries with no judgment at or above ``rel_threshold`` (their right answer is "nothing")."""
        return [q for q, docs in self.grades.items() if not any(g >= rel_threshold for g in docs.values())]

    def human_judgments(self, *, source: str = "human") -> list[HumanJudgment]:
        """The judgments as stored records, keyed by normalised query text (what the report joins on)."""
        out: list[HumanJudgment] = []
        for query_id, docs in self.grades.items():
            text = self.texts.get(query_id)
            if text is None:
                raise QrelsError(
                    self.path or "<qrels>",
                    self.lines.get(query_id),
                    f"query {query_id!r} has no query text; judgments are joined to the logs by text, so "
                    f"use the JSONL form with a \"query\" field or the Workbench form",
                )
            info = self.meta.get(query_id, {})
            for doc_id, grade in docs.items():
                out.append(
                    HumanJudgment(
                        query=normalize_query(text),
                        doc_id=doc_id,
                        grade=grade,
                        source=source,
                        query_id=query_id,
                        assessor=info.get("assessor"),
                        judged_at=info.get("judged_at"),
                        rubric=info.get("rubric"),
                        origin=self.path,
                    )
                )
        return out


# --------------------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------------------


def read_input_text(path: str | Path, error: type[InputFileError] = QrelsError) -> str:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError as exc:
        raise error(str(path), None, "no such file") from exc
    except IsADirectoryError as exc:
        raise error(str(path), None, "is a directory, expected a file") from exc
    except OSError as exc:
        raise error(str(path), None, f"cannot read: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(str(path), line, f"not valid UTF-8 (byte {exc.start}): save the file as UTF-8") from exc


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """Numbered lines; a final newline does not make an extra (blank) line, and ``\\r\\n`` is accepted."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    for number, line in enumerate(parts, 1):
        yield number, line[:-1] if line.endswith("\r") else line


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def loads_json_line(path: str, number: int, line: str, error: type[InputFileError] = QrelsError) -> Any:
    """Parse one JSONL line; blank lines, malformed JSON and repeated keys raise ``error`` at that line."""
    if not line.strip():
        raise error(path, number, "blank line: every line must hold one JSON object (remove the empty line)")
    try:
        return json.loads(line, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as exc:
        raise error(
            path, number, f"key {exc.key!r} appears twice in one object; JSON keeps only the last, so fix the line"
        ) from exc
    except json.JSONDecodeError as exc:
        raise error(path, number, f"malformed JSON at column {exc.colno}: {exc.msg}") from exc


class _Located(dict[str, Any]):
    """A JSON object that remembers the line it starts on (for error messages on multi-line JSON)."""

    line: int = 0


def _load_located_json(path: str, text: str, error: type[InputFileError] = QrelsError) -> Any:
    """Parse a whole JSON document; every object is a :class:`_Located` carrying its line number.

    The stdlib decoder does not report positions of values, but its pure-Python scanner calls
    ``parse_object`` with the offset of each ``{``: wrapping it gives every object its line. Duplicate keys
    raise instead of silently keeping the last value.
    """
    newlines = [i for i, ch in enumerate(text) if ch == "\n"]

    def parse_object(s_and_end: tuple[str, int], strict: bool, scan_once: Any, object_hook: Any,
                     object_pairs_hook: Any, memo: Any = None) -> tuple[Any, int]:
        start = s_and_end[1] - 1
        line = bisect.bisect_left(newlines, start) + 1

        def hook(pairs: list[tuple[str, Any]]) -> _Located:
            obj = _Located()
            for key, value in pairs:
                if key in obj:
                    raise error(path, line, f"key {key!r} appears twice in one object; JSON keeps only the last")
                obj[key] = value
            obj.line = line
            return obj

        return json_decoder.JSONObject(s_and_end, strict, scan_once, object_hook, hook, memo)  # type: ignore[attr-defined]

    dec = json.JSONDecoder()
    dec.parse_object = parse_object  # type: ignore[attr-defined]
    dec.scan_once = json_scanner.py_make_scanner(dec)  # type: ignore[attr-defined]
    try:
        return dec.decode(text)
    except json.JSONDecodeError as exc:
        raise error(path, exc.lineno, f"malformed JSON at column {exc.colno}: {exc.msg}") from exc
    except RecursionError as exc:
        raise error(path, None, "JSON nested too deeply") from exc


def sniff_qrels_format(path: str | Path, text: str | None = None) -> QrelsFormat:
    """Guess the judgment format from the content: a JSON object per line, one SRW document, or TREC."""
    body = read_input_text(path) if text is None else text
    stripped = body.lstrip()
    if not stripped.startswith("{"):
        return "trec"
    first = stripped.split("\n", 1)[0]
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        return _sniff_unparsed_first_line(stripped)
    return "workbench" if isinstance(obj, dict) and "judgmentRatings" in obj else "jsonl"


def _sniff_unparsed_first_line(stripped: str) -> QrelsFormat:
    """The first line is not a whole JSON value: a Workbench document spread over lines, or a bad JSONL line.

    Guessing "workbench" for a broken one-line file made the whole-document parser report the end of the
    file (line 2, column 1) instead of the fault; the JSONL parser reads that line alone and points at it.
    """
    try:
        json.loads(stripped)
        return "workbench"  # a valid multi-line document (its shape is checked by the Workbench parser)
    except json.JSONDecodeError:
        pass
    lines = [line for line in stripped.split("\n") if line.strip()]
    if len(lines) <= 1:
        return "jsonl"  # one line: the line-by-line parser gives the exact column
    head = lines[0].strip()
    if head in ("{", "[") or '"judgmentRatings"' in stripped:
        return "workbench"
    return "jsonl"


def load_qrels(
    path: str | Path,
    *,
    format: str = "auto",
    corpus: Collection[str] | None = None,
    require_positive: bool = False,
    require_text: bool = False,
    rel_threshold: int = 1,
    rating_map: RatingMap = ESCI_RATINGS,
) -> Qrels:
    """Load and validate human judgments (``format``: ``auto``, ``jsonl``, ``trec`` or ``workbench``).

    ``corpus``: doc ids that exist; a judgment of any other doc is an error. ``require_positive``: every
    query needs a judgment with grade >= ``rel_threshold``. ``require_text``: every query needs its text
    (the report joins judgments to the logs by text). ``rating_map`` applies to Workbench ratings.
    """
    name = str(path)
    text = read_input_text(path)
    fmt = sniff_qrels_format(path, text) if format == "auto" else format
    if fmt == "jsonl":
        qrels = _parse_jsonl(name, text, corpus)
    elif fmt == "trec":
        qrels = _parse_trec(name, text, corpus)
    elif fmt == "workbench":
        qrels = _parse_workbench(name, text, rating_map, corpus)
    else:
        raise QrelsError(name, None, f"unknown judgment format {format!r}; use one of auto, {', '.join(QRELS_FORMATS)}")
    if not qrels.grades:  # evaluating against nothing would print means "over 0 queries" and exit 0
        what = "the file is empty" if not text.strip() else f"no query in this {fmt} file"
        raise QrelsError(name, None, f"no judgments: {what}; give a judgments file with at least one graded "
                                     f"(query, doc)")
    _check_queries(qrels, require_positive=require_positive, require_text=require_text, rel_threshold=rel_threshold)
    return qrels


def _check_queries(qrels: Qrels, *, require_positive: bool, require_text: bool, rel_threshold: int) -> None:
    """Checks over whole queries, reported at the line where the query starts."""
    name = qrels.path or "<qrels>"
    if isinstance(rel_threshold, bool) or not isinstance(rel_threshold, int) or rel_threshold < 1:
        raise QrelsError(name, None, f"rel_threshold must be an integer >= 1 (grade 0 means 'not relevant'), got {rel_threshold!r}")
    for query_id, docs in qrels.grades.items():
        line = qrels.lines.get(query_id)
        if require_text and query_id not in qrels.texts:
            raise QrelsError(name, line, f"query {query_id!r} has no query text (add a \"query\" field)")
        if require_positive and not any(g >= rel_threshold for g in docs.values()):
            raise QrelsError(
                name, line,
                f"query {query_id!r} has no judgment with grade >= {rel_threshold}; positives are required "
                f"(judge at least one relevant doc, or drop the requirement to report it as a labelled negative)",
            )


def _check_corpus(path: str, line: int, query_id: str, doc_id: str, corpus: Collection[str] | None) -> None:
    if corpus is not None and doc_id not in corpus:
        raise QrelsError(path, line, f"doc id {doc_id!r} of query {query_id!r} is not in the corpus; fix the id or the corpus")


def _query_id(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def _grade(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


class _TextIndex:
    """Rejects two queries whose texts normalise to the same string (the report would merge them)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: dict[str, tuple[str, int]] = {}

    def add(self, text: str, query_id: str, line: int) -> None:
        key = normalize_query(text)
        if key in self.seen:
            other, other_line = self.seen[key]
            raise QrelsError(
                self.path, line,
                f"query text {text!r} (normalised {key!r}) is already used by query {other!r} on line "
                f"{other_line}; judgments are joined by normalised text, so merge the two queries",
            )
        self.seen[key] = (query_id, line)


def _parse_jsonl(path: str, text: str, corpus: Collection[str] | None) -> Qrels:
    grades: dict[str, dict[str, int]] = {}
    texts: dict[str, str] = {}
    lines: dict[str, int] = {}
    meta: dict[str, dict[str, Any]] = {}
    by_text = _TextIndex(path)
    for number, line in numbered_lines(text):
        row = loads_json_line(path, number, line)
        if not isinstance(row, dict):
            raise QrelsError(path, number, f"expected a JSON object, got {type(row).__name__}")
        unknown = sorted(set(row) - _JSONL_KEYS)
        if unknown:
            raise QrelsError(
                path, number,
                f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(_JSONL_KEYS))}",
            )
        query_id = _query_id(row.get("query_id"))
        if query_id is None:
            raise QrelsError(path, number, "\"query_id\" is missing or empty: give a non-empty string")
        if query_id in grades:
            raise QrelsError(path, number, f"duplicate query_id {query_id!r} (first on line {lines[query_id]}); one line per query")
        if "query" in row:
            qtext = row["query"]
            if not isinstance(qtext, str) or not normalize_query(qtext):
                raise QrelsError(path, number, f"query {query_id!r}: \"query\" must be non-empty text, got {qtext!r}")
            by_text.add(qtext, query_id, number)
            texts[query_id] = qtext
        relevant = row.get("relevant")
        if not isinstance(relevant, dict):
            raise QrelsError(
                path, number,
                f"query {query_id!r}: \"relevant\" must be an object {{doc_id: grade}}, got "
                f"{'nothing' if relevant is None else type(relevant).__name__}",
            )
        docs: dict[str, int] = {}
        for doc_id, value in relevant.items():
            if not doc_id.strip():
                raise QrelsError(path, number, f"query {query_id!r}: empty doc id in \"relevant\"")
            grade = _grade(value)
            if grade is None:
                raise QrelsError(
                    path, number,
                    f"query {query_id!r}, doc {doc_id!r}: grade {value!r} is not a non-negative integer "
                    f"(0 = judged not relevant, higher = better)",
                )
            _check_corpus(path, number, query_id, doc_id, corpus)
            docs[doc_id] = grade
        info: dict[str, Any] = {}
        for key in ("assessor", "rubric", "source"):
            value = row.get(key)
            if value is not None and not isinstance(value, str):
                raise QrelsError(path, number, f"query {query_id!r}: \"{key}\" must be a string or null")
            if value:
                info[key] = value
        if row.get("judged_at") is not None:
            try:
                info["judged_at"] = parse_timestamp(row["judged_at"]).astimezone(UTC).replace(tzinfo=None)
            except ValueError as exc:
                raise QrelsError(path, number, f"query {query_id!r}: \"judged_at\": {exc}") from exc
        grades[query_id] = docs
        lines[query_id] = number
        if info:
            meta[query_id] = info
    return Qrels(grades=grades, texts=texts, lines=lines, meta=meta, path=path, format="jsonl")


def _parse_trec(path: str, text: str, corpus: Collection[str] | None) -> Qrels:
    grades: dict[str, dict[str, int]] = {}
    lines: dict[str, int] = {}
    doc_lines: dict[tuple[str, str], int] = {}
    for number, line in numbered_lines(text):
        fields = line.split()
        if not fields:
            raise QrelsError(path, number, "blank line: TREC qrels have one 'query_id iteration doc_id grade' per line")
        if len(fields) != 4:
            raise QrelsError(
                path, number,
                f"expected 4 whitespace-separated fields 'query_id iteration doc_id grade', got {len(fields)}",
            )
        query_id, _iteration, doc_id, grade_text = fields
        if not _DIGITS.fullmatch(grade_text):
            hint = (" (negative grades, which some collections use for 'unjudged', are not accepted: "
                    "remove those lines)") if grade_text.startswith("-") else ""
            raise QrelsError(path, number, f"grade {grade_text!r} is not a non-negative integer{hint}")
        key = (query_id, doc_id)
        if key in doc_lines:
            raise QrelsError(
                path, number,
                f"query {query_id!r}, doc {doc_id!r} is judged twice (first on line {doc_lines[key]}); keep one grade",
            )
        _check_corpus(path, number, query_id, doc_id, corpus)
        doc_lines[key] = number
        if query_id not in grades:
            grades[query_id] = {}
            lines[query_id] = number
        grades[query_id][doc_id] = int(grade_text)
    return Qrels(grades=grades, lines=lines, path=path, format="trec")


def _parse_workbench(path: str, text: str, rating_map: RatingMap, corpus: Collection[str] | None) -> Qrels:
    doc = _load_located_json(path, text)
    if not isinstance(doc, dict) or not isinstance(doc.get("judgmentRatings"), list):
        raise QrelsError(
            path, 1,
            "expected a Search Relevance Workbench judgment object with a \"judgmentRatings\" list "
            "({\"judgmentRatings\": [{\"query\": ..., \"ratings\": [{\"docId\": ..., \"rating\": ...}]}]})",
        )
    grades: dict[str, dict[str, int]] = {}
    texts: dict[str, str] = {}
    lines: dict[str, int] = {}
    by_text = _TextIndex(path)
    for i, entry in enumerate(doc["judgmentRatings"]):
        if not isinstance(entry, _Located):
            raise QrelsError(path, None, f"judgmentRatings[{i}] must be an object with \"query\" and \"ratings\"")
        line = entry.line
        unknown = sorted(set(entry) - _WB_ENTRY_KEYS)
        if unknown:
            raise QrelsError(path, line, f"judgmentRatings[{i}]: unknown key(s) {', '.join(map(repr, unknown))}; "
                                         f"expected \"query\" and \"ratings\"")
        query = entry.get("query")
        if not isinstance(query, str) or not normalize_query(query):
            raise QrelsError(path, line, f"judgmentRatings[{i}]: \"query\" must be non-empty text, got {query!r}")
        if query in grades:
            raise QrelsError(path, line, f"duplicate query {query!r} (first on line {lines[query]}); one entry per query")
        by_text.add(query, query, line)
        ratings = entry.get("ratings")
        if not isinstance(ratings, list):
            raise QrelsError(path, line, f"query {query!r}: \"ratings\" must be a list of {{\"docId\", \"rating\"}}")
        docs: dict[str, int] = {}
        doc_lines: dict[str, int] = {}
        for j, item in enumerate(ratings):
            item_line = item.line if isinstance(item, _Located) else line
            if not isinstance(item, dict):
                raise QrelsError(path, item_line, f"query {query!r}: ratings[{j}] must be an object")
            unknown = sorted(set(item) - _WB_RATING_KEYS)
            if unknown:
                raise QrelsError(path, item_line, f"query {query!r}: ratings[{j}] has unknown key(s) "
                                                  f"{', '.join(map(repr, unknown))}; expected \"docId\" and \"rating\"")
            doc_id = item.get("docId")
            if not isinstance(doc_id, str) or not doc_id.strip():
                raise QrelsError(path, item_line, f"query {query!r}: ratings[{j}] needs a non-empty string \"docId\"")
            if doc_id in docs:
                raise QrelsError(path, item_line, f"query {query!r}: docId {doc_id!r} is rated twice "
                                                  f"(first on line {doc_lines[doc_id]}); keep one rating")
            if "rating" not in item:
                raise QrelsError(path, item_line, f"query {query!r}, docId {doc_id!r}: \"rating\" is missing")
            try:
                docs[doc_id] = rating_map.grade(item["rating"])
            except ValueError as exc:
                raise QrelsError(path, item_line, f"query {query!r}, docId {doc_id!r}: {exc}") from exc
            _check_corpus(path, item_line, query, doc_id, corpus)
            doc_lines[doc_id] = item_line
        grades[query] = docs
        texts[query] = query
        lines[query] = line
    return Qrels(grades=grades, texts=texts, lines=lines, path=path, format="workbench")


# --------------------------------------------------------------------------------------------------------
# Writing judgments
# --------------------------------------------------------------------------------------------------------

# What the Search Relevance Workbench accepts as a name and a description (its import answers 400 "Invalid
# name" / "Invalid description" otherwise): opensearch-project/search-relevance,
# src/main/java/org/opensearch/searchrelevance/utils/TextValidationUtil.java, validateName (at most 50
# characters) and validateDescription (at most 250), both through validateText: not empty, and none of the
# characters of its DANGEROUS_CHARS_PATTERN, the double quote, the backslash, < and >. Java counts UTF-16
# code units, so the lengths here do too.
WORKBENCH_NAME_MAX = 50
WORKBENCH_DESCRIPTION_MAX = 250
_WORKBENCH_FORBIDDEN = frozenset('"\\<>')


class WorkbenchTextError(UbiError):
    """A name or description the Search Relevance Workbench would refuse."""


def workbench_text_problem(value: str, max_len: int) -> str | None:
    """Why the Workbench would refuse ``value`` as a name (``max_len`` 50) or description (250), or None."""
    if not value.strip():
        return "must not be empty"
    length = len(value.encode("utf-16-le")) // 2
    if length > max_len:
        return f"is {length} characters long; at most {max_len}"
    bad = sorted({ch for ch in value if ch in _WORKBENCH_FORBIDDEN})
    if bad:
        return "contains " + " ".join(bad) + ", which the Workbench does not allow (none of \" \\ < >)"
    return None


def check_workbench_text(value: str, what: str, max_len: int) -> str:
    """``value`` when the Workbench accepts it, else :class:`WorkbenchTextError` naming ``what`` and the rule."""
    problem = workbench_text_problem(value, max_len)
    if problem is not None:
        raise WorkbenchTextError(f"{what} {value!r} {problem}; the Search Relevance Workbench would refuse the "
                                 f"file with 400")
    return value


def workbench_safe(text: str, max_len: int = WORKBENCH_DESCRIPTION_MAX) -> str:
    """Generated text made acceptable: forbidden characters become spaces, cut to ``max_len`` code units."""
    out = "".join(" " if ch in _WORKBENCH_FORBIDDEN else ch for ch in text).strip() or "Exported by ubi-pipeline"
    while len(out.encode("utf-16-le")) // 2 > max_len:
        out = out[:-1]
    return out.rstrip()


def format_qrels(
    qrels: Mapping[str, Mapping[str, int]],
    format: str,
    *,
    texts: Mapping[str, str] | None = None,
    rating_map: RatingMap = ESCI_RATINGS,
    name: str = "Judgments",
    description: str = "Exported by ubi-pipeline",
) -> str:
    """Serialise judgments; ``texts`` defaults to ``qrels.texts`` for a loaded :class:`Qrels`.

    The output loads back to the same grades. TREC qrels cannot hold ids with whitespace and the
    Workbench form cannot hold a grade outside ``rating_map``: both raise instead of writing a lossy file.
    """
    if texts is None:
        texts = qrels.texts if isinstance(qrels, Qrels) else {}
    meta = qrels.meta if isinstance(qrels, Qrels) else {}
    target = f"<{format} output>"
    for query_id, docs in qrels.items():
        for doc_id, grade in docs.items():
            if isinstance(grade, bool) or not isinstance(grade, int) or grade < 0:
                raise QrelsError(target, None, f"query {query_id!r}, doc {doc_id!r}: grade {grade!r} is not a non-negative integer")
    if format == "jsonl":
        out = []
        for query_id, docs in qrels.items():
            row: dict[str, Any] = {"query_id": query_id}
            if query_id in texts:
                row["query"] = texts[query_id]
            row["relevant"] = dict(docs)
            info = meta.get(query_id, {})
            for key in ("assessor", "rubric", "source"):
                if info.get(key):
                    row[key] = info[key]
            if isinstance(info.get("judged_at"), datetime):
                row["judged_at"] = info["judged_at"].isoformat() + ("" if info["judged_at"].tzinfo else "Z")
            out.append(json.dumps(row, ensure_ascii=False))
        return "".join(line + "\n" for line in out)
    if format == "trec":
        out = []
        for query_id, docs in qrels.items():
            for doc_id in docs:
                for what, value in (("query id", query_id), ("doc id", doc_id)):
                    if not value or len(value.split()) != 1 or value != value.strip():
                        raise QrelsError(target, None, f"{what} {value!r} contains whitespace, which TREC qrels "
                                                       f"cannot hold; export as jsonl or workbench instead")
            out.extend(f"{query_id} 0 {doc_id} {grade}\n" for doc_id, grade in docs.items())
        return "".join(out)
    if format == "workbench":
        entries = []
        for query_id, docs in qrels.items():
            try:
                ratings = [{"docId": d, "rating": rating_map.rating(g)} for d, g in docs.items()]
            except ValueError as exc:
                raise QrelsError(target, None, f"query {query_id!r}: {exc}") from exc
            entries.append({"query": texts.get(query_id, query_id), "ratings": ratings})
        check_workbench_text(name, "name", WORKBENCH_NAME_MAX)
        check_workbench_text(description, "description", WORKBENCH_DESCRIPTION_MAX)
        body = {"name": name, "description": description, "type": "IMPORT_JUDGMENT", "judgmentRatings": entries}
        return json.dumps(body, indent=2, ensure_ascii=False) + "\n"
    raise QrelsError(target, None, f"unknown judgment format {format!r}; use one of {', '.join(QRELS_FORMATS)}")


def write_qrels(qrels: Mapping[str, Mapping[str, int]], path: str | Path, format: str, **options: Any) -> None:
    """Write judgments to ``path`` in ``format`` (see :func:`format_qrels`)."""
    Path(path).write_text(format_qrels(qrels, format, **options), encoding="utf-8")


# --------------------------------------------------------------------------------------------------------
# Query sets
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuerySetQuery:
    """One query of a query set; ``frequency`` is how often the logs saw it, when known."""

    query_id: str
    query: str
    frequency: int | None = None
    reference_answer: str | None = None


@dataclass(frozen=True)
class QuerySet:
    """An ordered set of queries to send to human reviewers (or to evaluate a system on)."""

    queries: tuple[QuerySetQuery, ...]
    name: str | None = None
    description: str | None = None
    sampling: str | None = None
    path: str | None = None

    def __len__(self) -> int:
        return len(self.queries)

    def __iter__(self) -> Iterator[QuerySetQuery]:
        return iter(self.queries)


#: query-set files read but not written: plain text, one query a line (blank lines and ``#`` comments skipped)
QUERYSET_READ_FORMATS: tuple[str, ...] = (*QUERYSET_FORMATS, "lines")


def load_queryset(path: str | Path, *, format: str = "auto") -> QuerySet:
    """Load and validate a query set (``format``: ``auto``, ``jsonl``, ``workbench`` or ``lines``).

    ``auto`` reads the first non-blank line: a JSON object is JSONL (or a one-line Workbench query set), a line
    opening a JSON document is a Workbench query set, anything else is plain text with one query a line (its
    query ids are the texts; a text repeated after normalisation is kept once).
    """
    name = str(path)
    text = read_input_text(path)
    fmt = format
    if fmt == "auto":
        first = next((line for line in text.splitlines() if line.strip()), "").strip()
        try:
            obj = json.loads(first)
            fmt = "workbench" if isinstance(obj, dict) and "querySetQueries" in obj else "jsonl"
        except json.JSONDecodeError:
            fmt = "workbench" if first.startswith(("{", "[")) else "lines"
    if fmt not in QUERYSET_READ_FORMATS:
        raise QrelsError(name, None, f"unknown query-set format {format!r}; use one of auto, "
                                     f"{', '.join(QUERYSET_READ_FORMATS)}")
    if fmt == "lines":
        seen: dict[str, QuerySetQuery] = {}
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                seen.setdefault(normalize_query(line), QuerySetQuery(line.strip(), line.strip()))
        return QuerySet(tuple(seen.values()), path=name)
    queries: list[QuerySetQuery] = []
    ids: dict[str, int] = {}
    by_text = _TextIndex(name)

    def add(query_id: str, query: str, line: int, frequency: int | None, reference: str | None) -> None:
        if query_id in ids:
            raise QrelsError(name, line, f"duplicate query_id {query_id!r} (first on line {ids[query_id]})")
        by_text.add(query, query_id, line)
        ids[query_id] = line
        queries.append(QuerySetQuery(query_id, query, frequency, reference))

    if fmt == "jsonl":
        for number, line in numbered_lines(text):
            row = loads_json_line(name, number, line)
            if not isinstance(row, dict):
                raise QrelsError(name, number, f"expected a JSON object, got {type(row).__name__}")
            unknown = sorted(set(row) - _QS_JSONL_KEYS)
            if unknown:
                raise QrelsError(name, number, f"unknown key(s) {', '.join(map(repr, unknown))}; "
                                                f"allowed: {', '.join(sorted(_QS_JSONL_KEYS))}")
            query = row.get("query")
            if not isinstance(query, str) or not normalize_query(query):
                raise QrelsError(name, number, f"\"query\" must be non-empty text, got {query!r}")
            query_id = _query_id(row.get("query_id", query))
            if query_id is None:
                raise QrelsError(name, number, "\"query_id\" must be a non-empty string when given")
            frequency = row.get("frequency")
            if frequency is not None and _grade(frequency) is None:
                raise QrelsError(name, number, f"\"frequency\" must be a non-negative integer, got {frequency!r}")
            reference = row.get("reference_answer")
            if reference is not None and not isinstance(reference, str):
                raise QrelsError(name, number, "\"reference_answer\" must be a string or null")
            add(query_id, query, number, frequency, reference)
        return QuerySet(tuple(queries), path=name)

    doc = _load_located_json(name, text)
    if not isinstance(doc, dict) or not isinstance(doc.get("querySetQueries"), list):
        raise QrelsError(name, 1, "expected a Workbench query set object with a \"querySetQueries\" list")
    for i, item in enumerate(doc["querySetQueries"]):
        item_line = item.line if isinstance(item, _Located) else None
        if not isinstance(item, dict):
            raise QrelsError(name, item_line, f"querySetQueries[{i}] must be an object with \"queryText\"")
        unknown = sorted(set(item) - _QS_WB_KEYS)
        if unknown:
            raise QrelsError(name, item_line, f"querySetQueries[{i}]: unknown key(s) {', '.join(map(repr, unknown))}")
        query = item.get("queryText")
        if not isinstance(query, str) or not normalize_query(query):
            raise QrelsError(name, item_line, f"querySetQueries[{i}]: \"queryText\" must be non-empty text, got {query!r}")
        reference = item.get("referenceAnswer")
        if reference is not None and not isinstance(reference, str):
            raise QrelsError(name, item_line, f"querySetQueries[{i}]: \"referenceAnswer\" must be a string")
        add(query, query, item_line or 0, None, reference)
    meta = {k: doc.get(k) if isinstance(doc.get(k), str) else None for k in ("name", "description", "sampling")}
    return QuerySet(tuple(queries), path=name, **meta)


def format_queryset(queryset: QuerySet, format: str) -> str:
    """Serialise a query set as JSONL or as a Workbench query-set document."""
    if format == "jsonl":
        rows = []
        for q in queryset.queries:
            row: dict[str, Any] = {"query_id": q.query_id, "query": q.query}
            if q.frequency is not None:
                row["frequency"] = q.frequency
            if q.reference_answer is not None:
                row["reference_answer"] = q.reference_answer
            rows.append(json.dumps(row, ensure_ascii=False) + "\n")
        return "".join(rows)
    if format == "workbench":
        items = []
        for q in queryset.queries:
            item = {"queryText": q.query}
            if q.reference_answer is not None:
                item["referenceAnswer"] = q.reference_answer
            items.append(item)
        body = {
            "name": check_workbench_text(queryset.name or "Query set", "name", WORKBENCH_NAME_MAX),
            "description": check_workbench_text(queryset.description or "Exported by ubi-pipeline", "description",
                                                WORKBENCH_DESCRIPTION_MAX),
            "sampling": queryset.sampling or "manual",
            "querySetQueries": items,
        }
        return json.dumps(body, indent=2, ensure_ascii=False) + "\n"
    raise QrelsError(f"<{format} output>", None, f"unknown query-set format {format!r}; use one of {', '.join(QUERYSET_FORMATS)}")


def write_queryset(queryset: QuerySet, path: str | Path, format: str) -> None:
    """Write a query set to ``path`` in ``format`` (``jsonl`` or ``workbench``)."""
    Path(path).write_text(format_queryset(queryset, format), encoding="utf-8")


def load_corpus_ids(path: str | Path) -> frozenset[str]:
    """Doc ids of a corpus: one id per line, or JSONL objects with ``doc_id`` (or ``id`` / ``_id``)."""
    name = str(path)
    ids: set[str] = set()
    for number, line in numbered_lines(read_input_text(path)):
        if not line.strip():
            raise QrelsError(name, number, "blank line: one doc id per line")
        if line.lstrip().startswith("{"):
            row = loads_json_line(name, number, line)
            doc_id = next((row[k] for k in ("doc_id", "id", "_id") if isinstance(row, dict) and k in row), None)
            if not isinstance(doc_id, str | int) or isinstance(doc_id, bool) or not str(doc_id).strip():
                raise QrelsError(name, number, "expected an object with a non-empty \"doc_id\" (or \"id\" / \"_id\")")
            ids.add(str(doc_id))
        else:
            ids.add(line.strip())
    return frozenset(ids)
