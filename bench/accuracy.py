"""Accuracy against known truth: position bias θ̂_k/θ̂_1 and relevance recovery, as the log grows.

Simulated PBM traffic following docs/position-bias.md (issue 3, "What it must show"): η = 1 (θ_k = 1/k),
ε⁻ = 0.1, ε⁺ = 1, grades 0..3, 10 ranks, 3 rankers of differing quality (grade + Gaussian noise, σ = 0.5,
1.0, 2.0), query popularity ∝ 1/rank^0.5, on two catalogs (--queries): the simulator's default of 40
queries x 20 docs (what ``ubi simulate`` produces), and a sparse one of 1,000 queries x 20 docs, where most
pairs are seen only a few dozen times. For each catalog and log size (default 10,000, 100,000 and
1,000,000 sessions) it prints:

* position bias: mean relative error of θ̂_k/θ̂_1 over ranks 2..10 for PBM EM and intervention harvesting
  (AllPairs) on that log, and for randomised swaps on a second log of the same size and protocol in which
  10% of searches are in a rank-1 swap experiment (--randomize); target (issue 3): <= 5% at 100,000 for EM
  and harvesting;
* relevance recovery for every model of the click-model registry: per query, the docs the log showed are
  ranked by the model's relevance score and compared with the true grades by Kendall τ-b (scipy) and nDCG@10
  (linear gain, ideal over all 20 judged docs of the query: trec_eval ``ndcg_cut``; ubi_pipeline.reports.metrics.ndcg),
  averaged over queries; raw CTR (``dctr``) and COEC sit beside the models, and the true grades (ties
  broken at random) give the ceiling; check: PBM and UBM beat raw CTR.

    .venv/bin/python bench/accuracy.py [--sizes 10000 100000 1000000] [--queries 40 1000] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ubi_pipeline.processors.click_models import MODEL_NAMES, get_model  # noqa: E402
from ubi_pipeline.processors.clicks.stats import cells_from_sessions  # noqa: E402
from ubi_pipeline.processors.propensity.em import em_ratios  # noqa: E402
from ubi_pipeline.processors.propensity.harvest import allpairs  # noqa: E402
from ubi_pipeline.processors.propensity.randomized import randomized_ratios  # noqa: E402
from ubi_pipeline.processors.simulation import SimConfig, simulate  # noqa: E402
from ubi_pipeline.reports.metrics.ndcg import linear_gain, ndcg  # noqa: E402

TARGET_MRE = 0.05


def relative_errors(ratio: np.ndarray, truth: np.ndarray) -> np.ndarray:
    t = truth / truth[0]
    return np.abs(ratio[1:] - t[1:]) / t[1:]


def recovery(score: np.ndarray, grades_of_pair: np.ndarray, catalog_grades: np.ndarray,
             q_of_pair: np.ndarray) -> tuple[float, float]:
    """Mean per-query Kendall τ-b (scores vs grades, shown docs) and nDCG@10 (docs ranked by score).

    ``q_of_pair`` is the catalog query of each pair (the simulator's ``PairIndex.query_index``).
    """
    n_q = catalog_grades.shape[0]
    order = np.lexsort((np.arange(len(score)), -np.nan_to_num(score, nan=-np.inf), q_of_pair))
    taus: list[float] = []
    depth = 10
    gains = np.zeros((n_q, depth))
    seen = np.zeros(n_q, dtype=bool)
    starts = np.searchsorted(q_of_pair[order], np.arange(n_q))
    ends = np.searchsorted(q_of_pair[order], np.arange(n_q), side="right")
    for q in range(n_q):
        idx = order[starts[q]:ends[q]]
        if len(idx) == 0:
            continue
        seen[q] = True
        top = grades_of_pair[idx[:depth]]
        gains[q, :len(top)] = linear_gain(top)
        s, g = score[idx], grades_of_pair[idx]
        if len(idx) >= 2 and np.ptp(g) > 0 and np.nanstd(s) > 0:
            tau = kendalltau(s, g).statistic
            if np.isfinite(tau):
                taus.append(float(tau))
    ideal = -np.sort(-linear_gain(catalog_grades), axis=1)
    nd = ndcg(gains[seen], ideal[seen], depth)
    return (float(np.mean(taus)) if taus else float("nan")), float(nd.mean())


def run_size(n: int, n_queries: int, args: argparse.Namespace) -> dict[str, Any]:
    config = SimConfig(sessions=n, seed=args.seed, model="pbm", eta=1.0, rankers=3, queries=n_queries,
                       docs_per_query=20, max_rank=10, eps_minus=0.1, eps_plus=1.0)
    t0 = time.perf_counter()
    traffic = simulate(config)
    patterns = traffic.patterns()
    sim_s = time.perf_counter() - t0
    truth = traffic.truth
    theta = truth.theta
    cells = cells_from_sessions(patterns)
    out: dict[str, Any] = {"sessions": n, "queries": n_queries, "patterns": int(len(patterns.weight)),
                           "pairs": len(patterns.pairs),
                           "median_impressions_per_pair": float(np.median(np.bincount(cells.pair, weights=cells.impressions))),
                           "simulate_s": round(sim_s, 2), "propensity": {}, "relevance": {}}
    for name, fn in (("em", em_ratios), ("harvest", allpairs)):
        t0 = time.perf_counter()
        ratio = fn(cells)
        err = relative_errors(ratio, theta)
        out["propensity"][name] = {"mre": float(err.mean()), "max_error": float(err.max()),
                                   "ratio": [round(float(x), 4) for x in ratio],
                                   "seconds": round(time.perf_counter() - t0, 2)}
    if args.randomize > 0:
        swap_log = simulate(SimConfig(**{**config.__dict__, "randomize": args.randomize, "seed": args.seed + 1}))
        swaps = swap_log.swap_sessions()
        ratio = randomized_ratios(swaps)
        err = relative_errors(ratio, theta)
        out["propensity"]["randomized"] = {"mre": float(err.mean()), "max_error": float(err.max()),
                                           "ratio": [round(float(x), 4) for x in ratio],
                                           "searches": int(swaps.weight.sum())}
    grades, _ = truth.pair_lookup(patterns.pairs)
    # Reference: the true grades with ties broken at random. Kendall τ-b of scores without ties against
    # tied grades cannot reach 1, so this is the ceiling a model's (untied) estimates can reach.
    jitter = np.random.default_rng(args.seed).random(len(grades)) * 1e-6
    tau, nd = recovery(grades + jitter, grades, truth.catalog.grades, patterns.pairs.query_index)
    out["relevance"]["oracle"] = {"kendall_tau": tau, "ndcg10": nd, "fit_s": 0.0}
    for name in args.models:
        t0 = time.perf_counter()
        model = get_model(name).fit(patterns)
        fit_s = time.perf_counter() - t0
        rel = model.relevance()
        tau, nd = recovery(np.asarray(rel.score, dtype=float), grades, truth.catalog.grades,
                           patterns.pairs.query_index)
        out["relevance"][name] = {"kendall_tau": tau, "ndcg10": nd, "fit_s": round(fit_s, 2)}
        print(f"  {n_queries:>5} queries {n:>9,} sessions  {name:<8} τ={tau:.3f}  nDCG@10={nd:.3f}  fit {fit_s:.1f}s", file=sys.stderr)
    return out


def print_tables(results: list[dict[str, Any]], models: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(100, Console().width))
    for n_queries in sorted({r["queries"] for r in results}):
        rows = [r for r in results if r["queries"] == n_queries]
        console.rule(f"catalog of {n_queries:,} queries x 20 docs")
        t = Table(title="Position bias: mean relative error of θ̂_k/θ̂_1 over ranks 2..10 (largest in brackets)")
        t.add_column("sessions", justify="right")
        t.add_column("median impressions per pair", justify="right")
        methods = [m for m in ("em", "harvest", "randomized") if m in rows[0]["propensity"]]
        for m in methods:
            t.add_column({"em": "PBM EM", "harvest": "harvesting (AllPairs)",
                          "randomized": "randomised swaps*"}[m], justify="right")
        for r in rows:
            t.add_row(f"{r['sessions']:,}", f"{r['median_impressions_per_pair']:,.0f}",
                      *[f"{r['propensity'][m]['mre']:.2%} ({r['propensity'][m]['max_error']:.1%})" for m in methods])
        console.print(t)
        if "randomized" in methods:
            console.print("* on a second log of the same size and protocol with 10% of searches in a rank-1 swap "
                          "experiment (searches used: " + ", ".join(
                              f"{r['propensity']['randomized']['searches']:,}" for r in rows) + ")")
        t = Table(title="Relevance recovery against the true grades (mean per query): Kendall τ-b | nDCG@10")
        t.add_column("model")
        for r in rows:
            t.add_column(f"{r['sessions']:,}", justify="right")
        for name in [*models, "oracle"]:
            if all(name in r["relevance"] for r in rows):
                t.add_row(name if name != "oracle" else "true grades†",
                          *[f"{r['relevance'][name]['kendall_tau']:.3f} | {r['relevance'][name]['ndcg10']:.3f}"
                            for r in rows])
        console.print(t)
        console.print("† the true grades with ties broken at random: the ceiling for untied scores (τ-b < 1 "
                      "because grades tie; nDCG@10 < 1 when the log never showed some relevant docs)")
        for r in rows:
            ctr = r["relevance"].get("dctr")
            for name in ("pbm", "ubm"):
                if ctr and name in r["relevance"]:
                    m = r["relevance"][name]
                    ok = m["kendall_tau"] > ctr["kendall_tau"] and m["ndcg10"] > ctr["ndcg10"]
                    console.print(f"{r['sessions']:>9,} sessions: {name.upper()} τ {m['kendall_tau']:.3f} vs raw CTR "
                                  f"{ctr['kendall_tau']:.3f}, nDCG@10 {m['ndcg10']:.3f} vs {ctr['ndcg10']:.3f}: "
                                  f"{'beats raw CTR' if ok else 'does NOT beat raw CTR'}")
            console.print(f"{r['sessions']:>9,} sessions: simulated and deduplicated to {r['patterns']:,} patterns "
                          f"in {r['simulate_s']:.1f} s")
            if r["sessions"] == 100_000:
                for m in ("em", "harvest"):
                    e = r["propensity"][m]["mre"]
                    console.print(f"  100,000 sessions: {m} mean relative error {e:.2%} "
                                  f"{'meets' if e <= TARGET_MRE else 'MISSES'} the {TARGET_MRE:.0%} target")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--queries", type=int, nargs="+", default=[40, 1000],
                        help="catalog sizes (default: 40, the simulator's default, and 1000, a sparse log)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--randomize", type=float, default=0.1,
                        help="swap share of the second log for the randomised estimator (0 = skip; default 0.1)")
    parser.add_argument("--models", nargs="+", default=list(MODEL_NAMES), help="click models (default: all)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    args = parser.parse_args()
    results = [run_size(n, q, args) for q in args.queries for n in args.sizes]
    if args.json:
        print(json.dumps({"protocol": {"eta": 1.0, "eps_minus": 0.1, "eps_plus": 1.0, "max_rank": 10, "rankers": 3,
                                       "ranker_noise": [0.5, 1.0, 2.0], "docs_per_query": 20, "query_skew": 0.5,
                                       "seed": args.seed},
                          "results": results}, indent=2))
    else:
        print_tables(results, args.models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
