"""The held-out split of searches: a search is held out when the first 32 bits of md5(query_id) fall below a cut.

The rule is the same in SQL (the session build, the system rankings) and in Python (:func:`holdout_flags`), so a
model fitted on one fold never sees a held-out search, whichever path read it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

#: ``load_sessions(application=...)`` default: every application
ALL_APPLICATIONS = object()

#: held-out flags use the first 32 bits of md5(query_id)
HASH_SPACE = 1 << 32


def holdout_cut(fraction: float) -> int:
    """The 32-bit threshold below which a search's hash puts it in the held-out split."""
    return int(round(fraction * HASH_SPACE))


def holdout_flags(query_ids: Iterable[str], fraction: float) -> np.ndarray:
    """Per search: held out? The first 32 bits of md5(query_id) below ``fraction`` of 2^32 (as the SQL does)."""
    cut = holdout_cut(fraction)
    return np.fromiter((int(hashlib.md5(q.encode()).hexdigest()[:8], 16) < cut for q in query_ids), dtype=bool)
