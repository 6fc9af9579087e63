"""Agreement among assessors: Krippendorff's alpha and Cohen's kappa with bootstrap intervals, in every report format.

Golden values: Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", the 4-coder x 12-unit example
(values 1-5, missing cells) with its published alphas nominal 0.743, ordinal 0.815, interval 0.849; and the
reference implementation, the PyPI package ``krippendorff`` 0.9.0 (fast-krippendorff, Castro), on random data.
Kappa by hand (Cohen 1968 formula, worked below).
"""

from __future__ import annotations

import html
import json
import math
from datetime import datetime
from pathlib import Path

import krippendorff
import numpy as np
import pyarrow as pa
import pytest
from joint_fixtures import build_store

from ubi_pipeline.cli import main
from ubi_pipeline.processors.labels.grades import quadratic_kappa_from_confusion
from ubi_pipeline.processors.labels.merge import Label, LabelSet
from ubi_pipeline.processors.labels.reliability import (
    ReliabilityError,
    bootstrap_alpha,
    bootstrap_kappa,
    kappa_batch,
    krippendorff_alpha,
)
from ubi_pipeline.reports.agreement import DISPUTED_SHOWN, assessor_agreement
from ubi_pipeline.reports.intervals import why_no_interval
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import HUMAN_JUDGMENT_SCHEMA

N = np.nan
#: Krippendorff (2011), section C: coders A-D (rows) x units 1-12 (columns)
KRIPPENDORFF_2011 = np.array([
    [1, 2, 3, 3, 2, 1, 4, 1, 2, N, N, N],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, N, 3],
    [N, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, N],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, N],
])


@pytest.mark.parametrize(("metric", "published"), [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849)])
def test_krippendorff_published_example(metric: str, published: float) -> None:
    got = krippendorff_alpha(KRIPPENDORFF_2011, metric)
    assert round(got, 3) == published
    assert got == pytest.approx(krippendorff.alpha(reliability_data=KRIPPENDORFF_2011, level_of_measurement=metric),
                                abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("metric", ["nominal", "ordinal", "interval"])
def test_alpha_matches_the_reference_package(seed: int, metric: str) -> None:
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 4, 80)
    # 5 assessors who mostly agree, each missing about a third of the units
    data = np.clip(truth + rng.integers(-1, 2, (5, 80)) * (rng.random((5, 80)) < 0.4), 0, 3).astype(float)
    data[rng.random(data.shape) < 0.35] = np.nan
    ours = krippendorff_alpha(data, metric, n_grades=4)
    ref = krippendorff.alpha(reliability_data=data, level_of_measurement=metric, value_domain=[0, 1, 2, 3])
    assert ours == pytest.approx(ref, abs=1e-10)
    assert 0.3 < ours < 1.0  # mostly agreeing assessors: a clearly positive alpha, so the check is not vacuous


def test_kappa_by_hand_and_bootstrap_bounds() -> None:
    # a = (0, 1, 2), b = (0, 2, 2), G = 3, w = (i-j)^2/4. Observed: only (1, 2) off the diagonal: Σ w·O = 1/4.
    # Marginals a (1, 1, 1), b (1, 0, 2), N = 3: E[i] = (1/3, 0, 2/3) for every row i, so Σ w·E =
    # row 0: 1·2/3 + row 1: (1/4)/3 + (1/4)·2/3 + row 2: 1/3 = 2/3 + 1/4 + 1/3 = 5/4; kappa = 1 - (1/4)/(5/4) = 0.8
    k = bootstrap_kappa(np.array([0, 1, 2]), np.array([0, 2, 2]), 3)
    assert k.value == pytest.approx(0.8) and k.n == 3
    rng = np.random.default_rng(5)
    a = rng.integers(0, 4, 200)
    b = np.clip(a + rng.integers(-1, 2, 200), 0, 3)
    est = bootstrap_kappa(a, b, 4, n_boot=500, seed=1)
    assert est.low < est.value < est.high and est.high - est.low < 0.2
    assert bootstrap_kappa(a, b, 4, n_boot=500, seed=1) == est  # seeded: the same interval again
    alpha = bootstrap_alpha(np.vstack([a, b]).astype(float), n_grades=4, n_boot=500, seed=1)
    assert alpha.low < alpha.value < alpha.high and alpha.n == 200
    with pytest.raises(ReliabilityError, match="non-negative"):
        krippendorff_alpha(np.array([[0, -1], [0, 1]]))
    with pytest.raises(ReliabilityError, match="metric"):
        krippendorff_alpha(KRIPPENDORFF_2011, "ratio-ish")


def test_kappa_batch_is_the_kernel_on_each_matrix() -> None:
    rng = np.random.default_rng(7)
    mats = rng.integers(0, 6, (50, 4, 4)).astype(float)
    mats[3] = 0.0  # no pairs: undefined
    mats[4] = 0.0
    mats[4, 2, 2] = 5.0  # one grade on both sides: undefined
    got = kappa_batch(mats)
    want = np.array([quadratic_kappa_from_confusion(m) for m in mats])
    assert np.allclose(got, want, equal_nan=True) and np.isnan(got[3]) and np.isnan(got[4])


