"""``ubi``: one command whose subcommands map to the pipeline stages (:mod:`ubi_pipeline.stages`), plus ``ubi demo``.

Exit codes: 0 done, 1 a gate fell short, 2 bad input or usage, 3 a bug, 130 interrupted (see
:func:`ubi_pipeline.stages.run`).
"""

from __future__ import annotations

import argparse
import sys

from ubi_pipeline import demo
from ubi_pipeline.commands import judge
from ubi_pipeline.stages import run, stage_parser


def build_parser() -> argparse.ArgumentParser:
    return stage_parser(demo.register, judge.register)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
