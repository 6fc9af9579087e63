"""``ubi report`` and ``ubi queryset``: the joint report and query sets for human reviewers."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from ubi_pipeline.commands.common import csv_list, run_arg, write_output
from ubi_pipeline.schemas.cli_names import (
    DEFAULT_PRECEDENCE,
    DEFAULT_REPORT_REPLICATES,
    DEFAULT_SPLIT_KEYS,
    GAINS,
    POSITION_BASE_CHOICES,
    POSITION_BASE_HELP,
    QRELS_FORMATS,
    QUERYSET_FORMATS,
    STRATEGIES,
)
from ubi_pipeline.schemas.errors import InputFileError, UbiError

if TYPE_CHECKING:
    from ubi_pipeline.reports.gates import Threshold
    from ubi_pipeline.schemas.settings import Settings

# The handlers import what they run (numpy, scipy, duckdb, pyarrow, matplotlib) when they run, so that building
# the parser for `ubi --help` stays light (tests/ubi/test_cli_imports.py).

_DB_HELP = "DuckDB file of the store (default: $UBI_DB or ./ubi.duckdb); works while `ubi serve` runs"
_FORMATS = ("text", "json", "md", "html")
_FORMAT_NAMES = {"text": "text", "json": "JSON", "md": "Markdown", "html": "HTML"}

_EPILOG = """\
verdict (first in every format): which system wins on which evidence and how firmly, or "undetermined" and
what would decide it. A line of evidence counts only when its interval excludes 0 (no interval below n = 5);
an observed A/B line exists only for systems that served one application at overlapping times on shared
queries; no prediction rests on a click model the identifiability verdict rules out; the online figures leave
out the searches the session filter drops (bots, click-on-everything), counted per system; no implicit source
is recommended on fewer than 200 held-out searches or 30 graded pairs.

exit codes: 0 report written (gates passed or none given), 1 a gate failed (each shortfall is named),
2 bad input (the message names the file and line), 3 internal error (a bug: the traceback is printed; never
mistaken for a failed gate).

examples:
  ubi report --qrels judgments.jsonl
  ubi report --qrels esci_us_judgments.json --baseline shop/ranker=bm25 --html report.html
  ubi report --qrels qrels.jsonl --thresholds gates.toml --format md --out report.md   # the CI step
  ubi report --qrels qrels.jsonl --min ndcg@10=0.45 --min online/ctr@10=0.05 --max online/abandonment=0.6
  ubi report --qrels qrels.jsonl --run bm25.trec --run ltr.trec=ltr-v2 --baseline bm25   # run files as systems

