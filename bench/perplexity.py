"""Held-out click prediction of every click model on PBM-, cascade- and DBN-simulated traffic.

Usage: .venv/bin/python bench/perplexity.py [--sessions 500000] [--queries 1000] [--json]
       .venv/bin/python bench/perplexity.py --sessions 2000 20000 --priors   (prior comparison)
       .venv/bin/python bench/perplexity.py --sessions 50000 --relevance    (relevance by support, per prior)

With ``--relevance`` (PBM traffic) the table is relevance recovery instead: mean per-query Kendall τ-b against
the true grades by the pair's impressions (``bench/accuracy_hard.py``'s buckets), for raw CTR, PBM under each
prior (the empirical one without and with the rankers that showed each ranking, ``priors.system_features``)
and COEC, every source fitted on the whole log.

With ``--priors`` every model is fitted three times, with ``prior="empirical"`` (ours, the default),
``prior="pseudocount"`` (PyClick's +1/+2 convention) and ``prior="none"`` (the MLE), and the table shows the
three side by side with a check that ours is lower than the pseudo-count baseline, full and conditional.

Each log (queries x 20 graded docs, 3 rankers of differing noise, θ_k = 1/k, attractiveness from the
position-bias.md grade protocol; DBN: σ = 0.2 + 0.6·g/4, γ = 0.9) is split 80/20 by session; every model
is fitted on the 80 % and scored on the 20 %: mean perplexity over ranks 1..10, full (unconditional
click_probs) and conditional (given the clicks above), and log-likelihood per session. A model should be
best, or close to best, on the traffic its own assumptions generate.

For context only (a different data set and scale): on 10 M Yandex sessions the published conditional
perplexities are DBN 1.309, UBM 1.310, PBM 1.312, CCM 1.313, SDBN 1.314, per-rank CTR 1.366, global
CTR 1.526 (position-bias.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

OWN = {"pbm": "pbm", "cascade": "cascade", "dbn": "dbn"}
TRAFFIC = ("pbm", "cascade", "dbn")


def main() -> int:
    import numpy as np
    from _clicklog import simulate_log

    from ubi_pipeline.processors.click_models import MODEL_NAMES, get_model
    from ubi_pipeline.processors.click_models.evaluate import evaluate, split_sessions

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[500_000])
    ap.add_argument("--priors", action="store_true", help="compare the priors of every model (see above)")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--relevance", action="store_true", help="relevance recovery by support per prior (see above)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    args = ap.parse_args()
    if args.priors:
        return compare_priors(args)
    if args.relevance:
        return relevance_by_support(args)
    args.sessions = args.sessions[0]

    results: dict[str, dict[str, dict[str, float]]] = {}
    for traffic in TRAFFIC:
        s, _ = simulate_log(args.sessions, model=traffic, seed=args.seed, n_queries=args.queries)
        train, test = split_sessions(s, 0.2, np.random.default_rng(args.seed))
        results[traffic] = {}
        for name in MODEL_NAMES:
            t0 = time.perf_counter()
            model = get_model(name).fit(train)
            fit_s = time.perf_counter() - t0
            ev = evaluate(model, test)
            results[traffic][name] = {
                "perplexity": ev.perplexity_mean,
                "conditional_perplexity": ev.conditional_perplexity_mean,
                "log_likelihood_per_session": ev.log_likelihood_per_session,
                "fit_s": fit_s,
            }
            print(f"{traffic:8s} {name:8s} done in {fit_s:.1f} s", file=sys.stderr)
    if args.json:
        print(json.dumps({"sessions": args.sessions, "queries": args.queries, "results": results}, indent=2))
        return 0

    print(
        f"\nHeld-out (20 %) mean perplexity over ranks 1-10; {args.sessions:,} sessions per log, "
        f"{args.queries:,} queries x 20 docs, 3 rankers"
    )
    head = "".join(f" {t + ' full':>13s} {t + ' cond':>13s}" for t in TRAFFIC)
    print(f"{'model':8s}{head}")
    best = {
        (t, key): min(r[key] for r in results[t].values())
        for t in TRAFFIC
        for key in ("perplexity", "conditional_perplexity")
    }
    for name in MODEL_NAMES:
        cells = ""
        for t in TRAFFIC:
            for key in ("perplexity", "conditional_perplexity"):
                v = results[t][name][key]
                mark = "*" if v == best[(t, key)] else " "
                cells += f" {v:12.4f}{mark}"
        print(f"{name:8s}{cells}")
    print("* = best in the column")
    print("\nEach generating model's own click model, conditional perplexity vs the best model:")
    for t in TRAFFIC:
        own = results[t][OWN[t]]["conditional_perplexity"]
        order = sorted(results[t], key=lambda n: results[t][n]["conditional_perplexity"])
        gap = own - best[(t, "conditional_perplexity")]
        print(
            f"  {t:8s} traffic: {OWN[t]} {own:.4f}, rank {order.index(OWN[t]) + 1} of {len(order)}, "
            f"{gap:.4f} above the best ({order[0]})"
        )
    return 0


PRIORS = ("empirical", "pseudocount", "none")


def relevance_by_support(args: argparse.Namespace) -> int:
    """τ-b per query against the true grades, by support bucket, of raw CTR and PBM / COEC under each prior."""
    import numpy as np
    from _clicklog import simulate_log
    from accuracy_hard import BUCKETS, tau_by_bucket

    from ubi_pipeline.processors.click_models import get_model
    from ubi_pipeline.processors.click_models.common import pair_support
    from ubi_pipeline.processors.clicks.stats import SystemRankings

    out = []
    for n in args.sessions:
        t0, c0 = time.perf_counter(), time.process_time()
        s, truth = simulate_log(n, model="pbm", seed=args.seed, n_queries=args.queries)
        r = truth["rankings"]
        systems = SystemRankings(tuple(f"ranker-{j}" for j in range(int(r[:, 1].max()) + 1)), r[:, 0], r[:, 1],
                                 r[:, 2:])
        imps_i, clicks_i, _ = pair_support(s)
        imps = imps_i.astype(np.float64)
        grades, query = truth["grades"], s.pairs.query_index
        shown = imps > 0
        rows = {"raw CTR (`ctr --prior none`)": np.where(shown, clicks_i / np.maximum(imps, 1), np.nan)}
        for prior, label in (("none", "PBM, MLE"), ("pseudocount", "PBM, pseudo-count"),
                             ("empirical", "PBM, empirical prior without the systems")):
            rows[label] = get_model("pbm", prior=prior).fit(s).relevance().score
        rows["PBM, empirical prior (default: with the systems)"] = get_model("pbm").fit(s, systems).relevance().score
        rows["COEC, empirical prior"] = get_model("coec").fit(s).relevance().score
        taus = {k: tau_by_bucket(np.asarray(v, dtype=np.float64)[shown], grades[shown], query[shown], imps[shown])
                for k, v in rows.items()}
        pairs = {b: int(((imps >= lo) & (imps <= hi)).sum()) for b, lo, hi in BUCKETS}
        out.append({"sessions": n, "pairs": pairs, "tau": taus, "wall_s": round(time.perf_counter() - t0, 1),
                    "cpu_s": round(time.process_time() - c0, 1)})
    if args.json:
        print(json.dumps({"queries": args.queries, "seed": args.seed, "rows": out}, indent=2))
        return 0
    for o in out:
        print(f"\n{o['sessions']:,} PBM sessions, {args.queries:,} queries x 20 docs, 3 rankers, seed {args.seed} "
              f"({o['wall_s']} s wall, {o['cpu_s']} s CPU on a shared machine); mean per-query Kendall tau-b:\n")
        names = [b for b, _, _ in BUCKETS]
        order = ["all", *[b for b in names if b != "all"]]
        print("| source | " + " | ".join(f"{b} ({o['pairs'][b]:,})" for b in order) + " |")
        print("|---" * (1 + len(order)) + "|")
        best = {b: max(t[b]["tau"] for t in o["tau"].values()) for b in order}
        for k, t in o["tau"].items():
            cells = [f"{t[b]['tau']:.3f}".replace("0.", ".", 1) for b in order]
            cells = [f"**{c}**" if t[b]["tau"] == best[b] else c for c, b in zip(cells, order, strict=True)]
            print(f"| {k} | " + " | ".join(cells) + " |")
    return 0


def compare_priors(args: argparse.Namespace) -> int:
    """Held-out mean perplexity (full / conditional) of every model under each prior, ours first."""
    import numpy as np
    from _clicklog import simulate_log

    from ubi_pipeline.processors.click_models import MODEL_NAMES, get_model
    from ubi_pipeline.processors.click_models.evaluate import evaluate, split_sessions

    names = [n for n in MODEL_NAMES if n not in ("gctr", "rctr")]  # no per-pair parameter to put a prior on
    rows: list[dict[str, object]] = []
    for n in args.sessions:
        for traffic in TRAFFIC:
            s, _ = simulate_log(n, model=traffic, seed=args.seed, n_queries=args.queries)
            train, test = split_sessions(s, 0.25, np.random.default_rng(args.seed))
            for name in names:
                row: dict[str, object] = {"sessions": n, "traffic": traffic, "model": name}
                for prior in PRIORS:
                    t0, c0 = time.perf_counter(), time.process_time()
                    ev = evaluate(get_model(name, prior=prior).fit(train), test)
                    row[prior] = {"perplexity": ev.perplexity_mean, "conditional": ev.conditional_perplexity_mean,
                                  "fit_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
                rows.append(row)
                print(f"{n:>8,} {traffic:8s} {name:8s} done", file=sys.stderr)
    if args.json:
        print(json.dumps({"queries": args.queries, "split": "75/25 by session", "rows": rows}, indent=2))
        return 0
    print(f"\nHeld-out (25 %) mean perplexity over ranks 1-10, full / conditional; {args.queries:,} queries x 20 "
          f"docs, 3 rankers, seed {args.seed}")
    print(f"{'sessions':>8s} {'traffic':8s} {'model':8s} {'ours (empirical)':>17s} {'pseudo-count':>17s} "
          f"{'MLE':>17s}  ours < pseudo (full, cond)")
    wins = total = 0
    for r in rows:
        cells = []
        for prior in PRIORS:
            v = r[prior]
            assert isinstance(v, dict)
            cells.append(f"{v['perplexity']:8.4f}/{v['conditional']:<8.4f}")
        ours, base = r["empirical"], r["pseudocount"]
        assert isinstance(ours, dict) and isinstance(base, dict)
        full_ok = ours["perplexity"] < base["perplexity"]
        cond_ok = ours["conditional"] < base["conditional"]
        wins += full_ok + cond_ok
        total += 2
        print(f"{r['sessions']:>8,} {r['traffic']:8s} {r['model']:8s} {' '.join(cells)}  "
              f"{'yes' if full_ok else 'NO'}, {'yes' if cond_ok else 'NO'}")
    print(f"ours lower than the pseudo-count baseline in {wins} of {total} comparisons")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
