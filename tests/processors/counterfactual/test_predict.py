"""``predict`` end to end on small logs: candidate mapping, the bootstrap, and a simulated (A, B) check."""

from __future__ import annotations

import pytest

from ubi_pipeline.processors.clicks.sessions import patterns_from_sessions
from ubi_pipeline.processors.counterfactual.predict import PredictionError, candidate_arrays, predict
from ubi_pipeline.schemas.sessions import Session

MLE = {"prior": "none"}  # hand-worked numbers need the maximum-likelihood fit (no prior on α)


def _log() -> list[Session]:
    """80 "shoes" searches whose cell click rates fit PBM exactly: θ = (1, 0.5, 0.25), α_a = 0.8, α_b = α_c = 0.4.

    Order a, b, c (40 searches): a clicked 32 times (1·0.8), b 8 (0.5·0.4), c 4 (0.25·0.4); order b, a, c
    (40): b 16 (0.4), a 16 (0.5·0.8), c 4. Plus 10 "hats" searches of one doc, half of them clicked.
    """
    out = []
    for i in range(40):
        out.append(Session(f"x{i}", "shoes", ("a", "b", "c"), (1, 2, 3), (i < 32, i % 5 == 0, i % 10 == 1)))
        out.append(Session(f"y{i}", "shoes", ("b", "a", "c"), (1, 2, 3), (i < 16, i >= 24, i % 10 == 1)))
    out += [Session(f"h{i}", "hats", ("h",), (1,), (i % 2 == 0,)) for i in range(10)]
    return out


def test_candidate_arrays_map_seen_unseen_and_unlogged() -> None:
    pat = patterns_from_sessions(_log(), max_rank=3)
    cand = candidate_arrays(pat, {"shoes": ["c", "zz", "a", "b"], "socks": ["x"]})
    texts = list(pat.pairs.queries)
    shoes = int(pat.pairs.query_index[texts.index("shoes")])
    doc = {str(d): p for p, d in enumerate(pat.pairs.doc_ids)}
    assert cand.docs[shoes].tolist() == [doc["c"], cand.unseen, doc["a"]]  # cut at K = 3
    assert cand.rank_of_pair[doc["c"]] == 1 and cand.rank_of_pair[doc["a"]] == 3 and cand.rank_of_pair[doc["b"]] == 0
    assert cand.length.tolist().count(3) == 1 and cand.length.sum() == 3  # hats not covered
    assert (cand.run_queries, cand.matched_queries, cand.cut_docs) == (2, 1, 1)


def test_predict_the_logged_ranking_reproduces_the_logged_clicks() -> None:
    # the PBM fit (MLE, no prior) reproduces the cells exactly, so every method predicts what order a, b, c logged:
    # (32 + 8 + 4) / 40 = 1.1 clicks per search
    sessions = _log()
    pat = patterns_from_sessions(sessions, max_rank=3)
    pred = predict(pat, {"shoes": ["a", "b", "c"]}, replicates=30, seed=1, model_options=MLE)
    shown = [s for s in sessions if s.doc_ids == ("a", "b", "c")]
    logged = sum(sum(s.clicked) for s in shown) / len(shown)
    assert logged == pytest.approx(1.1)
    assert pred.theta_ratio[:2] == pytest.approx([1.0, 0.5], abs=1e-4)
    assert pred.searches == 80 and pred.covered_queries == 1 and pred.logged_queries == 2
    assert pred.prior_share == 0 and pred.unsupported_share == 0
    for method in ("dm", "ips", "dr"):
        fig = pred.figures[method]["clicks_per_search"]
        assert fig.low <= fig.value <= fig.high
        assert fig.value == pytest.approx(logged, abs=1e-3), method
    assert "abandonment" in pred.figures["dm"] and "abandonment" not in pred.figures["ips"]
    assert pred.to_json()["methods"]["dm"]["ctr@10"]["value"] is not None


def test_predict_refuses_a_candidate_without_logged_queries() -> None:
    pat = patterns_from_sessions(_log(), max_rank=3)
    with pytest.raises(PredictionError, match="none of the candidate's 1 queries"):
        predict(pat, {"socks": ["x"]}, replicates=0)
    with pytest.raises(PredictionError, match="--method"):
        predict(pat, {"shoes": ["a"]}, methods=("magic",))


def test_prior_share_is_reported_for_unseen_documents() -> None:
    pat = patterns_from_sessions(_log(), max_rank=3)
    pred = predict(pat, {"shoes": ["new1", "a", "new2"], "hats": ["h"]}, replicates=0, k=3)
    # top 3 of shoes (80 searches): 2 of 3 unseen; hats (10 searches): 0 of 1 -> (80·2) / (80·3 + 10·1)
    assert pred.prior_share == pytest.approx(160 / 250)
    assert pred.unsupported_share == pytest.approx(160 / 250)


