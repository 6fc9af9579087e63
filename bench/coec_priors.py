"""COEC's prior, variants measured on the hard scenario: held-out perplexity against relevance recovery.

Issue 10 asks COEC's empirical prior to beat the +1/+2 pseudo-count baseline on held-out perplexity, and
``--model auto``'s recommendation to beat raw CTR in every support bucket. This bench fits COEC with the
shipped prior and with the variants tried against its six losing rows, on the logs of
``bench/accuracy_hard.py`` (same simulator, split and τ buckets), and prints for each: held-out conditional
perplexity (COEC's conditional = full), the prior strength, and Kendall τ-b against the true grade by bucket
beside raw CTR. Variants (``shipped`` is the package's COEC; the others are written here):

* ``shipped``: ``ubi_pipeline.processors.click_models.coec.COEC`` itself: the score of ``current``; predictions from the
  quasi-Poisson posterior with the ranking features and the systems' votes in the mean (``qp-votes``) and a
  per-pair strength on the ranking features (PBM's convention: the votes enter the mean only);
* ``current``: r ~ Gamma(m s, s), log-linear m on the impression features, (m, s) by the negative-binomial
  marginal, score = prediction = posterior mean (a + c)/(s + E) (what COEC shipped before ``shipped``);
* ``pseudocount``: (c + 1)/(E + 1), the baseline;
* ``qp-predict``: score as ``current``; predictions from a second, quasi-Poisson posterior: counts scaled by
  φ_i = Σ_impressions ρ_k(1 − ρ_k) / Σ ρ_k (the binomial-to-Poisson variance ratio), prior refitted on them;
* ``qp``: that quasi-Poisson posterior for both the score and the predictions;
* ``votes``: ``current`` with the ranking features and the systems' votes of PBM's prior
  (``priors.ranking_features``, ``priors.system_features``) in the mean;
* ``qp-votes``: ``qp`` with those features;
* ``varying-qp``: ``qp`` with a per-pair strength ln s_i = λ·z_i (N(0, 1) hyperprior on the slopes, as PBM's);
* ``varying-qp-votes``: ``qp-votes`` with a per-pair strength on all its features, votes included (``shipped``
  puts the strength on the ranking features only).

    .venv/bin/python bench/coec_priors.py [--generators pbm cascade dbn] [--sizes 2000 20000] [--seed 0]
        [--variants current qp ...] [--json]

Figures come with CPU time; the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.special import digamma, gammaln

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from accuracy_hard import HOLDOUT, peak_mb, tau_by_bucket  # noqa: E402

from ubi_pipeline.processors.click_models import priors as P  # noqa: E402
from ubi_pipeline.processors.click_models.coec import COEC, PRIOR_COEC  # noqa: E402
from ubi_pipeline.processors.click_models.common import pair_support  # noqa: E402
from ubi_pipeline.processors.click_models.ctr import expected_clicks  # noqa: E402
from ubi_pipeline.processors.click_models.evaluate import evaluate  # noqa: E402
from ubi_pipeline.processors.clicks.holdout import holdout_flags  # noqa: E402
from ubi_pipeline.processors.clicks.stats import SessionPatterns  # noqa: E402
from ubi_pipeline.processors.simulation import scenario, simulate  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "shipped": {},
    "current": {},
    "pseudocount": {"prior": "pseudocount"},
    "qp-predict": {"predict": "qp"},
    "qp": {"marginal": "qp"},
    "votes": {"features": "votes"},
    "qp-votes": {"marginal": "qp", "features": "votes"},
    "varying-qp": {"marginal": "qp", "varying": True},
    "varying-qp-votes": {"marginal": "qp", "features": "votes", "varying": True},
}


def dispersion(sessions: SessionPatterns, rank_ctr: NDArray[np.float64]) -> NDArray[np.float64]:
    """φ_i = Σ ρ_k(1 − ρ_k) / Σ ρ_k over the pair's impressions (1 for a pair never shown)."""
    e = expected_clicks(sessions, rank_ctr)
    v = expected_clicks(sessions, rank_ctr * (1.0 - rank_ctr))
    return np.maximum(np.where(e > 0, v / np.where(e > 0, e, 1.0), 1.0), 1e-3)


