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

from ubi_pipeline.commands.report import _run_arg, _write
from ubi_pipeline.schemas.cli_names import COUNTERFACTUAL_METHODS as METHODS
from ubi_pipeline.schemas.cli_names import DEFAULT_CLIP, DEFAULT_REPLICATES, DEFAULT_SPLIT_KEYS
from ubi_pipeline.schemas.errors import UbiError

if TYPE_CHECKING:
    import duckdb

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

examples:
  ubi predict --run ltr-v3.trec
  ubi predict --run ltr-v3.trec=ltr-v3 --model auto --method all --json
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
    p.add_argument("--run", type=_run_arg, required=True, metavar="FILE[=NAME]",
                   help="the candidate's rankings: a TREC run or JSONL rankings. A query id that is the query_id of "
                        "a human judgment stands for that query's text; any other id is the query text itself")
    p.add_argument("--qrels", type=Path, metavar="FILE", help="human judgments whose query ids the run uses (optional)")
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


def logged_figures(con: duckdb.DuckDBPyConnection, settings: Settings, k: int, seed: int) -> dict[str, OnlineMetrics]:
    """The logged systems' online metrics (``ubi_pipeline.reports.online``), the figures a prediction stands beside."""
    from ubi_pipeline.reports.online import online_metrics
    from ubi_pipeline.reports.systems import load_searches

    load_searches(con, split_keys=DEFAULT_SPLIT_KEYS, impression_actions=(settings.impression_action,))
    return online_metrics(con, k=k, position_base=settings.position_base,
                          position_base_by_application=settings.position_base_by_application,
                          click_actions=tuple(settings.click_actions),
                          impression_actions=(settings.impression_action,),
                          reformulation_window_s=settings.reformulation_window_s, seed=seed)


def prediction_json(name: str, pred: Prediction, logged: dict[str, OnlineMetrics], inputs: dict[str, Any]) -> dict[str, Any]:
    """The prediction and the logged systems' actual figures of the same metrics, as one JSON document."""
    from ubi_pipeline.processors.counterfactual.direct import METRICS

    names = [m.replace("@k", f"@{pred.k}") for m in METRICS]
    return {
        "candidate": name,
        "inputs": inputs,
        "prediction": pred.to_json(),
        "logged": {
            system: {"searches": om.searches,
                     **{m: {"value": om.metrics[m].value, "ci_low": om.metrics[m].low, "ci_high": om.metrics[m].high}
                        for m in names if m in om.metrics}}
            for system, om in sorted(logged.items())
        },
    }


def _num(x: float | None, digits: int = 4) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def print_prediction(name: str, pred: Prediction, logged: dict[str, OnlineMetrics], console: Console) -> None:
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


def cmd_predict(args: argparse.Namespace) -> int:
    from ubi_pipeline.formats.qrels import load_qrels
    from ubi_pipeline.formats.runs import load_run
    from ubi_pipeline.processors.clicks.sessions import load_sessions
    from ubi_pipeline.processors.counterfactual.evidence import UnseenEvidence, returned_not_shown
    from ubi_pipeline.processors.counterfactual.predict import predict
    from ubi_pipeline.processors.labels.merge import LabelSet, labels_from_human, labels_from_store
    from ubi_pipeline.reports.joint import query_id_texts
    from ubi_pipeline.reports.predicted import load_swap_experiment
    from ubi_pipeline.reports.systems import file_run, run_system_name
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.store.client import reading

    settings = Settings.from_flags(args)
    methods = _methods(args.method)
    path, given = args.run
    run = load_run(path)
    name = run_system_name(run, given)
    labels = LabelSet()
    if args.qrels is not None:
        labels.add(labels_from_human(load_qrels(args.qrels).human_judgments()))
    k_model = max(settings.max_rank, args.k)
    with reading(settings.db, settings) as con:
        labels.add(labels_from_store(con))
        system = file_run(name, run, query_id_texts(labels))
        rankings = {system.query_of[qid]: docs for qid, docs in system.run.items()}
        data = load_sessions(con, settings, max_rank=k_model)
        swaps = load_swap_experiment(con, settings, k_model)
        logged = logged_figures(con, settings, args.k, settings.seed)
        returned = returned_not_shown(con, k_model)
    # what values the documents the log never showed: human grades, the hit lists below the display, run scores
    scores = {system.query_of[qid]: dict(zip(run[qid], run.scores[qid], strict=False))
              for qid in system.run if run.scores.get(qid)}
    evidence = UnseenEvidence(grades=labels.qrels("human"), returned=returned, scores=scores)
    pred = predict(data.patterns, rankings, model=args.model, methods=methods, k=args.k, clip=args.clip,
                   replicates=args.replicates, seed=settings.seed, swaps=swaps,
                   model_options=None if args.prior is None else {"prior": args.prior}, evidence=evidence)
    inputs = {"db": str(settings.db), "run": f"{path} ({len(run)} queries, {run.n_docs()} ranked docs)"}
    if args.json:
        _write(args.out, json.dumps(prediction_json(name, pred, logged, inputs), indent=2) + "\n")
    elif args.out is not None:
        console = Console(record=True, width=160, file=io.StringIO())
        print_prediction(name, pred, logged, console)
        _write(args.out, console.export_text())
    else:
        print_prediction(name, pred, logged, Console())
    return 0
