"""An opt-in pytest plugin: per-test CPU time beside wall time, for measuring the suite on a shared machine.

Not loaded in the normal run. ``pytest -p tests.cpu_durations`` prints, after the run, the slowest tests by
wall time with the CPU seconds of this process and of its reaped children (demo subprocesses, the
memory-cap imports, Spark's JVM once it exits) spent in setup + call + teardown. ``UBI_CPU_DURATIONS=N``
sets how many rows (default 80); ``UBI_CPU_DURATIONS_TSV=path`` also appends every test's row to a file as
the test ends (so a run stopped half-way still leaves its figures).

``pytest --durations`` reports wall time only, which other engineers' benchmarks inflate; CPU time moves
much less with the machine's load, so before/after comparisons use both columns.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Generator
from typing import Any

import pytest

_rows: dict[str, list[float]] = {}  # nodeid -> [wall, own cpu, children cpu]


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _measure(item: pytest.Item) -> Generator[None, Any, Any]:
    wall0, (own0, kids0) = time.perf_counter(), _cpu()
    result = yield
    own1, kids1 = _cpu()
    row = _rows.setdefault(item.nodeid, [0.0, 0.0, 0.0])
    row[0] += time.perf_counter() - wall0
    row[1] += own1 - own0
    row[2] += kids1 - kids0
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _measure(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _measure(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    result = yield from _measure(item)
    path = os.environ.get("UBI_CPU_DURATIONS_TSV")
    if path:
        w, c, k = _rows[item.nodeid]
        with open(path, "a") as out:
            out.write(f"{w:.3f}\t{c:.3f}\t{k:.3f}\t{item.nodeid}\n")
    return result


def pytest_terminal_summary(terminalreporter: Any) -> None:
    rows = sorted(_rows.items(), key=lambda kv: -kv[1][0])
    wall = sum(r[0] for _, r in rows)
    own = sum(r[1] for _, r in rows)
    kids = sum(r[2] for _, r in rows)
    n = int(os.environ.get("UBI_CPU_DURATIONS", "80"))
    tr = terminalreporter
    tr.write_sep("=", f"slowest {min(n, len(rows))} tests: wall and CPU seconds (setup+call+teardown)")
    tr.write_line(f"{'wall':>8} {'cpu':>8} {'child':>8}  test")
    for nodeid, (w, c, k) in rows[:n]:
        tr.write_line(f"{w:8.2f} {c:8.2f} {k:8.2f}  {nodeid}")
    tr.write_line(f"{wall:8.2f} {own:8.2f} {kids:8.2f}  TOTAL over {len(rows)} tests")
