"""Interleaved traffic on the simulator: two rankers team-drafted per search, clicks from the same users.

Each search draws a query from a distribution, interleaves the two rankers' lists for it with
:func:`ubi_pipeline.schemas.interleaving.team_draft` (seeded by the search's query id, as the route does), and draws
clicks on the interleaved list with the simulator's click kernel under the truth's click model. The same
kernel on each ranker's own list gives the A/B traffic the bench compares with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.simulation.catalog import SimulationError
from ubi_pipeline.processors.simulation.clicks import simulate_clicks
from ubi_pipeline.processors.simulation.traffic import Truth
from ubi_pipeline.schemas.interleaving import team_draft


@dataclass(frozen=True)
class InterleavedTraffic:
    """Per search: query, interleaved doc slots, which ranker contributed each (0 or 1), clicks."""

    query: NDArray[np.int64]  # [n]
    slots: NDArray[np.int64]  # [n, K]
    team: NDArray[np.int64]  # [n, K]: 0 = the reference ranker, 1 = the challenger
    clicks: NDArray[np.bool_]  # [n, K]

    def credits(self) -> NDArray[np.int64]:
        """[n, 2] credited clicks of (reference, challenger) per search."""
        return np.stack([(self.clicks & (self.team == 0)).sum(axis=1),
                         (self.clicks & (self.team == 1)).sum(axis=1)], axis=1).astype(np.int64)


def draw_clicks(truth: Truth, query: NDArray[np.int64], slots: NDArray[np.int64],
                rng: np.random.Generator) -> NDArray[np.bool_]:
    """Clicks on the lists ``slots[i]`` shown for ``query[i]`` under the truth's click model (pbm, cascade, dbn)."""
    cat = truth.catalog
    docs = query[:, None] * cat.docs_per_query + slots
    flat = truth.attractiveness.reshape(-1)
    model = truth.config.model
    if model == "pbm":
        return simulate_clicks(rng, docs, model="pbm", attractiveness=flat, theta=truth.theta)
    if model == "cascade":
        return simulate_clicks(rng, docs, model="cascade", attractiveness=flat)
    if model == "dbn" and truth.satisfaction is not None:
        return simulate_clicks(rng, docs, model="dbn", attractiveness=flat,
                               satisfaction=truth.satisfaction.reshape(-1), gamma=truth.config.dbn_gamma)
    raise SimulationError(f"interleaved traffic supports pbm, cascade and dbn truths, not {model!r}")


def simulate_interleaved(truth: Truth, reference: NDArray[np.int64], challenger: NDArray[np.int64],
                         query: NDArray[np.int64], rng: np.random.Generator, *, prefix: str = "il") -> InterleavedTraffic:
    """Team-draft ``reference[q]`` and ``challenger[q]`` ([Q, K] doc slots) for each search of ``query``."""
    k = reference.shape[1]
    if challenger.shape != reference.shape:
        raise SimulationError(f"the two rankers need lists of one shape, got {reference.shape} and {challenger.shape}")
    n = len(query)
    slots = np.empty((n, k), dtype=np.int64)
    team = np.empty((n, k), dtype=np.int64)
    ref_s = [[str(x) for x in row] for row in reference.tolist()]
    cha_s = [[str(x) for x in row] for row in challenger.tolist()]
    for i, q in enumerate(query.tolist()):
        out = team_draft(f"{prefix}-{i}", {"reference": ref_s[q], "challenger": cha_s[q]}, size=k)
        slots[i] = [int(d) for d in out.hits]
        team[i] = [0 if out.teams[d] == "reference" else 1 for d in out.hits]
    return InterleavedTraffic(query, slots, team, draw_clicks(truth, query, slots, rng))
