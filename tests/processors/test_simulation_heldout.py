"""The held-out generator (``ubi_pipeline.processors.simulation.heldout``): what it logs and what it knows."""

from __future__ import annotations

import numpy as np
import pytest

from ubi_pipeline.processors.simulation.catalog import SimulationError
from ubi_pipeline.processors.simulation.heldout import EXAMINATIONS, HeldoutConfig, generate


@pytest.mark.parametrize("examination", EXAMINATIONS)
def test_the_log_and_its_truth(examination: str) -> None:
    cfg = HeldoutConfig(examination=examination, queries=60, searches=6000, seed=3)
    log = generate(cfg)
    pat = log.patterns
    pat.check()
    assert pat.n_sessions == 6000 and pat.max_rank == 10 and (pat.docs >= 0).all()  # every search shows 10
    assert set(log.candidates) == {"candidate1", "candidate2"} and set(log.observed) == {"logger1", "logger2"}
    for rankings in log.candidates.values():
        assert len(rankings) == 60 and all(len(r) == 20 for r in rankings.values())
    # what the hit lists returned below the display was never shown for that query
    shown = {(str(q), str(d)) for q, d in zip(pat.pairs.queries, pat.pairs.doc_ids, strict=True)}
    below = {(q, d) for q, docs in log.returned.items() for d in docs}
    assert below and not below & shown
    assert all(10 < r <= 20 for docs in log.returned.values() for r in docs.values())
    # the exact CTR@10 of each logger is what its simulated searches did (within 3 standard errors)
    for system, (observed, low, high) in log.observed.items():
        assert abs(log.exact[system] - observed) <= 3 * (high - low) / 3.92, system
    # the candidates surface documents the log never displayed: a fifth of their top 10 or more
    for name, rankings in log.candidates.items():
        unseen = sum((q, d) not in shown for q, r in rankings.items() for d in r[:10])
        assert unseen / (60 * 10) > 0.2, name


def test_grades_for_a_third_of_the_queries_and_seeded() -> None:
    a = generate(HeldoutConfig(queries=300, searches=3000, seed=11))
    b = generate(HeldoutConfig(queries=300, searches=3000, seed=11))
    assert a.exact == b.exact and a.grades == b.grades and a.returned == b.returned
    assert 70 <= len(a.grades) <= 130  # Binomial(300, 1/3): mean 100, sd 8.2
    assert all(len(g) == 30 and set(g.values()) <= {0.0, 1.0, 2.0, 3.0, 4.0} for g in a.grades.values())
    assert generate(HeldoutConfig(queries=300, searches=3000, seed=12)).exact != a.exact
    with pytest.raises(SimulationError, match="examination"):
        generate(HeldoutConfig(examination="linear"))
    with pytest.raises(SimulationError, match="displayed"):
        generate(HeldoutConfig(displayed=25))


def test_cascade_truth_matches_a_long_simulation() -> None:
    # the cascade's exact figure (a recursion) inside the 95% interval of its 200,000 simulated searches (seeded)
    log = generate(HeldoutConfig(examination="cascade", queries=20, searches=200_000, seed=5))
    observed, low, high = log.observed["logger1"]
    assert low <= log.exact["logger1"] <= high
    assert np.isfinite(observed)
