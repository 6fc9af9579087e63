"""Building ``ubi``'s parser and printing help loads no numeric, storage or web library (issue 12 item 7).

The subcommand modules import what their handlers run inside the handlers; this checks it where it matters,
in a fresh interpreter, by what is in ``sys.modules`` after ``ubi --help`` and every ``ubi SUB ... --help``.
That holds on a loaded machine, where a timing assertion would not (the README gives the measured time).
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("scipy", "pandas", "matplotlib", "duckdb", "fastapi", "pyarrow", "numpy")

# Prints the help of `ubi` and of every (nested) subcommand, then the heavy modules that got imported.
_SCRIPT = """
import argparse, contextlib, io, json, sys
import ubi_pipeline.cli

def walk(parser, path):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, [*path, name])

helped = []
for path in walk(ubi_pipeline.cli.build_parser(), []):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        ubi_pipeline.cli.main([*path, "--help"])
    if out.getvalue().startswith("usage: ubi"):
        helped.append(" ".join(path))
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[1:]))
print(json.dumps({"helped": helped, "heavy": heavy}))
"""


def _run() -> dict[str, list[str]]:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, *HEAVY], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_help_of_every_command_imports_no_heavy_module() -> None:
    result = _run()
    # every command printed its help (so the check covers them all), ...
    for command in ("", "serve", "import", "consume", "process", "review export", "simulate", "propensity",
                    "select", "evaluate", "report", "queryset", "judgments import", "predict", "demo"):
        assert command in result["helped"], (command, result["helped"])
    # ... and none of them needed numpy, scipy, pandas, matplotlib, duckdb, fastapi or pyarrow to do it
    assert result["heavy"] == []


def test_the_check_sees_a_heavy_import() -> None:
    # the same check after running a handler's import: it must report what the handler loaded
    script = "import sys, ubi_pipeline.cli; ubi_pipeline.cli.build_parser(); import ubi_pipeline.reports.systems; " \
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'duckdb', 'pyarrow'}))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "['duckdb', 'pyarrow']"
