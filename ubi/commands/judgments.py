"""``ubi judgments export`` and ``ubi judgments import``: judgments between the store and JSONL / TREC / Workbench."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from ubi_pipeline.commands.common import csv_list, write_output
from ubi_pipeline.schemas.cli_names import DEFAULT_PRECEDENCE, QRELS_FORMATS
from ubi_pipeline.schemas.errors import UbiError

if TYPE_CHECKING:
    from ubi_pipeline.formats.qrels import RatingMap

_DB_HELP = "DuckDB file of the store (default: $UBI_DB or ./ubi.duckdb); works while `ubi serve` runs"
_MAP_HELP = ("Workbench ratings <-> grades: esci (default: 0->0, 1->1, 10->2, 100->3), integer (the rating is the "
             "grade), or pairs such as 0:0,1:1,10:2,100:3")

_EXPORT_EPILOG = """\
sources: human (default; imported qrels and blind review sheets), reviewed (every reviewed:<src>), one
reviewed:<src>, implicit:<model> (or just the model name: pbm), implicit (the store's click model when it holds
one; with several, name one: a file holds one grade per pair), or merged (one label per pair, chosen by
--precedence as in `ubi report`, e.g. implicit:pbm,implicit:dbn), or model:<name> (a model judge's grades:
`ubi judge`, or `ubi judgments import --source model:NAME`). Only graded labels are written. Where several
assessors graded a pair, human (and reviewed) export their aggregate, the lower median of their grades
(docs/labels.md); --assessor NAME writes that one assessor's grades instead.

formats: jsonl   {"query_id": ..., "query": ..., "relevant": {doc: grade}, "assessor": ..., "judged_at": ...}
         trec    query_id 0 doc_id grade; the id is the query text percent-escaped (red%20shoes)
         workbench  Search Relevance Workbench judgment JSON; grades -> ratings by --rating-map

examples:
  ubi judgments export --format workbench --out judgments.json
  ubi judgments export --source pbm --format trec --out pbm.qrels
  ubi judgments export --source merged --precedence human,implicit:pbm --format jsonl
  ubi judgments export --source model:gpt-4o-mini --format workbench --out llm.json
  ubi judgments export --assessor ann --format trec --out ann.qrels
"""

_IMPORT_EPILOG = """\
Every judgment is validated first (errors name the file and line); nothing is stored unless all are good.
Judgments join the logs by normalised query text: a query without text (TREC qrels, JSONL without "query")
takes it from --queries FILE (a query set: JSONL {"query_id", "query"} or Workbench), else its id is the text
(in TREC percent-decoded: red%20shoes is "red shoes", as `ubi judgments export --format trec` writes it).
Every assessor is kept: one row per (query, doc, assessor), the assessor from the file where it names one (JSONL
"assessor"), else --assessor, else '' (unnamed). A stored label of the same pair and assessor is replaced; other
assessors' labels of the pair stay beside it, and reports use their aggregate (the lower median, docs/labels.md).
--replace also deletes the file's assessors' stored human labels of pairs the file lacks (never another's).

--source model:NAME stores the file as a model's proposals instead (the judgments table, source model:NAME,
provenance in parameters): the report measures them against the human grades like an implicit source, and no
default precedence uses them; `ubi judge` asks a chat-completions endpoint for such grades itself.

examples:
  ubi judgments import esci_us_judgments.json                      # Workbench, ESCI rating map
  ubi judgments import llm.jsonl --source model:gpt-4o-mini        # a model's grades, kept apart
  ubi judgments import qrels.txt --queries queries.jsonl --assessor ann --rubric guidelines-v2
  ubi judgments import all.jsonl --replace
