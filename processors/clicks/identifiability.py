"""Can position be told apart from relevance in this log? One verdict for process, propensity and report.

Examination θ_k and attractiveness α_qd enter a click only as a product (PBM: P(C) = θ_k·α_qd), so a log in
which every (query, doc) pair was displayed at one rank only is explained equally well by any examination
curve: a steep θ with flat α, or a flat θ with α that falls with rank. Only pairs displayed at two or more
ranks (several rankers, ranking changes, interventions) tie the ranks together: a pair shown at ranks k and
k' says θ_k/θ_k' (Wang et al., WSDM 2018; Agarwal et al., WSDM 2019, "interventional sets"). Build a graph
with one node per displayed rank and an edge k–k' for every rank pair that shares at least one (query, doc);
θ_k/θ_1 is identifiable exactly for the ranks in the connected component of rank 1.

Verdicts:

* ``identified``: every displayed rank is linked to rank 1;
* ``partial``: some are, some are not: pairs shown only at unlinked ranks have no position-debiased
  relevance (their α is confounded with an unknown θ);
* ``unidentified``: no pair was displayed at two ranks (or none links any rank to rank 1).

Position-debiased sources (:data:`POSITION_DEBIASED`: PBM and UBM, which fit θ beside α; DBN, whose
persistence γ plays θ's part; COEC, which divides by a per-rank CTR that a fixed ranking mixes with
relevance) must not grade pairs whose ranks lie outside rank 1's component. Raw CTR measures what it
measures whatever the log. Cascade, DCM and SDBN are not gated: they fit no examination parameter but
count a pair as examined by the click pattern alone (at or above the first / last click), which a fixed
ranking does not confound (their assumption that users scan top-down can still be wrong; the held-out
perplexity of ``ubi select`` is what tests it). Ranks linked by fewer than :data:`FEW_LINKING_PAIRS`
pairs are named: the estimate there rests on little.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.clicks.stats import ClickCells

#: a rank linked to the others by fewer (query, doc) pairs than this is named in the notes
FEW_LINKING_PAIRS = 20
#: judgment sources whose relevance rests on separating position (examination) from relevance
POSITION_DEBIASED = frozenset({"coec", "pbm", "ubm", "dbn"})

IDENTIFIED, PARTIAL, UNIDENTIFIED = "identified", "partial", "unidentified"


@dataclass(frozen=True)
class Identifiability:
    """The verdict and the evidence behind it (see the module docstring)."""

    verdict: str  # identified | partial | unidentified
    max_rank: int
    pairs: int  # (query, doc) pairs displayed within the ranks
    pairs_at_several_ranks: int
    displayed_ranks: tuple[int, ...]
    linked_ranks: tuple[int, ...]  # displayed ranks in rank 1's component (rank 1 included when displayed)
    unlinked_ranks: tuple[int, ...]
    weak_ranks: tuple[int, ...]  # linked, but by fewer than FEW_LINKING_PAIRS pairs shown at another rank
    rank_links: tuple[tuple[int, int, int], ...]  # (k, k', pairs shown at both), k < k'
    pairs_linking_rank: tuple[int, ...] = field(default=())  # per rank 1..K: pairs shown there and elsewhere too

    @property
    def identifiable(self) -> bool:
        """True when every displayed rank is linked to rank 1."""
        return self.verdict == IDENTIFIED

    def reason(self) -> str:
        """One sentence a user can act on."""
        if self.verdict == IDENTIFIED:
            text = (f"position and relevance can be separated: {self.pairs_at_several_ranks:,} of {self.pairs:,} "
                    f"(query, doc) pairs were shown at two or more ranks, linking every displayed rank to rank 1")
            if self.weak_ranks:
                text += (f"; ranks {list(self.weak_ranks)} are linked by fewer than {FEW_LINKING_PAIRS} such pairs, "
                         "so estimates there rest on little")
            return text
        fix = ("position bias needs the same results at different ranks: several rankers over the same queries "
               "(A/B test, interleaving), ranking changes over time, or a randomised swap experiment")
        if self.verdict == UNIDENTIFIED:
            return (f"position and relevance cannot be separated: none of the {self.pairs:,} (query, doc) pairs was "
                    f"shown at two different ranks, so any examination curve explains these clicks equally well; "
                    f"position-debiased sources give no grades. {fix[0].upper()}{fix[1:]}")
        return (f"position and relevance can be separated only at ranks {list(self.linked_ranks)}: ranks "
                f"{list(self.unlinked_ranks)} share no (query, doc) pair with them; pairs shown only there get no "
                f"grade from position-debiased sources. {fix[0].upper()}{fix[1:]}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "identifiable": self.identifiable, "max_rank": self.max_rank,
            "pairs": self.pairs, "pairs_at_several_ranks": self.pairs_at_several_ranks,
            "displayed_ranks": list(self.displayed_ranks), "linked_ranks": list(self.linked_ranks),
            "unlinked_ranks": list(self.unlinked_ranks), "weak_ranks": list(self.weak_ranks),
            "rank_links": [{"k": a, "k2": b, "pairs": n} for a, b, n in self.rank_links],
            "pairs_linking_rank": list(self.pairs_linking_rank), "reason": self.reason(),
        }

    def gradable(self, cells: ClickCells) -> NDArray[np.bool_]:
        """Per pair of ``cells.pairs``: shown at some rank of rank 1's component (so its debiased score means something)."""
        linked = np.zeros(self.max_rank + 2, dtype=bool)
        linked[list(self.linked_ranks)] = True
        ok = np.zeros(len(cells.pairs), dtype=bool)
        keep = cells.rank <= self.max_rank
        ok[cells.pair[keep][linked[cells.rank[keep]]]] = True
        if self.verdict == UNIDENTIFIED:
            ok[:] = False
        return ok


