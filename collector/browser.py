"""What the collector serves to browsers: the UBI client script at ``/static/ubi-client.js``.

A collector extension (installed by ``ubi_pipeline.collector.app.create_app``): pages load the client from the collector
they send to, so the script and the collector's routes always match. The files are the package's
``collector/static/`` folder (shipped as package data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ubi_pipeline.schemas.settings import Settings

STATIC_DIR = Path(__file__).parent / "static"
CLIENT_SCRIPT = STATIC_DIR / "ubi-client.js"


def install(app: Any, settings: Settings) -> None:
    """Mount ``collector/static/`` at ``/static`` (the client script and the demo page's assets)."""
    from starlette.staticfiles import StaticFiles

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
