"""The Kafka connection flags ``ubi serve --sink kafka`` and ``ubi consume`` share (argparse only, so building
the command line imports neither kafka-python nor the settings)."""

from __future__ import annotations

import argparse


def add_kafka_connection_arguments(group: argparse._ActionsContainer, *, topics_verb: str) -> None:
    """``--bootstrap`` and ``--topic-prefix`` (dest = Settings field names); ``topics_verb`` says what the
    command does with the topics (``write``, ``read``)."""
    group.add_argument("--bootstrap", dest="kafka_bootstrap", metavar="HOST:PORT",
                       help="Kafka bootstrap servers, comma-separated (default $UBI_KAFKA_BOOTSTRAP or "
                            "127.0.0.1:9092)")
    group.add_argument("--topic-prefix", dest="kafka_topic_prefix", metavar="PREFIX",
                       help=f"{topics_verb} PREFIX.queries, PREFIX.events, PREFIX.failed (default ubi)")