def fit_varying_gamma(x: NDArray[np.float64], e: NDArray[np.float64], feats: NDArray[np.float64],
                      names: tuple[str, ...]) -> P.BetaPrior:
    """Gamma prior with log-linear mean and per-pair strength, maximising the negative-binomial marginal."""
    use = e > 0
    design, f_mean, f_std = P.standardise(feats, use)
    p = design.shape[1]
    xs, es, d = x[use], e[use], design[use]
    lo, hi = -4.0, float(np.log(max(es.sum(), 1.0)))

    def f(th: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        beta, lam = th[:p], th[p:]
        raw = d @ lam
        ls = np.clip(raw, lo, hi)
        s = np.exp(ls)
        a = np.exp(np.clip(d @ beta, -30, 30)) * s
        ll = gammaln(xs + a) - gammaln(a) + a * ls - (a + xs) * np.log(s + es)
        da = digamma(xs + a) - digamma(a) + ls - np.log(s + es)
        ds = a / s - (a + xs) / (s + es)
        g = np.concatenate([d.T @ (a * da), d.T @ np.where((raw > lo) & (raw < hi), a * da + s * ds, 0.0)])
        g[p + 1:] -= lam[1:]
        return -(ll.sum() - 0.5 * lam[1:] @ lam[1:]) / len(xs), -g / len(xs)

    x0 = np.zeros(2 * p)
    x0[0], x0[p] = np.log(max(xs.sum() / es.sum(), 1e-4)), np.log(10.0)
    th = minimize(f, x0, jac=True, method="BFGS", options={"maxiter": 300, "gtol": 1e-7}).x
    s = np.exp(np.clip(design @ th[p:], lo, hi))
    a = np.exp(np.clip(design @ th[:p], -30, 30)) * s
    return P.BetaPrior("empirical", a, s, tuple(th[:p]), float(np.median(s[use])), tuple(f_mean), tuple(f_std),
                       float("nan"), "gamma", tuple(th[p:]), names)


class COECVariant(COEC):
    """COEC with the prior variants of the module docstring (``fit``/``click_probs`` replaced)."""

    def __init__(self, prior: str = "empirical", features: str = "impressions", marginal: str = "nb",
                 predict: str = "same", varying: bool = False) -> None:
        super().__init__(prior=prior)
        self.features, self.marginal, self.predict, self.varying = features, marginal, predict, varying

    def _prior(self, x: NDArray[np.float64], e: NDArray[np.float64]) -> P.BetaPrior:
        if self.varying:
            return fit_varying_gamma(x, e, self.feats, self.names)
        return P.fit_prior(x, e, self.feats, family="gamma", feature_names=self.names)

    def fit(self, sessions: SessionPatterns, systems: P.SystemRankings | None = None) -> COECVariant:
        self._fit_counts(sessions)
        e = self.expected_clicks = expected_clicks(sessions, self.rank_ctr)
        phi = dispersion(sessions, self.rank_ctr)
        c = self.clicks.astype(np.float64)
        n_pairs = len(sessions.pairs)
        self.log_features = P.LogFeatures.from_sessions(sessions)
        self._rankings: NDArray[np.float64] | None = None
        if self.features == "votes":
            self.feats, self._rankings = P.ranking_features(sessions.query, sessions.docs,
                                                            sessions.pairs.query_index, n_pairs)
            self.names = P.RANKING_FEATURES
            if systems is not None:
                v, vn = P.system_features(systems, sessions.pairs.query_index, n_pairs)
                self.feats, self.names = np.column_stack([self.feats, v]), self.names + vn
        else:
            self.feats, self.names = self.log_features.features, P.FEATURES
        if self.prior != "empirical":
            self.coec_prior = P.fixed_prior(self.prior, n_pairs, "gamma")
            score = pred = self.coec_prior.posterior_mean(c, e)
            self.pred_prior = self.coec_prior
        else:
            qp_prior = self._prior(c / phi, e / phi) if "qp" in (self.marginal, self.predict) else None
            qp_post = qp_prior.posterior_mean(c / phi, e / phi) if qp_prior is not None else None
            if self.marginal == "qp" and qp_prior is not None and qp_post is not None:
                self.coec_prior, score = qp_prior, qp_post
            else:
                self.coec_prior = self._prior(c, e)
                score = self.coec_prior.posterior_mean(c, e)
            use_qp = self.predict == "qp" and qp_prior is not None and qp_post is not None
            self.pred_prior = qp_prior if use_qp else self.coec_prior
            pred = qp_post if use_qp else score
        self.coec = np.where(e > 0, score, np.nan)
        self.coec_pred = np.where(e > 0, pred, np.nan)
        self._systems_note = f"bench variant {self.features}"
        return self

    def click_probs(self, sessions: SessionPatterns) -> NDArray[np.float64]:
        d = sessions.docs
        out = np.full(d.shape, np.nan)
        inside = (d >= 0) & (d < len(self.coec_pred))
        out[inside] = self.coec_pred[d[inside]]
        unseen = (d >= 0) & np.isnan(out)
        if unseen.any():
            if self.pred_prior.kind == "empirical":
                ranks = np.broadcast_to(np.arange(1, d.shape[1] + 1), d.shape)[unseen]
                queries = np.broadcast_to(sessions.query[:, None], d.shape)[unseen]
                uf = (P.unseen_features(ranks, queries, self.log_features.searches) if self._rankings is None
                      else P.unseen_ranking_features(ranks, queries, self._rankings))
                extra = len(self.pred_prior.feature_mean) - uf.shape[1]
                if extra > 0:
                    uf = np.column_stack([uf, np.full((len(ranks), extra), np.nan)])
                out[unseen] = self.pred_prior.mean_at(uf)
            else:
                out[unseen] = PRIOR_COEC
        return np.minimum(out * self.rank_ctr[None, : sessions.max_rank], 1.0)


def run(generator: str, n: int, seed: int, variants: list[str]) -> list[dict[str, Any]]:
    traffic = simulate(scenario("hard", sessions=n, model=generator, seed=seed))
    held = holdout_flags(traffic.query_ids(), HOLDOUT)
    train, test, everything = traffic.patterns(searches=~held), traffic.patterns(searches=held), traffic.patterns()
    train_sys, all_sys = traffic.system_rankings(searches=~held), traffic.system_rankings()
    grades = traffic.truth.pair_lookup(everything.pairs)[0].astype(np.float64)
    imps_i, clicks_i, _ = pair_support(everything)
    imps = imps_i.astype(np.float64)
    q = everything.pairs.query_index
    raw = tau_by_bucket(np.where(imps > 0, clicks_i / np.maximum(imps, 1), np.nan), grades, q, imps)
    rows = []
    def make(name: str) -> COEC:
        return COEC() if name == "shipped" else COECVariant(**VARIANTS[name])

    for name in variants:
        t0 = time.process_time()
        ppl = evaluate(make(name).fit(train, train_sys), test).conditional_perplexity_mean
        model = make(name).fit(everything, all_sys)
        tau = tau_by_bucket(np.asarray(model.relevance().score, dtype=np.float64), grades, q, imps)
        rows.append({"generator": generator, "sessions": n, "seed": seed, "variant": name, "perplexity": ppl,
                     "strength": model.coec_prior.strength,
                     "tau": {b: v["tau"] for b, v in tau.items()}, "raw_ctr_tau": {b: v["tau"] for b, v in raw.items()},
                     "cpu_s": round(time.process_time() - t0, 1)})
        r = rows[-1]
        print(f"{generator:<8}{n:>8,} {name:<12} ppl {ppl:.4f}  s {r['strength']:6.2f}  τ "
              + "  ".join(f"{b} {r['tau'][b]:.4f} (raw {r['raw_ctr_tau'][b]:.4f})" for b in r["tau"])
              + f"  {r['cpu_s']} s CPU", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generators", nargs="+", default=["pbm", "cascade", "dbn"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    rows = [r for g in args.generators for n in args.sizes for r in run(g, n, args.seed, args.variants)]
    if args.json:
        print(json.dumps(rows, indent=2))
    print(f"total {time.perf_counter() - t_wall:.0f} s wall, {time.process_time() - t_cpu:.0f} s CPU, peak RSS "
          f"{peak_mb():.0f} MB (timings vary on a shared machine)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
