"""Rankings (runs): TREC run files and JSONL rankings in and out, and rankings built from scored documents.

A run in memory is ``query_id -> [doc_id, ...]`` in rank order (:class:`Run` is such a mapping). TREC run
lines are ``query_id Q0 doc_id rank score tag``; like trec_eval we order each query's docs by score
descending, ties by doc id descending (byte order), and ignore the rank column. TREC files cannot hold ids
with whitespace (Workbench query ids are query texts), so a JSONL form carries such rankings:
``{"query_id": "red shoes", "doc_ids": ["d3", "d1"]}``, already in rank order. A doc id that appears twice
for one query invalidates the ranking (it would push recall above 1), so it is an error, never de-duplicated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ubi_pipeline.formats.qrels import loads_json_line, numbered_lines, read_input_text
from ubi_pipeline.schemas.errors import InputFileError
from ubi_pipeline.schemas.judgments import ScoredDoc


class RunError(InputFileError):
    """A run file is malformed; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Run(Mapping[str, list[str]]):
    """Rankings per query (a mapping ``query_id -> ranked doc ids``) with their scores when known."""

    rankings: dict[str, list[str]]
    scores: dict[str, list[float]] = field(default_factory=dict)
    tag: str | None = None
    path: str | None = None
    lines: dict[str, int] = field(default_factory=dict)
    #: "trec" or "jsonl" when read from a file (None: built in memory). A TREC query id cannot hold whitespace,
    #: so a query text in it is percent-escaped (``red%20shoes``) and decoded when mapped to a query
    #: (``ubi_pipeline.reports.systems.file_run``), as TREC qrels ids are.
    format: str | None = None

    def __getitem__(self, query_id: str) -> list[str]:
        return self.rankings[query_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.rankings)

    def __len__(self) -> int:
        return len(self.rankings)

    def n_docs(self) -> int:
        """Total ranked (query, doc) entries."""
        return sum(len(docs) for docs in self.rankings.values())


