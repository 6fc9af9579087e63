"""Click models, one module each. Every model fits on ``processors.stats`` arrays (no per-session Python loop)."""
