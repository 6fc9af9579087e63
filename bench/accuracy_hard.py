"""Accuracy on the hard scenario: held-out perplexity, relevance recovery by support, and θ, as the log grows.

The log is ``ubi simulate --scenario hard`` (ubi_pipeline.processors.simulation.SCENARIOS): 1,000 queries x 20 graded docs
with Zipf frequencies (popularity ∝ 1/rank: a long tail of rare queries), four rankers from nearly right
(σ = 0.3) to nearly random (σ = 3.0), θ_k = 1/k, ε⁻ = 0.1, ε⁺ = 1, and 5% of searches from crawlers. The
crawler searches are left out as the session filter drops them from a store (tests/processors check that it
drops exactly those). For each generator (pbm, cascade, dbn) and size (default 2,000, 20,000 and 200,000
searches) it prints:

* **held-out perplexity**: searches split by query_id hash (25% held out, ``ubi_pipeline.processors.clicks.sessions.holdout_flags``,
  the split of ``ubi select``); every model is fitted on the rest with its default prior and with
  ``prior="pseudocount"`` (PyClick's +1/+2 convention) when the model accepts one; mean conditional and full
  perplexity over ranks 1..10 on the held-out searches. Target (issue 10): ours lower on every row. The
  held-out searches' *clicks* are what is predicted; their rankings, and the systems that showed them, are
  given to the fits with the training searches' (the prior's features are computed over every ranking of the
  log, ``priors.prior_features``), as ``ubi process --model auto`` does; ``--train-rankings-only`` hides them.
* **relevance recovery**: every judgment source fitted on all (non-crawler) searches; per query, Kendall τ-b
  (scipy) between the source's score and the true grade over the query's pairs in a support bucket (1-9,
  10-49, 50+ impressions, and all), averaged over queries with at least two pairs of different grades in the
  bucket; raw CTR (``ctr``) on the same pairs beside it. The *recommended* source is the one ``ubi process
  --model auto`` picks on this log (lowest held-out conditional perplexity among its candidates: judgment
  models other than COEC, whose predictions and scores are different posteriors). Target:
  it beats raw CTR in every bucket, by at least 0.05 overall.
* **θ** (pbm generator): mean relative error of θ̂_k/θ̂_1 over ranks 2..10 for the estimators ``ubi
  propensity`` ships (EM and harvesting, no bootstrap), and with ``--coverage-seeds N`` the share of ranks
  2..10 whose 95% bootstrap interval holds the truth over N logs of ``--coverage-sessions`` searches from
  ``--coverage-first-seed`` (target: error <= 2% at 50,000 searches, coverage 93-97%); harvesting's interval
  with the query-cluster bootstrap it ships and with a session bootstrap, and with ``--coverage-methods
  harvest allpairs`` the AllPairs estimator it replaced.

Every figure is printed with the CPU time and peak RSS of the run: timings on a shared machine vary.

    .venv/bin/python bench/accuracy_hard.py [--sizes 2000 20000 200000] [--generators pbm cascade dbn]
        [--models coec pbm ...] [--coverage-seeds 0] [--coverage-sessions 50000] [--replicates 100] [--seed 0]
        [--json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ubi_pipeline.processors.click_models import MODEL_NAMES  # noqa: E402
from ubi_pipeline.processors.click_models.evaluate import evaluate  # noqa: E402
from ubi_pipeline.processors.click_models.registry import model_class  # noqa: E402
from ubi_pipeline.processors.click_models.selection import (  # noqa: E402
    CHOOSABLE,
    ModelScore,
    Selection,
    exclusions,
    source_name,
)
from ubi_pipeline.processors.clicks.holdout import holdout_flags  # noqa: E402
from ubi_pipeline.processors.clicks.identifiability import assess  # noqa: E402
from ubi_pipeline.processors.clicks.stats import cells_from_sessions  # noqa: E402
from ubi_pipeline.processors.propensity import estimate_from_patterns  # noqa: E402
from ubi_pipeline.processors.simulation import scenario, simulate  # noqa: E402

BUCKETS: tuple[tuple[str, int, float], ...] = (("1-9", 1, 9), ("10-49", 10, 49), ("50+", 50, np.inf),
                                               ("all", 1, np.inf))
SOURCES = ("dctr", "coec", "pbm", "ubm", "cascade", "dcm", "sdbn", "dbn")
HOLDOUT = 0.25


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_model(name: str, prior: str | None) -> Any:
    """A fresh model; with ``prior``, None when the model has no such keyword (``prior`` not in its signature)."""
    cls = model_class(name)
    if prior is None:
        return cls()
    if "prior" not in inspect.signature(cls.__init__).parameters:
        return None
    return cls(prior=prior)


def fit_model(model: Any, patterns: Any, systems: Any) -> Any:
    """``model.fit(patterns, systems)``, as ``ubi process`` fits every model (the systems' votes enter the empirical
    prior of the models whose prior takes them)."""
    return model.fit(patterns, systems)


def tau_by_bucket(score: np.ndarray, grade: np.ndarray, query: np.ndarray, impressions: np.ndarray
                  ) -> dict[str, dict[str, float]]:
    """Mean per-query Kendall τ-b of score vs grade within each support bucket (see the module docstring)."""
    order = np.argsort(query, kind="stable")
    q_sorted = query[order]
    bounds = np.flatnonzero(np.diff(q_sorted)) + 1
    groups = np.split(order, bounds)
    out: dict[str, dict[str, float]] = {}
    for name, lo, hi in BUCKETS:
        taus: list[float] = []
        pairs = 0
        for idx in groups:
            sel = idx[(impressions[idx] >= lo) & (impressions[idx] <= hi)]
            if len(sel) < 2 or np.ptp(grade[sel]) == 0:
                continue
            s = score[sel]
            if not np.isfinite(s).all():
                s = np.nan_to_num(s, nan=-1.0)
            if np.ptp(s) == 0:
                taus.append(0.0)  # a constant score orders nothing: τ-b is undefined, count it as no information
            else:
                t = kendalltau(s, grade[sel]).statistic
                taus.append(float(t) if np.isfinite(t) else 0.0)
            pairs += len(sel)
        out[name] = {"tau": float(np.mean(taus)) if taus else float("nan"), "queries": len(taus), "pairs": pairs}
    return out


def run(n: int, generator: str, seed: int, use_systems: bool = True,
        models: tuple[str, ...] = MODEL_NAMES, train_rankings_only: bool = False) -> dict[str, Any]:
    """One log: perplexity of ``models`` (ours and pseudo-count), τ of the judgment sources among them, θ."""
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    traffic = simulate(scenario("hard", sessions=n, model=generator, seed=seed))
    held = holdout_flags(traffic.query_ids(), HOLDOUT)
    everything = traffic.patterns()
    train = traffic.patterns(searches=~held)
    test = traffic.patterns(searches=held)
    # which system showed which ranking, over every search: the held-out fits take the held-out searches'
    # rankings too (covariates of the prior's features, not clicks), as `ubi process --model auto` gives them
    # (priors.prior_features); --train-rankings-only hides them, the protocol before
    all_systems = traffic.system_rankings() if use_systems else None
    train_systems = (traffic.system_rankings(searches=~held) if train_rankings_only else all_systems) \
        if use_systems else None
    grades, _ = traffic.truth.pair_lookup(everything.pairs)
    ident = assess(cells_from_sessions(everything))
    out: dict[str, Any] = {"sessions": n, "generator": generator, "seed": seed, "crawler_searches": traffic.n_crawler_searches,
                           "train_sessions": train.n_sessions, "test_sessions": test.n_sessions,
                           "pairs": len(everything.pairs), "identifiability": ident.verdict, "systems": use_systems,
                           "held_out_rankings": not train_rankings_only, "perplexity": {},
                           "relevance": {}}
    # held-out perplexity, ours (default prior) beside the pseudo-count baseline
    fitted: dict[str, Any] = {}
    out["models"] = list(models)
    for name in models:
        row: dict[str, Any] = {}
        for label, prior in (("ours", None), ("pseudocount", "pseudocount")):
            model = make_model(name, prior)
            if model is None:
                row[label] = None
                continue
            t0 = time.perf_counter()
            fit_model(model, train, train_systems)
            ev = evaluate(model, test)
            row[label] = {"conditional": ev.conditional_perplexity_mean, "full": ev.perplexity_mean,
                          "ll_per_session": ev.log_likelihood_per_session, "fit_s": round(time.perf_counter() - t0, 2)}
            if label == "ours":
                fitted[name] = ev
        out["perplexity"][name] = row
        print(f"  {generator:<7} {n:>8,} {name:<8} ours {row['ours']['conditional']:.4f}"
              + (f" pseudocount {row['pseudocount']['conditional']:.4f}" if row.get("pseudocount") else ""),
              file=sys.stderr, flush=True)
    # the choice `ubi process --model auto` makes on this log, from the same fits
    sel = _choose(fitted, ident, train.n_sessions, test.n_sessions)
    out["recommended"] = source_name(sel.best) if sel.best else None
    # relevance recovery on all searches; raw CTR is clicks / impressions itself (no model, no prior)
    from ubi_pipeline.processors.click_models.common import pair_support

    imps_i, clicks_i, _ = pair_support(everything)
    imps = imps_i.astype(np.float64)
    raw = np.where(imps > 0, clicks_i / np.maximum(imps, 1), np.nan)
    out["relevance"]["raw CTR"] = tau_by_bucket(raw, grades.astype(np.float64), everything.pairs.query_index, imps)
    for name in (m for m in SOURCES if m in models):
        model = fit_model(make_model(name, None), everything, all_systems)
        rel = model.relevance()
        out["relevance"][source_name(name)] = tau_by_bucket(np.asarray(rel.score, dtype=np.float64),
                                                            grades.astype(np.float64),
                                                            everything.pairs.query_index, imps)
    if len(imps):
        out["pairs_by_bucket"] = {b: int(((imps >= lo) & (imps <= hi)).sum()) for b, lo, hi in BUCKETS}
    if generator == "pbm":
        truth = traffic.truth.theta / traffic.truth.theta[0]
        for method in ("em", "harvest"):
            est = estimate_from_patterns(everything, method, replicates=0)
            out.setdefault("theta", {})[method] = est.relative_error(truth)
    out["wall_s"] = round(time.perf_counter() - t_wall, 1)
    out["cpu_s"] = round(time.process_time() - t_cpu, 1)
    out["peak_mb"] = round(peak_mb(), 0)
    return out


def _choose(fitted: dict[str, Any], ident: Any, n_train: int, n_test: int) -> Selection:
    """The selection rule of ubi_pipeline.processors.click_models.selection applied to evaluations already made (no refit)."""
    scores = tuple(ModelScore(m, ev, 0.0) for m, ev in fitted.items())
    excluded = exclusions(tuple(fitted), ident)  # never COEC; position-debiased models when unidentified
    cands = [s for s in scores if s.model in CHOOSABLE and s.model not in excluded]
    best = min(cands, key=lambda s: (s.evaluation.conditional_perplexity_mean, s.model)).model if cands else None
    return Selection(None, n_train, n_test, HOLDOUT, scores, best, excluded, ident.verdict)


def _allpairs_estimate(patterns: Any, replicates: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The estimator ``ubi propensity --method harvest`` shipped before: AllPairs with a session bootstrap."""
    from ubi_pipeline.processors.propensity.bootstrap import CellMap, bootstrap
    from ubi_pipeline.processors.propensity.harvest import allpairs_from_stats, harvest_stats

    cmap = CellMap(patterns)
    ratio = allpairs_from_stats(harvest_stats(cmap.cells()))
    if not replicates:
        nan = np.full_like(ratio, np.nan)
        return ratio, nan, nan
    boot = bootstrap(patterns.weight, lambda w: allpairs_from_stats(harvest_stats(cmap.cells(w))),
                     replicates=replicates, seed=seed)
    return ratio, boot.low, boot.high


