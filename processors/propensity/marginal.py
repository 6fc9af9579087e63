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

The cells enter only through per-pair click and non-click counts at each rank, C[i, k] and N[i, k]: the
log-likelihood of pair i at grid point g is Σ_k C_ik·ln(θ_k α_g) + N_ik·ln(1 − θ_k α_g), so one
[pairs, K] @ [K, grid] product replaces (cells × grid) logarithms, and the θ update needs only Nᵀ·w
([K, grid]). Each iteration costs a few (pairs × grid) array operations; the marginal log-likelihood never
decreases. Only θ_k/θ_1 is reported.

Bootstrap replicates (:class:`Refit`) maximise the same marginal likelihood directly: BFGS over
(logit θ, β, ln s) with its gradient by Fisher's identity (the posterior expectation of the complete-data
score, from the same E-step), started at the full log's estimate with the inverse of the full log's Hessian
as the first metric. A replicate's maximiser lies O(1/√n) from the full log's, where the quadratic model is
good, so a replicate converges in a few evaluations instead of the tens to hundreds of EM iterations
(the k-step bootstrap of Andrews, Econometrica 2002, iterated to convergence; Davison & Hinkley 1997, §9.4
on cheap bootstrap refits). Same estimator, same resampling: only the route to each replicate's maximum
changes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from scipy.optimize import minimize
from scipy.special import expit

from ubi_pipeline.processors.click_models.pbm import initial_exam
from ubi_pipeline.processors.click_models.priors import rank_features, standardise
from ubi_pipeline.processors.clicks.stats import ClickCells

GRID = 40
MAX_ITER = 1000
TOL = 1e-9


#: a replicate's refit stops when no component of the gradient of the mean log-likelihood per pair exceeds this
REFIT_GTOL = 1e-5
REFIT_MAX_ITER = 200


class MarginalFit(NamedTuple):
    theta: NDArray[np.float64]  # per rank, max 1 (NaN for ranks never shown)
    coef: NDArray[np.float64]  # β of the prior mean on standardised features
    strength: float
    log_likelihood: list[float]  # marginal log-likelihood per iteration (never decreasing)
    iterations: int
    converged: bool
    raw_theta: NDArray[np.float64]  # θ on the likelihood's own scale (where :class:`Refit` starts)

    @property
    def ratio(self) -> NDArray[np.float64]:
        """θ̂_k/θ̂_1 (NaN for ranks never shown)."""
        return _ratios(self.theta)


class _Counts(NamedTuple):
    """The cells as the marginal likelihood uses them: per-pair counts at each rank and the prior's design.

    Pairs with the same counts at every rank and the same features add the same term to the likelihood, so
    each such group is one row with its size in ``mult`` (a fifth fewer rows on 50,000 hard-scenario searches).
    """

    clicks: sparse.csr_matrix  # [rows, K]
    non: sparse.csr_matrix  # [rows, K] impressions without a click
    non_mult: sparse.csr_matrix  # [rows, K] non·mult: Σ over pairs of the θ update and of θ's score
    pair_clicks: NDArray[np.float64]  # [rows]
    rank_clicks: NDArray[np.float64]  # [K]
    rank_imps: NDArray[np.float64]  # [K]
    design: NDArray[np.float64]  # [rows, 1 + features]
    mult: NDArray[np.float64]  # [rows] pairs each row stands for
    pairs: int  # Σ mult


def _counts(cells: ClickCells) -> _Counts:
    k = cells.max_rank
    used, pair = np.unique(cells.pair, return_inverse=True)
    n_pairs = len(used)
    rank0 = cells.rank - 1
    imps = cells.impressions.astype(np.float64)
    clk = cells.clicks.astype(np.float64)
    feats = rank_features(pair, cells.rank, imps, cells.pairs.query_index[used], n_pairs)
    design, _, _ = standardise(feats, np.ones(n_pairs, dtype=bool))
    dense_c = np.zeros((n_pairs, k))
    dense_n = np.zeros((n_pairs, k))
    np.add.at(dense_c, (pair, rank0), clk)
    np.add.at(dense_n, (pair, rank0), imps - clk)
    # equal rows by one random projection (sorting the rows themselves, np.unique(axis=0), cost 100 ms a call);
    # two different rows sharing a key would be caught below, and then every pair keeps its own row
    table = np.column_stack([dense_c, dense_n, design])
    key = np.einsum("ij,j->i", table, np.random.default_rng(0).standard_normal(table.shape[1]))
    _, first, group, mult = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    if not np.array_equal(table, table[first][group]):
        first, mult = np.arange(n_pairs), np.ones(n_pairs, dtype=np.int64)
    dense_c, dense_n, design = dense_c[first], dense_n[first], design[first]  # one pair stands for its group
    weight = mult.astype(np.float64)
    # sparse: a pair is shown at one or a few ranks, and scipy's sparse products run on one thread, where
    # a dense BLAS product of these thin matrices was 10x slower on a busy two-core machine (its threads contend)
    return _Counts(sparse.csr_matrix(dense_c), sparse.csr_matrix(dense_n), sparse.csr_matrix(dense_n * weight[:, None]),
                   dense_c.sum(axis=1), np.bincount(rank0, weights=clk, minlength=k).astype(np.float64),
                   np.bincount(rank0, weights=imps, minlength=k).astype(np.float64), design, weight, n_pairs)


