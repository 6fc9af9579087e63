"""Subcommands this stage adds to `ubi` (see `ubi/cli.py`): each listed module has `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib

COMMAND_MODULES: tuple[str, ...] = (
    "reports.evaluate_commands",  # evaluate (helper: offline metrics)
    "reports.commands",  # report, queryset (helper: joint report)
    "reports.judgment_commands",  # judgments export / import
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # TODO(integration): make strict once every module has landed
            if exc.name == name:
                continue
            raise
        module.register(sub)