run files (--run FILE[=NAME]): TREC runs ('query_id Q0 doc_id rank score tag', ordered as trec_eval does) or
JSONL rankings ({"query_id": ..., "doc_ids": [...]}, detected by a leading '{'). Each is one more system, named
NAME, else its run tag, else the file name without extension. Judgments are joined by normalised query text,
so each run query id is mapped to a text: an id that is a query_id of the human judgments (--qrels first,
then the store's human_judgments) or of the query set (--queries) stands for that query's text; any other id is
taken as the query text itself (normalised; percent-decoded in a TREC run, red%20shoes, as `ubi judgments
import` reads TREC qrels), which is how Workbench judgments, implicit judgments and the logs name queries. A run is
evaluated offline like a logged system (every source, coverage, per query, --baseline, gates); it has no
online metrics ("no log"), takes no part in the offline-vs-online ordering, and an online gate applies to it
only when the thresholds file names it.
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "report",
        help="joint report: every system in the logs, offline on human and implicit labels, online, "
             "agreement, comparison, gates",
        description=(
            "Evaluate the rankings each system showed (systems: the application of the query records, split by "
            "query_attributes ranker / experiment, plus any --run files) against the human judgments and against "
            "each implicit and model "
            "judgment source in the store, beside the online metrics of the same systems, the agreement of "
            "the implicit and model labels with the human ones (and of the assessors among themselves), a paired "
            "comparison with a baseline, and quality gates. "
            "Every number says how many queries (or searches) it rests on; intervals are 95%."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", type=Path, help=_DB_HELP)
    p.add_argument("--qrels", type=Path, metavar="FILE",
                   help="human judgments (JSONL, TREC qrels or Workbench JSON); optional when the store already "
                        "holds human_judgments (`ubi judgments import FILE` puts them there)")
    p.add_argument("--qrels-format", default="auto", choices=("auto", *QRELS_FORMATS),
                   help="format of --qrels (default: detected)")
    p.add_argument("--rating-map", default=None, metavar="MAP",
                   help="Workbench ratings to grades: esci (default: 0->0, 1->1, 10->2, 100->3), integer, or "
                        "pairs such as 0:0,1:1,10:2,100:3")
    p.add_argument("--run", dest="runs", type=run_arg, action="append", default=[], metavar="FILE[=NAME]",
                   help="a TREC run file (or JSONL rankings) evaluated as one more system, named NAME, else its "
                        "run tag, else the file stem (repeatable). A run query id that is a query_id of the human "
                        "judgments stands for that query's text; any other id is the query text itself. No online "
                        "metrics (shown as 'no log'). See below")
    p.add_argument("--queries", type=Path, metavar="FILE",
                   help="query set mapping query ids to texts (JSONL {\"query_id\", \"query\"} or Workbench), for "
                        "--run files whose query ids are not texts")
    p.add_argument("--k", type=int, default=10, help="cutoff of the default metrics, coverage and CTR@k (default 10)")
    p.add_argument("--metrics", type=csv_list, metavar="LIST",
                   help="offline metrics (default: ndcg@K,recall@K,mrr,p@K,map,judged@K)")
    p.add_argument("--gain", choices=GAINS, default="linear",
                   help="nDCG gain: linear (trec_eval ndcg_cut, default) or exponential (2^g-1)")
    p.add_argument("--mode", choices=("modal", "each"), default="modal",
                   help="repeated searches of one query by one system: modal = its most frequent ranking "
                        "(default), each = every search evaluated on its own (traffic-weighted)")
    p.add_argument("--split-keys", type=csv_list, default=DEFAULT_SPLIT_KEYS, metavar="KEYS",
                   help="query_attributes keys that split an application into systems (default ranker,experiment)")
    p.add_argument("--sources", type=csv_list, metavar="LIST",
                   help="implicit, model (or reviewed) sources to evaluate, e.g. implicit:ctr,model:gpt-4o-mini (default: all)")
    p.add_argument("--precedence", type=csv_list, default=DEFAULT_PRECEDENCE, metavar="LIST",
                   help="merged view: label kinds or sources in order (default human,reviewed,implicit)")
    cls = p.add_mutually_exclusive_group()
    cls.add_argument("--class-key", metavar="KEY", help="query class from this query_attributes key")
    cls.add_argument("--classes", type=Path, metavar="FILE",
                     help='query classes from a TOML file: [classes] name = "regex" (first match wins)')
    p.add_argument("--baseline", metavar="SYSTEM",
                   help="compare every other system with this one (a logged system or a --run name)")
    p.add_argument("--thresholds", type=Path, metavar="FILE", help="quality gates (TOML: [min], [max], systems)")
    p.add_argument("--min", dest="min_flags", action="append", default=[], metavar="METRIC=VALUE",
                   help="a gate: METRIC must be >= VALUE (repeatable; METRIC like ndcg@10, implicit:ctr/mrr, "
                        "online/ctr@10)")
    p.add_argument("--max", dest="max_flags", action="append", default=[], metavar="METRIC=VALUE",
                   help="a gate: METRIC must be <= VALUE (repeatable; e.g. online/abandonment=0.6)")
    p.add_argument("--window", type=float, dest="reformulation_window_s", metavar="SECONDS",
                   help="reformulation window (default: $UBI_REFORMULATION_WINDOW_S or 60)")
    p.add_argument("--propensity", type=Path, metavar="FILE",
                   help="a position-bias estimate (JSON of `ubi propensity`) to plot in the HTML report")
    p.add_argument("--seed", type=int, help="seed of the bootstrap and randomisation test (default: $UBI_SEED or 0)")
    p.add_argument("--predict-replicates", type=int, default=None, metavar="N",
                   help="bootstrap replicates of the predicted online metrics of --run systems and of the joint "
                        f"view's predicted differences; each refits the click model per system (default "
                        f"{DEFAULT_REPORT_REPLICATES}, fewer (at least 10) when one fit is so slow that they would "
                        "take over a minute of CPU; `ubi predict` uses 200; 0: no interval)")
    p.add_argument("--predict-model", choices=("pbm", "dbn", "auto"), default="pbm",
                   help="click model of those predictions (default pbm; see `ubi predict`)")
    p.add_argument("--position-base", dest="position_base_flag", choices=POSITION_BASE_CHOICES, help=POSITION_BASE_HELP + " (online metrics)")
    p.add_argument("--format", choices=_FORMATS, default="text", help="output format (default text)")
    p.add_argument("--json", action="store_true", help="same as --format json")
    p.add_argument("--no-labels", dest="label_pairs", action="store_false",
                   help="JSON: leave out the per-pair labels (labels.pairs: every labelled (query, doc), the label "
                        "the precedence chose and all its labels with provenance); counts and merge summary stay")
    p.add_argument("--out", type=Path, metavar="FILE", help="write the report there instead of stdout")
    p.add_argument("--html", type=Path, metavar="FILE", help="also write the self-contained HTML report there")
    p.add_argument("--dashboard", type=Path, metavar="FILE",
                   help="also write per-query metric rows (OpenSearch _bulk NDJSON, search-quality dashboard shape)")
    p.add_argument("--dashboard-index", default="sqe_metrics", metavar="NAME", help="_index of the dashboard rows")
    p.set_defaults(func=cmd_report)

    q = sub.add_parser(
        "queryset",
        help="sample logged queries for human review: top, random, or probability proportional to frequency",
        description=(
            "Draw N distinct queries from the logged query texts (normalised; frequency = search instances). "
            "top: the N most frequent; random: uniform; pptss: probability proportional to frequency without "
            "replacement (Efraimidis-Spirakis). Always exactly N when N distinct queries exist."
        ),
    )
    q.add_argument("--strategy", choices=STRATEGIES, default="top", help="how to draw (default top)")
    q.add_argument("--size", type=int, required=True, metavar="N", help="number of queries")
    q.add_argument("--db", type=Path, help=_DB_HELP)
    q.add_argument("--seed", type=int, help="seed for random and pptss (default: $UBI_SEED or 0)")
    q.add_argument("--application", help="only queries of this application")
    q.add_argument("--name", help="name of the query set (Workbench format; at most 50 characters, none of \" \\ < >)")
    q.add_argument("--format", choices=QUERYSET_FORMATS, default="jsonl", help="jsonl (default) or workbench")
    q.add_argument("--out", type=Path, metavar="FILE", help="write there instead of stdout")
    q.set_defaults(func=cmd_queryset)


def _thresholds(args: argparse.Namespace) -> list[Threshold]:
    from ubi_pipeline.reports.gates import load_thresholds, parse_flag

    out: list[Threshold] = []
    if args.thresholds is not None:
        out += load_thresholds(args.thresholds)
    out += [parse_flag(t, "min") for t in args.min_flags]
    out += [parse_flag(t, "max") for t in args.max_flags]
    return out


def _propensity(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputFileError(str(path), None, f"cannot read: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise InputFileError(str(path), exc.lineno, f"malformed JSON: {exc.msg}") from exc
    if isinstance(doc, dict) and "propensity" in doc and isinstance(doc["propensity"], dict):
        doc = doc["propensity"]
    # `ubi propensity --json` wraps one estimate per method in {"estimates": [...]}: plot the first.
    if isinstance(doc, dict) and isinstance(doc.get("estimates"), list) and doc["estimates"]:
        doc = doc["estimates"][0]
    if not isinstance(doc, dict) or not isinstance(doc.get("ranks"), list):
        raise InputFileError(str(path), None, 'expected a propensity estimate: {"method": ..., "ranks": '
                             '[{"rank": 1, "ratio": 1.0, "ci_low": ..., "ci_high": ...}, ...]}')
    for i, row in enumerate(doc["ranks"]):
        rank = row.get("rank") if isinstance(row, dict) else None
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise InputFileError(str(path), None, f"ranks[{i}]: expected an object with an integer rank >= 1, "
                                 f"got {row!r:.80}")
        for key in ("ratio", "ci_low", "ci_high"):
            value = row.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise InputFileError(str(path), None, f"ranks[{i}].{key}: expected a number or null, got {value!r:.40}")
    return doc


#: An application's ordinal base is reported, even when the data's majority agrees with it, once at least this share
#: of its checked ordinals fits the other base: a producer that changed its mind (Chorus in the ESCI sample: 40%
#: of its ordinals fit base 0, 60% base 1) must not hide behind a one-word verdict.
MIXED_BASE_SHARE = 0.10


def _base_line(choice: Any) -> str:
    """The ordinal-base verdict of one application with the share of its evidence against the base in use."""
    from ubi_pipeline.processors.clicks.ordinal_base import describe

    line = describe(choice)
    ev = choice.evidence
    if ev is not None and ev.checked:
        fits, against = (ev.base0, ev.base1) if choice.base == 0 else (ev.base1, ev.base0)
        line += (f"; {against / ev.checked:.0%} of the checked ordinals fit base {1 - choice.base}, against the base "
                 f"in use ({fits / ev.checked:.0%} fit it)")
    return line


def _against_share(choice: Any) -> float:
    ev = choice.evidence
    if ev is None or not ev.checked:
        return 0.0
    return (ev.base1 if choice.base == 0 else ev.base0) / ev.checked


def _has_log(con: Any) -> bool:
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    return {"ubi_queries", "ubi_events"} <= tables


def _stored_labels(con: Any) -> bool:
    """Whether the store holds any judgment (human or implicit): checked before the session build, so a store
    without any fails at once; the labels themselves are read after the build (``cmd_report``)."""
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    for table in ("human_judgments", "judgments"):  # fixed names, quoted
        if table in tables and con.execute(f'SELECT EXISTS (SELECT 1 FROM "{table}")').fetchall()[0][0]:
            return True
    return False


def _sessions(con: Any, settings: Settings) -> Any:
    """The logged sessions with a held-out split (for identifiability and the recommended source), or None.

    With the systems that showed each ranking, so the recommendation fits PBM/UBM with the same prior covariates
    as ``ubi process`` and ``ubi select`` do (every model's ``fit(sessions, systems)``)."""
    from ubi_pipeline.processors.click_models.selection import DEFAULT_HOLDOUT
    from ubi_pipeline.processors.clicks.sessions import SessionError, load_sessions

    try:
        return load_sessions(con, settings, holdout=DEFAULT_HOLDOUT, systems=True)
    except SessionError:  # a store without UBI tables: the report of run files and labels alone still works
        return None


def _write_json(path: Path | None, report: Any, *, label_pairs: bool) -> None:
    """The JSON report written as it is encoded (:func:`ubi_pipeline.reports.render.json_out.write_json`), to ``path`` or stdout."""
    from ubi_pipeline.reports.render.json_out import write_json

    if path is None:
        write_json(report, sys.stdout.buffer, label_pairs=label_pairs)
        sys.stdout.flush()
        return
    try:
        with path.open("wb") as fh:
            write_json(report, fh, label_pairs=label_pairs)
    except OSError as exc:
        raise UbiError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def cmd_report(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ubi_pipeline.formats.qrels import ESCI_RATINGS, RatingMap, load_qrels, load_queryset
    from ubi_pipeline.formats.runs import load_run
    from ubi_pipeline.processors.clicks.ordinal_base import (
        effective_bases,
        position_base_flags,
        suggestion,
    )
    from ubi_pipeline.processors.clicks.sessions import position_bases
    from ubi_pipeline.processors.labels.merge import LabelSet, labels_from_human, labels_from_store
    from ubi_pipeline.reports.joint import ReportConfig, build_report, load_class_rules
    from ubi_pipeline.reports.render.dashboard import render_dashboard
    from ubi_pipeline.reports.render.html import render_html
    from ubi_pipeline.reports.render.markdown import render_markdown
    from ubi_pipeline.reports.render.text import print_report, render_text
    from ubi_pipeline.reports.systems import run_system_name
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.store.bounded import apply_limits, release_pool
    from ubi_pipeline.store.client import reading

    settings = Settings.from_flags(args, **position_base_flags(args.position_base_flag))
    fmt = "json" if args.json else args.format
    thresholds = _thresholds(args)
    propensity = _propensity(args.propensity)
    class_rules = load_class_rules(args.classes) if args.classes is not None else None
    try:
        rating_map = RatingMap.parse(args.rating_map) if args.rating_map else ESCI_RATINGS
    except ValueError as exc:
        raise UbiError(f"--rating-map: {exc}") from exc
    config = ReportConfig(
        k=args.k, metrics=args.metrics, gain=args.gain, mode=args.mode, split_keys=tuple(args.split_keys),
        class_key=args.class_key, class_rules=class_rules, sources=args.sources,
        precedence=tuple(args.precedence), baseline=args.baseline, position_base=settings.position_base,
        position_base_by_application=settings.position_base_by_application,
        click_actions=tuple(settings.click_actions), impression_actions=(settings.impression_action,),
        reformulation_window_s=settings.reformulation_window_s,
        max_client_queries_per_minute=settings.max_client_queries_per_minute, max_rank=max(settings.max_rank, args.k),
        grade_max=settings.grade_max, n_boot=settings.report_bootstrap, n_perm=settings.report_permutations,
        seed=settings.seed, predict_replicates=args.predict_replicates, predict_model=args.predict_model,
    )
    if args.predict_replicates is not None and args.predict_replicates < 0:
        raise UbiError(f"--predict-replicates {args.predict_replicates}: expected 0 or more")
    err = Console(stderr=True)
    labels = LabelSet()
    inputs: dict[str, Any] = {"db": str(settings.db)}
    if args.qrels is not None:
        qrels = load_qrels(args.qrels, format=args.qrels_format, rating_map=rating_map)
        labels.add(labels_from_human(qrels.human_judgments()))
        inputs["qrels"] = f"{args.qrels} ({qrels.format}, {len(qrels)} queries, {qrels.n_judgments()} judgments)"
        if qrels.format == "workbench":
            inputs["rating_map"] = rating_map.describe()
    if args.thresholds is not None:
        inputs["thresholds"] = str(args.thresholds)
    queryset = None
    if args.queries is not None:
        from ubi_pipeline.schemas.text import normalize_query

        queryset = {q.query_id: {normalize_query(q.query)} for q in load_queryset(args.queries)}
        inputs["queries"] = f"{args.queries} ({len(queryset)} queries)"
    file_runs = []
    for path, name in args.runs:
        run = load_run(path)
        system = run_system_name(run, name)
        file_runs.append((system, run))
        inputs.setdefault("runs", []).append(
            f"{path} as {system} ({len(run)} queries, {run.n_docs()} ranked docs{', tag ' + run.tag if run.tag else ''})")
    with reading(settings.db, settings) as con:
        apply_limits(con, settings)
        if not len(labels) and not _stored_labels(con):
            raise UbiError("no judgments at all: give human judgments with --qrels FILE, or run `ubi process` to "
                           "derive implicit ones")
        warnings = []
        if _has_log(con):
            # the online metrics place clicks by ordinal with the same bases `ubi process` uses
            bases = position_bases(con, settings)
            config.position_base_by_application = effective_bases(bases)
            # a base detected as the default changes nothing: only a change, a disagreement or mixed evidence is
            # worth a warning, and each says how much of the evidence goes against the base in use
            warnings = [_base_line(c) for c in bases.values()
                        if c.disagrees or (c.how == "detected" and c.base != settings.position_base)
                        or _against_share(c) >= MIXED_BASE_SHARE]
            hint = suggestion(bases, settings)
            if hint:
                warnings.append(f"suggested setting: {hint}")
        sessions = _sessions(con, settings)
        release_pool(con, settings)  # the session build's buffers, before the report's own steps
        swaps = None
        if sessions is not None:
            from ubi_pipeline.reports.predicted import load_swap_experiment

            swaps = load_swap_experiment(con, settings, sessions.max_rank)
        # the labels are read after the session build and after the report's own DuckDB steps (build_report calls
        # this once their temp tables are dropped): the peaks do not add up (at 20M events 416,660 labels were
        # held through the build, at 50M about 1M)
        def read_labels() -> LabelSet:
            # the search tables are dropped by now: what DuckDB still caches goes back before the labels, the
            # recommendation's fits and the predictions are built on top of it
            release_pool(con, settings)
            return labels.add(labels_from_store(con))

        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                      transient=True, disable=not err.is_terminal) as bar:
            task = bar.add_task("report", total=None)
            report = build_report(con, read_labels, config, thresholds=thresholds, propensity=propensity, inputs=inputs,
                                  progress=lambda name: bar.update(task, description=name), file_runs=file_runs,
                                  warnings=warnings, sessions=sessions, swaps=swaps, queryset=queryset)

    if fmt == "text":
        if args.out is None:
            print_report(report, Console())
        else:
            write_output(args.out, render_text(report))
    elif fmt == "json":
        # streamed: at 20M events the label pairs alone make a 1.59 GB document (ubi_pipeline.reports.render.json_out)
        _write_json(args.out, report, label_pairs=args.label_pairs)
    elif fmt == "md":
        write_output(args.out, render_markdown(report))
    else:
        write_output(args.out, render_html(report))
    # stdout stays the report's (or nothing, with --out): where each file went is said on stderr
    written = [(args.out, f"the {_FORMAT_NAMES[fmt]} report")] if args.out is not None else []
    if args.html is not None:
        write_output(args.html, render_html(report))
        written.append((args.html, "the HTML report"))
    if args.dashboard is not None:
        write_output(args.dashboard, render_dashboard(report, index=args.dashboard_index))
        written.append((args.dashboard, f"the dashboard rows (_index {args.dashboard_index})"))
    for path, what in written:
        err.print(escape(f"wrote {what} to {path}"), highlight=False, soft_wrap=True)
    failed = report.failed_gates
    if failed:
        for g in failed:
            err.print(f"[bold red]gate failed:[/] {escape(g.describe())}", highlight=False)
        return 1
    return 0


def cmd_queryset(args: argparse.Namespace) -> int:
    from ubi_pipeline.formats.qrels import WORKBENCH_NAME_MAX, check_workbench_text, format_queryset
    from ubi_pipeline.processors.labels.queryset import query_frequencies, sample, to_queryset
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.store.client import reading

    if args.name is not None:  # before reading anything: the Workbench refuses a longer name; never cut it silently
        check_workbench_text(args.name, "--name", WORKBENCH_NAME_MAX)
    settings = Settings.from_flags(args)
    with reading(settings.db, settings) as con:
        population = query_frequencies(con, application=args.application)
    chosen = sample(population, args.strategy, args.size, seed=settings.seed)
    qs = to_queryset(chosen, strategy=args.strategy, seed=settings.seed, name=args.name)
    write_output(args.out, format_queryset(qs, args.format))
    if args.out is not None:
        Console(stderr=True).print(
            escape(f"wrote {len(chosen)} of {len(population)} distinct queries ({args.strategy}) to {args.out}"),
            highlight=False)
    return 0