def _lab(doc: str, grade: int, who: str, note: str | None = None) -> Label:
    return Label("q", doc, grade, "human", origin="store", assessor=who, note=note)


def test_assessor_agreement_units_disputes_and_small_n() -> None:
    labels = LabelSet().add([
        _lab("d1", 3, "ann"), _lab("d1", 1, "bob", "wrong colour"), _lab("d1", 3, "cat"),
        _lab("d2", 0, "ann"), _lab("d2", 0, "bob"),
        _lab("d3", 2, "ann"),  # one assessor only: not a unit of alpha
        _lab("d4", 1, "bob"), _lab("d4", 3, "cat"),
        Label("q", "d1", 0, "implicit:ctr", origin="store"),  # implicit labels are not assessors
    ])
    a = assessor_agreement(labels, n_grades=4, n_boot=200)
    assert a is not None
    assert a.assessors == {"ann": 3, "bob": 3, "cat": 2} and (a.pairs_graded, a.pairs_several) == (4, 3)
    # alpha on 3 units, by the reference implementation (coders ann, bob, cat x units d1, d2, d4)
    ref = krippendorff.alpha(reliability_data=[[3, 0, N], [1, 0, 1], [3, N, 3]], level_of_measurement="interval",
                             value_domain=[0, 1, 2, 3])
    assert a.alpha.value == pytest.approx(ref) and a.alpha.n == 3
    assert why_no_interval(a.alpha) == "n = 3 < 5 for a bootstrap"  # n too small: no interval is drawn
    assert [(k.assessor_a, k.assessor_b, k.kappa.n) for k in a.kappas] == [("ann", "bob", 2), ("ann", "cat", 1),
                                                                           ("bob", "cat", 2)]
    # disputed: d1 (3, 1, 3: span 2) and d4 (1, 3: span 2), the one with more assessors first
    assert [(d.doc_id, d.grades, d.aggregate, d.notes) for d in a.disputed] == [
        ("d1", {"ann": 3, "bob": 1, "cat": 3}, 3, {"bob": "wrong colour"}), ("d4", {"bob": 1, "cat": 3}, 1, {})]
    assert assessor_agreement(LabelSet().add([_lab("d1", 3, "ann")]), n_grades=4) is None


def _human_rows(n_pairs: int) -> list[dict]:
    """Three assessors on n_pairs pairs of the fixture's logged query 'red shoes': ann and bob agree but on every
    fifth pair (bob one grade up), cat is 2 grades from ann on every seventh pair."""
    rows = []
    for i in range(n_pairs):
        g = i % 4
        for who, grade in (("ann", g), ("bob", min(3, g + (i % 5 == 0))), ("cat", (g + 2) % 4 if i % 7 == 0 else g)):
            rows.append({"query_id": "q1", "query": "red shoes", "doc_id": f"x{i:02d}", "grade": grade,
                         "source": "human", "assessor": who, "judged_at": datetime(2025, 1, 1), "rubric": "v1",
                         "origin": "f", "note": "see rubric 2b" if who == "cat" and i == 0 else None})
    return rows


def test_report_shows_assessor_agreement_in_every_format(tmp_path: Path) -> None:
    db = build_store(tmp_path / "ubi.duckdb")
    with Store(db) as store:
        store.load_table("human_judgments", pa.Table.from_pylist(_human_rows(40), schema=HUMAN_JUDGMENT_SCHEMA))
    out = tmp_path / "r.json"
    assert main(["report", "--db", str(db), "--format", "json", "--out", str(out), "--no-labels"]) == 0
    got = json.loads(out.read_text())["assessors"]
    assert got["assessors"] == {"ann": 40, "bob": 40, "cat": 40} and got["pairs_several"] == 40
    assert got["alpha_metric"] == "interval" and got["alpha"]["n"] == 40 and got["alpha"]["no_interval"] is None
    assert got["alpha"]["low"] < got["alpha"]["value"] < got["alpha"]["high"]
    assert [(k["assessor_a"], k["assessor_b"], k["kappa"]["n"]) for k in got["kappas"]] == [
        ("ann", "bob", 40), ("ann", "cat", 40), ("bob", "cat", 40)]
    # cat differs from ann by 2 on i = 0, 7, 14, 21, 28, 35: six disputed pairs, each listed
    assert got["disputed_total"] == 6 and len(got["disputed"]) == 6 <= DISPUTED_SHOWN
    assert got["disputed"][0]["notes"] == {"cat": "see rubric 2b"}
    alpha = got["alpha"]["value"]
    assert math.isfinite(alpha) and 0 < alpha < 1
    for fmt, name in (("md", "r.md"), ("html", "r.html"), ("text", "r.txt")):
        path = tmp_path / name
        assert main(["report", "--db", str(db), "--format", fmt, "--out", str(path)]) == 0
        text = " ".join(html.unescape(path.read_text()).split())
        assert "Agreement among assessors" in text, fmt
        assert f"Krippendorff's alpha (interval metric) {alpha:.3f} [" in text, fmt
        assert "Disputed pairs: assessors 2 or more grades apart (6 pairs)" in text, fmt
        assert "see rubric 2b" in text, fmt


