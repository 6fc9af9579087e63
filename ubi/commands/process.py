"""``ubi process`` (candidate judgments from the click log) and ``ubi review export|import|serve``."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ubi_pipeline.schemas.cli_names import AUTO, JUDGMENT_MODELS, POSITION_BASE_CHOICES, POSITION_BASE_HELP
from ubi_pipeline.schemas.errors import UbiError

if TYPE_CHECKING:
    from ubi_pipeline.schemas.settings import Settings

# The handlers import the stages they run (numpy, scipy, duckdb, pyarrow) when they run, so that building the
# parser for `ubi --help` stays light (tests/ubi/test_cli_imports.py).

_PROCESS_HELP = """\
Build search sessions from the stored UBI queries and events, filter implausible traffic, fit a click
model and turn its relevance estimates into candidate judgments, one per (normalised query, doc), with
score, interval, support and a grade on the human scale (0..UBI_GRADE_MAX) where the evidence suffices.
The judgments replace the stored rows of the same source (implicit:<model>); --out also writes a file.

Models: ctr (clicks/impressions), coec (clicks over expected clicks), pbm, ubm (EM, position-debiased),
cascade, dcm, sdbn, dbn (cascade family), or auto: per application, every one of them is fitted on 75% of
the searches (split by a hash of query_id) and the one with the lowest held-out conditional perplexity
judges (source implicit:auto; parameters.selection records the choice, the candidates and every model's
figures; see `ubi select`). coec is fitted and scored but never chosen: its click predictions and its
scores are different posteriors, so its perplexity does not measure its grades.

Identifiability: position-debiased sources (coec, pbm, ubm, dbn) grade only pairs shown at ranks that
pairs displayed at several ranks link to rank 1; in a log where no pair was shown at two ranks they grade
nothing and their rows say why (parameters.identifiability). `ubi propensity` and `ubi report` use the
same verdict.

Which pairs get a grade: every pair gets a score, but a grade only when it has a confidence interval no
wider than --max-ci-width AND at least --min-support observations counted the model's way: impressions
the model treats as examined (cascade: at or above the first click; dcm, sdbn: at or above the last click;
every rank of a search without clicks), expected examinations (pbm, ubm, dbn), every impression (ctr,
coec). A result that was displayed but never examined under the model scores the model's prior, has no
interval and gets no grade. Rows keep the displayed impressions; parameters.observations holds the count
the rule used.