def trec_order(pairs: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Sort ``(doc_id, score)`` as trec_eval does: score descending, then doc id descending."""
    # One reverse sort on (score, doc_id) gives both descending keys; Python compares str by code point,
    # which for UTF-8 is the same order as trec_eval's strcmp on bytes.
    return sorted(pairs, key=lambda p: (p[1], p[0]), reverse=True)


def load_trec_run(path: str | Path) -> Run:
    """Load and validate a TREC run file (``query_id Q0 doc_id rank score tag`` per line)."""
    return _parse_trec_run(str(path), read_input_text(path, RunError))


def _no_rankings(name: str) -> RunError:
    # nothing to score: means "over 0 queries" must not pass for a real evaluation
    return RunError(name, None, "no rankings: the file is empty; give at least one line "
                                "'query_id Q0 doc_id rank score tag' (or one JSONL ranking)")


def _parse_trec_run(name: str, text: str) -> Run:
    if not text.strip():
        raise _no_rankings(name)
    return _fast_trec_run(name, text) or _strict_trec_run(name, text)


def _fast_trec_run(name: str, text: str) -> Run | None:
    """The common case, a valid file, with the least work per line; None at the first anomaly.

    On None the strict parser re-reads the file to say exactly what is wrong and where, so both paths
    accept exactly the same files.
    """
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    docs_by_query: dict[str, list[str]] = {}
    scores_by_query: dict[str, list[float]] = {}
    lines: dict[str, int] = {}
    tag: str | None = None
    isfinite = math.isfinite
    try:
        for number, line in enumerate(rows, 1):
            query_id, _q0, doc_id, rank, score_text, run_tag = line.split()  # ValueError unless 6 fields
            int(rank)
            score = float(score_text)
            if run_tag != tag:
                if tag is not None:
                    return None
                tag = run_tag
            if not isfinite(score):
                return None
            docs = docs_by_query.get(query_id)
            if docs is None:
                docs = docs_by_query[query_id] = []
                scores_by_query[query_id] = []
                lines[query_id] = number
            docs.append(doc_id)
            scores_by_query[query_id].append(score)
    except ValueError:
        return None
    rankings: dict[str, list[str]] = {}
    scores: dict[str, list[float]] = {}
    for query_id, docs in docs_by_query.items():
        if len(set(docs)) != len(docs):
            return None
        # (score, doc_id) tuples sorted in reverse: score descending, then doc id descending, as trec_eval
        ordered = sorted(zip(scores_by_query[query_id], docs, strict=True), reverse=True)
        rankings[query_id] = [d for _, d in ordered]
        scores[query_id] = [sc for sc, _ in ordered]
    return Run(rankings=rankings, scores=scores, tag=tag, path=name, lines=lines, format="trec")


def _strict_trec_run(name: str, text: str) -> Run:
    pairs: dict[str, list[tuple[str, float]]] = {}
    seen: dict[str, dict[str, int]] = {}
    lines: dict[str, int] = {}
    tag: str | None = None
    tag_line = 0
    for number, line in numbered_lines(text):
        fields = line.split()
        if len(fields) != 6:
            what = "blank line" if not fields else f"{len(fields)} fields"
            raise RunError(name, number, f"{what}: expected 6 whitespace-separated fields 'query_id Q0 doc_id rank score tag'")
        query_id, _q0, doc_id, rank, score_text, run_tag = fields
        try:
            int(rank)
        except ValueError:
            raise RunError(name, number, f"rank {rank!r} is not an integer (trec_eval ignores it, but a malformed "
                                         f"rank usually means shifted columns)") from None
        try:
            score = float(score_text)
        except ValueError as exc:
            raise RunError(name, number, f"score {score_text!r} is not a number") from exc
        if not math.isfinite(score):
            raise RunError(name, number, f"score {score_text!r} is not finite; ranks would be undefined")
        if tag is None:
            tag, tag_line = run_tag, number
        elif run_tag != tag:
            raise RunError(name, number, f"run tag {run_tag!r} differs from {tag!r} on line {tag_line}; "
                                         f"keep one run per file")
        docs = seen.get(query_id)
        if docs is None:
            docs = seen[query_id] = {}
            pairs[query_id] = []
            lines[query_id] = number
        if doc_id in docs:
            raise RunError(name, number, f"doc {doc_id!r} is ranked twice for query {query_id!r} (first on line "
                                         f"{docs[doc_id]}); a duplicate would push recall above 1, so remove it")
        docs[doc_id] = number
        pairs[query_id].append((doc_id, score))
    rankings: dict[str, list[str]] = {}
    scores: dict[str, list[float]] = {}
    for query_id, items in pairs.items():
        ordered = trec_order(items)
        rankings[query_id] = [d for d, _ in ordered]
        scores[query_id] = [s for _, s in ordered]
    return Run(rankings=rankings, scores=scores, tag=tag, path=name, lines=lines, format="trec")


def load_jsonl_run(path: str | Path) -> Run:
    """Load and validate rankings in JSONL form, one ``{"query_id": ..., "doc_ids": [...]}`` per line."""
    return _parse_jsonl_run(str(path), read_input_text(path, RunError))


def _parse_jsonl_run(name: str, text: str) -> Run:
    if not text.strip():
        raise _no_rankings(name)
    rankings: dict[str, list[str]] = {}
    lines: dict[str, int] = {}
    for number, line in numbered_lines(text):
        row = loads_json_line(name, number, line, RunError)
        if not isinstance(row, dict) or set(row) != {"query_id", "doc_ids"}:
            raise RunError(name, number, 'expected exactly {"query_id": "...", "doc_ids": ["...", ...]}')
        query_id, docs = row["query_id"], row["doc_ids"]
        if not isinstance(query_id, str) or not query_id.strip():
            raise RunError(name, number, "\"query_id\" must be a non-empty string")
        if query_id in rankings:
            raise RunError(name, number, f"duplicate query_id {query_id!r} (first on line {lines[query_id]})")
        if not isinstance(docs, list) or not all(isinstance(d, str) and d.strip() for d in docs):
            raise RunError(name, number, f"query {query_id!r}: \"doc_ids\" must be a list of non-empty strings")
        first: dict[str, int] = {}
        for rank, doc_id in enumerate(docs, 1):
            if doc_id in first:
                raise RunError(name, number, f"query {query_id!r}: doc {doc_id!r} is ranked twice (ranks "
                                             f"{first[doc_id]} and {rank}); a duplicate would push recall above 1")
            first[doc_id] = rank
        rankings[query_id] = list(docs)
        lines[query_id] = number
    return Run(rankings=rankings, path=name, lines=lines, format="jsonl")


def load_run(path: str | Path, *, format: str = "auto") -> Run:
    """Load a run as ``trec`` or ``jsonl`` (``auto``: JSONL when the file starts with ``{``)."""
    if format not in ("auto", "trec", "jsonl"):
        raise RunError(str(path), None, f"unknown run format {format!r}; use auto, trec or jsonl")
    text = read_input_text(path, RunError)
    fmt = ("jsonl" if text.lstrip().startswith("{") else "trec") if format == "auto" else format
    return _parse_jsonl_run(str(path), text) if fmt == "jsonl" else _parse_trec_run(str(path), text)


def format_jsonl_run(run: Mapping[str, Sequence[str]]) -> str:
    """Serialise rankings as JSONL, one query a line, in rank order."""
    return "".join(json.dumps({"query_id": q, "doc_ids": list(docs)}, ensure_ascii=False) + "\n" for q, docs in run.items())


def run_from_scored(docs: Iterable[ScoredDoc], *, tag: str | None = None) -> Run:
    """Build a run from scored docs (any order), ordered as trec_eval would order the same run file."""
    pairs: dict[str, list[tuple[str, float]]] = {}
    seen: dict[str, set[str]] = {}
    for i, doc in enumerate(docs):
        ids = seen.setdefault(doc.query_id, set())
        if doc.doc_id in ids:
            raise RunError("<scored docs>", None, f"item {i}: doc {doc.doc_id!r} is ranked twice for query {doc.query_id!r}")
        if not math.isfinite(doc.score):
            raise RunError("<scored docs>", None, f"item {i}: score {doc.score!r} is not finite")
        ids.add(doc.doc_id)
        pairs.setdefault(doc.query_id, []).append((doc.doc_id, float(doc.score)))
    rankings, scores = {}, {}
    for query_id, items in pairs.items():
        ordered = trec_order(items)
        rankings[query_id] = [d for d, _ in ordered]
        scores[query_id] = [s for _, s in ordered]
    return Run(rankings=rankings, scores=scores, tag=tag)


def format_trec_run(run: Mapping[str, Sequence[str]], *, tag: str = "ubi") -> str:
    """Serialise rankings as a TREC run that trec_eval reads back in the same order.

    Scores are written as ``len - rank + 1`` (strictly decreasing), so no tie-break can reorder the list,
    whatever scores the run had.
    """
    if not tag or len(tag.split()) != 1:
        raise RunError("<trec output>", None, f"run tag {tag!r} must be one token without whitespace")
    out: list[str] = []
    for query_id, docs in run.items():
        seen: set[str] = set()
        n = len(docs)
        for rank, doc_id in enumerate(docs, 1):
            for what, value in (("query id", query_id), ("doc id", doc_id)):
                if not value or len(value.split()) != 1 or value != value.strip():
                    raise RunError("<trec output>", None, f"{what} {value!r} contains whitespace, which a TREC run cannot hold")
            if doc_id in seen:
                raise RunError("<trec output>", None, f"doc {doc_id!r} is ranked twice for query {query_id!r}")
            seen.add(doc_id)
            out.append(f"{query_id} Q0 {doc_id} {rank} {n - rank + 1} {tag}\n")
    return "".join(out)


def write_jsonl_run(run: Mapping[str, Sequence[str]], path: str | Path) -> None:
    """Write rankings to ``path`` as JSONL (see :func:`format_jsonl_run`)."""
    Path(path).write_text(format_jsonl_run(run), encoding="utf-8")


def write_trec_run(run: Mapping[str, Sequence[str]], path: str | Path, *, tag: str = "ubi") -> None:
    """Write rankings to ``path`` as a TREC run (see :func:`format_trec_run`)."""
    Path(path).write_text(format_trec_run(run, tag=tag), encoding="utf-8")
