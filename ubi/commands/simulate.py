"""``ubi simulate`` and ``ubi propensity``: traffic with known truth, and position bias with its intervals."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ubi_pipeline.commands.common import progress_bar
from ubi_pipeline.schemas.cli_names import (
    POSITION_BASE_CHOICES,
    POSITION_BASE_HELP,
    PROPENSITY_METHODS,
    SCENARIO_NAMES,
    TRAFFIC_MODELS,
)
from ubi_pipeline.schemas.errors import InputFileError, UbiError

if TYPE_CHECKING:
    import numpy as np

_DB_HELP = "DuckDB file of the store (default: $UBI_DB or ./ubi.duckdb)"
DEFAULT_OUT = Path("ubi-simulated.ndjson")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "simulate",
        help="generate UBI traffic with known position bias and relevance (for demos, tests and benches)",
        description=(
            "Simulate searches on a built-in catalog (readable shop queries, 20 candidate docs each, true grades "
            "0..3) shown by several rankers of differing quality (grade + Gaussian noise), with clicks drawn from "
            "a click model with examination θ_k = (1/k)^η and P(click | examined) = ε⁻ + (ε⁺ − ε⁻)(2^g − 1)/(2^G − 1) "
            "(docs/position-bias.md). Writes UBI query records, impression and click events (0-based "
            "position.ordinal, as OpenSearch tooling writes them) as an OpenSearch _bulk file for `ubi import`, "
            "or posts them to a running collector. The same --seed gives the same bytes."
        ),
        epilog="Example: ubi simulate --sessions 20000 --seed 7 --out sim.ndjson --truth truth.json && "
               "ubi import sim.ndjson && ubi propensity --method harvest",
    )
    p.add_argument("--scenario", choices=SCENARIO_NAMES, default="demo",
                   help="preset: demo (40 queries, 3 rankers, the easy case; default) or hard (1,000 Zipf-distributed "
                        "queries with a long tail of rare ones, 4 rankers from good to nearly random, 5%% of searches "
                        "from crawlers the session filter must drop); other flags override the preset")
    p.add_argument("--sessions", type=int, default=10_000, help="searches to simulate (default 10000)")
    p.add_argument("--seed", type=int, help="random seed (default: $UBI_SEED or 0)")
    p.add_argument("--model", choices=TRAFFIC_MODELS, default="pbm",
                   help="click model generating clicks (default pbm; trust = PBM with trust bias, Agarwal et al. 2019)")
    p.add_argument("--eta", type=float, help="severity of position bias: θ_k = (1/k)^η (default 1)")
    p.add_argument("--rankers", type=int,
                   help="rankers of differing quality; noise σ from 0.5 (best) to 2.0 (worst) (default 3)")
    p.add_argument("--queries", type=int, help="queries in the catalog (default 40)")
    p.add_argument("--docs-per-query", type=int, help="candidate docs per query (default 20)")
    p.add_argument("--max-rank", type=int, help="results displayed per search (default 10)")
    p.add_argument("--randomize", type=float, metavar="FRACTION",
                   help="share of searches in a rank-1 swap experiment, marked in query_attributes.randomized "
                        "(default 0; needed by `ubi propensity --method randomized`)")
    p.add_argument("--epochs", type=int,
                   help="times each ranker re-draws its noise over the log (ranking changes over time; default 1)")
    p.add_argument("--query-skew", type=float, help="query popularity ∝ 1/rank^skew (default 0.5; hard: 1)")
    p.add_argument("--crawlers", type=float, metavar="SHARE", dest="crawler_share",
                   help="share of searches made by crawlers (bots clicking at random; default 0, hard: 0.05)")
    p.add_argument("--interleave", metavar="REFERENCE,CHALLENGER",
                   help="interleave two of the simulated rankers (by name, e.g. ranker-a,ranker-b) by team draft on "
                        "a share of searches; their query records carry query_attributes.interleaving (the block "
                        "POST /v1/interleave returns) and ranker 'interleaved', so `ubi report` shows an "
                        "Interleaving section")
    p.add_argument("--interleave-share", type=float, metavar="FRACTION",
                   help="share of searches interleaved with --interleave (default 0.5; the rest are served by "
                        "single rankers as usual)")
    p.add_argument("--application", default="ubi-sim", help="application field of every record (default ubi-sim)")
    dest = p.add_mutually_exclusive_group()
    dest.add_argument("--out", type=Path, help=f"write an OpenSearch _bulk file (default {DEFAULT_OUT})")
    dest.add_argument("--post", metavar="URL", help="post to a running collector instead, e.g. http://127.0.0.1:8000")
    p.add_argument("--api-key", help="X-API-Key sent with --post (when the collector requires keys)")
    p.add_argument("--truth", type=Path, help="also write the truth (θ, attractiveness, grades, qrels) as JSON")
    p.add_argument("--qrels", type=Path, help="also write the true grades as qrels JSONL (docs/metrics.md)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser(
        "propensity",
        help="estimate position bias θ_k/θ_1 per rank with bootstrap confidence intervals",
        description=(
            "Estimate how much less often results at rank k are examined than at rank 1 (θ_k/θ_1), from the "
            "sessions in the store. Methods: em = PBM fitted by EM (Wang et al. 2018; no intervention needed); "
            "marginal = PBM with each pair's attractiveness integrated out under the rank-informed empirical "
            "prior (no per-pair parameters, so no incidental-parameter bias); "
            "harvest = intervention harvesting (Agarwal et al. 2019; the same (query, doc) shown at "
            "different ranks by different rankers or at different times), fitted by the pair fixed-effects "
            "(Poisson conditional) likelihood; randomized = searches of a swap "
            "experiment marked in query_attributes.randomized (Joachims et al. 2017); all = every method the "
            "data allow. em and harvest refuse a log in which no (query, doc) was shown at two different ranks "
            "(nothing separates position from relevance there) and name ranks linked by few such pairs. "
            "Intervals: bootstrap resampling whole queries for harvest (a query's searches share its pairs and "
            "rankings) and whole sessions otherwise (--resample changes it); percentile intervals, except for em, whose "
            "estimate runs a few percent high on small logs: its interval is the basic bootstrap interval of "
            "log θ, reflected around the estimate, and the notes say how large the bias looks. Writes a PNG "
            "of the curve."
        ),
    )
    p.add_argument("--db", type=Path, help=_DB_HELP)
    p.add_argument("--method", choices=(*PROPENSITY_METHODS, "all"), default="em", help="estimator (default em)")
    p.add_argument("--max-rank", type=int, help="deepest rank estimated (default: $UBI_MAX_RANK or 10)")
    p.add_argument("--bootstrap", type=int, default=200, metavar="N",
                   help="bootstrap replicates for the intervals (default 200; 0 = none)")
    p.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals (default 0.95)")
    p.add_argument("--seed", type=int, help="bootstrap seed (default: $UBI_SEED or 0)")
    p.add_argument("--resample", choices=("query", "session"),
                   help="what the bootstrap resamples: query = clusters, each drawn query with all its searches "
                        "(default for harvest), session = single searches (default for em and marginal)")
    p.add_argument("--plot", type=Path, metavar="FILE.png",
                   help="where to write the plot (default: beside the database, <db>.propensity-<method>.png)")
    p.add_argument("--no-plot", action="store_true", help="do not write a plot")
    p.add_argument("--position-base", dest="position_base_flag", choices=POSITION_BASE_CHOICES,
                   help=POSITION_BASE_HELP)
    p.add_argument("--truth", type=Path, help="a truth file from `ubi simulate --truth`: show the true curve and errors")
    p.add_argument("--json", action="store_true", help="print the estimates as JSON")
    p.set_defaults(func=cmd_propensity)


# ---------------------------------------------------------------- simulate


def cmd_simulate(args: argparse.Namespace) -> int:
    from ubi_pipeline.processors.simulation.traffic import scenario, simulate
    from ubi_pipeline.schemas.settings import Settings

    settings = Settings.from_flags(args, only=("seed",))
    given = {name: getattr(args, name) for name in ("eta", "rankers", "queries", "docs_per_query", "max_rank",
                                                     "randomize", "epochs", "query_skew", "crawler_share")
             if getattr(args, name) is not None}
    if args.interleave is not None:
        given["interleave"] = tuple(x.strip() for x in args.interleave.split(","))
    elif args.interleave_share is not None:
        raise UbiError("--interleave-share needs --interleave REFERENCE,CHALLENGER")
    if args.interleave_share is not None:
        given["interleave_share"] = args.interleave_share
    if "rankers" in given and args.scenario != "demo":
        given["ranker_noise"] = None  # the preset's noise list has the preset's number of rankers
    config = scenario(args.scenario, sessions=args.sessions, seed=settings.seed, model=args.model,
                      application=args.application, **given)
    err = Console(stderr=True)
    traffic = simulate(config)
    summary: dict[str, Any] = traffic.summary()
    show = not args.json and err.is_terminal
    if args.post:
        headers = {"x-api-key": args.api_key} if args.api_key else None
        with progress_bar(err, "posting", traffic.n_sessions, show) as tick:
            result = _post(traffic, args.post, headers, tick)
        summary["posted"] = {"url": args.post, **result}
    else:
        out = args.out or DEFAULT_OUT
        with progress_bar(err, "writing", traffic.n_sessions, show) as tick:
            records = traffic.write_bulk(out, progress=tick)
        summary["written"] = {"path": str(out), "records": records, "format": "opensearch _bulk"}
    if args.truth:
        traffic.write_truth(args.truth)
        summary["truth"] = str(args.truth)
    if args.qrels:
        traffic.write_qrels(args.qrels)
        summary["qrels"] = str(args.qrels)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    _print_simulation(Console(), summary)
    return 0


def _post(traffic: Any, url: str, headers: dict[str, str] | None, tick: Callable[[int], None]) -> dict[str, int]:
    import httpx

    with httpx.Client(timeout=60.0, headers=headers) as client:
        result = traffic.post(url, client=client, progress=tick)
    return {"queries_sent": result.queries_sent, "events_sent": result.events_sent, "accepted": result.accepted,
            "duplicates": result.duplicates, "rejected": result.rejected, "requests": result.requests}


def _print_simulation(console: Console, s: dict[str, Any]) -> None:
    console.print(f"[bold]Simulated {s['sessions']:,} searches[/] ({s['model']} clicks, seed {s['seed']}) over "
                  f"{s['queries']} queries: {s['impressions']:,} impressions, {s['clicks']:,} clicks"
                  + (f", {s['randomized_searches']:,} in the swap experiment" if s["randomized_searches"] else "")
                  + (f", {s['crawler_searches']:,} by crawlers" if s.get("crawler_searches") else "")
                  + (f", {s['interleaved_searches']:,} interleaving {' and '.join(s['interleave'])}"
                     if s.get("interleaved_searches") else ""))
    table = Table(title="rankers")
    for col in ("ranker", "noise σ", "searches", "clicks", "CTR (clicks / impressions)", "searches with a click"):
        table.add_column(col, justify="right" if col != "ranker" else "left")
    for r in s["rankers"]:
        table.add_row(r["ranker"], f"{r['noise']:.2f}", f"{r['searches']:,}", f"{r['clicks']:,}",
                      "-" if r["ctr"] is None else f"{r['ctr']:.1%}",
                      "-" if r["searches_with_click"] is None else f"{r['searches_with_click']:.1%}")
    console.print(table)
    console.print("CTR by rank: " + "  ".join(f"{k + 1}:{v:.3f}" for k, v in enumerate(s["ctr_at_rank"])))
    if "written" in s:
        w = s["written"]
        console.print(f"wrote {w['records']:,} records to {w['path']} (OpenSearch _bulk; load with `ubi import`)")
    if "posted" in s:
        p = s["posted"]
        console.print(f"posted {p['queries_sent']:,} queries and {p['events_sent']:,} events to {p['url']} in "
                      f"{p['requests']} requests: {p['accepted']:,} accepted, {p['duplicates']:,} duplicates, "
                      f"{p['rejected']:,} rejected")
    for key in ("truth", "qrels"):
        if key in s:
            console.print(f"wrote the {key} to {s[key]}")


# ---------------------------------------------------------------- propensity


def _read_truth(path: Path) -> np.ndarray:
    import numpy as np
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise InputFileError(str(path), None, f"cannot read: {exc.strerror or exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise InputFileError(str(path), exc.lineno, f"malformed JSON: {exc.msg}") from exc
    theta = data.get("theta") if isinstance(data, dict) else None
    if not isinstance(theta, list) or not theta or not all(isinstance(x, int | float) for x in theta):
        raise InputFileError(str(path), None, "no 'theta' list of numbers: use a truth file written by "
                                              "`ubi simulate --truth` with --model pbm or trust")
    return np.asarray(theta, dtype=float)


def cmd_propensity(args: argparse.Namespace) -> int:
    from ubi_pipeline.processors.clicks.ordinal_base import describe, position_base_flags, suggestion
    from ubi_pipeline.processors.propensity import estimate_from_patterns, estimate_randomized, plot_curve
    from ubi_pipeline.processors.propensity.common import PropensityError, PropensityEstimate
    from ubi_pipeline.processors.propensity.load import read_patterns, read_swaps
    from ubi_pipeline.schemas.settings import Settings

    settings = Settings.from_flags(args, only=("db", "max_rank", "seed"),
                                   **position_base_flags(args.position_base_flag))
    if not settings.db.exists():
        raise UbiError(f"{settings.db}: no such database; load traffic first (`ubi import`, `ubi serve`)")
    k = settings.max_rank
    truth = _read_truth(args.truth) if args.truth else None
    err = Console(stderr=True)
    show = not args.json and err.is_terminal
    methods = ("em", "harvest", "randomized") if args.method == "all" else (args.method,)
    estimates: list[PropensityEstimate] = []
    skipped: dict[str, str] = {}
    data = None
    for method in methods:
        try:
            if method == "randomized":
                swaps, bad = read_swaps(settings.db, settings, k)
                with progress_bar(err, "bootstrap (randomized)", args.bootstrap, show) as tick:
                    est = estimate_randomized(swaps, max_rank=k, replicates=args.bootstrap, seed=settings.seed,
                                              level=args.level, progress=tick)
                if bad:
                    est = _with_note(est, f"{bad} searches had a 'randomized' marker without two ranks; ignored")
            else:
                if data is None:
                    data = read_patterns(settings.db, settings, k)
                with progress_bar(err, f"bootstrap ({method})", args.bootstrap, show) as tick:
                    est = estimate_from_patterns(data.patterns, method, max_rank=k, replicates=args.bootstrap,
                                                 seed=settings.seed, level=args.level, progress=tick,
                                                 unit=args.resample)
        except PropensityError as exc:
            if args.method != "all":
                raise
            skipped[method] = str(exc)
            continue
        estimates.append(est)
    if not estimates:
        raise PropensityError("no method could estimate position bias: " + "; ".join(f"{m}: {e}" for m, e in skipped.items()))
    plot_path = None
    if not args.no_plot:
        plot_path = args.plot or Path(f"{settings.db}.propensity-{args.method}.png")
        plot_curve(estimates, plot_path, truth=truth,
                   title=f"Position bias in {settings.db.name} ({estimates[0].level:.0%} bootstrap intervals)")
    if args.json:
        out: dict[str, Any] = {"db": str(settings.db), "max_rank": k, "estimates": []}
        for est in estimates:
            row = est.to_json()
            if truth is not None:
                row["relative_error"] = _num(est.relative_error(truth))
            out["estimates"].append(row)
        out["skipped"] = skipped
        out["plot"] = str(plot_path) if plot_path else None
        if data is not None:
            out["filters"] = data.filters.as_dict()
            out["ordinal_bases"] = {app: c.as_dict() for app, c in data.quality.ordinal_bases.items()}
            out["suggested_setting"] = suggestion(data.quality.ordinal_bases, settings)
        print(json.dumps(out, indent=2))
        return 0
    console = Console()
    for est in estimates:
        _print_estimate(console, est, truth)
    for method, why in skipped.items():
        console.print(f"[yellow]{method}: skipped[/] ({why})")
    if data is not None:
        f = data.filters
        dropped = f.bot_searches + f.click_all_searches + f.empty_query_searches
        if dropped:
            console.print(f"filtered before fitting: {f.bot_searches:,} bot searches, {f.click_all_searches:,} "
                          f"click-on-everything searches, {f.empty_query_searches:,} empty queries")
        for choice in data.quality.ordinal_bases.values():
            console.print(escape(describe(choice)), highlight=False)
        hint = suggestion(data.quality.ordinal_bases, settings)
        if hint:
            console.print(f"[yellow]suggested setting:[/] {escape(hint)}", highlight=False)
    if plot_path:
        console.print(f"plot: {plot_path}")
    return 0


def _with_note(est: Any, note: str) -> Any:
    from dataclasses import replace

    return replace(est, notes=(*est.notes, note))


def _num(x: float) -> float | None:
    import numpy as np
    return None if not np.isfinite(x) else round(float(x), 6)


_SUPPORT_HEADERS = {"impressions": "impr.", "clicks": "clicks", "pairs_at_other_ranks": "pairs also at k'≠k",
                    "arm_searches": "searches in arm (1,k)", "arm_clicks_at_rank": "clicks at k in arm"}
_TITLES = {"em": "PBM EM", "marginal": "PBM by marginal likelihood (attractiveness integrated out)", "harvest": "Intervention harvesting (pair fixed effects)", "randomized": "Randomised swaps"}


def _print_estimate(console: Console, est: Any, truth: np.ndarray | None) -> None:
    import numpy as np
    pct = f"{est.level:.0%}"
    if est.method == "randomized":
        basis = (f"{est.sessions:,} searches of the swap experiment ({est.details['control']} as control), "
                 f"{est.rank_pairs} swap arms")
    else:
        verdict = est.details.get("identifiability", {}).get("verdict", "?")
        basis = (f"{est.sessions:,} sessions, {est.rank_pairs} rank pairs linked by "
                 f"{est.details['pairs_at_several_ranks']:,} (query, doc) pairs shown at several ranks "
                 f"(identifiability: {verdict})")
    unit = "queries" if "queries" in est.scheme else "searches" if "sessions" in est.scheme else "units"
    boot = f"{est.replicates} bootstrap replicates resampling {unit}" if est.replicates else "no bootstrap"
    table = Table(title=f"{_TITLES.get(est.method, est.method)}: θ̂_k/θ̂_1", caption=f"{basis}; {boot}")
    table.add_column("rank", justify="right")
    table.add_column("θ̂_k/θ̂_1", justify="right")
    table.add_column(f"{pct} interval", justify="right")
    names = list(est.support)
    for name in names:
        table.add_column(_SUPPORT_HEADERS.get(name, name.replace("_", " ")), justify="right")
    if truth is not None:
        table.add_column("true", justify="right")
        table.add_column("rel. error", justify="right")
        t = truth[: est.max_rank] / truth[0]
    for k in range(est.max_rank):
        r = est.ratio[k]
        row = [str(k + 1), "-" if not np.isfinite(r) else f"{r:.3f}",
               "-" if not np.isfinite(est.ci_low[k]) else f"{est.ci_low[k]:.3f}–{est.ci_high[k]:.3f}"]
        row += [f"{est.support[n][k]:,}" for n in names]
        if truth is not None:
            row += [f"{t[k]:.3f}", "-" if k == 0 or not np.isfinite(r) else f"{abs(r - t[k]) / t[k]:.1%}"]
        table.add_row(*row)
    console.print(table)
    if truth is not None:
        console.print(f"mean relative error over ranks 2..{est.max_rank}: {est.relative_error(truth):.2%}")
    for note in est.notes:
        console.print(f"[yellow]note:[/] {note}")