def test_report_names_model_sources_and_counts_pairs_not_assessor_rows(tmp_path: Path) -> None:
    """A model source in the agreement table is not called implicit (title, confusion header, no-overlap note), and
    the labels table counts (query, doc) pairs: 40 pairs graded by three assessors are 40 pairs and 120 labels."""
    db = build_store(tmp_path / "ubi.duckdb")
    with Store(db) as store:
        store.load_table("human_judgments", pa.Table.from_pylist(_human_rows(40), schema=HUMAN_JUDGMENT_SCHEMA))
    # the model grades the fixture's 40 pairs as ann did (grade i % 4), and one pair nobody graded ("nowhere")
    llm = tmp_path / "llm.jsonl"
    llm.write_text(json.dumps({"query_id": "q1", "query": "red shoes",
                               "relevant": {f"x{i:02d}": i % 4 for i in range(40)}}) + "\n"
                   + json.dumps({"query_id": "q9", "query": "nowhere", "relevant": {"z": 1}}) + "\n")
    assert main(["judgments", "import", str(llm), "--db", str(db), "--source", "model:llm"]) == 0
    out = tmp_path / "r.json"
    assert main(["report", "--db", str(db), "--format", "json", "--out", str(out), "--no-labels"]) == 0
    got = json.loads(out.read_text())
    # human: 3 assessors x 40 pairs = 120 rows on 40 pairs; the fixture's JSONL adds none (its qrels are --qrels)
    human = got["labels"]["counts"]["human"]
    assert (human["pairs"], human["graded_pairs"], human["labels"]) == (40, 40, 120)
    assert got["labels"]["counts"]["model:llm"] == {"pairs": 41, "graded_pairs": 41, "labels": 41, "graded": 41,
                                                   "queries": 2}
    # the merged human grade of pair i is the lower median of ann, bob, cat: 40 pairs with the model's grade
    assert got["agreement"]["model:llm"]["pairs"] == 40
    for fmt, name in (("md", "r.md"), ("html", "r.html"), ("text", "r.txt")):
        path = tmp_path / name
        assert main(["report", "--db", str(db), "--format", fmt, "--out", str(path)]) == 0
        text = " ".join(html.unescape(path.read_text()).split())
        assert "Agreement of implicit and model labels with human grades" in text, fmt
        assert "Agreement of implicit labels" not in text, fmt
        assert "labels (one per assessor)" in text, fmt
        if fmt != "html":  # the HTML draws the confusion matrix as a plot with its own axis names
            assert "human \\ model:llm" in text and "human \\ implicit " not in text, fmt


def test_small_n_in_the_report_no_intervals_and_one_disputed_pair(tmp_path: Path) -> None:
    """Two assessors on three pairs: x (3, 1, 0), y (2, 1, 2). Alpha (interval) 0.2424 and kappa (quadratic) 0.1176
    from the `krippendorff` package and by hand (Cohen 1968); n = 3 < 5, so neither has an interval; one pair
    (c: 0 and 2) is disputed, said as "1 pair" (it read "1 pairs")."""
    db = build_store(tmp_path / "ubi.duckdb")
    rows = [{"query_id": "q1", "query": "red shoes", "doc_id": d, "grade": g, "source": "human", "assessor": who,
             "judged_at": datetime(2025, 1, 1), "rubric": "v1", "origin": "f", "note": None}
            for who, grades in (("x", (3, 1, 0)), ("y", (2, 1, 2))) for d, g in zip("abc", grades, strict=True)]
    with Store(db) as store:
        store.load_table("human_judgments", pa.Table.from_pylist(rows, schema=HUMAN_JUDGMENT_SCHEMA))
    reference = krippendorff.alpha(reliability_data=np.array([[3, 1, 0], [2, 1, 2]], dtype=float),
                                   level_of_measurement="interval")
    assert reference == pytest.approx(8 / 33)
    path = tmp_path / "r.txt"
    assert main(["report", "--db", str(db), "--out", str(path)]) == 0
    text = " ".join(path.read_text().split())
    assert f"Krippendorff's alpha (interval metric) {reference:.3f} (no interval: n = 3 < 5 for a bootstrap)" in text
    assert "0.118 (no interval: n = 3 < 5 for a bootstrap)" in text
    assert "Disputed pairs: assessors 2 or more grades apart (1 pair)" in text
