"""What several ``ubi`` subcommands share: list and ``--run FILE[=NAME]`` arguments, writing an output file, and
the progress bar of a long loop (bootstrap replicates)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ubi_pipeline.schemas.errors import UbiError

if TYPE_CHECKING:
    from rich.console import Console


def csv_list(text: str) -> tuple[str, ...]:
    """A comma-separated flag value as its non-empty items (an argparse ``type``)."""
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def run_arg(text: str) -> tuple[Path, str | None]:
    """``FILE`` or ``FILE=NAME``: a path that exists as given is a FILE, else the split at the first ``=``
    whose left part is an existing file (names like ``shop/ranker=x`` hold ``=`` too), else the first ``=``.
    """
    if Path(text).exists() or "=" not in text:
        return Path(text), None
    cuts = [i for i, ch in enumerate(text) if ch == "="]
    cut = next((i for i in cuts if Path(text[:i]).is_file()), cuts[0])
    path, name = text[:cut], text[cut + 1:].strip()
    if not path or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FILE or FILE=NAME")
    return Path(path), name


def write_output(path: Path | None, data: str | bytes) -> None:
    """``data`` to ``path``, or to stdout without one; a file that cannot be written is a UbiError naming it."""
    if path is None:
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        else:
            sys.stdout.write(data)
        return
    try:
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
    except OSError as exc:
        raise UbiError(f"{path}: cannot write: {exc.strerror or exc}") from exc


@contextmanager
def progress_bar(console: Console, label: str, total: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A transient bar (label, done/total, elapsed) on ``console`` while the block runs; yields ``tick(done)``.

    Callers enable it only when the console (stderr) is a terminal and the output is not ``--json``, so
    nothing reaches a pipe or a log file; disabled, ``tick`` does nothing.
    """
    if not enabled or total <= 0:
        yield lambda done: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True)
    with bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)
