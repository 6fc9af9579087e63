"""A search session as the processors see it: one search instance, what it displayed, what was clicked."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple


class Session(NamedTuple):
    """One search instance (``query_id``) with its displayed ranking and clicks.

    ``doc_ids[i]`` was displayed at ``ranks[i]`` (1-based, increasing, gaps allowed where nothing is known
    to have been shown) and ``clicked[i]`` says whether it was clicked. ``query`` is the normalised text.
    """

    query_id: str
    query: str
    doc_ids: tuple[str, ...]
    ranks: tuple[int, ...]
    clicked: tuple[bool, ...]
    client_id: str | None = None
    application: str | None = None
    timestamp: datetime | None = None