def _components(n: int, edges_a: NDArray[np.int64], edges_b: NDArray[np.int64]) -> NDArray[np.int64]:
    """Component label per node 0..n-1 (union-find with path halving)."""
    parent = np.arange(n)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    for a, b in zip(edges_a.tolist(), edges_b.tolist(), strict=True):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(i) for i in range(n)], dtype=np.int64)


def assess(cells: ClickCells, max_rank: int | None = None) -> Identifiability:
    """The identifiability verdict of the log behind ``cells`` (PBM cells: one row per displayed (pair, rank))."""
    k = cells.max_rank if max_rank is None else min(int(max_rank), cells.max_rank)
    keep = (cells.rank <= k) & (cells.impressions > 0)
    pair, rank = cells.pair[keep], cells.rank[keep]
    n_pairs = int(len(np.unique(pair)))
    displayed = np.zeros(k + 1, dtype=bool)
    displayed[rank] = True
    # one row per (pair, rank): a dense [pairs at >= 2 ranks, K] incidence matrix is small (pairs of the log
    # shown at several ranks only), and its Gram matrix counts the pairs shared by every rank pair
    ranks_per_pair = np.bincount(pair, minlength=len(cells.pairs)) if len(pair) else np.zeros(0, dtype=np.int64)
    multi = ranks_per_pair[pair] >= 2 if len(pair) else np.zeros(0, dtype=bool)
    used, row = np.unique(pair[multi], return_inverse=True)
    inc = np.zeros((len(used), k), dtype=np.int64)
    inc[row, rank[multi] - 1] = 1
    shared = inc.T @ inc  # [K, K]: pairs shown at both ranks
    a_idx, b_idx = np.nonzero(np.triu(shared, 1))
    links = tuple((int(a) + 1, int(b) + 1, int(shared[a, b])) for a, b in zip(a_idx, b_idx, strict=True))
    comp = _components(k + 1, a_idx + 1, b_idx + 1)
    shown_ranks = [r for r in range(1, k + 1) if displayed[r]]
    linking = np.diag(shared) if len(used) else np.zeros(k, dtype=np.int64)
    if links and displayed[1]:
        linked = [r for r in shown_ranks if comp[r] == comp[1]]
    else:
        linked = []
    if len(linked) <= 1:
        verdict, linked = UNIDENTIFIED, []
    elif len(linked) == len(shown_ranks):
        verdict = IDENTIFIED
    else:
        verdict = PARTIAL
    unlinked = [r for r in shown_ranks if r not in linked]
    weak = [r for r in linked if linking[r - 1] < FEW_LINKING_PAIRS]
    return Identifiability(verdict, k, n_pairs, int(len(used)), tuple(shown_ranks), tuple(linked), tuple(unlinked),
                           tuple(weak), links, tuple(int(x) for x in linking))


def is_position_debiased(source: str) -> bool:
    """Whether a judgment source (``implicit:pbm`` or ``pbm``) rests on separating position from relevance."""
    name = source.split(":", 1)[1] if source.startswith("implicit:") else source
    return name in POSITION_DEBIASED
