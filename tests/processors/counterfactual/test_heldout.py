"""The primary interval on held-out logs (``simulation.heldout``): a small, fast ``bench/counterfactual_heldout.py``.

Logs the rules were not built on: two weak logging rankers (20 returned, 10 displayed), two better candidates
that surface documents the log returned but never displayed. The doubly robust estimator's primary interval
must hold the exact CTR@10 and never order a candidate the wrong way against a logged system, with human
grades for a third of the queries and without. The bootstrap interval alone (sampling error only) fails
the same check, which is what the primary interval's widening is for.
"""

from __future__ import annotations

from functools import cache

import pytest

from ubi_pipeline.processors.counterfactual.evidence import UnseenEvidence
from ubi_pipeline.processors.counterfactual.predict import Figure, ordering, predict
from ubi_pipeline.processors.simulation.heldout import HeldoutConfig, generate

#: fresh seeds (the evidence rules were looked at on seeds 0-3 of the full-size bench); small logs
CASES = [("exponential", 2101), ("plateau", 2102)]


@cache  # the two tests read the same predictions
def _checks(examination: str, seed: int) -> list[tuple[str, Figure, float, list[str]]]:
    log = generate(HeldoutConfig(examination=examination, queries=100, searches=8000, seed=seed))
    out = []
    for cand, rankings in log.candidates.items():
        truth = log.exact[cand]
        for qrels in (False, True):
            ev = UnseenEvidence(grades=log.grades if qrels else {}, returned=log.returned,
                                scores=log.candidate_scores[cand])
            f = predict(log.patterns, rankings, model="pbm", methods=("dr",), replicates=30, seed=seed,
                        evidence=ev).figures["dr"]["ctr@k"]
            orders = []
            for system, (_, low, high) in log.observed.items():
                side = ordering(f, low, high)
                true_side = "above" if truth > log.exact[system] else "below"
                orders.append("undetermined" if side == "undetermined" else ("right" if side == true_side else "wrong"))
            out.append((f"{cand} qrels={qrels}", f, truth, orders))
    return out


@pytest.mark.parametrize(("examination", "seed"), CASES)
def test_the_primary_interval_holds_and_never_orders_wrong(examination: str, seed: int) -> None:
    results = _checks(examination, seed)
    for label, f, truth, orders in results:
        assert f.cal_low <= truth <= f.cal_high, (label, f, truth)
        assert "wrong" not in orders, (label, orders)
    rights = sum(orders.count("right") for *_, orders in results)
    assert rights >= len(results)  # and it does decide: at least one right order per candidate and setting


def test_the_bootstrap_interval_alone_would_fail() -> None:
    misses = [label for ex, seed in CASES for label, f, truth, _ in _checks(ex, seed) if not f.low <= truth <= f.high]
    assert len(misses) >= 2, misses
