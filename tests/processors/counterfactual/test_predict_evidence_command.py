"""``ubi predict`` reads every signal on unseen documents: the store's hit lists, the run's scores, ``--qrels``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.processors.ubi_records import build_store
from ubi_pipeline.cli import main
from ubi_pipeline.processors.simulation.heldout import HeldoutConfig, generate


@pytest.fixture(scope="module")
def heldout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A held-out log in a store (20 hits returned, 10 displayed), candidate 1 as a TREC run, grades as JSONL."""
    d = tmp_path_factory.mktemp("heldout")
    log = generate(HeldoutConfig(examination="plateau", queries=30, searches=1500, seed=7))
    queries, events = log.ubi_records()
    db = build_store(d / "h.duckdb", queries, events)
    run = d / "cand.trec"
    run.write_text("".join(f"{q} Q0 {doc} {r + 1} {log.candidate_scores['candidate1'][q][doc]:.6f} c1\n"
                           for q, docs in log.candidates["candidate1"].items() for r, doc in enumerate(docs)))
    qrels = d / "grades.jsonl"
    qrels.write_text("".join(json.dumps({"query_id": q, "query": q, "relevant": {d: int(g) for d, g in gr.items()}})
                             + "\n" for q, gr in log.grades.items()))
    return db, run, qrels


def _predict(db: Path, run: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    assert main(["predict", "--db", str(db), "--run", str(run), "--replicates", "0", "--method", "dr",
                 "--json", *extra]) == 0
    (candidate,) = json.loads(capsys.readouterr().out)["candidates"]
    return candidate["prediction"]


def test_hit_lists_scores_and_qrels_each_count(heldout: tuple[Path, Path, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    db, run, qrels = heldout
    bare = _predict(db, run, capsys)
    shares = bare["evidence_shares"]
    assert sum(shares.values()) == pytest.approx(1.0)
    # the candidate's unseen documents rest on the hit lists below the display and on its scores, not the prior
    assert shares["returned_not_shown"] > 0.1 and shares["candidate_score"] > 0 and shares["human_grade"] == 0
    assert shares["prior"] == 0
    graded = _predict(db, run, capsys, "--qrels", str(qrels))
    assert graded["evidence_shares"]["human_grade"] > 0  # --qrels now changes what the prediction rests on
    assert graded["evidence_shares"]["shown"] == pytest.approx(shares["shown"])
    b, g = bare["methods"]["dr"]["ctr@10"], graded["methods"]["dr"]["ctr@10"]
    assert (g["calibrated_low"], g["calibrated_high"]) != (b["calibrated_low"], b["calibrated_high"])
