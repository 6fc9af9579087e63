"""A held-out log generator for counterfactual predictions, built apart from ``traffic.py`` (pure numpy).

Its own catalog, rankers, examination curves and click rules, so that what ``ubi predict`` was tuned on
(``traffic.py``: (1/k)^η examination, unseen documents like the deepest shown ones) does not carry over:

* catalog: ``queries`` queries of ``docs_per_query`` documents; grades 0..4 drawn per document; a document's
  click probability at rank 1 is ``GRADE_CLICK[grade] · exp(spread · z)`` (z standard normal, clipped to
  [0.01, 0.95]): what it looks like on the page, which a grade only partly says;
* rankers score ``grade + feature · z + noise · N(0, 1)`` per (query, doc), once (a deployed ranker is
  deterministic). Two weak logging rankers (large noise) each return their top ``returned`` documents and
  display the top ``displayed``; candidates (less noise) rank every document, so their top 10 holds
  documents the log returned but never displayed and a few it never returned. Their runs carry their scores;
* examination: "exponential" (θ_k = 0.9·e^{-0.45 (k-1)}), "plateau" (ULTRA-like: the first four ranks
  examined alike, then a drop), "cascade" (scan down until a click satisfies, with probability
  ``SATISFACTION[grade]``; no click continues), and "power" ((1/k)^1.5: the steep PBM of issue 24's
  held-out log, the curve family ``traffic.py`` uses);
* traffic: ``searches`` searches, queries Zipf-like (p ∝ 1/(i + 5)), each served by a logging ranker drawn
  uniformly;
* human grades for a ``judged`` share of the queries (every document of those), each off by one grade with
  probability ``grade_noise``.

Truth: each system's exact CTR@``displayed`` on the logged query distribution; the logged systems' observed
CTR with a normal 95% interval over their searches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.clicks.stats import PairIndex, SessionPatterns
from ubi_pipeline.processors.simulation.catalog import SimulationError

EXAMINATIONS = ("exponential", "plateau", "cascade", "power")
GRADE_CLICK = np.array([0.02, 0.08, 0.2, 0.45, 0.75])
SATISFACTION = np.array([0.1, 0.25, 0.45, 0.7, 0.9])
PLATEAU = np.array([1.0, 1.0, 0.97, 0.93, 0.55, 0.42, 0.35, 0.3, 0.27, 0.25, 0.23, 0.21, 0.2, 0.19, 0.18, 0.17,
                    0.16, 0.15, 0.14, 0.13])


@dataclass(frozen=True)
class HeldoutConfig:
    """One scenario of the held-out generator (module docstring)."""

    examination: str = "plateau"
    queries: int = 200
    docs_per_query: int = 30
    returned: int = 20
    displayed: int = 10
    searches: int = 20_000
    logger_noise: tuple[float, ...] = (2.0, 2.5)
    candidate_noise: tuple[float, ...] = (0.7, 1.2)
    feature: float = 0.6
    spread: float = 0.5
    judged: float = 1 / 3
    grade_noise: float = 0.15
    seed: int = 0


@dataclass(frozen=True)
class HeldoutLog:
    """The log as the estimators read it, what the user knows besides, and the truth."""

    config: HeldoutConfig
    patterns: SessionPatterns
    returned: dict[str, dict[str, float]]  # query text -> doc -> mean rank returned below the display
    grades: dict[str, dict[str, float]]  # human grades of the judged queries
    candidates: dict[str, dict[str, list[str]]]  # name -> query text -> top ``returned`` docs
    candidate_scores: dict[str, dict[str, dict[str, float]]]  # name -> query text -> doc -> score
    exact: dict[str, float]  # system (loggers and candidates) -> exact CTR@displayed on the logged queries
    observed: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # logger -> (CTR, low, high)
    click_at_1: dict[str, dict[str, float]] = field(default_factory=dict)  # query text -> doc -> true P(click | rank 1)
    #: per search: query text, logger (1-based), the returned hit list, the clicked ranks (1-based)
    searches: tuple[tuple[str, int, tuple[str, ...], tuple[int, ...]], ...] = ()

    def ubi_records(self, application: str = "heldout") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The log as UBI records: a query record per search (its whole hit list, ``ranker`` in its attributes),
        an ``impression`` per displayed result and a ``click`` per click; one client per 50 searches, a
        search a minute."""
        queries: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        t0 = datetime(2025, 1, 1, tzinfo=UTC)
        for i, (text, logger, hits, clicked) in enumerate(self.searches):
            qid, client = f"h{self.config.seed}-{i}", f"user{i // 50}"
            at = t0 + timedelta(minutes=i)
            queries.append({"application": application, "query_id": qid, "client_id": client, "user_query": text,
                            "timestamp": at.isoformat(), "query_attributes": {"ranker": f"logger{logger}"},
                            "object_id_field": "sku", "query_response_hit_ids": list(hits)})
            common = {"application": application, "query_id": qid, "client_id": client}
            for k, doc in enumerate(hits[: self.config.displayed]):
                kind = [("impression", 1)] + ([("click", 2)] if k + 1 in clicked else [])
                for action, sec in kind:
                    events.append({"action_name": action, "event_id": f"{qid}-{action}{k}", **common,
                                   "timestamp": (at + timedelta(seconds=sec)).isoformat(),
                                   "event_attributes": {"object": {"object_id": doc, "object_id_field": "sku"},
                                                        "position": {"ordinal": k}}})
        return queries, events


