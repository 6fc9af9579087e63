"""Simulated search traffic with known truth: rankers, sessions, clicks and the UBI records they leave.

The protocol is the standard one of ``docs/position-bias.md`` (after Agarwal et al., WSDM 2019, and the
ULTRA toolkit): a catalog with graded relevance 0..G, several rankers of differing quality, examination
θ_k = (1/k)^η and click-given-examination ε⁻ + (ε⁺ − ε⁻)(2^g − 1)/(2^G − 1). Clicks are drawn by the pure
kernel :func:`ubi_pipeline.processors.simulation.clicks.simulate_clicks`; this module decides *what* is shown to *whom*
and *when*, and writes it the way OpenSearch tooling does (0-based ``position.ordinal``, ``impression`` and
``click`` events linked to a query record whose ``query_response_hit_ids`` is the displayed ranking).

Everything is vectorised over sessions (a million sessions are a few numpy arrays), and every random draw
comes from a stream of one ``numpy.random.SeedSequence``, so the same config gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from ubi_pipeline.processors.clicks.stats import PairIndex, SessionPatterns, SystemRankings
from ubi_pipeline.processors.propensity.randomized import SwapSessions
from ubi_pipeline.processors.simulation.catalog import Catalog, SimulationError, build_catalog
from ubi_pipeline.processors.simulation.clicks import (
    click_given_grade,
    dedupe_patterns,
    examination_curve,
    simulate_clicks,
    trust_bias_epsilons,
)
from ubi_pipeline.schemas.cli_names import TRAFFIC_MODELS
from ubi_pipeline.schemas.interleaving import Interleaved, team_draft
from ubi_pipeline.schemas.systems import system_name
from ubi_pipeline.schemas.text import normalize_query

#: Click models the traffic simulator offers (the kernel has more; these are the protocol's).

OBJECT_ID_FIELD = "product_id"
INTERLEAVED_RANKER = "interleaved"  # query_attributes.ranker of an interleaved search
SEARCHES_PER_CLIENT = 5  # a client's searches come in one burst: the bot filter must not see a machine
_CLIENT_START_GAP_MS = 20_000  # next client starts 20 s after the previous one
_SEARCH_GAP_MS = 30_000  # a client's searches are 30 s apart (2 per minute)
_IMPRESSION_DELAY_MS = 250
_FIRST_CLICK_DELAY_MS = 2_000
_CLICK_GAP_MS = 1_500  # a click at rank k comes (k-1) x 1.5 s after the first possible click: top-down
_CRAWLER_GAP_MS = 500  # a crawler searches twice a second (120 a minute; the bot filter's default is 60)
#: a crawler client makes at least this many searches (fewer crawler searches in all: one crawler with all of
#: them; below 61 it does not exceed the filter's 60 a minute and stays in the log, as a slow bot would)
CRAWLER_MIN_SEARCHES = 100


#: Named presets of :class:`SimConfig` (``ubi simulate --scenario NAME``); fields given beside one win.
#: ``demo``: the protocol on the 40-query catalog, the easy case (every pair seen often). ``hard``: what
#: real logs look like and what benches and tests must also pass: 1,000 queries with Zipf frequencies
#: (popularity ∝ 1/rank, so most queries are rare: at 20,000 searches the rarest get 2 or 3 each), four
#: rankers from nearly right (σ = 0.3) to nearly random (σ = 3), and 5% of searches from three crawlers that
#: the session filter must drop.
SCENARIOS: dict[str, dict[str, Any]] = {
    "demo": {},
    "hard": {"queries": 1000, "docs_per_query": 20, "query_skew": 1.0, "rankers": 4,
             "ranker_noise": (0.3, 0.8, 1.5, 3.0), "crawler_share": 0.05, "crawlers": 3},
}


def scenario(name: str, **overrides: Any) -> SimConfig:
    """The :class:`SimConfig` of a named scenario (:data:`SCENARIOS`) with ``overrides`` applied."""
    if name not in SCENARIOS:
        raise SimulationError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}")
    config = SimConfig(**{**SCENARIOS[name], **overrides})
    config.check()
    return config


@dataclass(frozen=True)
class SimConfig:
    """What to simulate. Defaults are the protocol of ``docs/position-bias.md`` on a 40-query catalog."""

    sessions: int = 10_000
    seed: int = 0
    model: str = "pbm"  # pbm | cascade | dbn | trust
    eta: float = 1.0  # θ_k = (1/k)^η
    rankers: int = 3
    ranker_noise: tuple[float, ...] | None = None  # σ per ranker; default geometric 0.5..2.0 (best first)
    ranker_names: tuple[str, ...] | None = None  # default ranker-a, ranker-b, ...
    queries: int = 40
    docs_per_query: int = 20
    max_rank: int = 10
    max_grade: int = 3
    eps_minus: float = 0.1
    eps_plus: float = 1.0
    dbn_gamma: float = 0.9  # DBN persistence after an unsatisfying click or a skip
    randomize: float = 0.0  # share of searches in a rank-1 swap experiment (Joachims et al. 2017)
    epochs: int = 1  # rankers re-draw their noise this many times over the log ("ranking changes over time")
    query_skew: float = 0.5  # query popularity ∝ 1/rank^skew (0 = uniform)
    crawler_share: float = 0.0  # share of searches made by crawlers (bots the session filter must drop)
    crawlers: int = 3  # crawler clients sharing those searches
    crawler_click: float = 0.3  # a crawler "clicks" each result with this probability, whatever it is
    #: (reference, challenger) ranker names: a share of searches shows their team-draft interleaving instead
    interleave: tuple[str, str] | None = None
    interleave_share: float = 0.5  # share of searches interleaved when ``interleave`` is set
    application: str = "ubi-sim"
    start: datetime = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)

    def check(self) -> None:
        """Raise :class:`SimulationError` naming the first setting out of range."""
        if self.sessions < 1:
            raise SimulationError(f"sessions must be at least 1, got {self.sessions}")
        if self.model not in TRAFFIC_MODELS:
            raise SimulationError(f"model {self.model!r} is not one of {', '.join(TRAFFIC_MODELS)}")
        if not 0.0 <= self.eta <= 5.0:
            raise SimulationError(f"eta must lie in 0..5, got {self.eta}")
        if self.rankers < 1:
            raise SimulationError(f"rankers must be at least 1, got {self.rankers}")
        if self.ranker_noise is not None and len(self.ranker_noise) != self.rankers:
            raise SimulationError(f"ranker noise needs {self.rankers} values, got {len(self.ranker_noise)}")
        if self.ranker_names is not None and (len(self.ranker_names) != self.rankers
                                              or len(set(self.ranker_names)) != self.rankers):
            raise SimulationError(f"ranker names need {self.rankers} distinct values, got {self.ranker_names}")
        if not 1 <= self.max_rank <= min(self.docs_per_query, 62):
            raise SimulationError(f"max rank must lie in 1..min(docs per query, 62) = "
                                  f"{min(self.docs_per_query, 62)}, got {self.max_rank}")
        if not 0.0 <= self.eps_minus <= self.eps_plus <= 1.0:
            raise SimulationError(f"need 0 <= eps_minus <= eps_plus <= 1, got {self.eps_minus}, {self.eps_plus}")
        if not 0.0 <= self.randomize <= 1.0:
            raise SimulationError(f"randomize is a fraction of searches in 0..1, got {self.randomize}")
        if not 0.0 <= self.dbn_gamma <= 1.0:
            raise SimulationError(f"dbn gamma must lie in 0..1, got {self.dbn_gamma}")
        if self.epochs < 1:
            raise SimulationError(f"epochs must be at least 1, got {self.epochs}")
        if self.query_skew < 0:
            raise SimulationError(f"query skew must be >= 0, got {self.query_skew}")
        if not 0.0 <= self.crawler_share < 1.0:
            raise SimulationError(f"crawler share is a fraction of searches in [0, 1), got {self.crawler_share}")
        if self.crawlers < 1:
            raise SimulationError(f"crawlers must be at least 1, got {self.crawlers}")
        if not 0.0 <= self.crawler_click <= 1.0:
            raise SimulationError(f"crawler click probability must lie in 0..1, got {self.crawler_click}")
        if self.interleave is not None:
            names = self.names()
            if len(self.interleave) != 2 or self.interleave[0] == self.interleave[1]:
                raise SimulationError(f"interleave names two different rankers (reference, challenger), got "
                                      f"{list(self.interleave)}")
            unknown = [r for r in self.interleave if r not in names]
            if unknown:
                raise SimulationError(f"interleave: no ranker named {unknown[0]!r}; the rankers are {', '.join(names)}")
        if not 0.0 < self.interleave_share <= 1.0:
            raise SimulationError(f"interleave share is a fraction of searches in (0, 1], got {self.interleave_share}")

    def noise(self) -> tuple[float, ...]:
        if self.ranker_noise is not None:
            return tuple(float(x) for x in self.ranker_noise)
        if self.rankers == 1:
            return (0.5,)
        return tuple(float(x) for x in np.geomspace(0.5, 2.0, self.rankers))

    def names(self) -> tuple[str, ...]:
        if self.ranker_names is not None:
            return tuple(self.ranker_names)
        return tuple(f"ranker-{_letters(r)}" for r in range(self.rankers))


def _letters(i: int) -> str:
    out = ""
    i += 1
    while i:
        i, rem = divmod(i - 1, 26)
        out = chr(ord("a") + rem) + out
    return out


@dataclass(frozen=True)
class Truth:
    """The parameters that generated a log: what estimators are measured against."""

    config: SimConfig
    catalog: Catalog
    theta: NDArray[np.float64] | None  # per rank; None for the cascade family (examination depends on clicks)
    attractiveness: NDArray[np.float64]  # [Q, D]: P(click | examined) (trust: at rank 1 averaged over R)
    satisfaction: NDArray[np.float64] | None  # [Q, D], DBN only
    relevance: NDArray[np.float64] | None  # [Q, D], trust only: P(R = 1)
    eps_pos: NDArray[np.float64] | None  # trust only, per rank
    eps_neg: NDArray[np.float64] | None
    ranker_noise: tuple[float, ...]
    ranker_names: tuple[str, ...]
    grade_click_prob: NDArray[np.float64]  # per grade 0..G

    @property
    def theta_ratio(self) -> NDArray[np.float64] | None:
        return None if self.theta is None else self.theta / self.theta[0]

    def pair_lookup(self, pairs: PairIndex) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """True (grade, attractiveness) per pair of ``pairs``, matched on (normalised query, doc id); -1/NaN if unknown."""
        where = {(normalize_query(t), str(d)): (q, j)
                 for q, t in enumerate(self.catalog.query_texts) for j, d in enumerate(self.catalog.doc_ids[q])}
        grades = np.full(len(pairs), -1, dtype=np.int64)
        attract = np.full(len(pairs), np.nan)
        for p, (qt, d) in enumerate(zip(pairs.queries, pairs.doc_ids, strict=True)):
            hit = where.get((str(qt), str(d)))
            if hit is not None:
                grades[p] = self.catalog.grades[hit]
                attract[p] = self.attractiveness[hit]
        return grades, attract

    def to_json(self) -> dict[str, Any]:
        """The truth file: parameters, per-(query, doc) attractiveness and grades, and the qrels."""
        c, cat = self.config, self.catalog

        def arr(x: NDArray[np.float64] | None) -> list[float] | None:
            return None if x is None else [round(float(v), 10) for v in x]

        queries = []
        for q in range(cat.n_queries):
            docs = []
            for j in range(cat.docs_per_query):
                doc: dict[str, Any] = {"doc_id": str(cat.doc_ids[q, j]), "grade": int(cat.grades[q, j]),
                                       "attractiveness": round(float(self.attractiveness[q, j]), 10)}
                if self.satisfaction is not None:
                    doc["satisfaction"] = round(float(self.satisfaction[q, j]), 10)
                if self.relevance is not None:
                    doc["relevance"] = round(float(self.relevance[q, j]), 10)
                docs.append(doc)
            queries.append({"query_id": cat.query_ids[q], "query": cat.query_texts[q], "docs": docs})
        config = asdict(c)
        config["start"] = c.start.isoformat().replace("+00:00", "Z")
        config["ranker_noise"] = list(self.ranker_noise)
        config["ranker_names"] = list(self.ranker_names)
        return {
            "generator": "ubi-pipeline simulate",
            "config": config,
            "model": c.model,
            "max_rank": c.max_rank,
            "max_grade": cat.max_grade,
            "theta": arr(self.theta),
            "theta_ratio": arr(self.theta_ratio),
            "grade_click_prob": arr(self.grade_click_prob),
            "eps_pos": arr(self.eps_pos),
            "eps_neg": arr(self.eps_neg),
            "dbn_gamma": c.dbn_gamma if c.model == "dbn" else None,
            "rankers": [{"name": n, "noise": s} for n, s in zip(self.ranker_names, self.ranker_noise, strict=True)],
            "queries": queries,
            "qrels": cat.qrels(),
            "fields": {
                "theta": "P(examined at rank k), k = 1..max_rank (pbm, trust; null for the cascade family)",
                "theta_ratio": "theta_k / theta_1: what `ubi propensity` estimates",
                "grade_click_prob": "P(click | examined) for grades 0..max_grade: eps- + (eps+ - eps-)(2^g - 1)/(2^G - 1)",
                "queries[].docs[].attractiveness": "true P(click | examined) of the (query, doc) (trust: at rank 1)",
                "queries[].docs[].satisfaction": "dbn only: P(satisfied | clicked)",
                "queries[].docs[].relevance": "trust only: P(R = 1)",
                "qrels": "the true grades as human judgments (docs/metrics.md JSONL form)",
            },
        }


def _truth(config: SimConfig, catalog: Catalog) -> Truth:
    k, g = config.max_rank, catalog.grades
    alpha_g = click_given_grade(np.arange(catalog.max_grade + 1), catalog.max_grade, config.eps_minus, config.eps_plus)
    theta = examination_curve(k, config.eta) if config.model in ("pbm", "trust") else None
    satisfaction = relevance = eps_pos = eps_neg = None
    attract = alpha_g[g]
    if config.model == "dbn":
        # satisfaction on the same exponential gain, without the click noise: grade 0 never satisfies
        satisfaction = ((2.0 ** g - 1.0) / (2.0 ** catalog.max_grade - 1.0)).astype(np.float64)
    if config.model == "trust":
        relevance = ((2.0 ** g - 1.0) / (2.0 ** catalog.max_grade - 1.0)).astype(np.float64)
        eps_pos, eps_neg = trust_bias_epsilons(k)
        attract = eps_pos[0] * relevance + eps_neg[0] * (1.0 - relevance)
    return Truth(config, catalog, theta, attract, satisfaction, relevance, eps_pos, eps_neg,
                 config.noise(), config.names(), alpha_g)


def _rankings(rng: np.random.Generator, catalog: Catalog, noise: tuple[float, ...], epochs: int,
              max_rank: int) -> NDArray[np.int64]:
    """[R, E, Q, K] doc slots shown by ranker r in epoch e: the grade plus N(0, σ_r²) noise, sorted, top K."""
    n_q, n_d = catalog.grades.shape
    out = np.empty((len(noise), epochs, n_q, max_rank), dtype=np.int64)
    for r, sigma in enumerate(noise):
        for e in range(epochs):
            score = catalog.grades + rng.normal(0.0, sigma, size=(n_q, n_d))
            out[r, e] = np.argsort(-score, axis=1, kind="stable")[:, :max_rank]
    return out


@dataclass(frozen=True)
class SimulatedTraffic:
    """One simulated log: per-session arrays plus the records and summaries derived from them."""

    config: SimConfig
    truth: Truth
    query: NDArray[np.int64]  # [n] catalog query per search
    ranker: NDArray[np.int64]  # [n]; -1 for an interleaved search
    swap: NDArray[np.int64]  # [n] 0 = not in the experiment, else k: rank 1 swapped with rank k (1 = control)
    slots: NDArray[np.int64]  # [n, K] doc slot (column of the catalog) at each rank
    clicks: NDArray[np.bool_]  # [n, K]
    crawler: NDArray[np.bool_] | None = None  # [n] search made by a crawler (None: no crawlers)
    #: [n, K] per interleaved search the team of each rank (0 = reference, 1 = challenger), -1 elsewhere
    team: NDArray[np.int8] | None = None
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_sessions(self) -> int:
        return len(self.query)

    @property
    def n_clicks(self) -> int:
        return int(self.clicks.sum())

    # ---------------------------------------------------------------- in-memory statistics

    @property
    def n_crawler_searches(self) -> int:
        return 0 if self.crawler is None else int(self.crawler.sum())

    @property
    def n_crawler_clients(self) -> int:
        """Clients the crawler searches are spread over: up to ``config.crawlers``, each with at least
        :data:`CRAWLER_MIN_SEARCHES` (a bot with a few dozen searches is not above any query rate)."""
        n = self.n_crawler_searches
        return 0 if n == 0 else max(1, min(self.config.crawlers, n // CRAWLER_MIN_SEARCHES))

    def query_ids(self) -> list[str]:
        """The ``query_id`` of every search, as the UBI records carry it (``sim<seed>-<index>``)."""
        w = self._ids()["width"]
        return [f"sim{self.config.seed}-{i:0{w}d}" for i in range(self.n_sessions)]

    def patterns(self, *, crawlers: bool = False, searches: NDArray[np.bool_] | None = None) -> SessionPatterns:
        """Deduplicated :class:`SessionPatterns` over the pairs that were shown (as the store would give).

        Crawler searches are left out, as the session filter drops them from the store (``crawlers=True``
        keeps them). ``searches`` (a mask over all searches) keeps only those; the pair index always covers
        every pair the kept searches and the rest showed, so patterns of two masks share it.
        """
        key = ("patterns", crawlers, None if searches is None else hash(searches.tobytes()))
        if key not in self._cache:
            if "pairs" not in self._cache:
                d = self.truth.catalog.docs_per_query
                flat = self.query[:, None] * d + self.slots
                used, compact = np.unique(flat, return_inverse=True)
                cat = self.truth.catalog
                texts = np.array([normalize_query(t) for t in cat.query_texts], dtype=object)
                pairs = PairIndex(queries=texts[used // d], doc_ids=cat.doc_ids.reshape(-1)[used],
                                  query_index=(used // d).astype(np.int64))
                self._cache["pairs"] = (pairs, compact.reshape(flat.shape))
            pairs, compact = self._cache["pairs"]
            keep = np.ones(self.n_sessions, dtype=bool) if searches is None else np.asarray(searches, dtype=bool)
            if self.crawler is not None and not crawlers:
                keep = keep & ~self.crawler
            self._cache[key] = dedupe_patterns(pairs, self.query[keep], compact[keep], self.clicks[keep])
        return self._cache[key]

    def system_rankings(self, *, crawlers: bool = False, searches: NDArray[np.bool_] | None = None) -> SystemRankings:
        """Which system showed which ranking, over the searches :meth:`patterns` keeps (same masks, same pairs).

        A system is named as ``ubi_pipeline.schemas.systems`` names it from the records :meth:`iter_searches` writes
        (``<application>/ranker=<name>``; an interleaved search is ranker ``interleaved``). One row per
        distinct (query, system, ranking).
        """
        self.patterns(crawlers=crawlers, searches=searches)  # builds the pair index
        compact = self._cache["pairs"][1]
        keep = np.ones(self.n_sessions, dtype=bool) if searches is None else np.asarray(searches, dtype=bool)
        if self.crawler is not None and not crawlers:
            keep = keep & ~self.crawler
        app = self.config.application
        names = [system_name(app, {"ranker": n}) for n in self.truth.ranker_names]
        ranker = self.ranker[keep]
        system = np.where(ranker >= 0, ranker, len(names))
        if (ranker < 0).any():
            names.append(system_name(app, {"ranker": INTERLEAVED_RANKER}))
        rows = np.unique(np.column_stack([self.query[keep], system, compact[keep]]), axis=0)
        return SystemRankings(tuple(names), rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64),
                              rows[:, 2:].astype(np.int64))

    def swap_sessions(self) -> SwapSessions:
        """The searches of the swap experiment, by arm (control = rank 1 swapped with itself)."""
        k = self.config.max_rank
        inside = self.swap > 0
        arms = np.stack([np.ones(k, dtype=np.int64), np.arange(1, k + 1)], axis=1)
        mask = (self.clicks[inside].astype(np.int64) << np.arange(k)).sum(axis=1)
        key = (self.swap[inside] - 1) * (1 << k) + mask
        uniq, weight = np.unique(key, return_counts=True)
        arm = uniq >> k
        clicks = ((uniq[:, None] & (1 << np.arange(k))) > 0)
        return SwapSessions(arms, arm.astype(np.int64), clicks, weight.astype(np.int64))

    # ---------------------------------------------------------------- UBI records

    def _ids(self) -> dict[str, Any]:
        if "ids" in self._cache:
            return self._cache["ids"]
        n, s = self.n_sessions, self.config.seed
        idx = np.arange(n)
        client = idx // SEARCHES_PER_CLIENT
        start_ms = int(self.config.start.timestamp() * 1000)
        t_query = start_ms + client * _CLIENT_START_GAP_MS + (idx % SEARCHES_PER_CLIENT) * _SEARCH_GAP_MS
        crawler_of = np.full(n, -1, dtype=np.int64)
        if self.crawler is not None and self.crawler.any():
            rows = np.flatnonzero(self.crawler)
            j = np.arange(len(rows))
            n_crawl = self.n_crawler_clients
            crawler_of[rows] = j % n_crawl
            # each crawler searches every _CRAWLER_GAP_MS from the start: far above any human query rate
            t_query[rows] = start_ms + (j // n_crawl) * _CRAWLER_GAP_MS + crawler_of[rows]
        ids = {
            "t_query": _iso(t_query),
            "t_imp": _iso(t_query + _IMPRESSION_DELAY_MS),
            "t_query_ms": t_query,
            "client": client,
            "crawler_of": crawler_of,
            "width": max(6, len(str(n - 1))),
            "seed": s,
        }
        self._cache["ids"] = ids
        return ids

    def iter_searches(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """(query record, its events) per search in log order: impressions of the displayed list, then clicks."""
        ids = self._ids()
        cfg, cat = self.config, self.truth.catalog
        names = self.truth.ranker_names
        w, seed, app = ids["width"], ids["seed"], cfg.application
        stop = self.n_sessions if stop is None else min(stop, self.n_sessions)
        for i in range(start, stop):
            q = int(self.query[i])
            qid = f"sim{seed}-{i:0{w}d}"
            c = int(ids["crawler_of"][i])
            client = f"client{seed}-{int(ids['client'][i]):0{w}d}" if c < 0 else f"crawler{seed}-{c}"
            session = client + "-s1"
            text = cat.query_texts[q]
            hits = [str(cat.doc_ids[q, j]) for j in self.slots[i]]
            if self.team is not None and self.team[i, 0] >= 0:
                pair = cfg.interleave or ("", "")
                block = Interleaved(qid, hits, {h: pair[int(t)] for h, t in zip(hits, self.team[i].tolist(),
                                                                                 strict=True)}, pair)
                attrs: dict[str, Any] = {"ranker": INTERLEAVED_RANKER, **block.query_attributes()}
            else:
                attrs = {"ranker": names[int(self.ranker[i])]}
            if self.swap[i]:
                attrs["randomized"] = {"method": "swap", "ranks": [1, int(self.swap[i])]}
            query = {
                "application": app, "query_id": qid, "client_id": client, "user_query": text,
                "timestamp": ids["t_query"][i], "query_attributes": attrs,
                "object_id_field": OBJECT_ID_FIELD, "query_response_hit_ids": hits,
            }
            common = {"query_id": qid, "session_id": session, "client_id": client, "application": app,
                      "user_query": text}
            events = [
                {"action_name": "impression", "event_id": f"{qid}-imp{k}", **common, "timestamp": ids["t_imp"][i],
                 "event_attributes": {"object": {"object_id": doc, "object_id_field": OBJECT_ID_FIELD},
                                      "position": {"ordinal": k}}}
                for k, doc in enumerate(hits)
            ]
            clicked = np.flatnonzero(self.clicks[i])
            if clicked.size:
                t_click = _iso(ids["t_query_ms"][i] + _FIRST_CLICK_DELAY_MS + clicked * _CLICK_GAP_MS)
                for k, ts in zip(clicked.tolist(), t_click, strict=True):
                    events.append(
                        {"action_name": "click", "event_id": f"{qid}-click{k}", **common, "timestamp": ts,
                         "event_attributes": {"object": {"object_id": hits[k], "object_id_field": OBJECT_ID_FIELD},
                                              "position": {"ordinal": k}}})
            yield query, events

    @property
    def queries(self) -> _Records:
        """The query records, one per search (re-iterable)."""
        return _Records(self, "queries", self.n_sessions)

    @property
    def events(self) -> _Records:
        """The events: an ``impression`` per displayed result and a ``click`` per click (re-iterable)."""
        return _Records(self, "events", self.n_sessions * self.config.max_rank + self.n_clicks)

    def bulk_lines(self) -> Iterator[bytes]:
        """The log as an OpenSearch ``_bulk`` body (action line, then document), one search at a time."""
        for query, events in self.iter_searches():
            yield from _bulk_pairs(query, events)

    def write_bulk(self, path: Path | str, *, progress: Callable[[int], None] | None = None) -> int:
        """Write the ``_bulk`` body to ``path`` (loads with ``ubi import``); returns the number of records."""
        records = 0
        step = max(1, self.n_sessions // 100)
        with open(path, "wb") as fh:
            buf: list[bytes] = []
            for i, (query, events) in enumerate(self.iter_searches()):
                buf.extend(_bulk_pairs(query, events))
                records += 1 + len(events)
                if (i + 1) % step == 0:
                    fh.write(b"\n".join(buf) + b"\n")
                    buf.clear()
                    if progress:
                        progress(i + 1)
            if buf:
                fh.write(b"\n".join(buf) + b"\n")
            if progress:
                progress(self.n_sessions)
        return records

    def write_truth(self, path: Path | str) -> None:
        """Write the truth file (JSON, keys sorted, so the same seed gives the same bytes)."""
        Path(path).write_bytes(orjson.dumps(self.truth.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))

    def write_qrels(self, path: Path | str) -> int:
        """Write the true grades as qrels JSONL (``docs/metrics.md``); returns the number of queries."""
        rows = self.truth.catalog.qrels()
        Path(path).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        return len(rows)

    def post(self, url: str, *, batch_searches: int = 500, timeout: float = 30.0,
             progress: Callable[[int], None] | None = None, client: Any = None) -> PostResult:
        """POST the log to a running collector (``/v1/queries`` then ``/v1/events`` per batch of searches)."""
        import httpx  # only this path talks HTTP

        base = url.rstrip("/")
        total = PostResult()
        own = client is None
        http = httpx.Client(timeout=timeout) if own else client
        try:
            for start in range(0, self.n_sessions, batch_searches):
                queries: list[dict[str, Any]] = []
                events: list[dict[str, Any]] = []
                for query, evs in self.iter_searches(start, start + batch_searches):
                    queries.append(query)
                    events.extend(evs)
                total = total + _post(http, f"{base}/v1/queries", queries, "queries")
                for e0 in range(0, len(events), 5000):  # stay under the collector's item limit
                    total = total + _post(http, f"{base}/v1/events", events[e0:e0 + 5000], "events")
                if progress:
                    progress(min(start + batch_searches, self.n_sessions))
        finally:
            if own:
                http.close()
        return total

    def summary(self) -> dict[str, Any]:
        """Counts worth printing: searches, impressions, clicks, CTR per rank, per ranker.

        Per ranker, ``ctr`` is clicks / impressions (every search displays ``max_rank`` results) and
        ``searches_with_click`` the share of its searches with at least one click.
        """
        k = self.config.max_rank
        per_ranker = []
        for r, name in enumerate(self.truth.ranker_names):
            sel = self.ranker == r
            n = int(sel.sum())
            clicks = int(self.clicks[sel].sum())
            per_ranker.append({"ranker": name, "noise": self.truth.ranker_noise[r], "searches": n,
                               "impressions": n * k, "clicks": clicks,
                               "ctr": clicks / (n * k) if n else None,
                               "searches_with_click": float(self.clicks[sel].any(axis=1).mean()) if n else None})
        return {
            "sessions": self.n_sessions,
            "queries": self.truth.catalog.n_queries,
            "impressions": self.n_sessions * k,
            "clicks": self.n_clicks,
            "randomized_searches": int((self.swap > 0).sum()),
            "interleaved_searches": 0 if self.team is None else int((self.team[:, 0] >= 0).sum()),
            "interleave": None if self.config.interleave is None else list(self.config.interleave),
            "crawler_searches": self.n_crawler_searches,
            "crawler_clients": self.n_crawler_clients,
            "ctr_at_rank": [round(float(x), 6) for x in self.clicks.mean(axis=0)],
            "rankers": per_ranker,
            "model": self.config.model,
            "seed": self.config.seed,
        }


@dataclass(frozen=True)
class PostResult:
    """Counts the collector answered, summed over the batches posted."""

    queries_sent: int = 0
    events_sent: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    requests: int = 0

    def __add__(self, other: PostResult) -> PostResult:
        return PostResult(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values(), strict=True)))


class PostError(SimulationError):
    """The collector could not be reached or refused a batch (names the URL and the status)."""


def _post(http: Any, url: str, items: list[dict[str, Any]], kind: str) -> PostResult:
    import httpx

    if not items:
        return PostResult()
    try:
        resp = http.post(url, content=orjson.dumps(items), headers={"content-type": "application/json"})
    except httpx.HTTPError as exc:
        raise PostError(f"cannot post to {url}: {exc}. Is `ubi serve` running there?") from exc
    if resp.status_code >= 300:
        raise PostError(f"{url} answered {resp.status_code}: {resp.text[:300]}")
    body = resp.json()
    sent = len(items)
    return PostResult(sent if kind == "queries" else 0, sent if kind == "events" else 0,
                      int(body.get("accepted", 0)), int(body.get("duplicates", 0)), int(body.get("rejected", 0)), 1)


def _bulk_pairs(query: dict[str, Any], events: list[dict[str, Any]]) -> Iterator[bytes]:
    """Action line and document for a query and its events; the event's ``_id`` is its ``event_id``."""
    yield b'{"index":{"_index":"ubi_queries","_id":"%s"}}' % query["query_id"].encode()
    yield orjson.dumps(query)
    for event in events:
        yield b'{"index":{"_index":"ubi_events","_id":"%s"}}' % event["event_id"].encode()
        yield orjson.dumps(event)


