"""Judgment and ranking records shared by processors and reports."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

#: the kind prefix of a model judge's source, ``model:<name>``
MODEL_PREFIX = "model:"
#: what a model source's name may hold: no blanks or commas, so that it survives ``--precedence`` and ``--sources``
#: lists and file names unquoted (``ubi judge`` makes such a name of any ``--model``)
MODEL_NAME = re.compile(r"[A-Za-z0-9._-]+")


def model_source_problem(source: str) -> str | None:
    """What is wrong with ``source`` as a model judge's source name, or None when it is one (``model:gpt-4o-mini``)."""
    if not source.startswith(MODEL_PREFIX):
        return f"expected {MODEL_PREFIX}NAME"
    name = source[len(MODEL_PREFIX):]
    if not name:
        return f"expected {MODEL_PREFIX}NAME, the name is missing"
    if not MODEL_NAME.fullmatch(name):
        return f"the name {name!r} may hold only letters, digits, '.', '_' and '-'"
    return None


class Judgment(BaseModel):
    """A candidate (implicit) judgment for one (normalised query, doc): a score with its evidence.

    ``source`` is ``implicit:<model>``; ``grade`` is on the human scale, or ``None`` when the pair has too
    little support or too wide an interval to be graded.
    """

    model_config = ConfigDict(frozen=True)

    query: str
    doc_id: str
    source: str
    model_version: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    score: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    impressions: int = 0
    clicks: int = 0
    sessions: int = 0
    grade: int | None = None
    created_at: datetime


class HumanJudgment(BaseModel):
    """A judgment a person made (or reviewed): ``source`` is ``human`` or ``reviewed:<implicit source>``."""

    model_config = ConfigDict(frozen=True)

    query: str
    doc_id: str
    grade: int = Field(ge=0)
    source: str = "human"
    query_id: str | None = None
    assessor: str | None = None
    judged_at: datetime | None = None
    rubric: str | None = None
    origin: str | None = None


class Qrel(NamedTuple):
    """One graded (query, doc) pair as metrics consume it."""

    query_id: str
    doc_id: str
    grade: int


class ScoredDoc(NamedTuple):
    """One ranked doc of a run as metrics consume it."""

    query_id: str
    doc_id: str
    score: float
