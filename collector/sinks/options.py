"""The sinks' names and ``ubi serve`` flags, without importing the sinks (argparse only)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ubi_pipeline.transport.kafka_flags import add_kafka_connection_arguments

#: the sinks ``--sink`` accepts (each is a module of this package with ``create(settings)``)
SINK_NAMES: tuple[str, ...] = ("duckdb", "kafka")


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """``ubi serve`` flags of the Kafka sink (dest = Settings field names)."""
    g = parser.add_argument_group("kafka sink (--sink kafka)")
    add_kafka_connection_arguments(g, topics_verb="write")
    g.add_argument("--spool", dest="spool_dir", type=Path, metavar="DIR",
                   help="local spool for records the broker cannot take yet; collectors on one host may share "
                        "it (each takes a slot) (default ./ubi-spool)")
    g.add_argument("--spool-max-bytes", dest="spool_max_bytes", type=int, metavar="N",
                   help="spool size above which requests get 503 + Retry-After (default 1 GiB)")
    g.add_argument("--ack-timeout", dest="kafka_ack_timeout", type=float, metavar="SECONDS",
                   help="wait this long for the broker's acknowledgement before spooling a batch (default 5)")

