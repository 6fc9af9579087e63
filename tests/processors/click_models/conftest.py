"""Shared fixture: a hand-sized log whose arithmetic is worked out in the tests."""

from __future__ import annotations

import numpy as np
import pytest
from click_logs import make_pairs

from ubi_pipeline.processors.clicks.stats import SessionPatterns


@pytest.fixture
def tiny_log() -> SessionPatterns:
    """Pairs A=0, B=1, C=2, D=3 (D never shown), two ranks.

    pattern  ranking  clicks   weight
    p1       A, B     1, 0     3
    p2       B, A     1, 1     1
    p3       A, C     0, 0     2
    p4       C, -     0, -     4
    """
    return SessionPatterns(
        pairs=make_pairs(4),
        query=np.zeros(4, dtype=np.int64),
        docs=np.array([[0, 1], [1, 0], [0, 2], [2, -1]]),
        clicks=np.array([[1, 0], [1, 1], [0, 0], [0, 0]], dtype=bool),
        weight=np.array([3, 1, 2, 4]),
    )
