"""Shared fixtures: a hand-sized log with arithmetic worked out in the tests, and simulated traffic."""

from __future__ import annotations

import numpy as np
import pytest

from processors.stats import PairIndex, SessionPatterns


def make_pairs(n: int) -> PairIndex:
    """n pairs of one query: doc ids d0..d{n-1}."""
    return PairIndex(
        queries=np.array(["q"] * n, dtype=object),
        doc_ids=np.array([f"d{i}" for i in range(n)], dtype=object),
        query_index=np.zeros(n, dtype=np.int64),
    )


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
