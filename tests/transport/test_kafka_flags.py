"""The Kafka connection flags are built once (transport/kafka_flags.py) for ``ubi serve`` and ``ubi consume``."""

from __future__ import annotations

import argparse

from ubi_pipeline.cli import build_parser
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.transport.kafka_flags import add_kafka_connection_arguments


def test_serve_and_consume_take_the_same_connection_flags_into_settings(tmp_path) -> None:
    parser = build_parser()
    serve = parser.parse_args(["serve", "--sink", "kafka", "--bootstrap", "127.0.0.1:1", "--topic-prefix", "t1"])
    consume = parser.parse_args(["consume", "--db", str(tmp_path / "s.duckdb"), "--bootstrap", "127.0.0.1:1",
                                 "--topic-prefix", "t1"])
    for args in (serve, consume):
        settings = Settings.from_flags(args)
        assert (settings.kafka_bootstrap, settings.kafka_topic_prefix) == ("127.0.0.1:1", "t1")


def test_the_topic_help_says_what_the_command_does_with_them() -> None:
    p = argparse.ArgumentParser()
    add_kafka_connection_arguments(p, topics_verb="read")
    text = p.format_help()
    assert "read PREFIX.queries, PREFIX.events, PREFIX.failed" in " ".join(text.split())
    assert {a.dest for a in p._actions} >= {"kafka_bootstrap", "kafka_topic_prefix"}
    assert set(Settings.model_fields) >= {"kafka_bootstrap", "kafka_topic_prefix"}
