"""Sinks: where validated records go. ``duckdb`` (the embedded store, default) and ``kafka``.

Each sink module provides a :class:`~collector.sinks.base.Sink` subclass and ``create(settings) -> Sink``;
the Kafka one also ``add_arguments(parser)`` for its ``ubi serve`` flags (their ``dest`` are
:class:`~schemas.settings.Settings` field names).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from collector.sinks import duckdb as duckdb_sink
from collector.sinks import kafka as kafka_sink
from collector.sinks.base import Sink
from schemas.errors import UbiError
from schemas.settings import Settings

#: Sink name -> its factory.
SINKS: dict[str, Callable[[Settings], Sink]] = {
    "duckdb": duckdb_sink.create,
    "kafka": kafka_sink.create,
}


def available_sinks() -> list[str]:
    """Names of the sinks ``--sink`` accepts."""
    return list(SINKS)


def add_sink_arguments(parser: argparse.ArgumentParser) -> None:
    """The sinks' own ``ubi serve`` flags."""
    kafka_sink.add_arguments(parser)


def create_sink(settings: Settings) -> Sink:
    """The sink named by ``settings.sink``, built from the settings."""
    factory = SINKS.get(settings.sink)
    if factory is None:
        raise UbiError(f"unknown sink {settings.sink!r}; available: {', '.join(SINKS)}")
    return factory(settings)


__all__ = ["Sink", "SINKS", "available_sinks", "add_sink_arguments", "create_sink"]
