"""Team-draft interleaving (Radlinski, Kurup & Joachims, CIKM 2008): one list from two rankers' lists.

The two rankers are teams that take turns: the team with fewer picks so far picks next, and a coin decides
when both have picked as often; each picks its highest-ranked result not yet in the list. A click on a result
credits the team that contributed it. When one ranker has nothing new left, the other fills the remaining
slots (common practice; the original stops there), so the list is as long as both rankers allow.

Pure and deterministic: the coins come from a generator seeded with SHA-256 of ``seed`` and the ``query_id``,
so a retried request with the same query id gets the same list and teams. What the search backend logs, in
the query record's ``query_attributes``, is :func:`query_attributes` of the result::

    {"interleaving": {"method": "team_draft", "rankers": ["baseline", "candidate"],
                      "teams": {"doc-7": "baseline", "doc-3": "candidate", ...}}}

``rankers`` lists the reference ranker first; ``teams`` maps every interleaved doc id to its team.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ubi_pipeline.schemas.errors import UbiError

METHOD = "team_draft"
ATTRIBUTE = "interleaving"  # the query_attributes key


class InterleavingError(UbiError):
    """Rankings that cannot be interleaved (names the field and what was expected; the collector answers 400)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(f"field '{field}': {message}")
        self.field = field


@dataclass(frozen=True)
class Interleaved:
    """The interleaved list, who contributed each result, and the coins that decided it."""

    query_id: str
    hits: list[str]
    teams: dict[str, str]  # doc id -> ranker name
    rankers: tuple[str, str]  # (reference, challenger), in the request's order

    def query_attributes(self) -> dict[str, Any]:
        """The block the backend puts in the query record's ``query_attributes`` (module docstring)."""
        return {ATTRIBUTE: {"method": METHOD, "rankers": list(self.rankers),
                            "teams": {d: self.teams[d] for d in self.hits}}}


def _rng(query_id: str, seed: int) -> random.Random:
    digest = hashlib.sha256(f"{seed}\x1f{query_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def team_draft(
    query_id: str, rankings: Mapping[str, Sequence[str]], *, size: int | None = None, seed: int = 0
) -> Interleaved:
    """Interleave exactly two rankings (name -> doc ids, best first) into at most ``size`` results.

    ``size`` defaults to the longer ranking's length. Duplicate ids within one ranking count once (the first).
    """
    if not isinstance(query_id, str) or not query_id:
        raise InterleavingError("expected a non-empty string", field="query_id")
    if len(rankings) != 2:
        raise InterleavingError(f"expected exactly two rankings, got {len(rankings)}", field="rankings")
    names = tuple(rankings)
    lists = []
    for name in names:
        docs = rankings[name]
        if not isinstance(docs, Sequence) or isinstance(docs, str) or not all(isinstance(d, str) and d for d in docs):
            raise InterleavingError("expected a list of non-empty doc id strings", field=f"rankings.{name}")
        lists.append(list(dict.fromkeys(docs)))
    limit = max(len(x) for x in lists) if size is None else size
    if limit < 0:
        raise InterleavingError(f"expected a size >= 0, got {size}", field="size")
    rng = _rng(query_id, seed)
    hits: list[str] = []
    teams: dict[str, str] = {}
    picks = [0, 0]
    pos = [0, 0]

    def next_new(t: int) -> str | None:
        while pos[t] < len(lists[t]) and lists[t][pos[t]] in teams:
            pos[t] += 1
        return lists[t][pos[t]] if pos[t] < len(lists[t]) else None

    while len(hits) < limit:
        cand = [next_new(0), next_new(1)]
        if cand[0] is None and cand[1] is None:
            break
        if cand[0] is None or cand[1] is None:
            t = 0 if cand[1] is None else 1
        elif picks[0] != picks[1]:
            t = 0 if picks[0] < picks[1] else 1
        else:
            t = rng.randrange(2)
        doc = cand[t]
        if doc is None:  # unreachable: t always names a ranker with a new doc
            break
        hits.append(doc)
        teams[doc] = names[t]
        picks[t] += 1
    return Interleaved(query_id, hits, teams, (names[0], names[1]))
