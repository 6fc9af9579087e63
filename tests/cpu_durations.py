"""An opt-in pytest plugin: per-test CPU time beside wall time, for measuring the suite on a shared machine.

Not loaded in the normal run. ``pytest -p tests.cpu_durations`` prints, after the run, the slowest tests by
wall time with the CPU seconds of this process and of its reaped children (demo subprocesses, the
memory-cap imports, Spark's JVM once it exits) spent in setup + call + teardown. ``UBI_CPU_DURATIONS=N``
sets how many rows (default 80); ``UBI_CPU_DURATIONS_TSV=path`` also appends every test's row to a file as
the test ends (so a run stopped half-way still leaves its figures).

``pytest --durations`` reports wall time only, which other engineers' benchmarks inflate; CPU time moves
much less with the machine's load, so before/after comparisons use both columns.

Under pytest-xdist (``make test``: ``-n 2``) the tests run in the workers: each hands its rows to the
controller when it ends (``workeroutput``), and the table adds one line per worker with its wall time from
start to end and its CPU seconds (own, and its children's). The TOTAL row then sums the tests of all
workers, so its wall column is more than the run's wall time.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Generator
from typing import Any

import pytest

_rows: dict[str, list[float]] = {}  # nodeid -> [wall, own cpu, children cpu]
_workers: dict[str, list[float]] = {}  # xdist worker id -> [wall, own cpu, children cpu] of its whole session
_started = time.perf_counter()


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _measure(item: pytest.Item) -> Generator[None, Any, Any]:
    wall0, (own0, kids0) = time.perf_counter(), _cpu()
    try:
        return (yield)
    finally:  # a failing phase raises out of the yield: its time counts too
        own1, kids1 = _cpu()
        row = _rows.setdefault(item.nodeid, [0.0, 0.0, 0.0])
        row[0] += time.perf_counter() - wall0
        row[1] += own1 - own0
        row[2] += kids1 - kids0


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # an xdist worker: the controller prints the table
        own, kids = _cpu()
        output["cpu_durations"] = {"rows": _rows, "session": [time.perf_counter() - _started, own, kids]}


@pytest.hookimpl(optionalhook=True)  # an xdist hook: called on the controller as each worker ends
def pytest_testnodedown(node: Any, error: Any) -> None:
    got = getattr(node, "workeroutput", {}).get("cpu_durations")
    if got:
        _rows.update(got["rows"])
        _workers[str(node.gateway.id)] = list(got["session"])


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
    for worker, (w, c, k) in sorted(_workers.items()):
        tr.write_line(f"{w:8.2f} {c:8.2f} {k:8.2f}  worker {worker}, start to end")