def coverage(seeds: int, sessions: int, replicates: int, first_seed: int, bootstrapped: list[str]) -> dict[str, Any]:
    """θ error over ``seeds`` logs; interval coverage for the ``bootstrapped`` methods.

    Rows: ``harvest`` (what ``ubi propensity`` ships: pair fixed effects, query-cluster bootstrap), the same
    estimate with a session bootstrap (``harvest/session``), ``em`` and, when asked for, ``allpairs`` (the
    estimator shipped before, with its session bootstrap).
    """
    out: dict[str, Any] = {"seeds": seeds, "first_seed": first_seed, "sessions": sessions, "replicates": replicates}
    rows = ["harvest", "harvest/session", "em"] + (["allpairs"] if "allpairs" in bootstrapped else [])
    acc = {m: {"hit": 0, "total": 0, "errs": [], "per_seed": [], "seconds": 0.0} for m in rows}
    for s in range(first_seed, first_seed + seeds):
        traffic = simulate(scenario("hard", sessions=sessions, model="pbm", seed=s))
        truth = traffic.truth.theta / traffic.truth.theta[0]
        patterns = traffic.patterns()
        t = truth[1:]
        for m in rows:
            t0 = time.perf_counter()
            reps = replicates if m.split("/")[0] in bootstrapped else 0
            if m == "allpairs":
                ratio, lo, hi = _allpairs_estimate(patterns, reps, s)
                err = float(np.nanmean(np.abs(ratio[1:] - t) / t))
            else:
                method, _, unit = m.partition("/")
                est = estimate_from_patterns(patterns, method, replicates=reps, seed=s, unit=unit or None)
                ratio, lo, hi, err = est.ratio, est.ci_low, est.ci_high, est.relative_error(truth)
            a = acc[m]
            seed_hit = int(((lo[1:] <= t) & (t <= hi[1:])).sum())
            a["hit"] += seed_hit
            a["total"] += len(t)
            a["errs"].append(err)
            a["seconds"] += time.perf_counter() - t0
            a["per_seed"].append({"seed": s, "covered": seed_hit if reps else None, "cases": len(t),
                                  "relative_error": err, "signed_error": (ratio[1:] / t - 1).round(5).tolist()})
            print(f"  coverage {m} seed {s}: {a['hit']}/{a['total']} so far, error {err:.2%} "
                  f"({a['seconds']:.0f} s)", file=sys.stderr, flush=True)
    for m in rows:
        a = acc[m]
        reps = replicates if m.split("/")[0] in bootstrapped else 0
        out[m] = {"covered": a["hit"] if reps else None, "cases": a["total"],
                  "coverage": a["hit"] / a["total"] if a["total"] and reps else None,
                  "mean_relative_error": float(np.mean(a["errs"])), "seconds": round(a["seconds"], 1),
                  "per_seed": a["per_seed"]}
    return out


