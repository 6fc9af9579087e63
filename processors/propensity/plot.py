"""The examination curve θ̂_k/θ̂_1 with its bootstrap intervals, as a PNG (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.propensity.common import PropensityError, PropensityEstimate

_LABELS = {"em": "PBM EM", "marginal": "PBM, marginal likelihood", "harvest": "intervention harvesting (pair fixed effects)", "randomized": "randomised swaps"}


def plot_curve(
    estimates: PropensityEstimate | Sequence[PropensityEstimate],
    path: Path | str,
    *,
    truth: NDArray[np.float64] | None = None,
    title: str | None = None,
) -> Path:
    """Write a PNG of θ̂_k/θ̂_1 per rank, one line per estimate with its interval band; ``truth`` dashed."""
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only: never needs a display
    import matplotlib.pyplot as plt

    items = [estimates] if isinstance(estimates, PropensityEstimate) else list(estimates)
    if not items:
        raise PropensityError("nothing to plot: no estimate given")
    out = Path(path)
    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=110)
    try:
        offsets = np.linspace(-0.12, 0.12, len(items)) if len(items) > 1 else [0.0]
        for est, dx in zip(items, offsets, strict=True):
            ranks = np.arange(1, est.max_rank + 1)
            unit = "; intervals resample queries" if "queries" in est.scheme else ""
            label = f"{_LABELS.get(est.method, est.method)} ({est.sessions:,} sessions{unit})"
            line = ax.plot(ranks + dx, est.ratio, marker="o", ms=4, lw=1.6, label=label)[0]
            if est.replicates:
                lo, hi = est.ratio - est.ci_low, est.ci_high - est.ratio
                ax.errorbar(ranks + dx, est.ratio, yerr=np.vstack([np.maximum(lo, 0), np.maximum(hi, 0)]),
                            fmt="none", ecolor=line.get_color(), elinewidth=1.0, capsize=3)
        if truth is not None:
            t = np.asarray(truth, dtype=float)
            t = t / t[0]
            ax.plot(np.arange(1, len(t) + 1), t, ls="--", color="black", lw=1.2, label="true θ_k/θ_1")
        level = items[0].level
        ax.set_xlabel("rank k")
        ax.set_ylabel("θ_k / θ_1 (relative examination)")
        ax.set_xticks(np.arange(1, max(e.max_rank for e in items) + 1))
        ax.set_ylim(0.0, max(1.1, float(np.nanmax([np.nanmax(e.ci_high) if e.replicates else 1.0
                                                    for e in items])) * 1.05))
        ax.grid(True, alpha=0.3)
        ax.set_title(title or f"Position bias with {level:.0%} bootstrap intervals")
        ax.legend(fontsize=8)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png")
    finally:
        plt.close(fig)
    return out
