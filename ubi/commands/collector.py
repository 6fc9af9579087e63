"""``ubi serve``, ``ubi import``, ``ubi failed`` and ``ubi schema``: the collector's subcommands."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from ubi_pipeline.schemas.errors import StoreHeldByReader, StoreLocked, UbiError
from ubi_pipeline.schemas.terminal import printable

_DB_HELP = "DuckDB file of the store (default: $UBI_DB or ./ubi.duckdb)"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from ubi_pipeline.collector.sinks import add_sink_arguments, available_sinks

    p = sub.add_parser(
        "serve",
        help="run the collector: UBI queries and events over HTTP into the store",
        description=(
            "Run the UBI collector. POST /v1/queries and /v1/events (one object, a JSON array or NDJSON), "
            "/ubi_queries and /ubi_events (the OpenSearch reference client), /v1/bulk (OpenSearch _bulk "
            "exports), and OpenSearch's own /_bulk, /{index}/_bulk, /{index}/_doc[/{id}] and /{index}/_create/{id} "
            "for the UBI indices (answered in OpenSearch's shapes). A 202 is sent only once the records are durable: "
            "fsync'd to the store's answer log when every key is new (DuckDB commits them within UBI_LOG_COMMIT_MS, "
            "and before any read), else committed (--ack commit: always committed). The collector holds the DuckDB "
            "file; `ubi process`, `ubi report` and `ubi import` keep working while it runs (they read a "
            "sealed Parquet segments of it and write through it). A request to /v1/* or /ubi_* whose every item is "
            "rejected gets 422 naming the first errors (/v1/bulk: 202 with its counts). GET / and HEAD / (the "
            "OpenSearch identity and ping) and HEAD /{index} answer OpenSearch clients' connectivity checks. "
            "GET /healthz, /metrics, /v1/failed, /docs."
        ),
    )
    p.add_argument("--db", type=Path, help=_DB_HELP)
    p.add_argument("--host", help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument(
        "--port", type=int, help="port to listen on (default 8000; 0 picks a free one and prints it)"
    )
    p.add_argument("--sink", choices=available_sinks(), help="where records go (default duckdb)")
    p.add_argument(
        "--ack",
        choices=["log", "commit"],
        help="duckdb sink: answer once new records are fsync'd to the answer log beside the store (log, the "
        "default: several times the single-event rate) or only after the DuckDB commit (commit)",
    )
    p.add_argument(
        "--parse-workers",
        type=int,
        metavar="N",
        help="processes that parse and validate request bodies of 32 KiB or more, started on the first one "
        "(default: one per core, at most 8; 0: all in the collector's process)",
    )
    p.add_argument(
        "--allow-origin",
        action="append",
        dest="cors_allow_origins",
        metavar="URL",
        help="a web page origin (scheme://host[:port], as the browser sends it) allowed to send records from a "
        "browser, e.g. --allow-origin https://shop.example; repeat for more (default: $UBI_CORS_ALLOW_ORIGINS, "
        "else only the collector's own pages)",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="server log level (default warning)",
    )
    add_sink_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "import",
        help="load UBI files (NDJSON, JSON arrays, OpenSearch _bulk exports) into the store",
        description=(
            "Load UBI query records and events from files through the collector's own parsing and "
            "validation: NDJSON (one record per line), a JSON array or object, or an OpenSearch _bulk export "
            "(detected from the first line). Records already stored count as duplicates; rejected ones are "
            "kept in failed_records and listed with their item index (0-based position in the file) and "
            "line. If a running `ubi serve` holds the database, records are sent to it over HTTP (/v1/bulk, "
            "in chunks) instead of opening the file."
        ),
    )
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--db", type=Path, help=_DB_HELP)
    p.add_argument(
        "--kind",
        choices=["query", "event"],
        help="kind of every record in plain files (default: per record, by its keys; _bulk files "
        "say it in their action lines)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--progress-every",
        type=_non_negative_seconds,
        default=5.0,
        metavar="SECONDS",
        help="when stderr is not a terminal, seconds between plain progress lines (default 5; 0: a line "
        "after every committed chunk); a terminal gets a live bar instead",
    )
    p.set_defaults(func=cmd_import)

    p = sub.add_parser(
        "failed",
        help="list kept failed records (rejected items, unparseable bodies), newest first",
        description="List what the collector refused, with why and the raw bytes (as text when UTF-8, "
        "else base64). Works while a collector runs (asks it).",
    )
    p.add_argument("--db", type=Path, help=_DB_HELP)
    p.add_argument("--limit", type=int, default=20, help="records to show (default 20)")
    p.add_argument("--offset", type=int, default=0, help="records to skip (default 0)")
    p.add_argument("--kind", help="only this kind: event, query, body, conflict, forbidden, ...")
    p.add_argument("--json", action="store_true", help="print the page as JSON")
    p.set_defaults(func=cmd_failed)

    p = sub.add_parser(
        "schema",
        help="print the JSON Schemas of the records the collector accepts",
        description="Print the JSON Schema (draft 2020-12, with $schema and $id) of UBI query records and "
        "events as the collector accepts them, leniencies included (naive and +0000 timestamps, epoch "
        "milliseconds, integer ids, legacy positions, extra keys); for client authors and validators. "
        'Without --kind it prints {"query": SCHEMA, "event": SCHEMA}.',
    )
    p.add_argument("--kind", choices=["query", "event"], help="only this record kind (default: both)")
    p.set_defaults(func=cmd_schema)


# ---------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    from ubi_pipeline.collector.app import create_app
    from ubi_pipeline.collector.server import bind_socket, close_serving, make_server, server_config
    from ubi_pipeline.collector.sinks import create_sink
    from ubi_pipeline.collector.workers import tune_gc
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.store.client import advertise

    settings = Settings.from_flags(args)
    sock = bind_socket(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    try:
        sink = create_sink(settings)
    except StoreHeldByReader:
        sock.close()
        raise  # a reader holds the file: the store's message names it and the setting to wait longer
    except StoreLocked as exc:
        sock.close()
        raise StoreLocked(_held_store_message(settings.db)) from exc
    except BaseException:
        sock.close()
        raise
    side = None
    try:
        app = create_app(settings, sink)
        if sink.store is not None:
            side = advertise(sink.store.path, url)
        config = server_config(app, settings, log_level=args.log_level, timeout_graceful_shutdown=10)
        tune_gc()
        print(
            f"ubi collector listening on {url} (sink {sink.name}"
            f"{', db ' + str(sink.store.path) if sink.store else ''})",
            flush=True,
        )
        make_server(config).run(sockets=[sock])
    finally:
        close_serving(sock, sink, side)
    return 0




def _cell(text: str) -> Text:
    """A table cell of stored or user text: never read as rich markup (a ``[my_logs]`` stays), no escape sequence."""
    return Text(printable(text))


def _held_store_message(db: Path) -> str:
    """What a second `ubi serve` on a store another process writes should be told (one writer per DuckDB file)."""
    from ubi_pipeline.store.client import collector_url

    try:
        holder = f"the collector at {collector_url(db)}"
    except StoreLocked:
        holder = "another process (no collector advertises it)"
    return (f"{db} is already held by {holder}: a DuckDB store has one writer, so a second `ubi serve` cannot open "
            f"it. Send records to that collector, stop it before starting this one, or serve another file with --db")


# ---------------------------------------------------------------- import


def _non_negative_seconds(text: str) -> float:
    """argparse type of ``--progress-every``: a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def cmd_import(args: argparse.Namespace) -> int:
    from ubi_pipeline.collector.import_hints import likely_command, not_ubi_records
    from ubi_pipeline.collector.importer import import_files
    from ubi_pipeline.collector.record_filters import record_filters  # not the web stack: faster to start
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.store.rows import Counts

    settings = Settings.from_flags(args)
    for path in args.files:
        if not path.is_file():
            raise UbiError(f"{path}: no such file")
    # before anything is stored: a file that is certainly something else is named, not rejected item by item
    others = [what for what in map(not_ubi_records, args.files) if what]
    if others:
        raise UbiError("; ".join(others) + ". Nothing was imported")
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[records]:,} records"),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=args.json or not console.is_terminal,
        transient=False,
    )
    tasks: dict[str, Any] = {}

    plain = not args.json and not console.is_terminal
    last = [0.0]

    def on_progress(path: str, done: int, total: int, records: int) -> None:
        if path not in tasks:
            tasks[path] = progress.add_task(Path(path).name, total=total, records=0)
        progress.update(tasks[path], completed=done, total=total, records=records)
        now = time.monotonic()
        if plain and (now - last[0] >= args.progress_every or done >= total):  # not a terminal: now and then
            last[0] = now
            console.print(f"{path}: {done:,} of {total:,} bytes, {records:,} records", highlight=False)

    with progress:
        reports, mode = import_files(
            args.files,
            settings.db,
            kind=args.kind,
            filters=record_filters(settings),
            on_progress=on_progress,
            memory_limit=settings.writer_memory_limit,
            batch_records=settings.import_batch_records,
        )
    sums = Counts()
    for r in reports:
        sums.add(r.counts)
    total = {"queries": sums.queries, "events": sums.events, "duplicates": sums.duplicates,
             "rejected": sum(r.rejected for r in reports)}
    code = _import_exit_code(total)
    hints = [h for r in reports if r.rejected and not (r.counts.accepted or r.counts.duplicates)
             for h in [likely_command(Path(r.path))] if h]
    if args.json:
        print(
            json.dumps(
                {
                    "db": str(settings.db),
                    "via": mode,
                    **total,
                    "accepted": total["queries"] + total["events"],
                    "files": [r.public() for r in reports],
                    "exit_code": code,
                    "hints": hints,
                },
                indent=2,
            )
        )
        _import_verdict(code, total, hints)
        return code
    out = Console()
    table = Table(title=_cell(f"ubi import into {settings.db}" + ("" if mode == "direct" else f" (through {mode})")))
    for col in ("file", "queries", "events", "duplicates", "rejected"):
        table.add_column(col, justify="left" if col == "file" else "right")
    for r in reports:
        table.add_row(_cell(r.path), f"{r.counts.queries:,}", f"{r.counts.events:,}", f"{r.counts.duplicates:,}",
                      f"{r.rejected:,}")
    if len(reports) > 1:
        table.add_row("total", *(f"{total[k]:,}" for k in ("queries", "events", "duplicates", "rejected")))
    out.print(table)
    for r in reports:
        for index, line, fld, message in r.errors:
            where = f"{r.path}:{line}" if line is not None else r.path
            out.print(
                f"[red]rejected[/] {escape(printable(where))} item {index}"
                + (f" field {escape(printable(fld))}" if fld else "")
                + f": {escape(printable(message))}",
                highlight=False,
                markup=True,
            )
        if r.rejected > len(r.errors):
            out.print(Text(f"... and {r.rejected - len(r.errors)} more in {printable(r.path)}: see `ubi failed`"))
    _import_verdict(code, total, hints)
    return code