Default grades invert the simulation curve of docs/position-bias.md (attractiveness-based scores), or its
attractiveness x satisfaction product (sdbn, dbn); --calibrate fits the thresholds on half of the pairs
that have human grades and reports agreement (quadratic-weighted kappa, Spearman) on the other half.
"""


_EXPORT_HELP = """\
Write the candidate judgments of one implicit source (see `ubi process`) for assessors, as CSV or JSONL (by
the extension of --out). Queries: those listed in --queries (one per line, or a Search Relevance Workbench
query set JSON), else the --top N with the most sessions; per query the --per-query best-scored docs.
Each row carries the evidence (score, interval, impressions, clicks, sessions, suggested grade) and empty
grade, assessor, judged_at, rubric and notes columns to fill in. --blind leaves out the evidence, the
suggested grade and the source, so assessors grade from scratch. Load the graded file with
`ubi review import`.
"""

_IMPORT_HELP = """\
Load a review file graded by assessors (CSV or JSONL, as `ubi review export` writes it) into the
human_judgments table. Rows with an empty grade were not reviewed and are skipped (counted). A row whose
source names an implicit source becomes source reviewed:<that source>; a row without one (blind sheets)
becomes source human. Per row: assessor and rubric from its columns, else --assessor / --rubric (one sheet
may hold several assessors' rows for a pair: every assessor is kept); the notes column as the grade's note; the
judging date from its judged_at (or date) column, else --date, else the import time (ISO 8601; an offset
is converted to UTC). Grades must lie in 0..UBI_GRADE_MAX. Importing the same rows again replaces them (the
same assessor's only).
"""


def _date(text: str) -> datetime:
    """argparse type for --date: naive UTC, errors in argparse's own words."""
    from ubi_pipeline.processors.labels.review import parse_date

    try:
        return parse_date(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _dump(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def _spark_sessions(args: argparse.Namespace, settings: Settings) -> Any:
    """``--engine spark``: the session statistics of ``--parquet DIR`` built on Spark (``--master``)."""
    if args.parquet is None:
        raise UbiError("--engine spark reads a Parquet folder (`ubi consume --parquet DIR`): give --parquet DIR")

    def build() -> Any:
        from ubi_pipeline.processors.clicks.spark_sessions import spark_session, spark_sessions

        spark = spark_session(args.master)
        try:
            return spark_sessions(spark, args.parquet, settings, max_rank=args.max_rank)
        finally:
            spark.stop()

    return build


def cmd_process(args: argparse.Namespace) -> int:
    from ubi_pipeline.processors.click_models.selection import source_name
    from ubi_pipeline.processors.clicks.ordinal_base import describe, position_base_flags, suggestion
    from ubi_pipeline.processors.labels.implicit import process
    from ubi_pipeline.schemas.settings import Settings

    settings = Settings.from_flags(args, only=("db", "max_rank", "min_support", "max_ci_width"),
                                   **position_base_flags(args.position_base_flag))
    sessions = None
    db: Path = settings.db
    if args.engine == "spark":
        sessions = _spark_sessions(args, settings)
        if args.db is None and not args.no_store:
            # a Parquet folder holds the raw log only: judgments go to a DuckDB store named with --db
            raise UbiError("--engine spark: judgments are stored in a DuckDB file; give --db FILE, or --no-store "
                           "with --out FILE")
    elif args.parquet is not None:
        db = args.parquet  # the DuckDB engine reads a Parquet folder through ubi_pipeline.store.parquet_store
    with Console(stderr=True).status("starting", spinner="dots") as status:
        res = process(db, args.model, settings, calibrate_with=args.calibrate, store=not args.no_store,
                      out=args.out, out_format=args.format, progress=status.update, prior=args.prior,
                      sessions=sessions)
    data, run, stored, written, out_fmt = res.data, res.run, res.stored, res.rows_written, res.out_format
    result = {"db": str(settings.db), "engine": args.engine, **res.summary(),
              "suggested_setting": suggestion(data.quality.ordinal_bases, settings)}
    if args.json:
        _dump(result)
        return 0
    con = Console()
    f, q = data.filters, data.quality
    con.print(f"[bold]{run.source}[/]: {run.table.num_rows:,} pairs, {run.graded:,} graded "
              f"(min support {run.min_support} observations under the model, max CI width {run.max_ci_width})")
    con.print(f"sessions fitted: {f.sessions:,} (of {q.searches:,} searches; {f.impressions:,} impressions, "
              f"{f.clicks:,} clicks within rank {data.max_rank})")
    con.print(f"filtered: {f.bot_searches:,} searches of {f.bot_clients:,} bot clients, {f.click_all_searches:,} "
              f"click-on-everything searches, {f.empty_query_searches:,} empty queries, "
              f"{f.clicks_without_search:,} clicks without a matching search")
    if args.engine == "spark":
        con.print("data quality: not counted on Spark (run `ubi process --parquet DIR` for the counts)")
    else:
        con.print(f"data quality: {q.searches_without_ranking:,} searches without ranking, {q.duplicate_query_records:,} "
                  f"duplicate query records, {q.clicks_on_undisplayed:,} clicks on undisplayed docs, "
                  f"{q.click_rank_disagreements:,}/{q.click_rank_checked:,} click ordinals disagree with the ranking")
        for choice in q.ordinal_bases.values():
            con.print("  " + escape(describe(choice)), highlight=False)
        hint = suggestion(q.ordinal_bases, settings)
        if hint:
            con.print(f"  [yellow]suggested setting:[/] {escape(hint)} (or --position-base auto)", highlight=False)
    for sel in res.selections:
        con.print(f"--model auto, {'application ' + repr(sel.application) if sel.application else 'the log'}: "
                  f"[bold]{source_name(sel.best) if sel.best else 'none'}[/] ({sel.why()}; identifiability: "
                  f"{sel.identifiability})", highlight=False)
    if run.identifiability is not None:
        ident = run.identifiability
        style = "green" if ident.identifiable else "yellow"
        con.print(f"[{style}]identifiability: {ident.verdict}[/] ({ident.reason()})", highlight=False)
        if run.withheld_unidentified:
            con.print(f"[yellow]{run.source} is position-debiased: {run.withheld_unidentified:,} pairs that met the "
                      "support and interval rules get no grade, because this log cannot separate position from "
                      "relevance for them[/]", highlight=False)
    grades = run.summary()["grade_counts"]
    con.print("grades: " + (", ".join(f"{g}: {c:,}" for g, c in grades.items()) or "none") +
              f"; mapping {run.mapping.method} thresholds " + ", ".join(f"{t:.4g}" for t in run.mapping.thresholds))
    if run.calibration:
        c = run.calibration
        t = Table(title=f"calibration on {c.qrels} ({c.overlap_eligible} of {c.human_pairs} human pairs usable)")
        for col in ("split", "mapping", "pairs", "kappa (quadratic)", "spearman", "exact"):
            t.add_column(col)
        for name, mapping, a in (("fit", "calibrated", c.fit), ("held out", "calibrated", c.holdout),
                                 ("held out", "default", c.holdout_default)):
            t.add_row(name, mapping, str(a.pairs), _fmt(a.kappa), _fmt(a.spearman), _fmt(a.exact))
        con.print(t)
    if stored is not None:
        con.print(f"stored {stored:,} rows in {settings.db}, replacing every earlier row of {run.source}")
    if written is not None:
        con.print(f"wrote {written:,} {'graded qrels' if out_fmt == 'trec' else 'judgments'} to {args.out}")
    return 0


def cmd_review_export(args: argparse.Namespace) -> int:
    from ubi_pipeline.processors.labels.review import (
        export_candidates,
        read_query_set,
        resolve_source,
        write_review,
    )
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.store.client import reading

    settings = Settings.from_flags(args, only=("db",))
    queries = read_query_set(args.queries) if args.queries else None
    with reading(settings.db, settings) as con:
        source = resolve_source(con, args.source)
        rows, missing = export_candidates(con, source, queries=queries, top=args.top,
                                          per_query=None if args.per_query == 0 else args.per_query)
    n = write_review(rows, args.out, blind=args.blind)
    summary = {"source": source, "out": str(args.out), "rows": n, "queries": len({r["query"] for r in rows}),
               "queries_without_candidates": missing, "blind": args.blind}
    if args.json:
        _dump(summary)
    else:
        Console().print(f"wrote {n:,} candidates of {summary['queries']:,} queries from {source} to {args.out}"
                        + (f"; {len(missing)} requested queries have none" if missing else ""))
    return 0


def cmd_review_import(args: argparse.Namespace) -> int:
    from ubi_pipeline.processors.labels.review import import_review
    from ubi_pipeline.schemas.settings import Settings

    settings = Settings.from_flags(args, only=("db",))
    result = import_review(settings.db, args.file, assessor=args.assessor, rubric=args.rubric, judged_at=args.date,
                           settings=settings)
    summary = {"file": str(args.file), "db": str(settings.db), "rows": result.rows, "imported": result.table.num_rows,
               "reviewed": result.reviewed, "human": result.human, "skipped_ungraded": result.skipped_ungraded}
    if args.json:
        _dump(summary)
    else:
        Console().print(f"imported {result.table.num_rows:,} of {result.rows:,} rows ({result.reviewed:,} reviewed "
                        f"candidates, {result.human:,} graded from scratch; {result.skipped_ungraded:,} left "
                        f"ungraded) into {settings.db}")
    return 0


_SERVE_HELP = """\
Serve a page at /review where assessors grade (query, document) pairs one at a time, in the order of the
review queue (processors/labels/queue.py): first a stratified held-out sample (shown blind, for measuring
agreement), then the pairs whose sources disagree most, with the widest intervals, on the most frequent
queries; each pair shows why it is there. Up to --assessors-per-pair assessors grade a pair, never one
twice. Keys 0..UBI_GRADE_MAX grade, s skips, u undoes; buttons do the same; a note explains a grade.

Each grade is stored at once in human_judgments (source human when shown blind, else reviewed:<the first
source of the evidence>; assessor, time, rubric version, origin review:page, note), also while `ubi serve`
holds the store (through its admin protocol). Loopback only unless UBI_REVIEW_TOKEN is set: then
--host may be another address, and assessors open /review?token=<token>. See docs/review.md.
"""


def cmd_review_serve(args: argparse.Namespace) -> int:
    from ubi_pipeline.processors.labels.catalog import read_docs
    from ubi_pipeline.review.app import serve_review
    from ubi_pipeline.review.session import ReviewSession, read_rubric
    from ubi_pipeline.schemas.settings import Settings

    settings = Settings.from_flags(args, only=("db",))
    if args.assessors_per_pair < 1 or args.held_out < 0:
        raise UbiError("--assessors-per-pair must be >= 1 and --held-out >= 0")
    docs = read_docs(args.docs) if args.docs else None
    session = ReviewSession.open(settings.db, settings, rubric=read_rubric(args.rubric, settings.grade_max),
                                 docs=docs, blind=args.blind, assessors_per_pair=args.assessors_per_pair,
                                 held_out=args.held_out, seed=args.seed)

    # with a token every request needs it: the address printed says so (the token itself stays out of logs)
    token = "token=<UBI_REVIEW_TOKEN>&" if settings.review_token is not None else ""

    def ready(url: str) -> None:
        print(f"review page: {url}?{token}assessor=YOUR_NAME ({len(session.queue.items):,} pairs in the queue; "
              f"{settings.db}); Ctrl-C stops", flush=True)

    return serve_review(session, settings, host=args.host, port=args.port, ready=ready)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("process", help="candidate judgments from the click log (sessions, filters, click model)",
                       description=_PROCESS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", type=Path, help="DuckDB store (default: UBI_DB or ./ubi.duckdb); works while a collector runs")
    p.add_argument("--model", "--source", dest="model", default="pbm", metavar="MODEL",
                   help=f"click model, one of {', '.join((*JUDGMENT_MODELS, AUTO))} (default: pbm; --source is an "
                        "alias)")
    p.add_argument("--out", type=Path, help="also write the judgments to this file")
    p.add_argument("--format", choices=("jsonl", "trec"),
                   help="file format of --out (needs --out): jsonl (every row) or trec (qrels of graded rows); "
                        "default by extension (.trec/.qrels/.txt: trec, else jsonl)")
    p.add_argument("--calibrate", type=Path, metavar="QRELS",
                   help="human grades (JSONL of docs/metrics.md or TREC qrels) to fit the grade thresholds on")
    p.add_argument("--min-support", type=int, metavar="N",
                   help="observations under the model (examined impressions, not merely displayed) a pair needs "
                        "to get a grade, >= 0 (default 10)")
    p.add_argument("--max-ci-width", type=float, metavar="W",
                   help="widest interval that still gets a grade, on the attractiveness scale, > 0 (default 0.5); "
                        "pairs without an interval never get one")
    p.add_argument("--max-rank", type=int, help="deepest rank kept (default 10)")
    p.add_argument("--position-base", dest="position_base_flag", choices=POSITION_BASE_CHOICES, help=POSITION_BASE_HELP)
    p.add_argument("--prior", choices=("empirical", "pseudocount", "none"),
                   help="prior on the model's per-pair parameters: empirical (default; rank-informed, empirical "
                        "Bayes), pseudocount (+1/+2) or none (maximum likelihood)")
    p.add_argument("--no-store", action="store_true", help="do not write the judgments into the store")
    p.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb",
                   help="where sessions are aggregated: duckdb (default, in this process) or spark (over --parquet "
                        "DIR; needs the spark extra and Java 17); the fit and judgments run here either way")
    p.add_argument("--parquet", type=Path, metavar="DIR",
                   help="a Parquet folder written by `ubi consume --parquet` to read the log from")
    p.add_argument("--master", default="local[*]", metavar="URL",
                   help="Spark master for --engine spark: local[*] (default), spark://host:7077, yarn, k8s://...")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary (JSON) instead")
    p.set_defaults(func=_guard(cmd_process))

    r = sub.add_parser("review", help="grade candidate judgments in the browser, or export them for assessors and "
                                      "import their grades",
                       description="Candidate judgments in front of people: `serve` puts them on a page at /review, "
                                   "one pair at a time in the review queue's order, each grade stored at once "
                                   "(docs/review.md); the file round trip: `export` writes candidates of a query set "
                                   "as CSV or JSONL with empty grade columns; `import` loads the graded file into "
                                   "human_judgments (source reviewed:<implicit source>, or human for blind sheets).")
    rs = r.add_subparsers(dest="review_command", metavar="{export,import,serve}")
    e = rs.add_parser("export", help="write candidates of a query set for assessors", description=_EXPORT_HELP,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--db", type=Path, help="DuckDB store (default: UBI_DB or ./ubi.duckdb)")
    e.add_argument("--source", help="implicit source to export (pbm or implicit:pbm); default: the only one stored")
    group = e.add_mutually_exclusive_group()
    group.add_argument("--queries", type=Path, metavar="FILE",
                       help="queries to review: one per line, or a Search Relevance Workbench query set JSON")
    group.add_argument("--top", type=int, metavar="N", help="the N queries with the most sessions (default 20)")
    e.add_argument("--per-query", type=int, default=20, metavar="M", help="candidates per query, best first (0: all)")
    e.add_argument("--out", type=Path, required=True, help="FILE.csv or FILE.jsonl")
    e.add_argument("--blind", action="store_true",
                   help="leave out scores, support, suggested grade and source: assessors grade from scratch")
    e.add_argument("--json", action="store_true", help="print a machine-readable summary (JSON)")
    e.set_defaults(func=_guard(cmd_review_export))
    i = rs.add_parser("import", help="load a graded review file into human_judgments", description=_IMPORT_HELP,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    i.add_argument("file", type=Path, help="the reviewed CSV or JSONL file")
    i.add_argument("--db", type=Path, help="DuckDB store (default: UBI_DB or ./ubi.duckdb)")
    i.add_argument("--assessor", required=True, help="who graded (used where a row's assessor column is empty)")
    i.add_argument("--rubric", help="the grading instructions, or where to find them")
    i.add_argument("--date", type=_date, metavar="DATE",
                   help="when the rows were graded, ISO 8601 (2025-03-01 or 2025-03-01T14:30:00+01:00), for rows "
                        "whose judged_at/date column is empty (default: the import time)")
    i.add_argument("--json", action="store_true", help="print a machine-readable summary (JSON)")
    i.set_defaults(func=_guard(cmd_review_import))
    v = rs.add_parser("serve", help="grade candidate pairs in the browser (a page at /review)",
                      description=_SERVE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("--db", type=Path, help="DuckDB store (default: UBI_DB or ./ubi.duckdb); works while `ubi serve` "
                   "holds it")
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; another one needs "
                   "UBI_REVIEW_TOKEN)")
    v.add_argument("--port", type=int, default=8081, help="port (default 8081; 0: a free one)")
    v.add_argument("--docs", type=Path, metavar="CATALOG",
                   help="JSONL of the documents' display fields: doc_id plus any of title, description, image, url")
    v.add_argument("--rubric", type=Path, metavar="FILE",
                   help="the grading instructions shown beside each pair (text); its name and SHA-256 prefix are "
                        "stored with each grade (default: a built-in rubric)")
    v.add_argument("--assessors-per-pair", type=int, default=2, metavar="N",
                   help="grades each pair wants from different assessors (default 2: inter-assessor agreement "
                        "needs two; 1 covers more pairs)")
    v.add_argument("--held-out", type=int, default=50, metavar="N",
                   help="pairs in the stratified held-out sample served first and blind (default 50; 0: none)")
    v.add_argument("--seed", type=int, default=0, help="seed of the held-out sample (default 0)")
    v.add_argument("--blind", action="store_true", help="show no evidence (sources, scores, intervals) for any pair")
    v.set_defaults(func=_guard(cmd_review_serve))
    r.set_defaults(func=lambda args: (r.print_help(), 2)[1])


def _guard(fn: Any) -> Any:
    """Settings errors (bad UBI_* values or flags) become a typed error, so the CLI prints one line."""

    def run(args: argparse.Namespace) -> int:
        from pydantic import ValidationError

        try:
            return int(fn(args))
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            raise UbiError(f"setting {'.'.join(str(x) for x in first['loc'])}: {first['msg']}") from exc

    return run
