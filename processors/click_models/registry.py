"""Click models by name: ``get_model("pbm")`` gives a fresh, unfitted model.

Modules are imported on first use, so a command that needs one model does not load all of them.
"""

from __future__ import annotations

import importlib
from typing import Any

from ubi_pipeline.processors.click_models.base import ClickModel
from ubi_pipeline.processors.click_models.common import ClickModelError

# name -> "module:Class"; ``ctr`` is the per-pair CTR (what "the CTR of a result" usually means)
_MODELS: dict[str, str] = {
    "gctr": "ubi_pipeline.processors.click_models.ctr:GCTR",
    "rctr": "ubi_pipeline.processors.click_models.ctr:RCTR",
    "dctr": "ubi_pipeline.processors.click_models.ctr:DCTR",
    "ctr": "ubi_pipeline.processors.click_models.ctr:DCTR",
    "coec": "ubi_pipeline.processors.click_models.coec:COEC",
    "pbm": "ubi_pipeline.processors.click_models.pbm:PBM",
    "ubm": "ubi_pipeline.processors.click_models.ubm:UBM",
    "cascade": "ubi_pipeline.processors.click_models.cascade:Cascade",
    "dcm": "ubi_pipeline.processors.click_models.dcm:DCM",
    "sdbn": "ubi_pipeline.processors.click_models.sdbn:SDBN",
    "dbn": "ubi_pipeline.processors.click_models.dbn:DBN",
}
ALIASES: dict[str, str] = {"ctr": "dctr"}
MODEL_NAMES: tuple[str, ...] = tuple(name for name in _MODELS if name not in ALIASES)


def model_class(name: str) -> type:
    """The class registered under ``name`` (case-insensitive)."""
    key = name.strip().lower()
    if key not in _MODELS:
        raise ClickModelError(f"unknown click model {name!r}; choose one of {', '.join(sorted(_MODELS))}")
    module, cls = _MODELS[key].split(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


def get_model(name: str, **options: Any) -> ClickModel:
    """A new unfitted model; ``options`` go to its constructor (e.g. ``max_iter``, ``tol`` for EM models)."""
    model: ClickModel = model_class(name)(**options)
    return model
