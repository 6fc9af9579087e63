"""Coverage of the propensity intervals against known truth: how often the 95% interval holds θ_k/θ_1.

For each seed, simulates PBM traffic (docs/position-bias.md protocol: η = 1, ε⁻ = 0.1, ε⁺ = 1, 10 ranks, 40
queries x 20 docs) with the given number of rankers, runs ``estimate_from_patterns`` (what ``ubi propensity``
ships) for each method, and counts the ranks 2..K whose interval contains the true ratio 1/k. For EM it also
counts the percentile interval of the *same* replicates (the interval EM shipped before): the shipped one is
the basic interval of log θ, [θ̂²/q_hi, θ̂²/q_lo], so the percentiles come back exactly as q_lo = θ̂²/hi,
q_hi = θ̂²/lo. Prints, per method, covered / total, the mean signed relative error of θ̂ per rank (the bias)
and the mean bootstrap estimate of bias the estimator reports. ``--demo`` uses the demo's traffic instead
(2 rankers with noise 1.5 and 0.7, 6,000 searches, seed 7). ``--cold`` also counts, for marginal and em, the
interval their bootstrap gave before issue 26, every replicate fitted from scratch on all its cells, on the same
resamples (same seed), beside the shipped one (marginal: replicates refitted from the full log's estimate,
``marginal.Refit``; em: on the pairs clicked at least once, ``em.replicate_ratios``), with the largest
difference between their interval ends.

    .venv/bin/python bench/propensity_coverage.py [--seeds 5] [--sessions 5000] [--rankers 3] [--replicates 200]
    .venv/bin/python bench/propensity_coverage.py --methods marginal em --cold
    .venv/bin/python bench/propensity_coverage.py --demo
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ubi_pipeline.processors.clicks.stats import SessionPatterns  # noqa: E402
from ubi_pipeline.processors.propensity import estimate_from_patterns  # noqa: E402
from ubi_pipeline.processors.propensity.bootstrap import (  # noqa: E402
    BootstrapResult,
    CellMap,
    basic_log_interval,
    bootstrap,
)
from ubi_pipeline.processors.propensity.em import em_ratios  # noqa: E402
from ubi_pipeline.processors.propensity.marginal import marginal_ratios  # noqa: E402
from ubi_pipeline.processors.simulation import SimConfig, simulate  # noqa: E402


def cold_refits(patterns: SessionPatterns, method: str, replicates: int, seed: int) -> BootstrapResult:
    """The bootstrap as it was before issue 26: every replicate fitted from scratch on all its cells
    (``marginal_em``, or PBM EM by ``em_ratios``)."""
    cmap = CellMap(patterns)
    fit = marginal_ratios if method == "marginal" else em_ratios
    return bootstrap(patterns.weight, lambda w: fit(cmap.cells(w)), replicates=replicates, seed=seed)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="simulated logs (seeds 0..N-1; default 5)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--rankers", type=int, default=3)
    parser.add_argument(
        "--replicates", type=int, default=200, help="bootstrap replicates (default 200, as shipped)"
    )
    parser.add_argument("--methods", nargs="+", default=["em", "harvest"])
    parser.add_argument(
        "--demo", action="store_true", help="the demo's traffic: 2 rankers, 6,000 searches, seed 7"
    )
    parser.add_argument(
        "--cold", action="store_true", help="marginal, em: also the interval of replicates fitted from scratch on all cells"
    )
    args = parser.parse_args()
    if args.demo:
        configs = [SimConfig(sessions=6000, seed=7, rankers=2, ranker_noise=(1.5, 0.7))]
    else:
        configs = [
            SimConfig(sessions=args.sessions, seed=s, rankers=args.rankers)
            for s in range(args.first_seed, args.first_seed + args.seeds)
        ]
    covered: dict[str, int] = {}
    errors: dict[str, list[np.ndarray]] = {m: [] for m in args.methods}
    boot_bias: dict[str, list[np.ndarray]] = {m: [] for m in args.methods}
    total = 0
    for config in configs:
        traffic = simulate(config)
        truth = traffic.truth.theta / traffic.truth.theta[0]
        patterns = traffic.patterns()
        t = truth[1:]
        for method in args.methods:
            t0 = time.perf_counter()
            est = estimate_from_patterns(patterns, method, replicates=args.replicates, seed=config.seed)
            r, lo, hi = est.ratio[1:], est.ci_low[1:], est.ci_high[1:]
            shipped = int(((lo <= t) & (t <= hi)).sum())
            covered[method] = covered.get(method, 0) + shipped
            line = f"seed {config.seed} {method:<8} shipped interval covers {shipped}/{len(t)}"
            if method == "em":
                q_lo, q_hi = r * r / hi, r * r / lo
                pct = int(((q_lo <= t) & (t <= q_hi)).sum())
                covered["em (percentile, before)"] = covered.get("em (percentile, before)", 0) + pct
                line += f", percentile {pct}/{len(t)}"
            if method in ("marginal", "em") and args.cold:
                t1 = time.perf_counter()
                cold = cold_refits(patterns, method, args.replicates, config.seed)
                c_lo, c_hi = cold.low[1:], cold.high[1:]
                if method == "em":  # the shipped interval is the basic one of log θ, from the same replicates
                    c_lo, c_hi = (x[1:] for x in basic_log_interval(est.ratio, cold))
                n_cold = int(((c_lo <= t) & (t <= c_hi)).sum())
                covered[f"{method} (cold, before)"] = covered.get(f"{method} (cold, before)", 0) + n_cold
                gap = max(np.nanmax(np.abs(c_lo - lo)), np.nanmax(np.abs(c_hi - hi)))
                line += (f"; cold refits {n_cold}/{len(t)} ({time.perf_counter() - t1:.1f} s), interval ends apart "
                         f"by at most {gap:.1e} (width {np.nanmean(hi - lo):.3f})")
            errors[method].append(r / t - 1.0)
            bias = np.array([np.nan if b is None else b for b in est.details["bootstrap_bias"]], dtype=float)[
                1:
            ]
            boot_bias[method].append(bias / r)
            print(f"{line}  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        total += len(t)
    what = (
        "demo traffic: 2 rankers (noise 1.5, 0.7), 6,000 searches, seed 7"
        if args.demo
        else f"{len(configs)} seeds x {args.sessions:,} sessions x {args.rankers} rankers"
    )
    print(f"Coverage of the 95% intervals of θ_k/θ_1 at ranks 2..10 ({what}; {args.replicates} replicates)")
    for name, n in covered.items():
        print(f"  {name:<26} {n:>3} / {total}  ({n / total:.0%})")
    for method in args.methods:
        print(
            f"  {method}: mean signed relative error per rank 2..10 (truth known): "
            + " ".join(f"{x:+.3f}" for x in np.mean(errors[method], axis=0))
        )
        print(
            f"  {method}: mean bootstrap estimate of bias / estimate:          "
            + " ".join(f"{x:+.3f}" for x in np.nanmean(boot_bias[method], axis=0))
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
