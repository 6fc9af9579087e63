"""Query-text normalisation shared by every stage that groups by query text."""

from __future__ import annotations

import re
import unicodedata

_SPACE = re.compile(r"\s+")


def normalize_query(text: str) -> str:
    """Unicode NFKC, case-folded, whitespace collapsed and trimmed: ``"  Ｐrinter   TONER "`` -> ``"printer toner"``."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()
