"""Click models, one module each. Every model fits on ``ubi_pipeline.processors.clicks.stats`` arrays (no per-session Python loop).

Registered names (``get_model(name)``): gctr, rctr, dctr (alias ctr), coec, pbm, ubm, cascade, dcm, sdbn, dbn.
``evaluate`` scores any of them on held-out sessions (log-likelihood, perplexity per rank).
"""

from ubi_pipeline.processors.click_models.registry import ALIASES, MODEL_NAMES, get_model, model_class

__all__ = ["ALIASES", "MODEL_NAMES", "get_model", "model_class"]