def print_tables(results: list[dict[str, Any]], cov: dict[str, Any] | None) -> None:
    def f(x: Any, d: int = 4) -> str:
        return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{d}f}"

    for r in results:
        print(f"\n## {r['generator']} clicks, {r['sessions']:,} searches ({r['crawler_searches']:,} crawler searches "
              f"dropped; {r['train_sessions']:,} train / {r['test_sessions']:,} held out; {r['pairs']:,} pairs; "
              f"identifiability {r['identifiability']}; {r['wall_s']} s wall, {r['cpu_s']} s CPU, peak {r['peak_mb']:.0f} MB)")
        print("\nheld-out perplexity, conditional | full (ours = default prior; pseudocount = +1/+2)")
        print(f"{'model':<8} {'ours':>17} {'pseudocount':>17}  ours lower?")
        for name, row in r["perplexity"].items():
            o, p = row["ours"], row.get("pseudocount")
            lower = "-" if p is None else ("same" if abs(o["conditional"] - p["conditional"]) < 1e-9 else
                                           "yes" if o["conditional"] < p["conditional"] else "NO")
            print(f"{source_name(name):<8} {f(o['conditional'])} | {f(o['full'])} "
                  f"{(f(p['conditional']) + ' | ' + f(p['full'])) if p else '        -        ':>17}  {lower}")
        print(f"\nKendall τ-b per query vs the true grade, by impressions (recommended: {r['recommended']})")
        print(f"{'source':<8} " + " ".join(f"{b:>14}" for b, _, _ in BUCKETS))
        print(f"{'pairs':<8} " + " ".join(f"{r['pairs_by_bucket'][b]:>14,}" for b, _, _ in BUCKETS))
        ctr = r["relevance"]["raw CTR"]
        for name, buckets in r["relevance"].items():
            cells = []
            for b, _, _ in BUCKETS:
                v = buckets[b]["tau"]
                d = v - ctr[b]["tau"]
                cells.append(f"{f(v, 3)} ({d:+.3f})" if name != "raw CTR" else f"{f(v, 3)}        ")
            mark = " *" if name == r["recommended"] else ""
            print(f"{name + mark:<8} " + " ".join(f"{c:>14}" for c in cells))
        print("(in brackets: minus raw CTR, clicks / impressions, on the same pairs; ctr is our CTR source with its "
              "default prior)")
        rec = r["recommended"]
        if rec:
            diffs = {b: r["relevance"][rec][b]["tau"] - ctr[b]["tau"] for b, _, _ in BUCKETS}
            ok = all(d > 0 for d in diffs.values()) and diffs["all"] >= 0.05
            print(f"recommended {rec} vs raw CTR: " + ", ".join(f"{b} {d:+.3f}" for b, d in diffs.items())
                  + f": {'meets' if ok else 'MISSES'} the target (every bucket > 0, all >= +0.05)")
        if "theta" in r:
            print("θ̂_k/θ̂_1 mean relative error, ranks 2..10: " + ", ".join(
                f"{m} {e:.2%}" for m, e in r["theta"].items()))
    if cov:
        print(f"\n## θ interval coverage: {cov['seeds']} logs x {cov['sessions']:,} searches (hard, pbm), "
              f"{cov['replicates']} bootstrap replicates")
        for m in [r for r in ("harvest", "harvest/session", "allpairs", "em") if r in cov]:
            c = cov[m]
            covered = (f"covered {c['covered']}/{c['cases']} ({c['coverage']:.1%})" if c["coverage"] is not None
                       else "coverage not measured (no bootstrap asked for)")
            print(f"{m:<16} {covered}, mean relative error {c['mean_relative_error']:.2%} ({c['seconds']} s)")


