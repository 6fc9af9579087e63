"""Counterfactual evaluation against known truth: predict ranker B from ranker A's log alone.

For every ordered pair (A, B) of rankers of differing quality (noise σ of grade + N(0, σ²): 0.3, 0.7, 1.5,
3.0 by default, 12 pairs) and each generator (PBM with the protocol's ε⁻ = 0.1, ε⁺ = 1; cascade with
ε⁻ = 0.02, ε⁺ = 0.5, since with ε⁺ = 1 nearly every cascade search ends in exactly one click and CTR@10
cannot tell rankers apart), simulates A's log (``--sessions`` searches, 40 queries x 20 docs, A's noise
re-drawn ``--epochs`` times, a ``--randomize`` share of rank-1 swaps), predicts B with every method of
``ubi_pipeline.processors.counterfactual.predict`` (click model ``--model``, default auto), and compares with B's exact
CTR@10 on A's logged query distribution (from θ and α). B is also simulated on as many searches, as a check
of the exact figures. Prints per method: coverage of the 95% bootstrap interval, of the calibrated interval
(documents A never showed over quantiles of the click probabilities of the pairs A showed deep) and of the
prior-free interval (those documents at any click probability in [0, 1]), whether the order of B against A
(predicted B vs A's logged CTR@10, against the exact order) is right, and the MAE of CTR@10; overall, per
generator, and split by the share of B's top 10 that A's log never showed (the prior share).

Seeds: pair i of block s has seed 1000 s + i. The calibrated interval's quantiles were chosen on block 1; the
README reports block 2 (``--seed-block 2``). ``--part I/N`` runs every N-th pair and ``--save`` keeps them, so
a run spread over processes is summarised with ``--summarise FILE ...``.

    .venv/bin/python bench/counterfactual.py [--replicates 100] [--sessions 4000] [--swaps] [--seeds 1]
        [--seed-block 2] [--part 0/4 --save part0.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import Usage  # noqa: E402 (bench/, the script's folder)

from ubi_pipeline.processors.counterfactual.predict import METHODS, Figure  # noqa: E402
from ubi_pipeline.processors.counterfactual.validate import PairResult, run_pair  # noqa: E402

GENERATORS = {"pbm": (0.1, 1.0), "cascade": (0.02, 0.5)}  # (ε⁻, ε⁺)


def _rate(hits: int, n: int, widths: list[float]) -> tuple[str, float]:
    w = float(np.nanmean(widths)) if np.isfinite(widths).any() else float("nan")
    return (f"{hits:>4}/{n:<3} {hits / n:>4.0%}" if np.isfinite(w) else f"{'-':>13}"), w


def _to_json(r: PairResult) -> dict[str, object]:
    """What the summaries read of one pair (``--save``), so parts run apart can be summarised together."""
    p = r.prediction
    return {"model": r.model, "seed": r.seed, "noise_a": r.noise_a, "noise_b": r.noise_b,
            "exact_b": r.exact_b, "observed_b": r.observed_b, "exact_a": r.exact_a, "observed_a": r.observed_a,
            "prediction": {"model": p.model, "prior_share": p.prior_share, "unseen_click": list(p.unseen_click),
                           "figures": {m: {x: list(f.__dict__.values()) for x, f in figs.items()}
                                       for m, figs in p.figures.items()}}}


def _from_json(d: dict[str, object]) -> Any:
    pred = dict(d["prediction"])  # type: ignore[call-overload]
    pred["figures"] = {m: {x: Figure(*v) for x, v in figs.items()} for m, figs in pred["figures"].items()}
    return SimpleNamespace(**{**d, "prediction": SimpleNamespace(**pred)})


def _summary(rows: list[Any], label: str) -> None:
    if not rows:
        return
    print(f"\n{label}: {len(rows)} pairs (mean prior share {np.mean([r.prediction.prior_share for r in rows]):.1%})")
    print(f"  {'method':<6} {'coverage':>10} {'order right':>12} {'MAE CTR@10':>11} {'mean width':>11} "
          f"{'calibrated cov.':>16} {'its width':>10} {'prior-free cov.':>16} {'its width':>10}")
    for m in METHODS:
        cov = order = free = cal = 0
        err, width, free_width, cal_width = [], [], [], []
        for r in rows:
            f = r.prediction.figures[m]["ctr@k"]
            t = r.exact_b["ctr@k"]
            cov += f.low <= t <= f.high
            free += f.bound_low <= t <= f.bound_high  # False for NaN bounds (SNIPS has none)
            cal += f.cal_low <= t <= f.cal_high
            order += np.sign(f.value - r.observed_a["ctr@k"]) == np.sign(t - r.exact_a["ctr@k"])
            err.append(abs(f.value - t))
            width.append(f.high - f.low)
            free_width.append(f.bound_high - f.bound_low)
            cal_width.append(f.cal_high - f.cal_low)
        n = len(rows)
        free_txt, fw = _rate(free, n, free_width)
        cal_txt, cw = _rate(cal, n, cal_width)
        print(f"  {m:<6} {cov:>4}/{n:<3} {cov / n:>4.0%} {order:>4}/{n:<3} {order / n:>4.0%} {np.mean(err):>11.4f} "
              f"{np.mean(width):>11.4f} {cal_txt:>16} {cw:>10.4f} {free_txt:>16} {fw:>10.4f}")


def _report(results: list[Any], generators: list[str]) -> None:
    _summary(results, "all")
    for gen in generators:
        _summary([r for r in results if r.model == gen], gen)
    _summary([r for r in results if r.prediction.prior_share < 0.1], "prior share < 10%")
    _summary([r for r in results if r.prediction.prior_share >= 0.1], "prior share >= 10%")
    check = [abs(r.observed_b["ctr@k"] - r.exact_b["ctr@k"]) for r in results]
    print(f"\nsimulated B vs exact B, CTR@10: mean |difference| {np.mean(check):.4f} over {len(check)} pairs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise", type=float, nargs="+", default=[0.3, 0.7, 1.5, 3.0])
    parser.add_argument("--seeds", type=int, default=1, help="catalogs per (A, B) pair (default 1)")
    parser.add_argument("--seed-block", type=int, default=0,
                        help="first block of seeds: pair i of block s has seed 1000 s + i (default 0; the README "
                             "reports block 2, the constants were chosen on block 1)")
    parser.add_argument("--unseen", default="deep", help="unseen documents' click probability: deep or prior")
    parser.add_argument("--sessions", type=int, default=4000, help="searches in A's log (default 4000)")
    parser.add_argument("--epochs", type=int, default=3, help="times A's noise is re-drawn over its log (default 3)")
    parser.add_argument("--randomize", type=float, default=0.1, help="share of A's searches in a swap experiment")
    parser.add_argument("--swaps", action="store_true", help="IPS takes θ from the swap experiment (default: PBM EM)")
    parser.add_argument("--model", default="auto", help="click model of the direct method (pbm, dbn, auto)")
    parser.add_argument("--replicates", type=int, default=100)
    parser.add_argument("--prior", default=None, help="click-model prior: empirical, pseudocount, none (default: "
                                                       "predict's, none)")
    parser.add_argument("--generators", nargs="+", default=list(GENERATORS))
    parser.add_argument("--part", default="0/1", metavar="I/N",
                        help="run only every N-th pair, from the I-th (to spread the bench over processes)")
    parser.add_argument("--save", type=Path, help="write the pairs' results as JSON (for --summarise)")
    parser.add_argument("--summarise", type=Path, nargs="+", metavar="FILE",
                        help="print the summaries of results saved by --save (of several parts) and stop")
    args = parser.parse_args()
    if args.summarise:
        rows = [_from_json(d) for f in args.summarise for d in json.loads(f.read_text())]
        _report(rows, sorted({r.model for r in rows}, key=list(GENERATORS).index))
        return 0
    part, parts = (int(x) for x in args.part.split("/"))

    usage = Usage()
    results: list[PairResult] = []
    pairs = [(a, b) for a, b in itertools.permutations(args.noise, 2)]
    print(f"{len(pairs) * args.seeds} (A, B) pairs per generator; A's log: {args.sessions} searches, {args.epochs} "
          f"epochs, {args.randomize:.0%} swaps; IPS theta from {'swaps' if args.swaps else 'PBM EM'}; "
          f"{args.replicates} bootstrap replicates (model refitted on each); prior {args.prior or 'default'}; "
          f"unseen documents: {args.unseen}; seeds from block {args.seed_block}")
    job = -1
    for gen in args.generators:
        eps_minus, eps_plus = GENERATORS[gen]
        for s in range(args.seed_block, args.seed_block + args.seeds):
            for i, (a, b) in enumerate(pairs):
                job += 1
                if job % parts != part:
                    continue
                seed = 1000 * s + i
                r = run_pair(gen, seed, a, b, sessions=args.sessions, epochs=args.epochs, randomize=args.randomize,
                             eps_minus=eps_minus, eps_plus=eps_plus, click_model=args.model,
                             replicates=args.replicates, use_swaps=args.swaps, prior=args.prior, unseen=args.unseen)
                results.append(r)
                p = r.prediction
                figs = " ".join(f"{m}={p.figures[m]['ctr@k'].value:.4f}" for m in METHODS)
                print(f"{gen:<7} seed {seed:>4} A σ={a:<4} B σ={b:<4} model {p.model:<3} prior {p.prior_share:5.1%} "
                      f"unseen at {p.unseen_click[0]:.3f} [{p.unseen_click[1]:.3f}, {p.unseen_click[2]:.3f}] "
                      f"exact B {r.exact_b['ctr@k']:.4f} (simulated {r.observed_b['ctr@k']:.4f}) "
                      f"A logged {r.observed_a['ctr@k']:.4f} | {figs}", flush=True)
                if args.save:
                    args.save.write_text(json.dumps([_to_json(x) for x in results]))
    _report(results, args.generators)
    print(usage.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
