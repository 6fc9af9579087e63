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
    # issue 24: one document lists every candidate (before, it held one, and `--run A --run B` predicted B alone)
    (cand,) = out["candidates"]
    assert cand["candidate"] == "ideal"
    pred = cand["prediction"]
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


def test_every_run_is_predicted_and_trec_ids_are_percent_decoded(store: tuple[Path, Path, float], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # issue 24: `--run A --run B` predicted B only, silently; and a TREC run whose query ids are percent-escaped
    # texts (what `ubi judgments export --format trec` writes) matched no logged query. The TREC run below is the
    # ideal run's rankings with each text escaped, so it must be predicted exactly as the JSONL one is.
    from ubi_pipeline.processors.labels.implicit import trec_query_id

    db, run, _ = store
    rows = [json.loads(line) for line in run.read_text().splitlines()]
    assert any(" " in r["query_id"] for r in rows)  # the texts hold spaces: escaping is needed
    trec = tmp_path / "ideal.trec"
    trec.write_text("".join(f"{trec_query_id(r['query_id'])} Q0 {d} {i + 1} {len(r['doc_ids']) - i} ideal\n"
                            for r in rows for i, d in enumerate(r["doc_ids"])))
    assert main(["predict", "--db", str(db), "--run", f"{run}=ideal-jsonl", "--run", f"{trec}=ideal-trec",
                 "--replicates", "0", "--method", "dm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [c["candidate"] for c in out["candidates"]]
    assert names == ["ideal-jsonl", "ideal-trec"] and len(out["inputs"]["runs"]) == 2
    a, b = (c["prediction"] for c in out["candidates"])
    assert a["covered_queries"] == b["covered_queries"] == 40  # every escaped id found its logged query
    # the same documents at the same ranks: the same share shown in the log; the TREC run also carries scores,
    # which value the documents the log never showed (the JSONL rankings have none), so the figures may differ
    assert a["evidence_shares"]["shown"] == pytest.approx(b["evidence_shares"]["shown"], abs=1e-12)
    assert a["evidence_shares"]["candidate_score"] == 0 and b["evidence_shares"]["candidate_score"] > 0
    # each candidate has a verdict against each logged system
    assert {v["logged"] for v in out["candidates"][0]["verdict"]} == set(out["logged"])
    # the text output lists both candidates too
    text = tmp_path / "p.txt"
    assert main(["predict", "--db", str(db), "--run", f"{run}=ideal-jsonl", "--run", f"{trec}=ideal-trec",
                 "--replicates", "0", "--method", "dm", "--out", str(text)]) == 0
    t = text.read_text()
    assert "ideal-jsonl · dm" in t and "ideal-trec · dm" in t and t.count("verdict:") == 2 * len(out["logged"])


def test_a_query_set_maps_run_ids_to_texts(store: tuple[Path, Path, float], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    # the query-set ids `ubi judgments import --queries` accepts: a run keyed by q0, q1, ... and the set mapping them
    db, run, _ = store
    rows = [json.loads(line) for line in run.read_text().splitlines()]
    ids = tmp_path / "ids.jsonl"
    ids.write_text("".join(json.dumps({"query_id": f"q{i}", "doc_ids": r["doc_ids"]}) + "\n" for i, r in enumerate(rows)))
    qs = tmp_path / "qs.jsonl"
    qs.write_text("".join(json.dumps({"query_id": f"q{i}", "query": r["query_id"]}) + "\n" for i, r in enumerate(rows)))
    assert main(["predict", "--db", str(db), "--run", str(ids), "--replicates", "0", "--method", "dm", "--json"]) == 2
    capsys.readouterr()  # without the set no id is a logged query ("none of the candidate's 40 queries")
    assert main(["predict", "--db", str(db), "--run", str(ids), "--queries", str(qs), "--replicates", "0",
                 "--method", "dm", "--json"]) == 0
    (cand,) = json.loads(capsys.readouterr().out)["candidates"]
    assert cand["prediction"]["covered_queries"] == 40


def test_predict_shows_bootstrap_progress_on_a_terminal_only(store: tuple[Path, Path, float],
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: the bootstrap (one click-model fit per replicate) is the long part of `ubi predict`, so a bar
    counts its replicates on stderr when stderr is a terminal; never in a pipe, never under --json."""
    from rich.console import Console

    from ubi_pipeline.processors.counterfactual.predict import predict, query_texts

    patterns = simulate(sessions=300, seed=5, rankers=2).patterns()
    pairs = patterns.pairs
    rankings = {text: [str(d) for d in pairs.doc_ids[pairs.query_index == q][:10]]
                for q, text in enumerate(query_texts(patterns))}
    ticks: list[int] = []
    predict(patterns, rankings, methods=("dm",), replicates=4, progress=ticks.append)
    assert ticks == [1, 2, 3, 4]

    db, run, _ = store
    args = ["predict", "--db", str(db), "--run", f"{run}=ideal", "--replicates", "3", "--method", "dm"]
    assert main(args) == 0
    assert "bootstrap" not in capsys.readouterr().err  # stderr is a pipe here: no bar
    monkeypatch.setattr(Console, "is_terminal", property(lambda self: True))
    assert main(args) == 0
    assert "bootstrap (ideal)" in capsys.readouterr().err
    assert main([*args, "--json"]) == 0
    assert "bootstrap" not in capsys.readouterr().err
