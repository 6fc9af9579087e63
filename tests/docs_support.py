"""What the documentation tests share: how docs/settings.md writes a setting's default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from ubi_pipeline.schemas.settings import Settings


def setting_default(name: str) -> str:
    """The default of ``Settings.<name>`` as docs/settings.md shows it: the text as typed (JSON for numbers, lists and
    objects), code-formatted, or *unset*."""
    value: Any = Settings.model_fields[name].get_default(call_default_factory=True)
    if value is None:
        return "*unset*"
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, Path):
        value = str(value)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return f"`{text}`"
