"""``ubi predict`` on a simulated store: JSON shape, the logged systems beside, and a better ranker predicted better."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ubi_pipeline.cli import main
from ubi_pipeline.collector.ingest import ingest, parse_bulk, validate_items
from ubi_pipeline.processors.counterfactual.direct import aggregate, pbm_position_probs, query_metrics
from ubi_pipeline.processors.simulation import simulate
from ubi_pipeline.store.duckdb_store import Store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """3,000 searches by two noisy rankers (a third in a swap experiment) and the ideal ranker as a run file.

    Returns the store, the run and the ideal ranker's exact CTR@10 on the logged query distribution.
    """
    d = tmp_path_factory.mktemp("predict")
    traffic = simulate(sessions=3000, seed=5, rankers=2, ranker_noise=(1.0, 2.0), epochs=2, randomize=0.3)
    traffic.write_bulk(d / "sim.ndjson")
    with Store(d / "sim.duckdb") as s:
        assert ingest(s, validate_items(parse_bulk((d / "sim.ndjson").read_bytes())), source="test").rejected == 0
    cat, truth = traffic.truth.catalog, traffic.truth
    order = np.argsort(-cat.grades, axis=1, kind="stable")[:, :10]  # the ideal ranker: by true grade
    # query texts hold spaces, which TREC run lines cannot: JSONL rankings (ubi_pipeline.formats.runs)
    run = d / "ideal.jsonl"
    run.write_text("".join(json.dumps({"query_id": cat.query_texts[q], "doc_ids": [str(cat.doc_ids[q, j])
                                       for j in order[q]]}) + "\n" for q in range(cat.n_queries)))
    alpha = truth.attractiveness[np.arange(cat.n_queries)[:, None], order]
    searches = np.bincount(traffic.query, minlength=cat.n_queries).astype(float)
    exact = aggregate(query_metrics(pbm_position_probs(truth.theta, alpha), 10), searches)["ctr@k"]
    return d / "sim.duckdb", run, exact


def test_predict_json(store: tuple[Path, Path, float], capsys: pytest.CaptureFixture[str]) -> None:
    db, run, exact = store
    code = main(["predict", "--db", str(db), "--run", f"{run}=ideal", "--replicates", "40", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["candidate"] == "ideal"
    pred = out["prediction"]
    assert set(pred["methods"]) == {"dm", "ips", "snips", "dr"}
    assert set(pred["methods"]["dm"]) == {"ctr@10", "clicks_per_search", "abandonment", "rr_first_click"}
    assert set(pred["methods"]["ips"]) == {"ctr@10", "clicks_per_search"}
    assert pred["propensity"] == "randomized"  # the log holds a swap experiment
    assert pred["searches"] == 3000 and pred["covered_queries"] == 40
    assert set(out["logged"]) == {"ubi-sim/ranker=ranker-a", "ubi-sim/ranker=ranker-b"}
    best_logged = max(v["ctr@10"]["value"] for v in out["logged"].values())
    for method in ("dm", "dr"):
        fig = pred["methods"][method]["ctr@10"]
        assert fig["ci_low"] <= fig["value"] <= fig["ci_high"]
        assert fig["value"] > best_logged  # the ideal ranker beats both logged ones
        assert fig["value"] == pytest.approx(exact, abs=0.02), method  # exact: from θ and α of the truth


def test_predict_table_and_errors(store: tuple[Path, Path, float], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    db, run, _ = store
    out = tmp_path / "p.txt"
    assert main(["predict", "--db", str(db), "--run", str(run), "--method", "dm,ips", "--replicates", "0",
                 "--model", "dbn", "--out", str(out)]) == 0
    text = out.read_text()
    assert "ideal · dm" in text and "ideal · ips" in text and "ubi-sim/ranker=ranker-a · logged" in text
    assert "never shown for its query" in text and "calibrated range" in text
    assert main(["predict", "--db", str(db), "--run", str(run), "--method", "magic"]) == 2
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"query_id": "no such query", "doc_ids": ["x"]}) + "\n")
    assert main(["predict", "--db", str(db), "--run", str(other), "--replicates", "0"]) == 2
    assert "none of the candidate's 1 queries" in capsys.readouterr().err
