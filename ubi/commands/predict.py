"""``ubi predict``: a candidate ranker's online metrics predicted from the logs, beside the logged systems'."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ubi_pipeline.commands.common import progress_bar, run_arg, write_output
from ubi_pipeline.schemas.cli_names import COUNTERFACTUAL_METHODS as METHODS
from ubi_pipeline.schemas.cli_names import DEFAULT_CLIP, DEFAULT_REPLICATES, DEFAULT_SPLIT_KEYS
from ubi_pipeline.schemas.errors import UbiError

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from ubi_pipeline.processors.counterfactual.predict import Prediction
    from ubi_pipeline.reports.online import OnlineMetrics
    from ubi_pipeline.schemas.settings import Settings

# The handlers import the estimators (numpy, scipy, duckdb) when they run, so that building the parser for
# `ubi --help` stays light (tests/ubi/test_cli_imports.py).

_EPILOG = """\
methods: dm = direct method (expected clicks of the candidate's lists under the fitted click model; documents
the log never showed get the median click probability of the pairs it showed below rank k/2, and the share of
the top k resting on them is printed); ips = inverse
propensity scoring under the item-position model (weights clipped at --clip); snips = self-normalised IPS;
dr = doubly robust (dm plus the IPS-weighted residual of the model). ips, snips and dr estimate CTR@k and
clicks per search only. When the log holds a randomised swap experiment (query_attributes.randomized), IPS
takes theta_k/theta_1 from it instead of from the PBM fit.

