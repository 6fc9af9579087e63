"""ubi_pipeline.processors.clicks.stats: the cell sums taken a chunk of patterns at a time equal sums over the whole log at once
and sums written out by hand (a plain Python loop over every shown slot), on a random log with repeated docs,
short lists and weights."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from ubi_pipeline.processors.click_models.common import pair_support
from ubi_pipeline.processors.clicks.stats import (
    PairIndex,
    SessionPatterns,
    cells_from_sessions,
    ubm_cells_from_sessions,
)


def _log(n: int = 300, k: int = 5, n_pairs: int = 40, seed: int = 0) -> SessionPatterns:
    rng = np.random.default_rng(seed)
    docs = rng.integers(0, n_pairs, size=(n, k))
    docs[rng.random((n, k)) < 0.15] = -1  # shorter lists
    clicks = (rng.random((n, k)) < 0.3) & (docs >= 0)
    pairs = PairIndex(np.array([f"q{i % 7}" for i in range(n_pairs)], dtype=object),
                      np.array([f"d{i}" for i in range(n_pairs)], dtype=object), np.arange(n_pairs) % 7)
    return SessionPatterns(pairs, rng.integers(0, 7, size=n), docs, clicks, rng.integers(1, 5, size=n))


def _by_hand(s: SessionPatterns) -> tuple[Counter, Counter, Counter, Counter]:
    """PBM (pair, rank) and UBM (pair, rank, previous click rank) impressions and clicks, slot by slot."""
    pi, pc, ui, uc = Counter(), Counter(), Counter(), Counter()
    for docs, clicks, w in zip(s.docs.tolist(), s.clicks.tolist(), s.weight.tolist(), strict=True):
        prev = 0
        for r, (d, c) in enumerate(zip(docs, clicks, strict=True), start=1):
            if d >= 0:
                pi[d, r] += w
                pc[d, r] += w * c
                ui[d, r, prev] += w
                uc[d, r, prev] += w * c
            if c:
                prev = r
    return pi, pc, ui, uc


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_cells_equal_the_hand_sums(chunk: int) -> None:
    s = _log()
    pi, pc, ui, uc = _by_hand(s)
    c = cells_from_sessions(s, chunk=chunk)
    assert {(int(p), int(r)): int(n) for p, r, n in zip(c.pair, c.rank, c.impressions, strict=True)} == pi
    assert {(int(p), int(r)): int(n) for p, r, n in zip(c.pair, c.rank, c.clicks, strict=True)} == \
        {key: pc.get(key, 0) for key in pi}
    u = ubm_cells_from_sessions(s, chunk=chunk)
    got = {(int(p), int(r), int(q)): (int(n), int(x))
           for p, r, q, n, x in zip(u.pair, u.rank, u.prev_click, u.impressions, u.clicks, strict=True)}
    assert got == {key: (n, uc.get(key, 0)) for key, n in ui.items()}
    # cells come sorted by (pair, rank), as the one-chunk sums gave them
    assert np.all(np.diff(c.pair * (s.max_rank + 1) + c.rank) > 0)


def test_chunked_pair_support_equals_one_chunk() -> None:
    s = _log(seed=3)
    whole = pair_support(s, chunk=10_000)
    for chunk in (1, 5, 299):
        for a, b in zip(pair_support(s, chunk=chunk), whole, strict=True):
            np.testing.assert_array_equal(a, b)
    imps, clk, ses = whole
    # by hand: a doc shown twice in one list is one session there
    ses_hand = np.zeros(len(s.pairs), dtype=np.int64)
    for docs, w in zip(s.docs.tolist(), s.weight.tolist(), strict=True):
        for d in {d for d in docs if d >= 0}:
            ses_hand[d] += w
    np.testing.assert_array_equal(ses, ses_hand)
    assert imps.sum() == (s.weight[:, None] * (s.docs >= 0)).sum() and clk.sum() == (s.weight[:, None] * s.clicks).sum()


def test_no_patterns_give_no_cells() -> None:
    s = _log(n=0)
    assert len(cells_from_sessions(s).pair) == 0 and len(ubm_cells_from_sessions(s, chunk=3).pair) == 0
    assert all(len(a) == len(s.pairs) and not a.any() for a in pair_support(s))
