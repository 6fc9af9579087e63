"""The one place configuration is read: environment variables (``UBI_*``) and command-line flags.

Nothing else in ubi-pipeline reads the environment. Commands build a :class:`Settings` with
``Settings(**flags)``; flags left unset fall back to the environment, then to the defaults below.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """All settings of ubi-pipeline, each with its environment variable ``UBI_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="UBI_", extra="ignore")

    # --- store ---
    db: Path = Field(Path("ubi.duckdb"), description="DuckDB file of the embedded store")

    # --- collector ---
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = Field(5 * 1024 * 1024, description="largest request body accepted (413 above)")
    max_items: int = Field(10_000, description="most records in one request (413 above)")
    failed_list_limit: int = 100

    # --- processors ---
    position_base: int = Field(0, description="base of event_attributes.position.ordinal (0 as OpenSearch tooling counts)")
    min_support: int = Field(10, description="impressions a (query, doc) needs before it gets a grade")
    max_ci_width: float = Field(0.5, description="widest confidence interval that still gets a grade")
    max_client_queries_per_minute: float = Field(60.0, description="clients above this query rate are filtered as bots")
    filter_click_all: bool = Field(True, description="drop searches with a click on every displayed result")
    # (processors core: sessions, filters, judgments, review)
    position_base_by_application: dict[str, int] = Field(
        default_factory=dict,
        description='position base per application overriding position_base, e.g. {"Chorus": 1} (JSON in UBI_*)',
    )
    click_actions: list[str] = Field(
        default_factory=lambda: ["click"],
        description="action_name values counted as clicks on a result (JSON list in UBI_CLICK_ACTIONS)",
    )
    impression_action: str = Field("impression", description="action_name of the events that say a result was displayed")
    max_rank: int = Field(10, ge=1, le=100, description="deepest rank kept in sessions and click models (K)")
    click_all_min_results: int = Field(
        2, ge=1, description="filter_click_all applies to searches that displayed at least this many results"
    )
    grade_max: int = Field(3, ge=1, description="top grade of the human scale (grades 0..grade_max)")
    calibration_fraction: float = Field(
        0.5, gt=0.0, lt=1.0, description="share of human-graded pairs used to fit the grade mapping (rest: held out)"
    )
    seed: int = 0
