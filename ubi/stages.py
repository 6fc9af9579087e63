"""``ubi``'s pipeline subcommands and the exit-code contract; :mod:`ubi_pipeline.cli` adds ``ubi demo`` on top.

Each stage's command modules have ``register(subparsers)``, which adds their subcommands (listed in
:func:`stage_parser`, in pipeline order); every subcommand sets ``func`` (taking the parsed namespace,
returning an exit code). Typed errors from the package become a one-line message on stderr and exit code 2; anything else is a bug: it shows a traceback
and exits 3, so that it can never be mistaken for a failed quality gate (``ubi report`` exits 1 for that).
Exit codes: 0 done, 1 a gate fell short, 2 bad input or usage, 3 a bug, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape

from ubi_pipeline.commands import collector as collector_commands
from ubi_pipeline.commands import evaluate as evaluate_commands
from ubi_pipeline.commands import judgments as judgment_commands
from ubi_pipeline.commands import loader as loader_commands
from ubi_pipeline.commands import predict as predict_commands
from ubi_pipeline.commands import process as processors_commands
from ubi_pipeline.commands import report as reports_commands
from ubi_pipeline.commands import select as selection_commands
from ubi_pipeline.commands import simulate as simulation_commands
from ubi_pipeline.schemas.errors import UbiError


def stage_parser(*more: Callable[[Any], None]) -> argparse.ArgumentParser:
    """``ubi`` with the subcommands of every pipeline stage, then those ``more`` registers add (``ubi_pipeline.cli``
    adds ``ubi demo``, which runs the stages through :func:`main`)."""
    parser = argparse.ArgumentParser(
        prog="ubi",
        description=(
            "ubi-pipeline: collect User Behavior Insights (UBI) queries and events, estimate position bias, "
            "derive candidate relevance judgments with their evidence, and report offline and online metrics."
        ),
        epilog="Run `ubi COMMAND --help` for each command's options. Settings also come from UBI_* variables.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"ubi-pipeline {installed_version()}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    collector_commands.register(sub)  # serve, import, failed, schema
    loader_commands.register(sub)  # consume
    processors_commands.register(sub)  # process, review
    simulation_commands.register(sub)  # simulate, propensity
    selection_commands.register(sub)  # select
    evaluate_commands.register(sub)  # evaluate
    reports_commands.register(sub)  # report, queryset
    judgment_commands.register(sub)  # judgments export / import
    predict_commands.register(sub)  # predict (counterfactual evaluation)
    for register in more:
        register(sub)
    return parser


def installed_version() -> str:
    """The version of the installed ``ubi-pipeline`` distribution (its metadata, not a copy kept in the code)."""
    try:
        return importlib.metadata.version("ubi-pipeline")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


#: Width rich renders at when stdout is not a terminal (a pipe, a file, a CI log): wide enough that no table
#: is cut or folded and no message hard-wrapped at rich's default of 80 columns.
LOG_WIDTH = 10_000


@contextlib.contextmanager
def _log_width() -> Iterator[None]:
    """Give every rich Console of this command :data:`LOG_WIDTH` when stdout is not a terminal.

    Consoles are created all over the stages; rich reads ``COLUMNS`` when it builds one, so this is set for
    the command's duration (and put back, so a caller's process is left as it was). An explicit ``COLUMNS``
    is kept.
    """
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        yield
        return
    os.environ["COLUMNS"] = str(LOG_WIDTH)
    try:
        yield
    finally:
        os.environ.pop("COLUMNS", None)


def flag_names(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """``dest`` -> the flag as typed (its longest option string) of the (sub)command that ``args`` ran."""
    names: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if isinstance(chosen, str) and chosen in action.choices:
                names.update(flag_names(action.choices[chosen], args))
        elif action.option_strings:
            names.setdefault(action.dest, max(action.option_strings, key=len))
    return names


def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand, mapping errors to exit codes (module docstring)."""
    with _log_width():
        return _run(parser, argv)


class _NoPandas(importlib.abc.MetaPathFinder):
    """A finder that says pandas is not installed (used for one pyarrow call: :func:`skip_pyarrow_pandas_probe`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def skip_pyarrow_pandas_probe() -> None:
    """Keep pyarrow from importing pandas on its first array.

    pyarrow looks once, on the first array it builds, whether pandas is installed, so that it can recognise
    pandas objects; where it is (the README's venv has it, for the tests), that look imports all of pandas:
    0.2-0.3 s of every command's start-up. No command hands pyarrow a pandas object, so the look is made here,
    once, with pandas hidden: pyarrow notes "no pandas" and never looks again. pandas is still imported when
    something asks pyarrow for it by name (``Table.to_pandas``: tests/ubi/test_stages.py).
    """
    if "pandas" in sys.modules:
        return
    try:
        import pyarrow as pa
    except ImportError:
        return
    hide = _NoPandas()
    sys.meta_path.insert(0, hide)
    try:
        pa.array([0])  # a non-empty list: an empty one leaves one of its looks for later
    finally:
        sys.meta_path.remove(hide)


def _run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    args = parser.parse_args(argv)
    args.flag_names = flag_names(parser, args)  # so that Settings.from_flags names a bad flag as typed
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    skip_pyarrow_pandas_probe()
    try:
        return int(args.func(args) or 0)
    except UbiError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True,
                                   soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `ubi schema | head`: the reader left; point stdout at /dev/null so the exit flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception:  # a bug, not bad input: show where, and exit with the code reserved for it
        traceback.print_exc()
        Console(stderr=True).print("[bold red]internal error[/]: this is a bug in ubi-pipeline; please report it "
                                   "with the traceback above", highlight=False)
        return 3



def main(argv: list[str] | None = None) -> int:
    """``ubi`` without ``demo`` (what the demo itself runs, step by step)."""
    return run(stage_parser(), argv)
