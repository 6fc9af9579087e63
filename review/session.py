"""What the review page serves and stores: the queue over the store's pairs, the assessors' grades, undo.

Grades are rows of ``human_judgments`` (one per query, doc, source and assessor), written the moment they are
given with :func:`ubi_pipeline.store.client.load_derived`: directly when the store file is free, else through
the admin protocol of the collector (or loader) holding it. Their source says what the assessor saw:

* ``human`` when the pair was shown blind (``--blind``, and every pair of the held-out sample, which measures
  agreement and must not be anchored on a source's suggestion);
* ``reviewed:<source>`` when the evidence was shown, ``<source>`` being the first source of that evidence
  (``implicit:*`` sort before ``model:*``): the same name ``ubi review import`` gives a checked candidate.

``origin`` is ``review:page``, ``rubric`` the rubric's version (its file name and the first 12 hex digits of
its SHA-256), ``judged_at`` the time the grade was stored (naive UTC), ``note`` the assessor's explanation.

A second grade of a pair by the same assessor (from the disagreements view) replaces their first, keeping its
source. Undo takes back an assessor's last action: a skip is forgotten; a grade is deleted, or, when it had replaced
a row of the same key (the assessor graded the pair again), that row is written back.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import pyarrow as pa

from ubi_pipeline.processors.labels.grades import default_rubric_text
from ubi_pipeline.processors.labels.implicit import trec_query_id
from ubi_pipeline.processors.labels.queue import Candidate, HumanGrade, Queue, QueueItem, build_queue
from ubi_pipeline.schemas.errors import InputFileError, StoreError, UbiError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.tables import HUMAN_JUDGMENT_TABLE
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.store.client import delete_derived, load_derived, reading
from ubi_pipeline.store.rows import HUMAN_JUDGMENT_SCHEMA, utcnow

ORIGIN = "review:page"
#: display fields a --docs catalog line may give beside doc_id (other keys are ignored)
#: longest assessor name and note accepted (the note column's own limit)
ASSESSOR_MAX = 100
NOTE_MAX = next(c.max_length for c in HUMAN_JUDGMENT_TABLE.columns if c.name == "note") or 2048


class ReviewPageError(UbiError):
    """A request of the review page that cannot be served; ``status_code`` is the answer."""

    status_code = 400


class NotInQueue(ReviewPageError):
    """A pair the queue does not hold (404)."""

    status_code = 404


class Rubric(NamedTuple):
    """The grading instructions shown beside each pair, and the version stored with each grade."""

    text: str
    version: str


def read_rubric(path: Path | None, grade_max: int) -> Rubric:
    """The rubric of ``path`` (UTF-8 text), or the built-in one; version ``<name>@<sha256 prefix>``."""
    if path is None:
        text, name = default_rubric_text(grade_max), "builtin"
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputFileError(str(path), None, f"cannot read the rubric: {exc}") from exc
        name = path.name
    return Rubric(text, f"{name}@{hashlib.sha256(text.encode()).hexdigest()[:12]}")


@dataclass(frozen=True)
class Inputs:
    """What the queue is built from, read from the store at start."""

    candidates: list[Candidate]
    humans: list[dict[str, Any]]  # human_judgments rows, every column
    frequencies: dict[str, int]  # normalised query -> searches (ubi_queries rows)


def read_inputs(con: duckdb.DuckDBPyConnection) -> Inputs:
    """Every ``judgments`` row (all sources), every ``human_judgments`` row and the searches per normalised query."""
    candidates = [Candidate(*r) for r in con.execute(
        "SELECT query, doc_id, source, score, ci_low, ci_high, impressions, clicks, sessions, grade FROM judgments"
    ).fetchall()]
    humans = con.sql("SELECT * FROM human_judgments").to_arrow_table().to_pylist()
    freq: dict[str, int] = {}
    for text, n in con.execute("SELECT user_query, count(*) FROM ubi_queries GROUP BY user_query").fetchall():
        q = normalize_query(text)
        freq[q] = freq.get(q, 0) + int(n)
    return Inputs(candidates, humans, freq)


def _key(row: dict[str, Any]) -> tuple[str, str, str, str]:
    return (row["query"], row["doc_id"], row["source"], row["assessor"])


@dataclass
class _Action:
    kind: str  # "grade" | "skip"
    pair: tuple[str, str]
    key: tuple[str, str, str, str] | None = None
    replaced: dict[str, Any] | None = None


@dataclass
class ReviewSession:
    """The queue, every stored human grade, and each assessor's actions (for undo), behind one lock."""

    db: Path
    settings: Settings
    queue: Queue
    rows: dict[tuple[str, str, str, str], dict[str, Any]]
    rubric: Rubric
    docs: dict[str, dict[str, str]] = field(default_factory=dict)
    blind: bool = False
    actions: dict[str, list[_Action]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def open(cls, db: Path, settings: Settings, *, rubric: Rubric, docs: dict[str, dict[str, str]] | None = None,
             blind: bool = False, assessors_per_pair: int = 1, held_out: int = 50, seed: int = 0) -> ReviewSession:
        """Read the store (also while a collector holds it) and order its pairs."""
        with reading(db, settings) as con:
            inputs = read_inputs(con)
        humans = [HumanGrade(r["query"], r["doc_id"], r["assessor"], r["grade"], r["source"]) for r in inputs.humans]
        items = build_queue(inputs.candidates, humans, inputs.frequencies, held_out=held_out, seed=seed)
        if not items:
            raise ReviewPageError(f"{db}: no candidate judgments to review; run `ubi process` (or import model "
                                  "judgments) first")
        queue = Queue.of(items, humans, assessors_per_pair)
        return cls(db, settings, queue, {_key(r): r for r in inputs.humans}, rubric, docs or {}, blind)

    # ------------------------------------------------------------------ what the page shows

    def _shown_blind(self, item: QueueItem) -> bool:
        return self.blind or item.held_out

    def view(self, item: QueueItem | None, assessor: str) -> dict[str, Any]:
        """The page's state for ``assessor``: the pair to grade (or none left) and their progress."""
        out: dict[str, Any] = {"assessor": assessor, "progress": self.queue.progress(assessor),
                               "can_undo": bool(self.actions.get(assessor))}
        if item is None:
            return {**out, "item": None}
        blind = self._shown_blind(item)
        mine = [r for k, r in self.rows.items() if k[:2] == item.pair and k[3] == assessor]
        out["item"] = {
            "query": item.query, "doc_id": item.doc_id, "position": item.position, "of": len(self.queue.items),
            "held_out": item.held_out, "reason": item.reason, "blind": blind, "doc": self.docs.get(item.doc_id, {}),
            "evidence": None if blind else [c._asdict() for c in item.evidence],
            "frequency": None if blind else item.frequency,
            "your_grade": ({"grade": mine[0]["grade"], "note": mine[0].get("note")} if mine else None),
        }
        return out

    def next(self, assessor: str) -> dict[str, Any]:
        with self.lock:
            return self.view(self.queue.next_for(check_assessor(assessor)), assessor)

    def pair(self, assessor: str, query: str, doc_id: str) -> dict[str, Any]:
        """A given pair (from the disagreements view), whether or not the queue would serve it next."""
        with self.lock:
            return self.view(self._item(query, doc_id), check_assessor(assessor))

    def _item(self, query: str, doc_id: str) -> QueueItem:
        item = self.queue.item((query, doc_id))
        if item is None:
            raise NotInQueue(f"({query!r}, {doc_id!r}) is not in the review queue")
        return item

    # ------------------------------------------------------------------ what the page changes

    def grade(self, assessor: str, query: str, doc_id: str, grade: int, note: str | None) -> dict[str, Any]:
        """Store ``assessor``'s grade of the pair now; the view of the next pair."""
        assessor = check_assessor(assessor)
        if not 0 <= grade <= self.settings.grade_max:
            raise ReviewPageError(f"grade {grade} is outside 0..{self.settings.grade_max} (UBI_GRADE_MAX)")
        note = (note or "").strip() or None
        if note is not None and len(note) > NOTE_MAX:
            raise ReviewPageError(f"the note is {len(note):,} characters; at most {NOTE_MAX:,}")
        with self.lock:
            item = self._item(query, doc_id)
            source = "human" if self._shown_blind(item) else f"reviewed:{item.evidence[0].source}"
            # a second grade of a pair by one assessor replaces their first, whatever they were shown then, so that
            # an assessor never has two rows of one pair
            source = next((k[2] for k in self.rows if k[:2] == item.pair and k[3] == assessor), source)
            row = {"query_id": trec_query_id(query), "query": query, "doc_id": doc_id, "grade": grade,
                   "source": source, "assessor": assessor, "judged_at": utcnow(), "rubric": self.rubric.version,
                   "origin": ORIGIN, "note": note}
            self._write(row)
            replaced = self.rows.get(_key(row))
            self.rows[_key(row)] = row
            self.queue.record(item.pair, assessor)
            self.queue.unskip(item.pair, assessor)
            self.actions.setdefault(assessor, []).append(_Action("grade", item.pair, _key(row), replaced))
            return self.view(self.queue.next_for(assessor), assessor)

    def skip(self, assessor: str, query: str, doc_id: str) -> dict[str, Any]:
        """Pass the pair by for this assessor (others are still served it); the view of the next pair."""
        assessor = check_assessor(assessor)
        with self.lock:
            item = self._item(query, doc_id)
            self.queue.skip(item.pair, assessor)
            self.actions.setdefault(assessor, []).append(_Action("skip", item.pair))
            return self.view(self.queue.next_for(assessor), assessor)

    def undo(self, assessor: str) -> dict[str, Any]:
        """Take back the assessor's last grade or skip; the view of that pair again."""
        assessor = check_assessor(assessor)
        with self.lock:
            stack = self.actions.get(assessor)
            if not stack:
                raise ReviewPageError(f"{assessor} has nothing to undo")
            action = stack[-1]
            if action.kind == "grade" and action.key is not None:
                if action.replaced is not None:
                    self._write(action.replaced)
                    self.rows[action.key] = action.replaced
                else:
                    self._delete(action.key)
                    del self.rows[action.key]
                    if not any(k[:2] == action.pair and k[3] == assessor for k in self.rows):
                        self.queue.forget(action.pair, assessor)
            else:
                self.queue.unskip(action.pair, assessor)
            stack.pop()
            return self.view(self.queue.item(action.pair), assessor)

    def _write(self, row: dict[str, Any]) -> None:
        try:
            load_derived(self.db, "human_judgments", pa.Table.from_pylist([row], schema=HUMAN_JUDGMENT_SCHEMA))
        except duckdb.Error as exc:
            raise StoreError(f"{self.db}: could not store the grade: {exc}") from exc

    def _delete(self, key: tuple[str, str, str, str]) -> None:
        keys = pa.table({"query": [key[0]], "doc_id": [key[1]], "source": [key[2]], "assessor": [key[3]]})
        try:
            delete_derived(self.db, "human_judgments", keys)
        except duckdb.Error as exc:
            raise StoreError(f"{self.db}: could not delete the grade: {exc}") from exc

    # ------------------------------------------------------------------ overviews

    def progress(self) -> list[dict[str, Any]]:
        """Per assessor: grades among the queue's pairs, skips and what is left for them."""
        with self.lock:
            names = sorted({k[3] for k in self.rows} | set(self.actions))
            return [{"assessor": a or "(unnamed)", **self.queue.progress(a)} for a in names]

    def disagreements(self) -> list[dict[str, Any]]:
        """Pairs whose assessors gave different grades (any source), widest spread first, for adjudication."""
        with self.lock:
            by_pair: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for r in self.rows.values():
                by_pair.setdefault((r["query"], r["doc_id"]), []).append(r)
        out = []
        for (query, doc_id), rs in by_pair.items():
            grades = {r["grade"] for r in rs}
            if len({r["assessor"] for r in rs}) < 2 or len(grades) < 2:
                continue
            out.append({"query": query, "doc_id": doc_id, "spread": max(grades) - min(grades),
                        "in_queue": self.queue.item((query, doc_id)) is not None,
                        "grades": [{"assessor": r["assessor"], "grade": r["grade"], "source": r["source"],
                                    "note": r.get("note")} for r in sorted(rs, key=lambda r: (r["assessor"],
                                                                                              r["source"]))]})
        out.sort(key=lambda d: (-d["spread"], d["query"], d["doc_id"]))
        return out


def check_assessor(name: str) -> str:
    """An assessor's name as stored: trimmed, non-empty, at most :data:`ASSESSOR_MAX` characters."""
    name = (name or "").strip()
    if not name:
        raise ReviewPageError("name yourself: an assessor name is required (?assessor=NAME)")
    if len(name) > ASSESSOR_MAX:
        raise ReviewPageError(f"assessor name of {len(name)} characters; at most {ASSESSOR_MAX}")
    return name