"""


def _rating_map(text: str | None) -> RatingMap:
    from ubi_pipeline.formats.qrels import ESCI_RATINGS, RatingMap

    try:
        return RatingMap.parse(text) if text else ESCI_RATINGS
    except ValueError as exc:
        raise UbiError(f"--rating-map: {exc}") from exc


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "judgments",
        help="export stored judgments as JSONL, TREC or Workbench; import a human (or a model's) judgments file",
        description="Move judgments between the store and files: `export` writes the graded labels of one source "
                    "(human, reviewed, implicit:<model>, model:<name>, merged); `import` loads human judgments (JSONL, "
                    "TREC qrels or Workbench JSON) into human_judgments with their provenance, or with --source "
                    "model:NAME a model's grades into the judgments table, apart from the human ones.",
    )
    js = p.add_subparsers(dest="judgments_command", metavar="{export,import}")

    e = js.add_parser(
        "export", help="write the stored judgments of one source as jsonl, trec or workbench",
        description="Write the graded judgments of one source of the store in a judgment file format.",
        epilog=_EXPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument("--format", required=True, choices=QRELS_FORMATS, help="jsonl, trec or workbench")
    e.add_argument("--source", default="human", metavar="SOURCE",
                   help="human (default), reviewed[:SRC], implicit:MODEL (or the model name; plain implicit when the "
                        "store holds one model), model:NAME (a model judge's grades), or merged")
    e.add_argument("--precedence", type=csv_list, default=DEFAULT_PRECEDENCE, metavar="LIST",
                   help="for --source merged: label kinds or sources in order (default human,reviewed,implicit)")
    e.add_argument("--rating-map", metavar="MAP", help=_MAP_HELP)
    e.add_argument("--assessor", metavar="NAME",
                   help="human/reviewed: only this assessor's grades (default: every assessor's, aggregated per pair)")
    e.add_argument("--name", default="Judgments", help="Workbench: the judgment list's name (default Judgments)")
    e.add_argument("--db", type=Path, help=_DB_HELP)
    e.add_argument("--out", type=Path, metavar="FILE", help="write there instead of stdout")
    e.add_argument("--json", action="store_true", help="print a machine-readable summary (JSON) on stderr")
    e.set_defaults(func=cmd_export)

    i = js.add_parser(
        "import", help="load a human judgments file (jsonl, trec, workbench) into the store, or a model's",
        description="Validate a human judgments file and store it in human_judgments as source human, with its\n"
                    "provenance (assessor, date, rubric, the file); with --source model:NAME, a model's grades\n"
                    "in the judgments table instead (below).",
        epilog=_IMPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    i.add_argument("file", type=Path, metavar="FILE", help="the judgments: JSONL, TREC qrels or Workbench JSON")
    i.add_argument("--format", default="auto", choices=("auto", *QRELS_FORMATS), help="default: detected")
    i.add_argument("--rating-map", metavar="MAP", help=_MAP_HELP)
    i.add_argument("--assessor", help="who judged (kept where the file names nobody)")
    i.add_argument("--source", default="human", metavar="SOURCE",
                   help="human (default: human_judgments), or model:NAME for grades a model proposed: stored apart, "
                        "in the judgments table, measured against human grades like an implicit source")
    i.add_argument("--rubric", help="the grading instructions, or where to find them (where the file has none)")
    i.add_argument("--queries", type=Path, metavar="FILE",
                   help="query set mapping query ids to texts (JSONL {\"query_id\", \"query\"} or Workbench), for "
                        "files without query text")
    i.add_argument("--replace", action="store_true",
                   help="also delete the file's assessors' other stored human judgments, in the same transaction "
                        "(the file becomes their whole human set; other assessors' labels stay)")
    i.add_argument("--db", type=Path, help=_DB_HELP)
    i.add_argument("--json", action="store_true", help="print a machine-readable summary (JSON)")
    i.set_defaults(func=cmd_import)
    p.set_defaults(func=lambda _args: (p.print_help(), 2)[1])


def cmd_export(args: argparse.Namespace) -> int:
    from ubi_pipeline.formats.qrels import WORKBENCH_NAME_MAX, check_workbench_text
    from ubi_pipeline.processors.labels.judgment_io import export_judgments
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.store.client import reading

    if args.format == "workbench":  # before reading anything: a name the Workbench refuses is bad input (exit 2)
        check_workbench_text(args.name, "--name", WORKBENCH_NAME_MAX)
    settings = Settings.from_flags(args)
    with reading(settings.db, settings) as con:
        body, summary = export_judgments(con, args.format, source=args.source, precedence=tuple(args.precedence),
                                         rating_map=_rating_map(args.rating_map), name=args.name,
                                         assessor=args.assessor)
    write_output(args.out, body)
    err = Console(stderr=True, highlight=False)
    if args.json:
        err.print_json(json.dumps(summary.as_dict()))
    elif args.out is not None:
        origin = summary.source + (f", assessor {args.assessor}" if args.assessor is not None else "")
        if summary.source == "merged" or len(summary.chosen_by_source) > 1:
            origin += ": " + ", ".join(f"{n} {s}" for s, n in summary.chosen_by_source.items())
        mixed = (f"; {summary.mixed_provenance} queries with differing assessor/rubric/date written without them"
                 if summary.mixed_provenance else "")
        ratings = f"; ratings by {summary.rating_map}" if summary.rating_map else ""
        if summary.aggregated:
            rule = "lower median" if summary.aggregate_rule == "median_low" else summary.aggregate_rule
            ratings += f"; {summary.aggregated} pairs graded by several assessors written as the {rule} of their grades"
        err.print(escape(f"wrote {summary.judgments} judgments of {summary.queries} queries ({origin}) as "
                         f"{summary.format} to {args.out}{ratings}{mixed}"))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from ubi_pipeline.processors.labels.judgment_io import import_human, import_model
    from ubi_pipeline.schemas.settings import Settings

    settings = Settings.from_flags(args)
    options = {"format": args.format, "rating_map": _rating_map(args.rating_map), "assessor": args.assessor,
               "rubric": args.rubric, "queries": args.queries, "replace_all": args.replace}
    if args.source == "human":
        result = import_human(settings.db, args.file, **options)
    elif args.source.startswith("model:"):
        result = import_model(settings.db, args.file, args.source, **options)
    else:
        raise UbiError(f"--source {args.source!r}: expected human or model:NAME (implicit sources come from "
                       "`ubi process`, reviewed ones from `ubi review import`)")
    if args.json:
        print(json.dumps({**result.as_dict(), "db": str(settings.db)}, ensure_ascii=False))
        return 0
    out = Console(highlight=False)
    if result.source != "human":
        out.print(escape(f"imported {result.judgments} model judgments of {result.queries} queries ({result.format}) "
                         f"from {result.path} into {settings.db} as source {result.source} (judgments table; "
                         f"{result.replaced} replaced a stored grade of the same pair"
                         + (f", {result.removed} other rows of the source removed" if args.replace else "") + ")"))
        return 0
    parts = [f"imported {result.judgments} judgments of {result.queries} queries ({result.format}) from "
             f"{result.path} into {settings.db} as source human"]
    if result.rating_map:
        parts.append(f"ratings mapped by {result.rating_map}")
    who = ", ".join(a or "(unnamed)" for a in result.assessors)
    parts.append(f"assessor {who}" if len(result.assessors) == 1 else f"assessors {who}")
    parts.append(f"{result.replaced} replaced a stored human label of the same pair and assessor")
    if result.other_assessors:
        parts.append(f"{result.other_assessors} labels of other assessors on these pairs kept")
    if args.replace:
        parts.append(f"{result.removed} other stored human labels of the same assessor(s) removed (--replace)")
    if result.unmatched_queries:
        parts.append(f"{result.unmatched_queries} of {result.queries} query texts never appear in the logs "
                     f"(check the texts, or give --queries)")
    out.print(escape("; ".join(parts)))
    return 0