def _grid() -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    lo = np.log(1e-4 / (1 - 1e-4))
    u = np.linspace(lo, -lo, GRID)
    a = expit(u)
    return a, np.log(a), np.log1p(-a)


def _dot(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """a @ b for a tall [pairs, n] by a small b, by einsum: single-threaded, where the BLAS product's threads
    contend on a busy machine (measured 10x slower on two shared cores)."""
    if b.ndim == 1:
        return np.einsum("in,n->i", a, b)
    # column by column: einsum's "in,nj->ij" took three times as long as two matrix-vector passes
    return np.column_stack([np.einsum("in,n->i", a, b[:, j]) for j in range(b.shape[1])])


def _tdot(a: NDArray[np.float64], v: NDArray[np.float64]) -> NDArray[np.float64]:
    """aᵀ @ v for a tall [pairs, n] (see :func:`_dot`)."""
    return np.einsum("in,i->n", a, v)


def _softmax(x: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per row (axis 1, the grid): log Σ exp, and exp(x − that) (the weights), from one exp pass; finite rows.

    numpy only, in place where it can: scipy's logsumexp costs more per call, and these run thousands of times.
    """
    top = x.max(axis=1)
    e = np.subtract(x, top[:, None])
    np.exp(e, out=e)
    total = e.sum(axis=1)
    e /= total[:, None]
    return top + np.log(total), e


def _prior_grid(m: NDArray[np.float64], s: float, la: NDArray[np.float64], l1a: NDArray[np.float64]
                ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """The Beta(m s, (1 − m) s) prior renormalised on the logit grid: [pairs, grid] log density, ln Z, density."""
    # density in u = logit α: α^a (1 − α)^b (the Jacobian α(1 − α) folds into the exponents)
    raw = np.multiply.outer(m * s, la)
    raw += np.multiply.outer((1.0 - m) * s, l1a)
    log_z, q = _softmax(raw)
    raw -= log_z[:, None]
    return raw, log_z, q


def _e_step(c: _Counts, theta: NDArray[np.float64], lp: NDArray[np.float64], alpha: NDArray[np.float64],
            la: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per pair, the marginal log-likelihood and the posterior weights over the grid ([pairs, grid])."""
    miss = np.log1p(-np.minimum(theta[:, None] * alpha[None, :], 1 - 1e-12))  # [K, grid]: ln(1 − θ_k α_g)
    with np.errstate(divide="ignore"):
        log_t = np.where(c.rank_clicks > 0, np.log(theta), 0.0)  # a rank without clicks adds 0·ln θ_k
    joint = np.asarray(c.non @ miss)
    joint += lp
    joint += np.multiply.outer(c.pair_clicks, la)
    joint += (c.clicks @ log_t)[:, None]
    return _softmax(joint)


def marginal_em(cells: ClickCells, *, max_iter: int = MAX_ITER, tol: float = TOL) -> MarginalFit:
    """Fit θ and the prior by EM on the marginal likelihood (see the module docstring); pure numpy/scipy."""
    c = _counts(cells)
    alpha, la, l1a = _grid()
    rank_imps = c.rank_imps
    theta = initial_exam(c.rank_clicks, rank_imps)
    rate = float(np.clip(c.rank_clicks.sum() / max(float(rank_imps @ theta), 1e-12), 1e-3, 1 - 1e-3))
    params = np.zeros(c.design.shape[1] + 1)
    params[0], params[-1] = np.log(rate / (1 - rate)), np.log(10.0)
    trace: list[float] = []
    converged = False
    it = 0
    while it < max_iter:
        it += 1
        m = np.clip(expit(_dot(c.design, params[:-1])), 1e-6, 1 - 1e-6)
        s = float(np.exp(params[-1]))
        marg, w = _e_step(c, theta, _prior_grid(m, s, la, l1a)[0], alpha, la)
        trace.append(float((c.mult * marg).sum()))
        if len(trace) > 1 and abs(trace[-1] - trace[-2]) <= tol * abs(trace[-2]):
            converged = True
            break
        # θ: the PBM update averaged over α's posterior, E_w[θ_k(1 − α)/(1 − θ_k α)] summed through Nᵀ·w
        post_e = theta[:, None] * (1.0 - alpha[None, :]) / (1.0 - theta[:, None] * alpha[None, :])
        num = c.rank_clicks + ((c.non_mult.T @ w) * post_e).sum(axis=1)
        theta = np.where(rank_imps > 0, num / np.where(rank_imps > 0, rank_imps, 1.0), theta)
        # prior: maximise the expected complete-data log prior
        e_log = _dot(w, np.column_stack([la, l1a]))  # E_w[ln α], E_w[ln(1 − α)] per pair
        params = _fit_prior_step(params, c.design, e_log[:, 0], e_log[:, 1], la, l1a, c.mult)
    top = theta[rank_imps > 0].max() if (rank_imps > 0).any() else 1.0
    shown = np.where(rank_imps > 0, theta / top, np.nan)
    return MarginalFit(shown, params[:-1], float(np.exp(params[-1])), trace, it, converged, theta)


def _fit_prior_step(params: NDArray[np.float64], design: NDArray[np.float64], e_la: NDArray[np.float64],
                    e_l1a: NDArray[np.float64], la: NDArray[np.float64], l1a: NDArray[np.float64],
                    mult: NDArray[np.float64]) -> NDArray[np.float64]:
    """A few BFGS steps on Σ_i Σ_g w_ig ln prior_i(α_g) over (β, log s), from ``params`` (row i counted mult_i times)."""
    n = float(mult.sum())
    logs = np.column_stack([la, l1a])
    seen: dict[bytes, tuple[float, NDArray[np.float64]]] = {}  # BFGS's points, so the check below costs nothing

    def f(x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        key = x.tobytes()
        if key in seen:
            return seen[key]
        m = np.clip(expit(_dot(design, x[:-1])), 1e-6, 1 - 1e-6)
        s = float(np.exp(np.clip(x[-1], -4.0, 12.0)))
        a, b = m * s, (1 - m) * s
        _, log_z, q = _prior_grid(m, s, la, l1a)
        # Σ_g w ln prior = a E_w[ln α] + b E_w[ln(1 − α)] − ln Z; ∂/∂a = E_w[ln α] − E_q[ln α]
        val = float((mult * (a * e_la + b * e_l1a - log_z)).sum())
        e_q = _dot(q, logs)
        da = e_la - e_q[:, 0]
        db = e_l1a - e_q[:, 1]
        d_eta = mult * s * m * (1 - m) * (da - db)
        d_logs = float((mult * (a * da + b * db)).sum())
        grad = np.append(_tdot(design, d_eta), d_logs)
        seen[key] = (-val / n, -grad / n)
        return seen[key]

    res = minimize(f, params, jac=True, method="BFGS", options={"maxiter": 5, "gtol": 1e-8})
    # a partial M-step that does not lower Q keeps EM monotone (generalised EM)
    return res.x if np.all(np.isfinite(res.x)) and f(res.x)[0] <= f(params)[0] else params


def marginal_ratios(cells: ClickCells, **kw: float) -> NDArray[np.float64]:
    """θ̂_k/θ̂_1 by :func:`marginal_em` (NaN for ranks never shown)."""
    return marginal_em(cells, **kw).ratio  # type: ignore[arg-type]


def _ratios(theta: NDArray[np.float64]) -> NDArray[np.float64]:
    return theta / theta[0] if np.isfinite(theta[0]) and theta[0] > 0 else np.full_like(theta, np.nan)


class Refit:
    """Bootstrap refits of the marginal model, each started at the full log's fit (module docstring).

    ``Refit(cells, fit)`` computes, once, the Hessian of the full log's marginal log-likelihood at ``fit`` (central
    differences of the gradient); :meth:`ratios` then maximises a replicate's likelihood by BFGS from ``fit``
    with that Hessian's inverse as the starting metric.
    """

    def __init__(self, cells: ClickCells, fit: MarginalFit) -> None:
        full = _counts(cells)
        self.shown = full.rank_imps > 0  # the ranks whose θ is a parameter (as in marginal_em)
        self.theta = np.clip(np.asarray(fit.raw_theta, dtype=np.float64), 1e-9, 1 - 1e-9)
        self.scale = max(full.pairs, 1)  # one scale for every replicate: gtol means the same
        self.grid = _grid()
        self.start = np.concatenate([np.log(self.theta[self.shown] / (1 - self.theta[self.shown])),
                                     fit.coef, [np.log(fit.strength)]])
        self.hess_inv = self._inverse_hessian(full)

    def objective(self, c: _Counts, x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        """Minus the marginal log-likelihood per pair, and its gradient in (logit θ, β, ln s) (Fisher's identity)."""
        alpha, la, l1a = self.grid
        ns = int(self.shown.sum())
        theta = self.theta.copy()
        theta[self.shown] = expit(x[:ns])
        params = x[ns:]
        m = np.clip(expit(_dot(c.design, params[:-1])), 1e-6, 1 - 1e-6)
        s = float(np.exp(np.clip(params[-1], -20.0, 20.0)))
        a, b = m * s, (1 - m) * s
        lp, _, q = _prior_grid(m, s, la, l1a)
        marg, w = _e_step(c, theta, lp, alpha, la)
        # θ_k: Σ_i Σ_g w_ig [C_ik/θ_k − N_ik α_g/(1 − θ_k α_g)], times dθ/d logit θ = θ(1 − θ)
        nw = c.non_mult.T @ w
        with np.errstate(divide="ignore", invalid="ignore"):
            d_theta = np.where(c.rank_clicks > 0, c.rank_clicks / theta, 0.0) - (
                nw * alpha[None, :] / (1.0 - theta[:, None] * alpha[None, :])).sum(axis=1)
        g_theta = (d_theta * theta * (1 - theta))[self.shown]
        # prior: Σ_g w_ig ∂ ln prior_i(α_g); ∂/∂a_i = E_w[ln α] − E_prior[ln α], the same in b_i with ln(1 − α)
        w -= q
        dlog = _dot(w, np.column_stack([la, l1a]))
        da, db = dlog[:, 0], dlog[:, 1]
        g_beta = _tdot(c.design, c.mult * s * m * (1 - m) * (da - db))
        g_logs = float((c.mult * (a * da + b * db)).sum())
        grad = np.concatenate([g_theta, g_beta, [g_logs]])
        return -float((c.mult * marg).sum()) / self.scale, -grad / self.scale

    def _inverse_hessian(self, full: _Counts) -> NDArray[np.float64]:
        n = len(self.start)
        h = 1e-4
        hess = np.zeros((n, n))
        for j in range(n):
            step = np.zeros(n)
            step[j] = h
            hess[:, j] = (self.objective(full, self.start + step)[1] - self.objective(full, self.start - step)[1]) / (2 * h)
        hess = (hess + hess.T) / 2
        if not np.isfinite(hess).all():
            return np.eye(n)
        vals, vecs = np.linalg.eigh(hess)
        # the likelihood is nearly flat along θ's scale (the prior pins α's scale only weakly): floor the
        # curvature so the first step along it stays short, and let BFGS learn the rest
        floor = max(float(vals.max()) * 1e-6, 1e-12)
        inv = (vecs / np.maximum(vals, floor)) @ vecs.T
        return np.asarray((inv + inv.T) / 2)

    def ratios(self, cells: ClickCells) -> NDArray[np.float64]:
        """θ̂_k/θ̂_1 of a replicate's cells (NaN for ranks it never shows)."""
        c = _counts(cells)
        res = minimize(lambda x: self.objective(c, x), self.start, jac=True, method="BFGS",
                       options={"gtol": REFIT_GTOL, "maxiter": REFIT_MAX_ITER, "hess_inv0": self.hess_inv})
        if not np.all(np.isfinite(res.x)):  # the direct route failed: EM from its own start is slow but sure
            return marginal_ratios(cells)
        theta = self.theta.copy()
        theta[self.shown] = expit(res.x[: int(self.shown.sum())])
        return _ratios(np.where(c.rank_imps > 0, theta, np.nan))