intervals: percentile bootstrap over logged searches, the click model refitted on every replicate. They do
not contain the bias of a wrong click model or of documents the log never showed: read prior_share and
unsupported_share beside them. The primary interval {lo, hi} (the one to read) widens the bootstrap
interval by letting each document the log never showed range over what its evidence allows: human grades
(--qrels, or the store's), the logged hit lists below the displayed depth, the run's own scores, and
only then every deep pair's click probability; "evidence" says what share of the top k rests on each. The
prior-free interval <lo, hi> lets them take any click probability in [0, 1]: what the log alone can say.

candidates: --run is repeatable; each run is predicted on its own (the click model refitted for each) and
every candidate is listed, with its verdict against each logged system: ahead or behind only when its
primary interval (the calibrated one) and the logged system's interval are disjoint, else "undetermined"
with the share of its top k resting on assumptions. Run query ids: an id that is a query_id of the human
judgments (--qrels, else the store's) or of the query set (--queries) stands for that query's text; any
other id is the query text itself, percent-decoded in a TREC run (red%20shoes), as `ubi judgments import`
reads TREC qrels.

logged systems: their figures leave out the searches the session filter drops (bots, searches with a click
on every result, empty queries), as `ubi process` leaves them out of the judgments; the count is printed.

examples:
  ubi predict --run ltr-v3.trec
  ubi predict --run ltr-v3.trec=ltr-v3 --run bm25.trec --model auto --method all --json
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "predict",
        help="predict a candidate ranker's online metrics from the logs (counterfactual evaluation)",
        description=(
            "Predict the online metrics (CTR@k, clicks per search, abandonment, reciprocal rank of the first click) "
            "a ranker that never served would get on the logged query distribution, from a run file of its "
            "rankings, with a bootstrap interval over logged searches, beside the logged systems' actual figures."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", type=Path, help="DuckDB file of the store (default: $UBI_DB or ./ubi.duckdb)")
    p.add_argument("--run", dest="runs", type=run_arg, action="append", required=True, metavar="FILE[=NAME]",
                   help="a candidate's rankings: a TREC run or JSONL rankings (repeatable: each run is predicted). A "
                        "query id that is the query_id of a human judgment or of the query set stands for that "
                        "query's text; any other id is the query text itself (percent-decoded in a TREC run)")
    p.add_argument("--qrels", type=Path, metavar="FILE", help="human judgments whose query ids the run uses (optional)")
    p.add_argument("--queries", type=Path, metavar="FILE",
                   help="query set mapping query ids to texts (JSONL {\"query_id\", \"query\"} or Workbench), for runs "
                        "whose query ids are not texts")
    p.add_argument("--model", choices=("pbm", "dbn", "auto"), default="pbm",
                   help="click model of the direct method (auto: the better held-out log-likelihood; default pbm)")
    p.add_argument("--prior", choices=("empirical", "pseudocount", "none"),
                   help="prior of the click model on per-pair parameters (default none: the rank-informed empirical "
                        "prior pulls documents the log showed deep down, which a candidate that promotes them "
                        "contradicts; see README)")
    p.add_argument("--method", default="all", metavar="LIST",
                   help=f"comma-separated subset of {','.join(METHODS)}, or all (default)")
    p.add_argument("--k", type=int, default=10, help="cutoff of CTR@k (default 10)")
    p.add_argument("--max-rank", type=int, dest="max_rank", help="deepest rank modelled (default: $UBI_MAX_RANK or 10)")
    p.add_argument("--clip", type=float, default=DEFAULT_CLIP, help=f"IPS weight cap (default {DEFAULT_CLIP:g})")
    p.add_argument("--replicates", type=int, default=DEFAULT_REPLICATES,
                   help=f"bootstrap replicates, each refits the model (default {DEFAULT_REPLICATES}; 0: no interval)")
    p.add_argument("--seed", type=int, help="bootstrap seed (default: $UBI_SEED or 0)")
    p.add_argument("--json", action="store_true", help="JSON instead of a table")
    p.add_argument("--out", type=Path, metavar="FILE", help="write there instead of stdout")
    p.set_defaults(func=cmd_predict)


def _methods(text: str) -> tuple[str, ...]:
    items = tuple(x.strip().lower() for x in text.split(",") if x.strip())
    if items == ("all",):
        return METHODS
    bad = [m for m in items if m not in METHODS]
    if bad or not items:
        raise UbiError(f"--method {text!r}: expected all or a comma-separated subset of {', '.join(METHODS)}")
    return items


def logged_figures(con: duckdb.DuckDBPyConnection, settings: Settings, k: int, seed: int,
                   excluded: pa.Table | None = None) -> dict[str, OnlineMetrics]:
    """The logged systems' online metrics (``ubi_pipeline.reports.online``), the figures a prediction stands beside,
    without the searches of ``excluded`` (the session filter's verdict, ``SessionData.dropped``)."""
    from ubi_pipeline.reports.online import online_metrics
    from ubi_pipeline.reports.systems import load_searches

    load_searches(con, split_keys=DEFAULT_SPLIT_KEYS, impression_actions=(settings.impression_action,))
    return online_metrics(con, k=k, position_base=settings.position_base,
                          position_base_by_application=settings.position_base_by_application,
                          click_actions=tuple(settings.click_actions),
                          impression_actions=(settings.impression_action,),
                          reformulation_window_s=settings.reformulation_window_s, seed=seed, excluded=excluded)


def _logged_json(logged: dict[str, OnlineMetrics], k: int) -> dict[str, Any]:
    from ubi_pipeline.processors.counterfactual.direct import METRICS

    names = [m.replace("@k", f"@{k}") for m in METRICS]
    return {
        system: {"searches": om.searches, "searches_left_out": {"total": om.searches_left_out, "by_reason": om.left_out},
                 **{m: {"value": om.metrics[m].value, "ci_low": om.metrics[m].low, "ci_high": om.metrics[m].high}
                    for m in names if m in om.metrics}}
        for system, om in sorted(logged.items())
    }


def _num_or_none(x: float) -> float | None:
    return x if x == x and x not in (float("inf"), float("-inf")) else None


def candidate_json(name: str, run: str, pred: Prediction, logged: dict[str, OnlineMetrics],
                   veto: str | None = None) -> dict[str, Any]:
    """One candidate: its prediction and its verdict against each logged system (``ubi_pipeline.reports.verdict``)."""
    from ubi_pipeline.reports.verdict import candidate_findings

    findings = candidate_findings(name, pred, logged, pred.k, veto)
    return {"candidate": name, "run": run, "prediction": pred.to_json(),
            "verdict": [{"logged": f.reference, "winner": f.winner, "firmness": f.firmness, "text": f.text,
                         "would_decide": list(f.would_decide), "shares": {k: _num_or_none(v) for k, v in f.shares.items()}}
                        for f in findings]}


def prediction_json(candidates: list[dict[str, Any]], logged: dict[str, OnlineMetrics], inputs: dict[str, Any],
                    k: int) -> dict[str, Any]:
    """Every candidate (:func:`candidate_json`) and the logged systems' actual figures of the same metrics."""
    return {"inputs": inputs, "candidates": candidates, "logged": _logged_json(logged, k)}


def _num(x: float | None, digits: int = 4) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def print_prediction(name: str, pred: Prediction, logged: dict[str, OnlineMetrics], console: Console,
                     veto: str | None = None) -> None:
    from ubi_pipeline.processors.counterfactual.direct import METRICS

    names = [m.replace("@k", f"@{pred.k}") for m in METRICS]
    t = Table(title=f"predicted online metrics of {escape(name)} (never served): value, [{pred.confidence:.0%} "
                    "bootstrap interval], {primary interval}, <prior-free interval>")
    t.add_column("system / method")
    t.add_column("searches", justify="right")
    for m in names:
        t.add_column(m, justify="right")
    for method, figs in pred.figures.items():
        cells = []
        for metric in METRICS:
            f = figs.get(metric)
            free = f"\n<{_num(f.bound_low, 3)}, {_num(f.bound_high, 3)}>" if f is not None and f.bound_low == f.bound_low else ""
            cal = f"\n{{{_num(f.cal_low, 3)}, {_num(f.cal_high, 3)}}}" if f is not None and f.cal_low == f.cal_low else ""
            cells.append("n/a" if f is None else f"{_num(f.value)}\n[{_num(f.low, 3)}, {_num(f.high, 3)}]{cal}{free}")
        t.add_row(f"{escape(name)} · {method}", str(pred.searches), *cells)
    for system, om in sorted(logged.items()):
        cells = []
        for m in names:
            iv = om.metrics.get(m)
            cells.append("-" if iv is None else f"{_num(iv.value)}\n[{_num(iv.low, 3)}, {_num(iv.high, 3)}]")
        t.add_row(f"{escape(system)} · logged", str(om.searches), *cells)
    console.print(t)
    chosen = ""
    if pred.model_choice:
        chosen = " (auto: held-out log-likelihood per session " + ", ".join(
            f"{m} {_num(v, 4)}" for m, v in pred.model_choice.items()) + ")"
    console.print(
        f"model {pred.model}{chosen}; IPS propensities from {pred.propensity} "
        f"(theta_k/theta_1: {', '.join(_num(x, 3) for x in pred.theta_ratio)}); clip {pred.clip:g} "
        f"(max weight {_num(pred.max_weight, 2)}, {_num(pred.clipped_share * 100, 1)}% of the candidate's "
        f"examination clipped)", highlight=False)
    console.print(
        f"top {pred.k} never shown for its query: {_num(pred.prior_share * 100, 1)}%"
        + (f" (those resting on the prior only: click probability at rank 1 {_num(pred.unseen_click[0], 3)}, the "
           f"median of the pairs the log showed in the lower half of its lists, calibrated range "
           f"{_num(pred.unseen_click[1], 3)}-{_num(pred.unseen_click[2], 3)})"
           if pred.unseen == "deep" else " (on the model's prior)")
        + "; never shown in the "
        f"log (no IPS support): {_num(pred.unsupported_share * 100, 1)}%; predicted on {pred.covered_queries} of "
        f"{pred.logged_queries} logged queries ({pred.searches} of {pred.logged_searches} searches); "
        f"{pred.replicates} bootstrap replicates", highlight=False)
    if pred.evidence_shares:
        console.print("evidence of the top " + str(pred.k) + ": " + ", ".join(
            f"{kind} {_num(v * 100, 1)}%" for kind, v in pred.evidence_shares.items()), highlight=False)
    for note in pred.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    from ubi_pipeline.reports.verdict import candidate_findings

    if veto is not None:
        console.print(f"[bold]warning:[/] {escape(veto)}", highlight=False)
    for finding in candidate_findings(name, pred, logged, pred.k, veto):
        decide = f" Would decide: {'; '.join(finding.would_decide)}." if finding.would_decide else ""
        console.print(f"[bold]verdict:[/] {escape(finding.text)}.{escape(decide)}", highlight=False)
    left = {s: om.searches_left_out for s, om in logged.items() if om.searches_left_out}
    if left:
        console.print("logged figures leave out the searches the session filter drops (as `ubi process` does): "
                      + ", ".join(f"{escape(s)} {n}" for s, n in sorted(left.items())), highlight=False)


def cmd_predict(args: argparse.Namespace) -> int:
    from ubi_pipeline.formats.qrels import load_qrels, load_queryset
    from ubi_pipeline.formats.runs import load_run
    from ubi_pipeline.processors.clicks.identifiability import assess
    from ubi_pipeline.processors.clicks.sessions import load_sessions
    from ubi_pipeline.processors.counterfactual.evidence import returned_not_shown
    from ubi_pipeline.processors.counterfactual.predict import predict
    from ubi_pipeline.processors.labels.merge import LabelSet, labels_from_human, labels_from_store
    from ubi_pipeline.reports.joint import query_id_texts, ruled_out
    from ubi_pipeline.reports.predicted import load_swap_experiment, run_evidence
    from ubi_pipeline.reports.systems import file_run, run_system_name
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.schemas.text import normalize_query
    from ubi_pipeline.store.client import reading

    settings = Settings.from_flags(args)
    methods = _methods(args.method)
    runs: list[tuple[str, Path, Any]] = []
    for path, given in args.runs:
        run = load_run(path)
        name = run_system_name(run, given)
        if any(name == other for other, _, _ in runs):
            raise UbiError(f"{path}: candidate name {name!r} is already used by another --run; name them apart "
                           "with --run FILE=NAME")
        runs.append((name, path, run))
    labels = LabelSet()
    if args.qrels is not None:
        labels.add(labels_from_human(load_qrels(args.qrels).human_judgments()))
    queryset = {}
    if args.queries is not None:
        queryset = {q.query_id: {normalize_query(q.query)} for q in load_queryset(args.queries)}
    k_model = max(settings.max_rank, args.k)
    with reading(settings.db, settings) as con:
        labels.add(labels_from_store(con))
        # a judgment's query id first, then the query set's (the order `ubi judgments import` reads them in)
        texts = {**queryset, **query_id_texts(labels)}
        systems = [(name, path, run, file_run(name, run, texts)) for name, path, run in runs]
        data = load_sessions(con, settings, max_rank=k_model)
        # the verdict `ubi process` and `ubi report` use: on a log that cannot tell position from relevance the
        # figures are still printed (they are what the model says), but no candidate is ordered by them
        veto = ruled_out(args.model, assess(data.cells)) if len(data.cells.pair) else None
        swaps = load_swap_experiment(con, settings, k_model)
        logged = logged_figures(con, settings, args.k, settings.seed, data.dropped)
        returned = returned_not_shown(con, k_model)
    grades = labels.qrels("human")
    preds = []
    err = Console(stderr=True)
    show = not args.json and err.is_terminal  # the bootstrap is the long part: one click-model fit per replicate
    for name, path, run, system in systems:
        rankings = {system.query_of[qid]: docs for qid, docs in system.run.items()}
        evidence = run_evidence(grades, returned, run, system)  # grades, hit lists below the display, scores
        with progress_bar(err, f"bootstrap ({escape(name)})", args.replicates, show) as tick:
            pred = predict(data.patterns, rankings, model=args.model, methods=methods, k=args.k, clip=args.clip,
                           replicates=args.replicates, seed=settings.seed, swaps=swaps,
                           model_options=None if args.prior is None else {"prior": args.prior}, evidence=evidence,
                           progress=tick)
        preds.append((name, f"{path} ({len(run)} queries, {run.n_docs()} ranked docs)", pred))
    inputs = {"db": str(settings.db), "runs": [r for _, r, _ in preds]}
    if args.json:
        doc = prediction_json([candidate_json(name, r, pred, logged, veto) for name, r, pred in preds], logged, inputs,
                              args.k)
        doc["model_ruled_out"] = veto  # why the identifiability verdict rules the click model out, or null
        write_output(args.out, json.dumps(doc, indent=2) + "\n")
        return 0
    console = Console(record=True, width=160, file=io.StringIO()) if args.out is not None else Console()
    for name, _, pred in preds:
        print_prediction(name, pred, logged, console, veto)
    if args.out is not None:
        write_output(args.out, console.export_text())
    return 0
