"""Every registered model honours the ClickModel contract on the same small log."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click_logs import simulate

from ubi_pipeline.processors.click_models import MODEL_NAMES, get_model
from ubi_pipeline.processors.click_models.base import ClickModel
from ubi_pipeline.processors.click_models.evaluate import evaluate, split_sessions
from ubi_pipeline.processors.simulation.clicks import examination_curve

LOG, _ = simulate("pbm", seed=81, n_sessions=3000, n_queries=20, theta=examination_curve(10))
# ragged lists: every 7th pattern shows only 6 results
LOG.docs[::7, 6:] = -1
LOG.clicks[::7, 6:] = False
TRAIN, TEST = split_sessions(LOG, 0.3, np.random.default_rng(1))


def test_registry_names() -> None:
    assert set(MODEL_NAMES) == {"gctr", "rctr", "dctr", "coec", "pbm", "ubm", "cascade", "dcm", "sdbn", "dbn"}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_contract(name: str) -> None:
    m = get_model(name).fit(TRAIN)
    assert isinstance(m, ClickModel) and m.name == name and m.version
    shown = TEST.docs >= 0
    for probs in (m.click_probs(TEST), m.conditional_click_probs(TEST)):
        assert probs.shape == TEST.docs.shape
        assert np.isnan(probs[~shown]).all() and not np.isnan(probs[shown]).any()
        assert probs[shown].min() >= 0.0 and probs[shown].max() <= 1.0
    rel = m.relevance()
    n = len(LOG.pairs)
    for arr in (rel.score, rel.ci_low, rel.ci_high, rel.impressions, rel.clicks, rel.sessions):
        assert arr.shape == (n,)
    assert not np.isnan(rel.score).any()  # unseen pairs score the prior
    has_ci = ~np.isnan(rel.ci_low)
    assert (rel.ci_low[has_ci] <= rel.score[has_ci] + 1e-12).all()
    assert (rel.score[has_ci] <= rel.ci_high[has_ci] + 1e-12).all()
    assert rel.impressions.sum() == (TRAIN.weight[:, None] * (TRAIN.docs >= 0)).sum()
    # every model says how many of the displayed impressions it observed (examined, or expected to be)
    assert rel.observations is not None and rel.observations.shape == (n,)
    assert (rel.observations >= 0).all() and (rel.observations <= rel.impressions + 1e-9).all()
    # a pair the model never observed has no interval of its own (its score is the prior); gctr and rctr
    # give every pair the global / per-rank interval and make no judgments
    if name not in ("gctr", "rctr"):
        assert np.isnan(rel.ci_low[rel.observations == 0]).all()
    assert rel.parameters["model"] == name
    json.dumps(rel.parameters)  # recorded with every judgment, so it must be plain JSON
    ev = evaluate(m, TEST)
    assert ev.sessions == TEST.n_sessions
    assert (ev.perplexity[~np.isnan(ev.perplexity)] >= 1.0).all()
    assert ev.log_likelihood < 0
