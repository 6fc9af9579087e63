"""``ubi consume``: load the Kafka topics into the DuckDB store or a Parquet folder (the loader group)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ubi_pipeline.schemas.errors import StoreLocked
from ubi_pipeline.transport.kafka_flags import add_kafka_connection_arguments

if TYPE_CHECKING:
    from ubi_pipeline.schemas.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "consume",
        help="load UBI records from Kafka into the DuckDB store or a Parquet folder (consumer group)",
        description=(
            "Consume <prefix>.queries, <prefix>.events and <prefix>.failed (written by `ubi serve --sink "
            "kafka`) as one member of a consumer group, and load them in batches: into the DuckDB store "
            "(--db; one loader per store, DuckDB has one writer; `ubi process`/`ubi report` read the "
            "segments it seals while it runs) or into a Parquet folder (--parquet; one file writer per partition, so "
            "start as many loaders as partitions). Offsets are committed only after a batch is durably "
            "written; re-delivered records are absorbed by the dedup keys. Unreadable records are kept in "
            "failed_records (kind 'poison') with their topic, partition and offset. Stops on Ctrl-C/SIGTERM "
            "after writing what it holds."
        ),
        epilog="Example: ubi consume --bootstrap 127.0.0.1:9092 --db ubi.duckdb",
    )
    add_kafka_connection_arguments(p, topics_verb="read")
    p.add_argument("--group", dest="consumer_group", help="consumer group id (default ubi-loader)")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--db", type=Path, help="DuckDB store to load into (created when missing)")
    out.add_argument("--parquet", type=Path, metavar="DIR", help="Parquet folder to write (created when missing)")
    p.add_argument("--batch-records", dest="consumer_batch_records", type=int, metavar="N",
                   help="Kafka records per written batch, one offset commit each; a record holds one "
                        "search's rows of one request (default 5000)")
    p.add_argument("--batch-seconds", dest="consumer_batch_seconds", type=float, metavar="S",
                   help="write a partial batch after this long (default 1)")
    p.add_argument("--max-poll-interval-ms", dest="consumer_max_poll_interval_ms", type=int, metavar="MS",
                   help="Kafka max.poll.interval.ms, also the rebalance timeout; a new group's first join "
                        "waits this long on Tansu (default 30000)")
    p.add_argument("--no-check-crcs", dest="consumer_check_crcs", action="store_false", default=None,
                   help="skip the CRC-32C check of fetched record batches (kafka-python computes it in pure "
                        "Python, which costs about half the loader's throughput; a corrupted record then "
                        "mostly shows up as poison instead of an error)")
    p.add_argument("--exit-idle", type=float, metavar="S",
                   help="stop once caught up (lag 0) for S seconds, instead of running until stopped")
    p.add_argument("--progress-every", type=float, default=1.0, metavar="S",
                   help="seconds between progress updates (default 1)")
    p.add_argument("--json", action="store_true",
                   help="print progress as JSON lines (one per second and one per written batch) and a summary")
    p.set_defaults(func=cmd_consume)


def cmd_consume(args: argparse.Namespace) -> int:
    from ubi_pipeline.schemas.settings import Settings
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # its reconnect chatter; our own lines say enough
    from ubi_pipeline.loader.admin import AdminServer, serve_admin
    from ubi_pipeline.loader.consumer import Consumer
    from ubi_pipeline.loader.targets import DuckDBLoader, ParquetLoader
    from ubi_pipeline.store.duckdb_store import Store

    settings = Settings.from_flags(args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    admin: AdminServer | None = None
    store = None
    if args.db is not None:
        try:
            store = Store.from_settings(settings, args.db)
        except StoreLocked as exc:
            raise StoreLocked(f"{exc} DuckDB has one writer: run one loader per store, or use --parquet DIR to "
                              "run several loaders side by side.") from exc
        loader: Any = DuckDBLoader(store)
        target = f"DuckDB {args.db}"
    else:
        loader = ParquetLoader(args.parquet)
        target = f"Parquet {args.parquet}"

    consumer = Consumer(settings, loader)
    if store is not None:
        admin = serve_admin(store, lambda: {"loader": consumer.progress.public()},
                            max_load_bytes=settings.max_load_bytes, admin_hosts=settings.admin_hosts)
    emit = _JsonOut() if args.json else _HumanOut(target, settings)
    try:
        emit.start()
        consumer.connect()
        consumer.run(stop=stop, exit_idle=args.exit_idle, on_progress=emit.progress, on_written=emit.written,
                     progress_every=args.progress_every)
    finally:
        try:
            consumer.close()
        finally:
            if admin is not None:
                admin.stop()
            emit.done(consumer.progress)
    return 0


class _JsonOut:
    def start(self) -> None:
        return

    def _line(self, kind: str, progress: Any) -> None:
        sys.stdout.write(json.dumps({"event": kind, "time": round(time.time(), 3), **progress.public()}) + "\n")
        sys.stdout.flush()

    def progress(self, p: Any) -> None:
        self._line("progress", p)

    def written(self, p: Any) -> None:
        self._line("written", p)

    def done(self, p: Any) -> None:
        self._line("summary", p)


class _HumanOut:
    """A live status line: totals, rate and lag."""

    def __init__(self, target: str, settings: Settings) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console(stderr=True)
        self.target, self.settings = target, settings
        self.live = Live(console=self.console, refresh_per_second=2, transient=False)

    def start(self) -> None:
        self.console.print(f"loading {self.settings.kafka_topic_prefix}.* from {self.settings.kafka_bootstrap} "
                           f"(group {self.settings.consumer_group}) into {self.target}; Ctrl-C to stop")
        self.live.start()

    def _text(self, p: Any) -> str:
        d = p.public()
        lag = "?" if d["lag"] is None else f"{d['lag']:,}"
        return (f"[bold]{d['rows']:,}[/] rows ({d['records']:,} Kafka records) in {d['batches']:,} batches  "
                f"queries {d['queries']:,}  events {d['events']:,}  duplicates "
                f"{d['query_duplicates'] + d['event_duplicates']:,}  conflicts {d['conflicts']:,}  "
                f"failed {d['failed']:,}  poison {d['poison']:,}  |  lag [bold]{lag}[/]  "
                f"{d['rows_per_s']:,.0f} rows/s  partitions {d['partitions']}")

    def progress(self, p: Any) -> None:
        self.live.update(self._text(p))

    def written(self, p: Any) -> None:
        return

    def done(self, p: Any) -> None:
        self.live.update(self._text(p))
        self.live.stop()
