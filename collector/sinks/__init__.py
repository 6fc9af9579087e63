"""Sinks: where validated records go. ``duckdb`` (the embedded store, default) and ``kafka``.

Each sink module provides a :class:`~ubi_pipeline.collector.sinks.base.Sink` subclass and ``create(settings) -> Sink``.
The sinks' own ``ubi serve`` flags (their ``dest`` are :class:`~ubi_pipeline.schemas.settings.Settings` field names) are
defined in :mod:`ubi_pipeline.collector.sinks.options`, which imports nothing heavy: building the ``ubi`` parser must not load
DuckDB, Arrow or the Kafka client (``ubi --help``, tests/ubi/test_cli_imports.py). This package imports a sink's
module only when :func:`create_sink` builds that sink.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ubi_pipeline.collector.sinks.options import SINK_NAMES, add_kafka_arguments
from ubi_pipeline.schemas.errors import UbiError

if TYPE_CHECKING:
    from ubi_pipeline.collector.sinks.base import Sink
    from ubi_pipeline.schemas.settings import Settings


def available_sinks() -> list[str]:
    """Names of the sinks ``--sink`` accepts."""
    return list(SINK_NAMES)


def add_sink_arguments(parser: argparse.ArgumentParser) -> None:
    """The sinks' own ``ubi serve`` flags."""
    add_kafka_arguments(parser)


def create_sink(settings: Settings) -> Sink:
    """The sink named by ``settings.sink``, built from the settings."""
    if settings.sink == "duckdb":
        from ubi_pipeline.collector.sinks import duckdb as duckdb_sink

        return duckdb_sink.create(settings)
    if settings.sink == "kafka":
        from ubi_pipeline.collector.sinks import kafka as kafka_sink

        return kafka_sink.create(settings)
    raise UbiError(f"unknown sink {settings.sink!r}; available: {', '.join(SINK_NAMES)}")


__all__ = ["SINK_NAMES", "available_sinks", "add_sink_arguments", "create_sink"]
