"""Simulated click logs with known truth: click kernels (``clicks``) and the UBI-traffic simulator on top.

``simulate(SimConfig(...))`` gives a :class:`SimulatedTraffic` (UBI records, in-memory session patterns,
the truth); ``simulate_patterns`` skips the records for benches; ``build_catalog`` is the built-in catalog.
"""

from ubi_pipeline.processors.simulation.catalog import Catalog, SimulationError, build_catalog
from ubi_pipeline.processors.simulation.traffic import (
    SCENARIOS,
    PostError,
    PostResult,
    SimConfig,
    SimulatedTraffic,
    Truth,
    scenario,
    simulate,
    simulate_patterns,
)

__all__ = [
    "SCENARIOS",
    "Catalog",
    "PostError",
    "PostResult",
    "SimConfig",
    "SimulatedTraffic",
    "SimulationError",
    "Truth",
    "build_catalog",
    "scenario",
    "simulate",
    "simulate_patterns",
]
