"""Subcommands this stage adds to `ubi` (see `ubi/cli.py`): each listed module has `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib

COMMAND_MODULES: tuple[str, ...] = (
    "reports.evaluate_commands",  # evaluate
    "reports.commands",  # report, queryset
    "reports.judgment_commands",  # judgments export / import
    "reports.predict_commands",  # predict (counterfactual evaluation)
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
