"""The parser's copies of registry names (ubi_pipeline.schemas.cli_names) match the registries they mirror."""

from __future__ import annotations

from ubi_pipeline.processors.click_models.registry import MODEL_NAMES
from ubi_pipeline.processors.click_models.selection import SELECT_MODELS
from ubi_pipeline.processors.simulation.traffic import SCENARIOS
from ubi_pipeline.schemas.cli_names import CLICK_MODEL_NAMES, SCENARIO_NAMES


def test_click_model_names_are_the_registry_names() -> None:
    assert CLICK_MODEL_NAMES == MODEL_NAMES == SELECT_MODELS


def test_scenario_names_are_the_simulator_scenarios() -> None:
    assert SCENARIO_NAMES == tuple(SCENARIOS)
