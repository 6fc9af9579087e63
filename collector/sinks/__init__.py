"""Sinks: where validated records go. ``duckdb`` (embedded, default) here; other sinks plug in by name.

A sink module listed in :data:`SINK_MODULES` provides a :class:`~collector.sinks.base.Sink` subclass and
``create(settings) -> Sink``; it may also provide ``add_arguments(parser)`` to add its ``ubi serve`` flags
(their ``dest`` must be :class:`~schemas.settings.Settings` field names: ``ubi serve`` passes every set flag
that names a field into ``Settings``).
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from collector.sinks.base import Sink
from schemas.errors import UbiError
from schemas.settings import Settings

#: Sink name -> module. Modules not written yet are skipped (the name is not offered).
SINK_MODULES: dict[str, str] = {
    "duckdb": "collector.sinks.duckdb",
    "kafka": "collector.sinks.kafka",
}


def _module(name: str) -> ModuleType | None:
    modname = SINK_MODULES[name]
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name == modname:
            return None
        raise


def available_sinks() -> list[str]:
    """Names of the sinks whose module is present."""
    return [name for name in SINK_MODULES if _module(name) is not None]


def add_sink_arguments(parser: argparse.ArgumentParser) -> None:
    """Let each present sink module add its own ``ubi serve`` flags."""
    for name in SINK_MODULES:
        module = _module(name)
        if module is not None and hasattr(module, "add_arguments"):
            module.add_arguments(parser)


def create_sink(settings: Settings) -> Sink:
    """The sink named by ``settings.sink``, built from the settings."""
    name = getattr(settings, "sink", "duckdb")
    module = _module(name) if name in SINK_MODULES else None
    if module is None:
        raise UbiError(f"unknown sink {name!r}; available: {', '.join(available_sinks())}")
    sink: Sink = module.create(settings)
    return sink


__all__ = ["Sink", "available_sinks", "add_sink_arguments", "create_sink", "SINK_MODULES"]
