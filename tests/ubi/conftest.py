"""The ``ubi demo`` runs the tests of this folder share (see ``demo_support``)."""

from __future__ import annotations

import pytest

from tests.ubi.demo_support import DemoRun, run_demos


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoRun, DemoRun]:
    """Two finished ``ubi demo`` runs, same seed (:data:`~tests.ubi.demo_support.DEMO_SEED`), made once per session.

    Read them, never change them: a test that runs commands on a demo's store works on a copy."""
    return run_demos(tmp_path_factory.mktemp("demo"))
