"""Sensitivity of interleaving against an A/B test of CTR@10: searches needed to detect a quality difference.

On one simulated catalog (40 queries x 20 docs, PBM with the protocol's η = 1, ε⁻ = 0.1, ε⁺ = 1, or
``--model cascade``), a baseline ranker (grade + N(0, σ²), σ = ``--baseline``) faces candidates of several
qualities (``--candidates``). For each pair, a pool of ``--pool`` searches is simulated three ways on the same
users (same truth, same query distribution): team-draft interleaved (``ubi_pipeline.processors.simulation.interleaved``),
all on the baseline, all on the candidate. A trial of N searches resamples N searches from a pool: interleaving
decides by the exact binomial sign test on wins vs losses, A/B by Welch's t test on clicks@10 per search with
N/2 searches per arm; a trial detects the difference when p < 0.05 in the right direction. Printed per pair:
the exact ΔCTR@10, the smallest N (grid of powers of 2) detecting it in >= 80% of ``--trials`` trials, for each
design, and their ratio. (Chapelle, Joachims, Radlinski & Yue, TOIS 2012, report one to two orders of magnitude.)

    .venv/bin/python bench/interleaving.py [--pool 200000] [--trials 400] [--model pbm|cascade]
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy.stats import binom
from scipy.stats import t as student_t

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import Usage  # noqa: E402 (bench/, the script's folder)

from ubi_pipeline.processors.counterfactual.validate import exact_metrics, ranker_slots  # noqa: E402
from ubi_pipeline.processors.simulation import SimConfig, simulate  # noqa: E402
from ubi_pipeline.processors.simulation.interleaved import draw_clicks, simulate_interleaved  # noqa: E402
from ubi_pipeline.reports.interleaving_outcomes import outcomes  # noqa: E402

GRID = [2**i for i in range(4, 24)]  # 16 .. 8 M searches (capped at the pool)
POWER = 0.8
ALPHA = 0.05


def sign_test_power(out: np.ndarray, n: int, trials: int, rng: np.random.Generator) -> float:
    """Share of trials of n resampled searches where the two-sided sign test rejects with the challenger ahead."""
    shares = np.array([(out < 0).mean(), (out == 0).mean(), (out > 0).mean()])
    counts = rng.multinomial(n, shares, size=trials)
    losses, wins = counts[:, 0], counts[:, 2]
    m = wins + losses
    p = np.minimum(1.0, 2.0 * np.minimum(binom.cdf(wins, m, 0.5), binom.sf(wins - 1, m, 0.5)))
    return float(((p < ALPHA) & (wins > losses)).mean())


def welch_power(a: np.ndarray, b: np.ndarray, n: int, trials: int, rng: np.random.Generator) -> float:
    """Share of trials (n/2 searches per arm) where Welch's t test rejects with arm b ahead."""
    half = max(n // 2, 2)

    def draws(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values, freq = np.unique(x, return_counts=True)
        counts = rng.multinomial(half, freq / freq.sum(), size=trials)
        mean = counts @ values / half
        var = (counts @ (values**2) - half * mean**2) / (half - 1)
        return mean, var

    ma, va = draws(a)
    mb, vb = draws(b)
    se = np.sqrt(va / half + vb / half)
    with np.errstate(divide="ignore", invalid="ignore"):
        tstat = (mb - ma) / se
        dof = se**4 / ((va / half) ** 2 / (half - 1) + (vb / half) ** 2 / (half - 1))
    p = 2.0 * student_t.sf(np.abs(tstat), np.where(np.isfinite(dof), dof, 1.0))
    return float(((p < ALPHA) & (mb > ma)).mean())


def needed(power_at: Callable[[int], float], limit: int) -> int | None:
    """The smallest N of the grid up to ``limit`` whose power reaches :data:`POWER` (None: not within it).

    Trials resample a finite pool, so an N beyond the pool would measure the pool's own sampling error.
    """
    for n in GRID:
        if n > limit:
            return None
        if power_at(n) >= POWER:
            return n
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="pbm", choices=("pbm", "cascade"))
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--baseline", type=float, default=1.0)
    parser.add_argument("--candidates", type=float, nargs="+", default=[0.9, 0.7, 0.5])
    parser.add_argument("--pool", type=int, default=200_000,
                        help="simulated searches per design and pair; N is searched up to it (A/B: twice it)")
    parser.add_argument("--trials", type=int, default=400)
    args = parser.parse_args()
    usage = Usage()
    eps = (0.1, 1.0) if args.model == "pbm" else (0.02, 0.5)
    truth = simulate(SimConfig(sessions=1, seed=args.seed, model=args.model, eps_minus=eps[0], eps_plus=eps[1])).truth
    rng = np.random.default_rng([args.seed, 0x1EAF])
    n_q = truth.catalog.n_queries
    popularity = 1.0 / np.arange(1, n_q + 1) ** 0.5  # the simulator's default skew, in a random order
    popularity = popularity[rng.permutation(n_q)]
    popularity /= popularity.sum()
    base = ranker_slots(truth, args.baseline, args.seed)
    print(f"{args.model} generator, seed {args.seed}; baseline σ = {args.baseline}; pool {args.pool} searches per "
          f"design; {args.trials} trials per N; detection = p < {ALPHA} in the right direction in >= {POWER:.0%} of "
          "trials")
    print(f"{'cand σ':>7} {'exact ΔCTR@10':>14} {'win rate':>9} {'N interleaving':>15} {'N A/B':>10} {'ratio':>7}")
    for i, sigma in enumerate(args.candidates):
        cand = ranker_slots(truth, sigma, args.seed + 1 + i)
        query = rng.choice(n_q, size=args.pool, p=popularity)
        # every list holds 10 results, so pooled CTR@10 is the popularity-weighted mean of per-query CTR@10
        per_q = [exact_metrics(truth, np.array([q]), s[[q]])["ctr@k"] for s in (base, cand) for q in range(n_q)]
        delta = float(popularity @ (np.array(per_q[n_q:]) - np.array(per_q[:n_q])))
        il = simulate_interleaved(truth, base, cand, query, rng, prefix=f"s{sigma}")
        out = outcomes(il.credits())
        ab_a = draw_clicks(truth, query, base[query], rng)[:, :10].sum(axis=1).astype(float)
        q2 = rng.choice(n_q, size=args.pool, p=popularity)
        ab_b = draw_clicks(truth, q2, cand[q2], rng)[:, :10].sum(axis=1).astype(float)
        n_il = needed(functools.partial(lambda n, o: sign_test_power(o, n, args.trials, rng), o=out), args.pool)
        n_ab = needed(functools.partial(lambda n, a, b: welch_power(a, b, n, args.trials, rng), a=ab_a, b=ab_b),
                      2 * args.pool)
        wins, losses = int((out > 0).sum()), int((out < 0).sum())
        ratio = f"{n_ab / n_il:.2g}x" if n_il and n_ab else "-"
        over_il, over_ab = f">{args.pool}", f">{2 * args.pool}"
        print(f"{sigma:>7} {delta:>14.4f} {wins / max(wins + losses, 1):>9.3f} {n_il or over_il:>15} "
              f"{n_ab or over_ab:>10} {ratio:>7}", flush=True)
    print(usage.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
