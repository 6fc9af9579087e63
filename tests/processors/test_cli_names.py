"""The parser's copies of registry names (processors.cli_names) match the registries they mirror."""

from __future__ import annotations

from processors.cli_names import CLICK_MODEL_NAMES, SCENARIO_NAMES
from processors.click_models.registry import MODEL_NAMES
from processors.selection import SELECT_MODELS
from processors.simulation.traffic import SCENARIOS


def test_click_model_names_are_the_registry_names() -> None:
    assert CLICK_MODEL_NAMES == MODEL_NAMES == SELECT_MODELS


def test_scenario_names_are_the_simulator_scenarios() -> None:
    assert SCENARIO_NAMES == tuple(SCENARIOS)
