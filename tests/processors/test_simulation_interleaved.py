"""Interleaved simulated traffic: no preference between equal rankers, a clear one for a better ranker."""

from __future__ import annotations

import numpy as np

from ubi_pipeline.processors.counterfactual.validate import ranker_slots
from ubi_pipeline.processors.simulation import SimConfig, simulate
from ubi_pipeline.processors.simulation.interleaved import simulate_interleaved
from ubi_pipeline.reports.interleaving_outcomes import outcomes, sign_test, win_rate


def _truth():  # type: ignore[no-untyped-def]
    return simulate(SimConfig(sessions=1, seed=2)).truth


def test_equal_rankers_no_preference_and_credits_follow_teams() -> None:
    truth = _truth()
    rng = np.random.default_rng(0)
    base = ranker_slots(truth, 1.0, 7)
    query = rng.integers(0, truth.catalog.n_queries, size=3000)
    il = simulate_interleaved(truth, base, base.copy(), query, rng)
    # identical lists: every draft shows the ranker's list itself, teams split it 5/5
    assert (il.slots == base[query]).all()
    assert ((il.team == 0).sum(axis=1) == 5).all()
    cr = il.credits()
    assert cr.sum() == il.clicks.sum()
    out = outcomes(cr)
    assert abs(win_rate(out) - 0.5) < 0.05  # the team a result lands in is a coin flip: no preference
    assert sign_test(int((out > 0).sum()), int((out < 0).sum())) > 0.01


def test_a_better_challenger_wins() -> None:
    truth = _truth()
    rng = np.random.default_rng(1)
    base, better = ranker_slots(truth, 2.0, 3), ranker_slots(truth, 0.3, 4)
    query = rng.integers(0, truth.catalog.n_queries, size=2000)
    out = outcomes(simulate_interleaved(truth, base, better, query, rng).credits())
    wins, losses = int((out > 0).sum()), int((out < 0).sum())
    assert wins / (wins + losses) > 0.6
    assert sign_test(wins, losses) < 1e-6


def test_cli_interleaved_traffic_reaches_the_report(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`ubi simulate --interleave` -> `ubi import` -> `ubi report`: the Interleaving section on the simulated log.

    ranker-a (σ 0.5) challenges ranker-c (σ 2.0) on half the searches; a better ranker puts more relevant
    results in its team's slots, so it must win more interleaved searches than it loses (test above).
    """
    import json

    from ubi_pipeline.cli import main

    out, db = tmp_path / "il.ndjson", tmp_path / "ubi.duckdb"
    assert main(["simulate", "--sessions", "3000", "--seed", "5", "--interleave", "ranker-c,ranker-a", "--out",
                 str(out), "--qrels", str(tmp_path / "q.jsonl"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    n_il = summary["interleaved_searches"]
    assert 1200 < n_il < 1800 and summary["interleave"] == ["ranker-c", "ranker-a"]  # share 0.5 of 3000
    assert sum(r["searches"] for r in summary["rankers"]) == 3000 - n_il
    blocks = []
    for line in out.read_text().splitlines():
        doc = json.loads(line)
        if "query_response_hit_ids" in doc and "interleaving" in doc["query_attributes"]:
            blocks.append((doc["query_response_hit_ids"], doc["query_attributes"]))
    assert len(blocks) == n_il
    hits, attrs = blocks[0]
    assert attrs["ranker"] == "interleaved"
    block = attrs["interleaving"]
    assert block["method"] == "team_draft" and block["rankers"] == ["ranker-c", "ranker-a"]
    assert list(block["teams"]) == hits and set(block["teams"].values()) <= {"ranker-a", "ranker-c"}

    assert main(["import", str(out), "--db", str(db)]) == 0
    capsys.readouterr()
    report = tmp_path / "r.json"
    # --predict-replicates 0: the Interleaving section read here does not rest on the predicted online metrics
    # of the non-interleaved rankers, whose bootstrap (50 refits per replicate set) was most of the report's time
    assert main(["report", "--db", str(db), "--qrels", str(tmp_path / "q.jsonl"), "--json", "--out",
                 str(report), "--predict-replicates", "0"]) == 0
    section = json.loads(report.read_text())["interleaving"]
    assert [r["experiment"] for r in section] == ["ranker-a-vs-ranker-c"]
    s = section[0]["by_search"]
    assert s["wins"] + s["losses"] + s["ties"] <= n_il
    assert s["win_rate"] > 0.55 and s["p_value"] < 0.01


def test_interleaving_leaves_the_other_searches_as_they_were() -> None:
    """The interleaving stream is a new one: queries, and the lists of the searches not interleaved, are unchanged."""
    import pytest

    from ubi_pipeline.processors.simulation.catalog import SimulationError

    plain = simulate(SimConfig(sessions=2000, seed=4, randomize=0.1))
    il = simulate(SimConfig(sessions=2000, seed=4, randomize=0.1, interleave=("ranker-b", "ranker-a"),
                            interleave_share=0.3))
    assert il.team is not None
    inside = il.team[:, 0] >= 0
    assert 400 < inside.sum() < 800
    assert (il.query == plain.query).all()
    assert (il.slots[~inside] == plain.slots[~inside]).all() and (il.ranker[~inside] == plain.ranker[~inside]).all()
    assert (il.ranker[inside] == -1).all() and (il.swap[inside] == 0).all()
    assert ((il.team[inside] == 0).sum(axis=1) == 5).all()  # 10 slots, two teams: 5 each by the draft's rule
    with pytest.raises(SimulationError, match="no ranker named 'ranker-z'"):
        simulate(SimConfig(sessions=10, interleave=("ranker-a", "ranker-z")))