def markdown(results: list[dict[str, Any]], cov: dict[str, Any] | None) -> str:
    """The tables of docs/benchmarks.md: perplexity (ours / pseudo-count), τ by bucket (recommended vs raw CTR), θ."""
    def f(x: Any, d: int = 3) -> str:
        return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{d}f}"

    gens = list(dict.fromkeys(r["generator"] for r in results))
    sizes = sorted({r["sessions"] for r in results})
    at = {(r["generator"], r["sessions"]): r for r in results}
    lines = ["Held-out conditional perplexity, ours (default empirical prior) / `prior=\"pseudocount\"` (+1/+2); "
             "**bold**: ours lower:", ""]
    head = "| model | " + " | ".join(f"{g} {n // 1000}k" for g in gens for n in sizes) + " |"
    lines += [head, "|---" * (1 + len(gens) * len(sizes)) + "|"]
    for name in MODEL_NAMES:
        cells = []
        for g in gens:
            for n in sizes:
                if (g, n) not in at:  # a generator run at fewer sizes than another
                    cells.append("-")
                    continue
                row = at[(g, n)]["perplexity"].get(name)
                if row is None:  # fitted with --models, without this one
                    cells.append("-")
                    continue
                o, p = row["ours"], row.get("pseudocount")
                if p is None:
                    cells.append(f"{f(o['conditional'], 4)} / -")
                elif abs(o["conditional"] - p["conditional"]) < 1e-9:
                    cells.append(f"{f(o['conditional'], 4)} (same)")
                else:
                    mine = f(o["conditional"], 4)
                    cells.append((f"**{mine}**" if o["conditional"] < p["conditional"] else mine)
                                 + f" / {f(p['conditional'], 4)}")
        lines.append(f"| {source_name(name)} | " + " | ".join(cells) + " |")
    lines += ["", "Kendall τ-b per query against the true grade, by the pair's impressions: the recommended source "
              "(what `--model auto` picks) and the best source beside raw CTR (clicks / impressions) on the same pairs:", ""]
    lines += ["| generator | searches | recommended | bucket | pairs | raw CTR | recommended | best source |",
              "|---|---|---|---|---|---|---|---|"]
    for g in gens:
        for n in sizes:
            if (g, n) not in at:
                continue
            r = at[(g, n)]
            rec = r["recommended"]
            for b, _, _ in BUCKETS:
                raw = r["relevance"]["raw CTR"][b]["tau"]
                mine = r["relevance"][rec][b]["tau"] if rec else float("nan")
                best = max((s for s in r["relevance"] if s != "raw CTR"), key=lambda s: r["relevance"][s][b]["tau"])
                bv = r["relevance"][best][b]["tau"]
                lines.append(f"| {g} | {n:,} | {rec} | {b} | {r['pairs_by_bucket'][b]:,} | {f(raw)} | "
                             f"{'**' + f(mine) + '**' if mine > raw else f(mine)} | {best} {f(bv)} |")
    lines += ["", "θ̂_k/θ̂_1 mean relative error over ranks 2..10 (pbm generator, one log per size):", "",
              "| searches | PBM EM | harvesting |", "|---|---|---|"]
    for n in sizes:
        r = at.get(("pbm", n))
        if r and "theta" in r:
            lines.append(f"| {n:,} | {r['theta']['em']:.2%} | {r['theta']['harvest']:.2%} |")
    if cov:
        names = [m for m in ("harvest", "harvest/session", "allpairs", "em") if m in cov]
        lines += ["", f"θ at {cov['sessions']:,} searches, {cov['replicates']}-replicate bootstrap, 95% intervals "
                  "(error: mean relative error over ranks 2..10; covers: ranks 2..10 whose interval holds the truth):", "",
                  "| seed | " + " | ".join(f"{m} error | covers" if cov[m]["coverage"] is not None else f"{m} error"
                                         for m in names) + " |",
                  "|---" * (1 + sum(2 if cov[m]["coverage"] is not None else 1 for m in names)) + "|"]
        for i, row in enumerate(cov[names[0]]["per_seed"]):
            cells = []
            for m in names:
                ps = cov[m]["per_seed"][i]
                cells.append(f"{ps['relative_error']:.2%}")
                if cov[m]["coverage"] is not None:
                    cells.append(f"{ps['covered']}/{ps['cases']}")
            lines.append(f"| {row['seed']} | " + " | ".join(cells) + " |")
        pooled = []
        for m in names:
            pooled.append(f"**{cov[m]['mean_relative_error']:.2%}**")
            if cov[m]["coverage"] is not None:
                pooled.append(f"**{cov[m]['covered']}/{cov[m]['cases']} = {cov[m]['coverage']:.0%}**")
        lines.append("| pooled | " + " | ".join(pooled) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000, 200_000])
    ap.add_argument("--generators", nargs="*", default=["pbm", "cascade", "dbn"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--coverage-seeds", type=int, default=0)
    ap.add_argument("--coverage-first-seed", type=int, default=100)
    ap.add_argument("--coverage-sessions", type=int, default=50_000)
    ap.add_argument("--replicates", type=int, default=100)
    ap.add_argument("--coverage-methods", nargs="*", default=["harvest"],
                    help="estimators whose intervals are bootstrapped for coverage (default harvest, with both the "
                         "query and the session bootstrap; allpairs = the harvesting estimator shipped before; EM's "
                         "bootstrap refits EM per replicate and takes minutes per log)")
    ap.add_argument("--no-systems", action="store_true",
                    help="fit PBM and UBM without the systems that showed each ranking (their prior before the "
                         "systems' votes), for comparison")
    ap.add_argument("--train-rankings-only", action="store_true",
                    help="give the held-out fits only the training searches' rankings and systems (the protocol "
                         "before: the held-out searches' rankings hidden from the prior's features too)")
    ap.add_argument("--models", nargs="+", default=list(MODEL_NAMES), choices=MODEL_NAMES, metavar="MODEL",
                    help="fit only these models (registry names: " + ", ".join(MODEL_NAMES) + "; default all), "
                         "for the perplexity table and the relevance sources; the recommended source is then the "
                         "best of those fitted, which is what --model auto picks only when every model is given")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", nargs="+", metavar="RESULT.json",
                    help="print the docs/benchmarks.md tables of --json outputs (one or more files) instead of running")
    args = ap.parse_args()
    if args.markdown:
        results, cov = [], None
        for path in args.markdown:
            doc = json.loads(Path(path).read_text())
            results += doc["results"]
            cov = doc.get("coverage") or cov
        print(markdown(results, cov))
        return 0
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    models = tuple(m for m in MODEL_NAMES if m in args.models)
    results = [run(n, g, args.seed, not args.no_systems, models, args.train_rankings_only) for g in args.generators for n in args.sizes]
    cov = coverage(args.coverage_seeds, args.coverage_sessions, args.replicates, args.coverage_first_seed,
                   args.coverage_methods) if args.coverage_seeds else None
    if args.json:
        print(json.dumps({"command": " ".join(["bench/accuracy_hard.py", *sys.argv[1:]]), "seed": args.seed,
                          "results": results, "coverage": cov}, indent=2))
    else:
        print_tables(results, cov)
    print(f"\ntotal {time.perf_counter() - t_wall:.0f} s wall, {time.process_time() - t_cpu:.0f} s CPU, peak RSS "
          f"{peak_mb():.0f} MB (shared 2-core machine: timings vary with other work)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