def test_prior_free_interval_by_hand() -> None:
    # the log fits PBM exactly (θ_2/θ_1 = 0.5; α_a = 0.8; α_h = 0.5). Candidate shoes: [new1, a, new2].
    # Unseen docs at 0: shoes clicks@3 = 0.5·0.8 = 0.4; at 1: 1 + 0.4 + θ_3; hats: 0.5 (10 searches).
    # CTR@3 over 80·3 + 10·1 = 250 shown: (80·0.4 + 5)/250 = 0.148 and (80·(1.4 + θ_3) + 5)/250.
    # θ_3 is not identified (c is only ever at rank 3: only θ_3·α_c is), so it is read from the fit.
    pat = patterns_from_sessions(_log(), max_rank=3)
    pred = predict(pat, {"shoes": ["new1", "a", "new2"], "hats": ["h"]}, replicates=0, k=3, model_options=MLE)
    high = (80 * (1.4 + pred.theta_ratio[2]) + 5) / 250
    for method in ("dm", "ips", "dr"):
        fig = pred.figures[method]["ctr@k"]
        assert (fig.bound_low, fig.bound_high) == (pytest.approx(0.148, abs=1e-4), pytest.approx(high, abs=1e-4))
    assert pred.figures["snips"]["ctr@k"].bound_low != pred.figures["snips"]["ctr@k"].bound_low  # NaN: no bound
    boot = predict(pat, {"shoes": ["new1", "a", "new2"], "hats": ["h"]}, replicates=20, k=3,
                   model_options=MLE).figures["dm"]["ctr@k"]
    assert boot.bound_low <= boot.low <= boot.value <= boot.high <= boot.bound_high


def test_unseen_documents_take_the_deep_pairs_click_probability_by_hand() -> None:
    """Unseen documents at the click probability of the pairs the log showed deep; the calibrated interval.

    The log of ``_log`` plus 40 searches ordered a, c, b (a clicked 32 times, c 8 = 0.5·0.4, b 4 = 0.25·0.4),
    so PBM fits the cells exactly: θ = (1, 0.5, 0.25), α_a = 0.8, α_b = α_c = 0.4, α_h = 0.5. Mean display
    ranks over the 120 shoes searches: a 1.67, b 2.0, c 2.67, h 1; K/2 = 1.5, so the deep pairs are b and c,
    both at 0.4: every quantile of their click probabilities is 0.4, and the calibrated interval (no
    bootstrap) collapses to the point. Candidate shoes [new1, a, new2] (120 searches), hats [h] (10):
    clicks@3 of shoes = 0.4·θ_1 + 0.8·θ_2 + 0.4·θ_3 = 0.9, hats 0.5; CTR@3 = (120·0.9 + 10·0.5)/(120·3 + 10)
    = 113/370. IPS credits a's logged clicks (0.8·θ_2 per search) and the calibrated ends add 0.4·(θ_1 + θ_3)
    per search for the unseen pair: the same 113/370; its point (unseen at 0) is (48 + 5)/370.
    """
    sessions = _log()
    for i in range(40):
        sessions.append(Session(f"z{i}", "shoes", ("a", "c", "b"), (1, 2, 3), (i < 32, i % 5 == 0, i % 10 == 1)))
    pat = patterns_from_sessions(sessions, max_rank=3)
    cand = {"shoes": ["new1", "a", "new2"], "hats": ["h"]}
    pred = predict(pat, cand, replicates=0, k=3, model_options=MLE)
    assert pred.unseen == "deep"
    assert pred.unseen_click == pytest.approx((0.4, 0.4, 0.4), abs=1e-4)
    for method in ("dm", "dr"):
        fig = pred.figures[method]["ctr@k"]
        assert fig.value == pytest.approx(113 / 370, abs=1e-4), method
        assert (fig.cal_low, fig.cal_high) == (pytest.approx(113 / 370, abs=1e-4),) * 2, method
    ips = pred.figures["ips"]["ctr@k"]
    assert ips.value == pytest.approx(53 / 370, abs=1e-4)
    assert (ips.cal_low, ips.cal_high) == (pytest.approx(113 / 370, abs=1e-4),) * 2
    # the model's own prior instead: α₀ = clicks / expected examinations over every shown pair, not 0.4
    prior = predict(pat, cand, replicates=0, k=3, model_options=MLE, unseen="prior").figures["dm"]["ctr@k"]
    clicks = sum(sum(s.clicked) for s in sessions if s.query == "shoes")
    exam = 120 * (1 + 0.5 + 0.25)
    alpha0 = (clicks + 5) / (exam + 10)
    assert prior.value == pytest.approx((120 * (alpha0 * 1.25 + 0.4) + 5) / 370, abs=1e-3)
    with pytest.raises(PredictionError, match="unseen="):
        predict(pat, cand, replicates=0, unseen="zero")