class _Records:
    """A re-iterable, sized view of the query records or the events of a simulated log."""

    def __init__(self, traffic: SimulatedTraffic, kind: str, size: int) -> None:
        self._traffic, self._kind, self._size = traffic, kind, size

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for query, events in self._traffic.iter_searches():
            if self._kind == "queries":
                yield query
            else:
                yield from events


def _iso(ms: NDArray[np.int64] | Iterable[int]) -> list[str]:
    """Epoch milliseconds -> ISO 8601 strings with milliseconds and ``Z`` (vectorised)."""
    arr = np.asarray(ms, dtype="int64").astype("datetime64[ms]")
    return [s + "Z" for s in np.datetime_as_string(arr, unit="ms").tolist()]


def _sessions(config: SimConfig, catalog: Catalog, rankings: NDArray[np.int64],
              rng: np.random.Generator) -> tuple[NDArray[np.int64], ...]:
    n, k = config.sessions, config.max_rank
    popularity = 1.0 / np.arange(1, catalog.n_queries + 1) ** config.query_skew
    # which query is popular is itself random, so popularity does not follow catalog order
    popularity = popularity[rng.permutation(catalog.n_queries)]
    query = rng.choice(catalog.n_queries, size=n, p=popularity / popularity.sum())
    ranker = rng.integers(0, config.rankers, size=n)
    epoch = (np.arange(n) * config.epochs) // n
    slots = rankings[ranker, epoch, query].copy()
    swap = np.zeros(n, dtype=np.int64)
    if config.randomize > 0:
        inside = rng.random(n) < config.randomize
        arm = rng.integers(1, k + 1, size=n)  # k = 1 is the control arm (marked, nothing moved)
        swap[inside] = arm[inside]
        rows = np.flatnonzero(swap > 1)
        cols = swap[rows] - 1
        first = slots[rows, 0].copy()
        slots[rows, 0] = slots[rows, cols]
        slots[rows, cols] = first
    return query.astype(np.int64), ranker.astype(np.int64), swap, slots


