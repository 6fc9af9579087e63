"""Position bias by marginal likelihood: PBM with every pair's attractiveness integrated out under its prior.

    P(C = 1 | q, d, k) = θ_k · α_qd,     α_qd ~ Beta(m_qd·s, (1 − m_qd)·s),
    m_qd = logistic(β₀ + β₁·z₁ + β₂·z₂)   (z₁ mean log display rank, z₂ log display share; ``click_models.priors``)

PBM EM fits one α per (query, doc); with a few dozen impressions per pair, θ̂ then carries the
incidental-parameter bias (Neyman & Scott, Econometrica 1948) docs/limitations.md describes. Integrating α out and
maximising the *marginal* likelihood over θ and the prior's (β, s) removes the incidental parameters (the
random-effects remedy). Because relevance and display rank are correlated (rankers put relevant results
high), the random effects must be allowed to depend on the pair's ranks or θ is biased the other way: the
prior mean uses the pair's *mean* log display rank, which is Mundlak's device for correlated random effects
(Mundlak, Econometrica 1978). This is the rank-informed empirical-Bayes prior of the click models, fitted by
the same EM as θ.

α is integrated on a fixed grid of :data:`GRID` points uniform in logit(α) over [1e-4, 1 − 1e-4], with the
prior's density renormalised on the grid (so the model is exactly a discrete mixture, and EM is exact):

* E-step: per pair, posterior weights over the grid w_ig ∝ prior_i(α_g)·Π_cells (θ_k α_g)^c (1 − θ_k α_g)^(n−c);
* M-step for θ: θ_k = Σ_cells at k [c + (n − c)·E_w[θ_k(1 − α)/(1 − θ_k α)]] / Σ n (the PBM update, averaged
  over the posterior of α instead of at a point);
* M-step for (β, s): maximise Σ_i Σ_g w_ig ln prior_i(α_g) (a few BFGS steps from the last value; the gradient
  in a_i is E_w[ln α] − E_prior_i[ln α], in b_i the same with ln(1 − α)).

Each iteration costs a few (cells × grid) array operations; the marginal log-likelihood never decreases.
Only θ_k/θ_1 is reported.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from scipy.optimize import minimize
from scipy.special import expit, logsumexp

from ubi_pipeline.processors.click_models.pbm import initial_exam
from ubi_pipeline.processors.click_models.priors import rank_features, standardise
from ubi_pipeline.processors.clicks.stats import ClickCells

GRID = 40
MAX_ITER = 1000
TOL = 1e-9


class MarginalFit(NamedTuple):
    theta: NDArray[np.float64]  # per rank, max 1 (NaN for ranks never shown)
    coef: NDArray[np.float64]  # β of the prior mean on standardised features
    strength: float
    log_likelihood: list[float]  # marginal log-likelihood per iteration (never decreasing)
    iterations: int
    converged: bool


def _grid() -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    lo = np.log(1e-4 / (1 - 1e-4))
    u = np.linspace(lo, -lo, GRID)
    a = expit(u)
    return a, np.log(a), np.log1p(-a)


def _log_prior(m: NDArray[np.float64], s: float, la: NDArray[np.float64], l1a: NDArray[np.float64]
               ) -> NDArray[np.float64]:
    """[pairs, grid] log of the Beta(m s, (1 − m) s) prior renormalised on the logit grid."""
    a, b = m * s, (1.0 - m) * s
    # density in u = logit α: α^a (1 − α)^b (the Jacobian α(1 − α) folds into the exponents)
    raw = a[:, None] * la[None, :] + b[:, None] * l1a[None, :]
    return raw - logsumexp(raw, axis=1, keepdims=True)


def marginal_em(cells: ClickCells, *, max_iter: int = MAX_ITER, tol: float = TOL) -> MarginalFit:
    """Fit θ and the prior by EM on the marginal likelihood (see the module docstring); pure numpy/scipy."""
    k = cells.max_rank
    used, pair = np.unique(cells.pair, return_inverse=True)
    n_pairs = len(used)
    rank0 = cells.rank - 1
    imps = cells.impressions.astype(np.float64)
    clk = cells.clicks.astype(np.float64)
    non = imps - clk
    feats = rank_features(pair, cells.rank, imps, cells.pairs.query_index[used], n_pairs)
    design, _, _ = standardise(feats, np.ones(n_pairs, dtype=bool))
    alpha, la, l1a = _grid()
    to_pair = sparse.csr_matrix((np.ones(len(pair)), (pair, np.arange(len(pair)))), shape=(n_pairs, len(pair)))
    rank_imps = np.bincount(rank0, weights=imps, minlength=k)
    theta = initial_exam(np.bincount(rank0, weights=clk, minlength=k), rank_imps)
    rate = float(np.clip(clk.sum() / max((imps * theta[rank0]).sum(), 1e-12), 1e-3, 1 - 1e-3))
    params = np.zeros(design.shape[1] + 1)
    params[0], params[-1] = np.log(rate / (1 - rate)), np.log(10.0)
    trace: list[float] = []
    converged = False
    it = 0
    while it < max_iter:
        it += 1
        m = np.clip(expit(design @ params[:-1]), 1e-6, 1 - 1e-6)
        s = float(np.exp(params[-1]))
        lp = _log_prior(m, s, la, l1a)
        p = theta[rank0][:, None] * alpha[None, :]  # [cells, grid]
        cell_ll = clk[:, None] * np.log(p) + non[:, None] * np.log1p(-np.minimum(p, 1 - 1e-12))
        joint = lp + to_pair @ cell_ll
        marg = logsumexp(joint, axis=1)
        trace.append(float(marg.sum()))
        if len(trace) > 1 and abs(trace[-1] - trace[-2]) <= tol * abs(trace[-2]):
            converged = True
            break
        w = np.exp(joint - marg[:, None])  # [pairs, grid] posterior weights
        # θ: the PBM update averaged over α's posterior
        post_e = theta[rank0][:, None] * (1.0 - alpha[None, :]) / (1.0 - p)
        e_post = (w[pair] * post_e).sum(axis=1)
        num = np.bincount(rank0, weights=clk + non * e_post, minlength=k)
        theta = np.where(rank_imps > 0, num / np.where(rank_imps > 0, rank_imps, 1.0), theta)
        # prior: maximise the expected complete-data log prior
        e_la, e_l1a = w @ la, w @ l1a
        params = _fit_prior_step(params, design, e_la, e_l1a, la, l1a)
    top = theta[rank_imps > 0].max() if (rank_imps > 0).any() else 1.0
    theta = np.where(rank_imps > 0, theta / top, np.nan)
    return MarginalFit(theta, params[:-1], float(np.exp(params[-1])), trace, it, converged)


def _fit_prior_step(params: NDArray[np.float64], design: NDArray[np.float64], e_la: NDArray[np.float64],
                    e_l1a: NDArray[np.float64], la: NDArray[np.float64], l1a: NDArray[np.float64]
                    ) -> NDArray[np.float64]:
    """A few BFGS steps on Σ_i Σ_g w_ig ln prior_i(α_g) over (β, log s), from ``params``."""
    n = len(e_la)

    def f(x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        m = np.clip(expit(design @ x[:-1]), 1e-6, 1 - 1e-6)
        s = float(np.exp(np.clip(x[-1], -4.0, 12.0)))
        lp = _log_prior(m, s, la, l1a)
        q = np.exp(lp)
        val = float(((m * s) * e_la + ((1 - m) * s) * e_l1a).sum())
        # Σ_g w ln prior = a E_w[ln α] + b E_w[ln(1 − α)] − ln Z; ∂/∂a = E_w[ln α] − E_q[ln α]
        log_z = logsumexp((m * s)[:, None] * la[None, :] + ((1 - m) * s)[:, None] * l1a[None, :], axis=1)
        val -= float(log_z.sum())
        da = e_la - q @ la
        db = e_l1a - q @ l1a
        d_eta = s * m * (1 - m) * (da - db)
        d_logs = float(((m * s) * da + ((1 - m) * s) * db).sum())
        grad = np.append(design.T @ d_eta, d_logs)
        return -val / n, -grad / n

    res = minimize(f, params, jac=True, method="BFGS", options={"maxiter": 5, "gtol": 1e-8})
    # a partial M-step that does not lower Q keeps EM monotone (generalised EM)
    return res.x if np.all(np.isfinite(res.x)) and f(res.x)[0] <= f(params)[0] else params


def marginal_ratios(cells: ClickCells, **kw: float) -> NDArray[np.float64]:
    """θ̂_k/θ̂_1 by :func:`marginal_em` (NaN for ranks never shown)."""
    fit = marginal_em(cells, **kw)  # type: ignore[arg-type]
    t = fit.theta
    return t / t[0] if np.isfinite(t[0]) and t[0] > 0 else np.full_like(t, np.nan)
