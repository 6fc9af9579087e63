"""``ubi evaluate``: trec_eval-style evaluation of a run file against a judgments file."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ubi_pipeline.schemas.cli_names import DEFAULT_METRICS, GAINS, KNOWN_METRICS, QRELS_FORMATS
from ubi_pipeline.schemas.errors import UbiError

if TYPE_CHECKING:
    from ubi_pipeline.reports.metrics import MetricTable


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``ubi evaluate``."""
    p = sub.add_parser(
        "evaluate",
        help="evaluate a TREC run file against judgments (trec_eval / ranx conventions)",
        description=(
            "Evaluate rankings from a TREC run file against human judgments, exactly as trec_eval / ranx do. "
            "Queries with no positive judgment (labelled negatives) are reported on their own, never averaged "
            "in; run queries without judgments are not evaluated (as in trec_eval) and are counted."
        ),
        epilog=(
            f"Metrics: {KNOWN_METRICS}. nDCG uses linear gain (trec_eval ndcg_cut, ranx ndcg) unless --gain exponential "
            "(2^g-1, ranx ndcg_burges) or ndcg_exp@k. Example: ubi evaluate --qrels qrels.txt --run bm25.run "
            "--metrics ndcg@10,recall@100,mrr --per-query"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--qrels", required=True, metavar="FILE",
                   help="judgments: JSONL, TREC qrels or Search Relevance Workbench JSON")
    p.add_argument("--run", required=True, metavar="FILE",
                   help="rankings: a TREC run file (query_id Q0 doc_id rank score tag), or JSONL "
                        "{\"query_id\": ..., \"doc_ids\": [...]} for query ids with spaces (Workbench query texts)")
    p.add_argument("--run-format", choices=("auto", "trec", "jsonl"), default="auto",
                   help="run format (default: JSONL when the file starts with '{', else TREC)")
    p.add_argument("--metrics", default=DEFAULT_METRICS, help=f"comma-separated metric names (default: {DEFAULT_METRICS})")
    p.add_argument("--gain", choices=GAINS, default="linear", help="nDCG gain: grade (linear, default) or 2^grade-1")
    p.add_argument("--rel-threshold", type=int, default=1, metavar="GRADE",
                   help="lowest grade that counts as relevant for P, recall, RR, AP (default 1)")
    p.add_argument("--qrels-format", choices=("auto", *QRELS_FORMATS), default="auto",
                   help="judgment format (default: detected from the content)")
    p.add_argument("--rating-map", default="esci", metavar="MAP",
                   help="Workbench ratings to grades: 'esci' (0->0, 1->1, 10->2, 100->3, default), 'integer', "
                        "or pairs such as '0:0,1:1,2:2,3:3'")
    p.add_argument("--corpus", metavar="FILE", help="doc ids that exist (one per line); judging any other is an error")
    p.add_argument("--require-positive", action="store_true",
                   help="fail when a judged query has no positive (instead of reporting it as a labelled negative)")
    p.add_argument("--complete", action="store_true",
                   help="score judged queries missing from the run as empty rankings (trec_eval -c)")
    p.add_argument("--condensed", action="store_true",
                   help="drop unjudged docs from each ranking before scoring (condensed lists, Sakai 2007; "
                        "trec_eval -J); judged@k still describes the ranking as returned")
    p.add_argument("--per-query", action="store_true", help="also print (or include in JSON) one row per query")
    p.add_argument("--json", action="store_true", help="print JSON for machines instead of tables")
    p.set_defaults(func=run_evaluate)


def evaluate_files(args: argparse.Namespace) -> tuple[MetricTable, dict[str, Any]]:
    """Load and validate both files, then compute; returns the table and a description of the inputs."""
    from ubi_pipeline.formats.qrels import RatingMap, load_corpus_ids, load_qrels
    from ubi_pipeline.formats.runs import load_run
    from ubi_pipeline.reports.metrics import compute, parse_metrics

    try:
        rating_map = RatingMap.parse(args.rating_map)
    except ValueError as exc:
        raise UbiError(f"--rating-map: {exc}") from exc
    specs = parse_metrics(args.metrics, gain=args.gain)
    corpus = load_corpus_ids(args.corpus) if args.corpus else None
    status = Console(stderr=True)
    with status.status(f"loading {escape(str(args.qrels))}"):
        qrels = load_qrels(args.qrels, format=args.qrels_format, corpus=corpus, require_positive=args.require_positive,
                           rel_threshold=args.rel_threshold, rating_map=rating_map)
    with status.status(f"loading {escape(str(args.run))}"):
        run = load_run(args.run, format=args.run_format)
    with status.status("evaluating"):
        table = compute(qrels, run, specs, gain=args.gain, rel_threshold=args.rel_threshold, complete=args.complete,
                        condensed=args.condensed)
    inputs = {
        "qrels": {"path": args.qrels, "format": qrels.format, "queries": len(qrels), "judgments": qrels.n_judgments()},
        "run": {"path": args.run, "tag": run.tag, "queries": len(run), "docs": run.n_docs()},
    }
    if qrels.format == "workbench":
        inputs["qrels"]["rating_map"] = rating_map.describe()
    return table, inputs


def run_evaluate(args: argparse.Namespace) -> int:
    """Handler of ``ubi evaluate``."""
    table, inputs = evaluate_files(args)
    if args.json:
        print(json.dumps({"inputs": inputs, **table.as_dict(per_query=args.per_query)}, ensure_ascii=False))
        return 0
    console = Console(highlight=False)
    print_table(console, table, inputs)
    if args.per_query:
        print_per_query(console, table)
    return 0


def print_table(console: Console, table: MetricTable, inputs: dict[str, Any]) -> None:
    """Aggregate table, then the queries that are not in it and why."""
    q, r = inputs["qrels"], inputs["run"]
    title = f"{r['path']} ({r['queries']} queries) vs {q['path']} ({q['format']}, {q['queries']} queries)"
    out = Table(title=escape(title), title_justify="left")
    out.add_column("metric")
    out.add_column("definition")
    out.add_column("mean", justify="right")
    out.add_column("queries", justify="right")
    for spec, (name, agg) in zip(table.specs, table.aggregate().items(), strict=True):
        out.add_row(escape(name), escape(spec.describe()), _fmt(agg.mean), str(agg.n))
    console.print(out)
    if "rating_map" in q:
        console.print(f"Workbench ratings mapped to grades by {escape(q['rating_map'])}")
    console.print(f"positive = grade >= {table.rel_threshold}; means over {table.n_queries} queries with a positive")
    if table.condensed:
        console.print("condensed lists: unjudged docs were dropped from each ranking before scoring (not judged@k)")
    negatives = table.negatives_aggregate()
    n_neg = len(table.negative_query_ids)
    if n_neg:
        retrieved = negatives["retrieved"].mean or 0.0
        parts = [f"they retrieve {retrieved:.1f} docs on average (ideal: 0)"]
        parts += [f"{name} {_fmt(agg.mean)}" for name, agg in negatives.items() if name != "retrieved"]
        console.print(f"[yellow]labelled negatives[/] (judged, no positive): {n_neg} queries, reported apart, "
                      f"not averaged in; {'; '.join(parts)}")
    else:
        console.print("labelled negatives (judged, no positive): none")
    if table.unjudged_query_ids:
        console.print(f"run queries without judgments: {len(table.unjudged_query_ids)} (not evaluated, as trec_eval)")
    if table.missing_query_ids:
        how = ("scored as empty rankings (--complete)" if table.complete
               else "not evaluated; --complete scores them as empty rankings")
        console.print(f"[yellow]judged queries missing from the run[/]: {len(table.missing_query_ids)} ({how})")
    if not table.n_queries:
        console.print("[bold yellow]no query of the run has a positive judgment: nothing to average[/]")


def print_per_query(console: Console, table: MetricTable) -> None:
    """One row per evaluated query, then one per labelled negative."""
    out = Table(title="per query", title_justify="left")
    out.add_column("query_id")
    for name in table.metrics:
        out.add_column(name, justify="right")
    for row in table.per_query():
        out.add_row(escape(str(row["query_id"])), *(_fmt(row[name]) for name in table.metrics))
    console.print(out)
    if table.negative_query_ids:
        neg = Table(title="labelled negatives", title_justify="left")
        neg.add_column("query_id")
        neg.add_column("retrieved", justify="right")
        for name in table.negative_values:
            neg.add_column(name, justify="right")
        for row in table.negatives_per_query():
            neg.add_row(escape(str(row["query_id"])), str(row["retrieved"]),
                        *(_fmt(row[name]) for name in table.negative_values))
        console.print(neg)
