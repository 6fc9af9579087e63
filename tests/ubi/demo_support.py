"""Demo runs shared by the tests that read a demo's output (the fixture ``demo_runs`` is in ``conftest.py``).

``ubi demo`` costs about the same at 300 searches as at 800 (its time goes to starting the collector, fitting
the click models, the propensity bootstrap and the report's replicates, not to the searches), so the tests
that look at a finished demo share two runs made once per session: ``test_demo.py`` compares the two
(same seed, same report) and ``test_demo_readme.py`` runs the README's commands on a copy of the first.
The two runs are started together: each is one process plus its collector, and the machine has two cores.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: The demo's size and seed in every test that reads a finished demo. 300 searches: the size at which the
#: HTML report used to crash on the propensity plot (issue 12), so the shared run keeps guarding it.
DEMO_SESSIONS = 300
DEMO_SEED = 3


@dataclass(frozen=True)
class DemoRun:
    """A finished ``ubi demo --dir <dir>``: its folder and what it printed."""

    dir: Path
    stdout: str


def _start(workdir: Path) -> subprocess.Popen[bytes]:
    """``ubi demo`` into ``workdir``, its output into files beside it (a pipe nobody reads yet would stall it)."""
    with open(workdir.parent / "stdout.txt", "wb") as out, open(workdir.parent / "stderr.txt", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "ubi_pipeline", "demo", "--dir", str(workdir), "--sessions", str(DEMO_SESSIONS),
             "--seed", str(DEMO_SEED)],
            stdout=out, stderr=err, cwd=workdir.parent, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
        )


def run_demos(root: Path) -> tuple[DemoRun, DemoRun]:
    """Two ``ubi demo`` runs with the same seed, in ``root/a/demo-out`` and ``root/b/demo-out``, started together."""
    dirs = [root / name / "demo-out" for name in ("a", "b")]
    for d in dirs:
        d.parent.mkdir()
    procs = [_start(d) for d in dirs]
    runs = []
    try:
        for d, proc in zip(dirs, procs, strict=True):
            try:
                proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"`ubi demo --dir {d}` did not finish within 600 s") from None
            err = (d.parent / "stderr.txt").read_text()
            assert proc.returncode == 0, f"`ubi demo --dir {d}` exited with {proc.returncode}: {err[-3000:]}"
            runs.append(DemoRun(d, (d.parent / "stdout.txt").read_text()))
    finally:
        for proc in procs:  # the other run, when one failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return runs[0], runs[1]