def simulate(config: SimConfig | None = None, **overrides: Any) -> SimulatedTraffic:
    """Simulate a UBI log under ``config`` (or ``SimConfig(**overrides)``): same config, same log.

    Protocol (``docs/position-bias.md``): rankers sort a query's docs by grade + N(0, σ_r²) and show the top
    K; sessions pick a query (popularity ∝ 1/rank^skew) and a ranker uniformly; with ``randomize`` > 0 that
    share of searches swaps rank 1 with a uniform rank k in 1..K (Joachims et al., WSDM 2017; k = 1 is the
    control arm). Clicks follow ``model`` with θ_k = (1/k)^η and P(click | examined, g) =
    ε⁻ + (ε⁺ − ε⁻)(2^g − 1)/(2^G − 1); trust bias uses ε⁺_k = 1 − (k+1)/100, ε⁻_k = 0.65/k (Agarwal et al.,
    WSDM 2019) with P(R = 1 | g) = (2^g − 1)/(2^G − 1); DBN uses satisfaction (2^g − 1)/(2^G − 1) and
    persistence ``dbn_gamma``.
    """
    if config is None:
        config = SimConfig(**overrides)
    elif overrides:
        config = SimConfig(**{**asdict(config), **overrides})
    config.check()
    seq = np.random.SeedSequence(config.seed)
    # a fourth stream for crawlers: the first three (and so every log without crawlers) stay as they were
    # a fifth for interleaving (SeedSequence children depend on their index only: the first four are unchanged)
    rng_rank, rng_sess, rng_click, rng_crawl, rng_il = (np.random.default_rng(s) for s in seq.spawn(5))
    catalog = build_catalog(config.queries, config.docs_per_query, max_grade=config.max_grade, seed=config.seed)
    truth = _truth(config, catalog)
    rankings = _rankings(rng_rank, catalog, truth.ranker_noise, config.epochs, config.max_rank)
    query, ranker, swap, slots = _sessions(config, catalog, rankings, rng_sess)
    team = None
    if config.interleave is not None:
        ranker, swap, slots, team = _interleave(config, truth, rankings, query, ranker, swap, slots, rng_il)
    clicks = _draw_clicks(config, truth, query, slots, rng_click)
    crawler = None
    if config.crawler_share > 0:
        # crawlers walk the catalog uniformly and click at random: noise the session filter must remove
        crawler = rng_crawl.random(config.sessions) < config.crawler_share
        rows = np.flatnonzero(crawler)
        query = query.copy()
        query[rows] = rng_crawl.integers(0, catalog.n_queries, size=len(rows))
        slots[rows] = rankings[ranker[rows], (rows * config.epochs) // config.sessions, query[rows]]
        clicks[rows] = rng_crawl.random((len(rows), config.max_rank)) < config.crawler_click
        swap = swap.copy()
        swap[rows] = 0  # crawlers are not part of a swap experiment
        if team is not None:  # nor of an interleaving experiment: they show the ranker they drew
            team[rows] = -1
            ranker[rows] = rng_crawl.integers(0, config.rankers, size=len(rows))
            slots[rows] = rankings[ranker[rows], (rows * config.epochs) // config.sessions, query[rows]]
    return SimulatedTraffic(config, truth, query, ranker, swap, slots, clicks, crawler, team)


def _interleave(config: SimConfig, truth: Truth, rankings: NDArray[np.int64], query: NDArray[np.int64],
                ranker: NDArray[np.int64], swap: NDArray[np.int64], slots: NDArray[np.int64],
                rng: np.random.Generator
                ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int8]]:
    """Replace a ``interleave_share`` of searches by the team-draft interleaving of the two named rankers.

    Each chosen search interleaves the two rankers' lists of its epoch with
    :func:`ubi_pipeline.schemas.interleaving.team_draft`, seeded by the search's ``query_id`` as the collector's route
    is; it leaves any swap experiment (swap 0) and its ranker becomes -1 (its records say ``interleaved``).
    """
    names = truth.ranker_names
    pair = config.interleave or ("", "")
    ref, cha = names.index(pair[0]), names.index(pair[1])
    n, k = slots.shape
    inside = np.flatnonzero(rng.random(n) < config.interleave_share)
    epoch = (inside * config.epochs) // n
    width = max(6, len(str(n - 1)))  # as ``SimulatedTraffic._ids``: the records' query ids
    ranker, swap, slots = ranker.copy(), swap.copy(), slots.copy()
    team = np.full((n, k), -1, dtype=np.int8)
    for i, e in zip(inside.tolist(), epoch.tolist(), strict=True):
        q = int(query[i])
        lists = {pair[0]: [str(x) for x in rankings[ref, e, q]], pair[1]: [str(x) for x in rankings[cha, e, q]]}
        out = team_draft(f"sim{config.seed}-{i:0{width}d}", lists, size=k)
        slots[i] = [int(d) for d in out.hits]
        team[i] = [0 if out.teams[d] == pair[0] else 1 for d in out.hits]
    ranker[inside] = -1
    swap[inside] = 0
    return ranker, swap, slots, team


def _draw_clicks(config: SimConfig, truth: Truth, query: NDArray[np.int64], slots: NDArray[np.int64],
                 rng: np.random.Generator) -> NDArray[np.bool_]:
    d = truth.catalog.docs_per_query
    docs = query[:, None] * d + slots  # pair id = q * D + slot, as the kernel wants one value per pair
    flat = truth.attractiveness.reshape(-1)
    if config.model == "pbm":
        return simulate_clicks(rng, docs, model="pbm", attractiveness=flat, theta=truth.theta)
    if config.model == "trust":
        if truth.relevance is None:
            raise SimulationError("internal: trust bias without relevance")
        return simulate_clicks(rng, docs, model="trust", relevance=truth.relevance.reshape(-1), theta=truth.theta,
                               eps_pos=truth.eps_pos, eps_neg=truth.eps_neg)
    if config.model == "cascade":
        return simulate_clicks(rng, docs, model="cascade", attractiveness=flat)
    if truth.satisfaction is None:
        raise SimulationError("internal: DBN without satisfaction")
    return simulate_clicks(rng, docs, model="dbn", attractiveness=flat, satisfaction=truth.satisfaction.reshape(-1),
                           gamma=config.dbn_gamma)


def simulate_patterns(config: SimConfig | None = None, **overrides: Any) -> tuple[SessionPatterns, Truth]:
    """Weighted session patterns and the truth, without any UBI record (for benches: 1 M sessions in seconds)."""
    traffic = simulate(config, **overrides)
    return traffic.patterns(), traffic.truth