def _theta(kind: str, k: int) -> NDArray[np.float64]:
    if kind == "exponential":
        return 0.9 * np.exp(-0.45 * np.arange(k))
    if kind == "plateau":
        return PLATEAU[:k].copy()
    if kind == "power":
        return (1.0 / np.arange(1, k + 1)) ** 1.5
    return np.ones(k)


def _clicks(rng: np.random.Generator, kind: str, a: NDArray[np.float64], sat: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Clicks of searches whose shown docs have click probabilities ``a`` ([n, k]) under examination ``kind``."""
    n, k = a.shape
    if kind != "cascade":
        return rng.random((n, k)) < _theta(kind, k)[None, :] * a
    clicks = np.zeros((n, k), dtype=bool)
    going = np.ones(n, dtype=bool)
    for j in range(k):
        c = going & (rng.random(n) < a[:, j])
        clicks[:, j] = c
        going &= ~(c & (rng.random(n) < sat[:, j]))
    return clicks


def _expected_clicks(kind: str, a: NDArray[np.float64], sat: NDArray[np.float64]) -> NDArray[np.float64]:
    """Exact expected clicks of each list ([n, k] click probabilities at rank 1) under examination ``kind``."""
    if kind != "cascade":
        return (_theta(kind, a.shape[1])[None, :] * a).sum(axis=1)
    reach = np.cumprod(np.hstack([np.ones((len(a), 1)), 1.0 - a[:, :-1] * sat[:, :-1]]), axis=1)
    return (reach * a).sum(axis=1)


def generate(cfg: HeldoutConfig) -> HeldoutLog:
    """Simulate one held-out log (module docstring)."""
    if cfg.examination not in EXAMINATIONS:
        raise SimulationError(f"examination {cfg.examination!r}: choose one of {', '.join(EXAMINATIONS)}")
    if not 0 < cfg.displayed <= cfg.returned <= cfg.docs_per_query:
        raise SimulationError("need 0 < displayed <= returned <= docs_per_query")
    rng = np.random.default_rng([cfg.seed, 0x4E1D])
    nq, nd, kd = cfg.queries, cfg.docs_per_query, cfg.displayed
    grade = rng.choice(5, size=(nq, nd), p=[0.35, 0.3, 0.18, 0.11, 0.06])
    z = rng.normal(size=(nq, nd))
    attract = np.clip(GRADE_CLICK[grade] * np.exp(cfg.spread * z), 0.01, 0.95)
    sat = SATISFACTION[grade]
    texts = [f"item-{q:03d}" for q in range(nq)]
    docs = np.array([[f"d{q:03d}-{j:02d}" for j in range(nd)] for q in range(nq)], dtype=object)

    def ranking(noise: float) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        score = grade + cfg.feature * z + noise * rng.normal(size=(nq, nd))
        return np.argsort(-score, axis=1, kind="stable").astype(np.int64), score

    loggers = [ranking(s)[0][:, : cfg.returned] for s in cfg.logger_noise]
    cands = [ranking(s) for s in cfg.candidate_noise]
    pop = 1.0 / (np.arange(nq) + 5.0)
    query = rng.choice(nq, size=cfg.searches, p=pop / pop.sum())
    served = rng.integers(0, len(loggers), size=cfg.searches)
    slots = np.stack([loggers[s][q, :kd] for s, q in zip(served.tolist(), query.tolist(), strict=True)]) \
        if cfg.searches else np.zeros((0, kd), np.int64)
    a_shown = attract[query[:, None], slots]
    clicks = _clicks(rng, cfg.examination, a_shown, sat[query[:, None], slots])

    # pairs: every (query, doc) shown; patterns deduplicated over (query, slots, clicks)
    key = query[:, None] * nd + slots
    uniq, pair_of = np.unique(key, return_inverse=True)
    pair_of = pair_of.reshape(key.shape)
    pairs = PairIndex(np.array([texts[int(u) // nd] for u in uniq], dtype=object),
                      np.array([docs[int(u) // nd, int(u) % nd] for u in uniq], dtype=object),
                      (uniq // nd).astype(np.int64))
    rows = np.hstack([query[:, None], pair_of, clicks.astype(np.int64)])
    urows, weight = np.unique(rows, axis=0, return_counts=True)
    patterns = SessionPatterns(pairs, urows[:, 0].astype(np.int64), urows[:, 1:kd + 1].astype(np.int64),
                               urows[:, kd + 1:].astype(bool), weight.astype(np.int64))

    # returned below the display, as the hit lists of the searches say: mean rank per (query, doc)
    shown = set(uniq.tolist())
    returned: dict[str, dict[str, float]] = {}
    for q in np.unique(query).tolist():
        used = np.unique(served[query == q]).tolist()
        acc: dict[int, list[int]] = {}
        for s in used:
            for r, d in enumerate(loggers[s][q, kd:].tolist(), start=kd + 1):
                if q * nd + d not in shown:
                    acc.setdefault(d, []).append(r)
        if acc:
            returned[texts[q]] = {str(docs[q, d]): float(np.mean(r)) for d, r in acc.items()}

    judged = rng.random(nq) < cfg.judged
    off = rng.random((nq, nd)) < cfg.grade_noise
    human = np.clip(grade + np.where(off, rng.choice([-1, 1], size=(nq, nd)), 0), 0, 4)
    grades = {texts[q]: {str(docs[q, d]): float(human[q, d]) for d in range(nd)} for q in range(nq) if judged[q]}

    weight_q = np.bincount(query, minlength=nq).astype(np.float64)

    def exact(top: NDArray[np.int64]) -> float:
        a = attract[np.arange(nq)[:, None], top[:, :kd]]
        s = sat[np.arange(nq)[:, None], top[:, :kd]]
        return float((weight_q * _expected_clicks(cfg.examination, a, s)).sum() / (weight_q.sum() * kd))

    truth = {f"logger{i + 1}": exact(lg) for i, lg in enumerate(loggers)}
    observed = {}
    for i in range(len(loggers)):
        per = clicks[served == i].sum(axis=1) / kd
        mean = float(per.mean()) if len(per) else float("nan")
        se = float(per.std(ddof=1) / np.sqrt(len(per))) if len(per) > 1 else float("nan")
        observed[f"logger{i + 1}"] = (mean, mean - 1.96 * se, mean + 1.96 * se)
    candidates, scores = {}, {}
    for i, (order, score) in enumerate(cands):
        name = f"candidate{i + 1}"
        truth[name] = exact(order)
        top = order[:, : cfg.returned]
        candidates[name] = {texts[q]: [str(docs[q, d]) for d in top[q]] for q in range(nq)}
        scores[name] = {texts[q]: {str(docs[q, d]): float(score[q, d]) for d in top[q]} for q in range(nq)}
    click_at_1 = {texts[q]: {str(docs[q, d]): float(attract[q, d]) for d in range(nd)} for q in range(nq)}
    hit_docs = [[tuple(str(docs[q, d]) for d in lg[q]) for q in range(nq)] for lg in loggers]
    searches = tuple((texts[q], s + 1, hit_docs[s][q], tuple((np.flatnonzero(c) + 1).tolist()))
                     for q, s, c in zip(query.tolist(), served.tolist(), clicks, strict=True))
    return HeldoutLog(cfg, patterns, returned, grades, candidates, scores, truth, observed, click_at_1, searches)
