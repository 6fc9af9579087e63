"""``ubi``: one command whose subcommands map to the pipeline stages.

Each stage package has a ``cli`` module with ``register(subparsers)``, which adds its subcommands; every
subcommand sets ``func`` (taking the parsed namespace, returning an exit code). Typed errors from the
package become a one-line message on stderr and exit code 2; anything else is a bug and shows a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rich.console import Console
from rich.markup import escape

from schemas.errors import UbiError

#: Stage modules that contribute subcommands, in pipeline order.
STAGES = ("collector.cli", "processors.cli", "reports.cli", "ubi.demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ubi",
        description=(
            "ubi-pipeline: collect User Behavior Insights (UBI) queries and events, estimate position bias, "
            "derive candidate relevance judgments with their evidence, and report offline and online metrics."
        ),
        epilog="Run `ubi COMMAND --help` for each command's options. Settings also come from UBI_* variables.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in STAGES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a stage not written yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UbiError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