def _import_exit_code(total: dict[str, int]) -> int:
    """0: nothing rejected; 1: some records rejected; 2: records rejected and none accepted (nor already stored),
    so a script notices a wrong file (a qrels file, a CSV) instead of reading exit 0."""
    if not total["rejected"]:
        return 0
    return 2 if not (total["queries"] or total["events"] or total["duplicates"]) else 1


def _import_verdict(code: int, total: dict[str, int], hints: list[str]) -> None:
    if code == 0:
        return
    err = Console(stderr=True)
    what = (f"{total['rejected']:,} records rejected and none accepted" if code == 2 else
            f"{total['rejected']:,} records rejected ({total['queries'] + total['events']:,} accepted)")
    err.print(f"[bold red]error:[/] {escape(what)}; exit {code} (`ubi failed` shows each with its reason)",
              highlight=False, soft_wrap=True)
    for hint in hints:
        err.print(f"hint: {escape(hint)}", highlight=False, soft_wrap=True)


# ---------------------------------------------------------------- failed


def cmd_failed(args: argparse.Namespace) -> int:
    from ubi_pipeline.schemas.settings import Settings
    settings = Settings.from_flags(args)
    if args.limit < 1 or args.offset < 0:
        raise UbiError("--limit must be at least 1 and --offset at least 0")
    from ubi_pipeline.store.client import failed_records

    page = failed_records(settings.db, limit=min(args.limit, 1000), offset=args.offset, kind=args.kind)
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    out = Console()
    table = Table(title=_cell(f"failed records in {settings.db}: {page['total']:,} in all, newest first"))
    for col in ("received (UTC)", "source", "kind", "item", "field", "reason", "raw"):
        table.add_column(col, overflow="fold")
    for r in page["items"]:
        raw = printable(r["raw"] or "")  # before the cut, so that no half escape sequence is left
        shown = (raw[:120] + "…") if len(raw) > 120 else raw
        if r["raw_encoding"] == "base64":
            shown = "base64:" + shown
        # every cell is stored text a client sent (or derived from it): shown as is, never as markup
        table.add_row(
            _cell(r["received_at"][:19]),
            _cell(r["source"]),
            _cell(r["kind"]),
            "" if r["item_index"] is None else str(r["item_index"]),
            _cell(r["field"] or ""),
            _cell(r["reason"]),
            _cell(shown),
        )
    out.print(table)
    if page["next_offset"] is not None:
        out.print(f"more: ubi failed --offset {page['next_offset']}")
    return 0


# ---------------------------------------------------------------- schema


def cmd_schema(args: argparse.Namespace) -> int:
    from ubi_pipeline.schemas.ubi import UbiEvent, UbiQuery, json_schema

    models: dict[str, type[UbiQuery] | type[UbiEvent]] = {"query": UbiQuery, "event": UbiEvent}
    schema: dict[str, Any]
    if args.kind:
        schema = json_schema(models[args.kind])
    else:
        # Each member is a whole schema with its own $schema and $id: validate records against out["event"].
        schema = {kind: json_schema(model) for kind, model in models.items()}
    json.dump(schema, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
