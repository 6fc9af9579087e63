"""Fixtures shared by every test package: record factories for UBI queries and events, and the one way to
reach ``../shared`` (samples, spec, docs, reference client)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# No per-example deadline: on a loaded 2-core CI machine a 200 ms deadline fails property tests for time alone
# (seen on test_fitted_thresholds_are_ordered_and_never_worse_than_quantile_start), which says nothing about
# the property. Example counts stay hypothesis' defaults unless a test sets its own.
settings.register_profile("ubi", deadline=None)
settings.load_profile("ubi")

# A test that reads a live store in this process would lower this process's priority for the rest of the run
# (ubi_pipeline.store.client.yield_to_writer: a nice value cannot be raised back), and every subprocess started after it
# would inherit it. Tests of that step set the value they test, in a subprocess of their own.
os.environ.setdefault("UBI_READER_NICE", "0")

_serial = itertools.count()

Factory = Callable[..., dict[str, Any]]

#: ``../shared`` beside the repository (UBI spec, samples, reference JS client, docs): read there, never copied in.
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
#: The files under it that many tests read (docs/ubi.md describes the sample: 473 queries, 3,448 events).
SAMPLE_LOG = "ubi-samples/ubi_queries_events.ndjson"
ESCI_JUDGMENTS = "ubi-samples/esci_us_judgments.json"


def shared_path(relative: str) -> Path:
    """``../shared/<relative>`` (e.g. ``"ubi-samples/esci_us_judgments.json"``); when it is absent the calling
    test is skipped with the path as the reason. Call it inside a test or fixture, never at import time."""
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"shared data is absent: {path} (the tests read ../shared beside the repository)")
    return path


def _apply(record: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    for key, value in overrides.items():
        if value is ...:  # `...` removes the field
            record.pop(key, None)
        else:
            record[key] = value
    return record


def new_event(**overrides: Any) -> dict[str, Any]:
    """A valid UBI 1.3.0 click event as a client sends it; overrides replace fields (``...`` removes one)."""
    n = next(_serial)
    return _apply(
        {
            "action_name": "click",
            "query_id": f"q-{n}",
            "session_id": "s-1",
            "client_id": "c-1",
            "application": "shop",
            "timestamp": "2024-05-16T12:34:56.789Z",
            "user_query": "running shoes",
            "event_attributes": {
                "object": {"object_id": f"doc-{n}", "object_id_field": "sku"},
                "position": {"ordinal": 2},
            },
        },
        overrides,
    )


def new_query(**overrides: Any) -> dict[str, Any]:
    """A valid UBI 1.3.0 query record; overrides replace fields (``...`` removes one)."""
    n = next(_serial)
    return _apply(
        {
            "query_id": f"q-{n}",
            "user_query": "running shoes",
            "client_id": "c-1",
            "application": "shop",
            "timestamp": "2024-05-16T12:34:50Z",
            "query_attributes": {"ranker": "bm25"},
            "object_id_field": "sku",
            "query_response_hit_ids": ["doc-1", "doc-2", "doc-3"],
        },
        overrides,
    )


@pytest.fixture
def make_event() -> Factory:
    """``make_event(**overrides)``: a fresh valid event (distinct query_id and object_id per call)."""
    return new_event


@pytest.fixture
def make_query() -> Factory:
    """``make_query(**overrides)``: a fresh valid query record (distinct query_id per call)."""
    return new_query


@pytest.fixture
def shared() -> Callable[[str], Path]:
    """``shared("ubi-samples/x.json")``: a path under ``../shared``; skips the test when the file is absent."""
    return shared_path


# ---------------------------------------------------------------- parallel runs (pytest-xdist, `make test`)
#
# `make test` runs the suite on two workers (``-n 2 --dist loadgroup --no-loadscope-reorder``). The scheduler
# below hands out whole groups: a group runs on one worker, in collection order. A test's group is its file,
# so a module-scoped fixture is still made once, as in a serial run; the tests that share a session- or
# package-scoped fixture too costly to make once per worker share one group across their files.
#
# The groups are chosen here from the test's id, not with ``xdist_group`` marks: xdist 3.8 applies a mark by
# appending ``@group`` to ``item._nodeid``, which pytest 9.2 no longer reads, so marks group nothing.

#: path prefix -> group, for the tests sharing such a fixture.
SHARED_FIXTURE_GROUPS = {
    "tests/collector/kafka/": "kafka",  # `broker`: the session's Tansu broker
    # `browser`: one chromium for the folder; `axios_esm`: npm installs axios into .cache/npm on first use,
    # which two workers at once would race on
    "tests/browser/": "browser",
    "tests/ubi/test_demo.py": "demo",  # `demo_runs`: the session's two `ubi demo` runs (35 s wall, 2 processes)
    "tests/ubi/test_demo_readme.py": "demo",
}

#: Groups handed out first, longest first: a long group handed out last would leave the other worker idle
#: at the end. The figure beside each is its share of the wall time of a serial run (-p tests.cpu_durations,
#: 3,201 s in all on the loaded shared machine); the other groups (each under 3 %) follow in collection order.
LONGEST_GROUPS = (
    "browser",  # 15 %
    "kafka",  # 13 %
    "tests/processors/clicks/test_spark_sessions.py",  # 12 %
    "tests/reports/test_report_command.py",  # 8 %
    "tests/collector/test_import_stream.py",  # 5 %
    "tests/reports/test_report_honest.py",  # 5 %
    "demo",  # 5 %
    "tests/processors/click_models/test_selection.py",  # 4 %
    "tests/reports/test_predict_command.py",  # 3 %
    "tests/collector/test_fastpath.py",  # 3 %
)


def xdist_group_of(nodeid: str) -> str:
    """The worker group of a test: its shared-fixture group, else its file."""
    path = nodeid.split("::", 1)[0]
    for prefix, group in SHARED_FIXTURE_GROUPS.items():
        if path.startswith(prefix):
            return group
    return path


@pytest.hookimpl(optionalhook=True)  # an xdist hook, called on the controller; None: xdist's own scheduler
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduling, its scopes being :func:`xdist_group_of`'s groups."""

        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the workers of a ``--dist loadgroup`` run: the longest groups first (the scheduler hands groups out
    in the order the workers collected them, under ``--no-loadscope-reorder``). A serial run keeps file order."""
    if not getattr(config.option, "loadgroup", False):  # xdist sets it in its workers
        return
    first = {group: rank for rank, group in enumerate(LONGEST_GROUPS)}
    items.sort(key=lambda item: first.get(xdist_group_of(item.nodeid), len(first)))  # stable: groups stay whole


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a serial run): before any worker starts
        os.environ.setdefault("UBI_TESTS_CONTROLLER_COLUMNS", os.environ.get("COLUMNS", ""))


@pytest.fixture(scope="session", autouse=True)
def _controllers_columns() -> None:
    """An xdist worker runs with ``COLUMNS=80`` where the controller had none, and ``ubi`` keeps an explicit
    ``COLUMNS`` (ubi/stages.py ``_log_width``): a worker's tests get the controller's, as in a serial run."""
    if "PYTEST_XDIST_WORKER" in os.environ and "UBI_TESTS_CONTROLLER_COLUMNS" in os.environ:
        columns = os.environ["UBI_TESTS_CONTROLLER_COLUMNS"]
        if columns:
            os.environ["COLUMNS"] = columns
        else:
            os.environ.pop("COLUMNS", None)
