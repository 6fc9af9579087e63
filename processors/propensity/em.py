"""Position bias from the PBM fitted by EM, with no intervention (Wang et al., WSDM 2018).

    P(C = 1 | q, d, k) = θ_k · α_qd

The fit is :class:`ubi_pipeline.processors.click_models.pbm.PBM` on aggregated (pair, rank) cells; θ is identifiable
(up to scale) because the same pairs appear at several ranks, so the estimate rests on the pairs shown at two
or more ranks and on the rank pairs they link. Only θ_k/θ_1 is reported.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.processors.click_models.common import ClickModelError
from ubi_pipeline.processors.click_models.pbm import PBM
from ubi_pipeline.processors.clicks.stats import ClickCells
from ubi_pipeline.processors.propensity.common import PropensityError

#: A tighter tolerance than the click model's default costs little on cells and steadies the curve's tail.
EM_TOL = 1e-10
EM_MAX_ITER = 2000


def em_ratios(cells: ClickCells, *, max_iter: int = EM_MAX_ITER, tol: float = EM_TOL) -> NDArray[np.float64]:
    """θ̂_k/θ̂_1 for k = 1..K from PBM EM on ``cells`` (NaN for ranks never shown)."""
    if len(cells.pair) == 0:
        raise PropensityError("no impressions to fit: the log has no displayed results within the ranks asked for")
    try:
        # no prior on α here: measured on sparse simulated logs, the empirical rank-informed prior moved
        # θ̂_k/θ̂_1 further from the truth than the MLE did (docs/limitations.md)
        model = PBM(max_iter=max_iter, tol=tol, prior="none").fit_cells(cells)
    except ClickModelError as exc:
        raise PropensityError(f"PBM EM failed: {exc}") from exc
    return np.asarray(model.theta_ratio, dtype=np.float64)
