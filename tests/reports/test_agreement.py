"""Agreement of implicit labels with human grades: quadratic-weighted kappa, correlations, calibration split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from joint_fixtures import build_store, write_human

from ubi_pipeline.formats.qrels import load_qrels
from ubi_pipeline.processors.labels.grades import GradeError, quadratic_weighted_kappa
from ubi_pipeline.processors.labels.merge import Label, LabelSet, labels_from_human, labels_from_store
from ubi_pipeline.reports.agreement import agreement, agreement_all
from ubi_pipeline.store.client import open_reader


def test_fixture_agreement_by_hand(tmp_path):
    con = open_reader(build_store(tmp_path / "ubi.duckdb"))
    try:
        labels = LabelSet().add(labels_from_store(con))
    finally:
        con.close()
    labels.add(labels_from_human(load_qrels(write_human(tmp_path / "h.jsonl")).human_judgments()))
    a = agreement(labels, "implicit:ctr", n_grades=4)
    # pairs with both: red shoes d1 (human 3, ctr 3), d2 (1, 2), blue hat h2 (0, 0); blue hat h1 was in the
    # calibration fit split -> left out; d4 and b2 have no human grade
    assert (a.pairs, a.excluded_calibration) == (3, 1)
    assert a.confusion == [[1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1]]
    # kappa: w_ij = (i-j)^2/9; observed sum w*O = w[1][2] = 1/9. Marginals human (1,1,0,1), ctr (1,0,1,1), N=3:
    # sum w*E = (1/3)[row0: 4/9 + 1 + row1: 1/9 + 1/9 + 4/9 + row3: 1 + 1/9] = (1/3)(29/9) = 29/27
    # kappa = 1 - (1/9)/(29/27) = 1 - 3/29 = 26/29
    assert a.kappa == pytest.approx(26 / 29)
    # human (3, 1, 0) and ctr (3, 2, 0) are in the same order
    assert a.spearman == pytest.approx(1.0) and a.kendall == pytest.approx(1.0)
    assert set(agreement_all(labels)) == {"implicit:ctr"}


def test_kappa_known_values():
    # perfect agreement -> 1. Complete reversal on a 0..2 scale, each grade used once: w = (i-j)^2/4 =
    # [[0,.25,1],[.25,0,.25],[1,.25,0]]; O is the anti-diagonal, sum w*O = 1 + 0 + 1 = 2; every marginal is 1,
    # so E = 1*1/3 in every cell and sum w*E = (sum w)/3 = 3/3 = 1; kappa = 1 - 2/1 = -1
    assert quadratic_weighted_kappa(np.array([0, 1, 2]), np.array([0, 1, 2])) == pytest.approx(1.0)
    assert quadratic_weighted_kappa(np.array([0, 1, 2]), np.array([2, 1, 0])) == pytest.approx(-1.0)
    assert np.isnan(quadratic_weighted_kappa(np.array([1, 1]), np.array([1, 1])))  # one grade: undefined
    with pytest.raises(GradeError):
        quadratic_weighted_kappa(np.array([0, 1]), np.array([0]))
    with pytest.raises(GradeError):
        quadratic_weighted_kappa(np.array([-1]), np.array([0]))


def test_kappa_matches_the_textbook_formula_with_loops():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 4, 50), rng.integers(0, 4, 50)
    # direct transcription of Cohen (1968) with explicit loops, as an independent check
    n, g = 50, 4
    obs = np.zeros((g, g))
    for x, y in zip(a, b, strict=True):
        obs[x, y] += 1
    num = den = 0.0
    for i in range(g):
        for j in range(g):
            w = (i - j) ** 2 / (g - 1) ** 2
            num += w * obs[i, j] / n
            den += w * (obs[i].sum() / n) * (obs[:, j].sum() / n)
    assert quadratic_weighted_kappa(a, b, 4) == pytest.approx(1 - num / den)


def test_used_for_calibration_flag_and_reviewed_labels_do_not_count():
    labels = LabelSet().add([
        Label("q", "a", 2, "human"), Label("q", "a", 2, "implicit:pbm", parameters={"used_for_calibration": True}),
        Label("q", "b", 1, "human"), Label("q", "b", 0, "implicit:pbm"),
        Label("q", "c", 3, "reviewed:pbm"), Label("q", "c", 3, "implicit:pbm"),
    ])
    a = agreement(labels, "implicit:pbm")
    assert (a.pairs, a.excluded_calibration) == (1, 1)  # only b; c has no human grade (reviewed is not human)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=2, max_size=40))
def test_kappa_is_at_most_one_and_symmetric(pairs):
    h = np.array([p[0] for p in pairs])
    i = np.array([p[1] for p in pairs])
    k1, k2 = quadratic_weighted_kappa(h, i, 4), quadratic_weighted_kappa(i, h, 4)
    if not np.isnan(k1):
        assert k1 <= 1 + 1e-12
        assert k1 == pytest.approx(k2)
