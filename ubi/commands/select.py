"""``ubi select``: every click model fitted on one split of the stored searches and scored on the other."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from ubi_pipeline.schemas.cli_names import CLICK_MODEL_NAMES, DEFAULT_HOLDOUT
from ubi_pipeline.schemas.errors import UbiError

_HELP = """\
Fit every click model on the training searches of the store and score it on the held-out ones: a search
is held out when the first 32 bits of md5(query_id) fall below --holdout of 2^32, so the split is the same
on every run and on every copy of the log. Per application (or for --application only), prints held-out
log-likelihood and mean perplexity, full and conditional, side by side, then the conditional and full
perplexity per rank (1 is perfect, 2 is a coin). The recommended model is the judgment model with the
lowest mean conditional perplexity (what `ubi process --model auto` uses); gctr and rctr are baselines.
When no (query, doc) pair was shown at two ranks, position-debiased models (coec, pbm, ubm, dbn) are left
out of the recommendation: they could not grade (see `ubi process --help`, identifiability). COEC's row is
printed and marked but it is never recommended: its click predictions and its scores are different
posteriors, so its perplexity measures its predictor, not its grades (`candidate` and `not_a_candidate` in
--json say which models the choice was made among). Only the held-out searches' clicks are held out: what
they showed, and which system showed it, enters the empirical priors' features with the training searches'
(a ranking is known before its clicks), as in `ubi process --model auto`.
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("select", help="model selection: every click model's held-out likelihood and perplexity",
                       description=_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", type=Path, help="DuckDB store (default: UBI_DB or ./ubi.duckdb); works while a collector runs")
    p.add_argument("--models", nargs="+", metavar="MODEL", default=list(CLICK_MODEL_NAMES),
                   help=f"models to fit (default: all: {' '.join(CLICK_MODEL_NAMES)})")
    p.add_argument("--holdout", type=float, default=DEFAULT_HOLDOUT, metavar="FRACTION",
                   help=f"share of searches held out, in (0, 1) (default {DEFAULT_HOLDOUT})")
    p.add_argument("--application", help="only this application's searches (default: each application on its own)")
    p.add_argument("--max-rank", type=int, help="deepest rank kept (default 10)")
    p.add_argument("--json", action="store_true", help="print every figure as JSON")
    p.set_defaults(func=cmd_select)


def cmd_select(args: argparse.Namespace) -> int:
    from ubi_pipeline.processors.click_models.registry import model_class
    from ubi_pipeline.processors.click_models.selection import SelectionError, select
    from ubi_pipeline.processors.clicks.identifiability import assess
    from ubi_pipeline.processors.clicks.sessions import applications, read_sessions
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.store.client import reading

    settings = Settings.from_flags(args, only=("db", "max_rank"))
    if not settings.db.exists():
        raise UbiError(f"{settings.db}: no such database; load traffic first (`ubi import`, `ubi serve`)")
    if not 0.0 < args.holdout < 1.0:
        raise UbiError(f"--holdout: the held-out share must lie strictly between 0 and 1, got {args.holdout}")
    for name in args.models:
        model_class(name)  # an unknown name fails here, naming the known ones
    with reading(settings.db, settings) as con:
        apps = applications(con)
    if args.application is not None:
        if args.application not in apps:
            raise UbiError(f"--application {args.application!r}: no such application in {settings.db}; found "
                           f"{', '.join(repr(a) for a in apps) or 'none'}")
        apps = [args.application]
    err = Console(stderr=True)
    out: list[dict[str, Any]] = []
    with err.status("reading sessions", spinner="dots") as status:
        for app in apps:
            # with which system showed which ranking, every search's, as --model auto fits them (its figures)
            options: dict[str, Any] = {"holdout": args.holdout, "systems": True}
            if len(apps) > 1 or args.application is not None:
                options["application"] = app
            data = read_sessions(settings.db, settings, **options)
            if data.patterns.n_sessions == 0:
                continue
            train, test = data.split()
            ident = assess(data.cells)
            try:
                sel = select(train, test, models=args.models, identifiability=ident, holdout=args.holdout,
                             application=app, progress=status.update, systems=data.systems)
            except SelectionError as exc:
                raise UbiError(f"application {app!r}: {exc}") from exc
            out.append({**sel.as_dict(), "identifiability_detail": ident.as_dict()})
    if not out:
        raise UbiError(f"{settings.db}: no sessions to fit on (no displayed results survive the filters)")
    if args.json:
        sys.stdout.write(orjson.dumps({"db": str(settings.db), "selections": out},
                                      option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
        return 0
    console = Console()
    for row in out:
        _print(console, row)
    return 0


def _f(x: Any, digits: int = 4) -> str:
    import numpy as np
    return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{digits}f}"


def _print(con: Console, sel: dict[str, Any]) -> None:
    title = f"application {sel['application']!r}" if sel["application"] is not None else "the log"
    con.rule(f"[bold]{title}[/]: {sel['train_sessions']:,} training / {sel['test_sessions']:,} held-out searches")
    t = Table(title="Held-out fit (lower perplexity is better; 1 perfect, 2 a coin)", title_justify="left")
    for col in ("model", "log-likelihood", "per search", "perplexity", "conditional", "fit s"):
        t.add_column(col, justify="left" if col == "model" else "right")
    fitted = [m for m in sel["models"] if m.get("error") is None]
    for m in sorted(fitted, key=lambda m: m["conditional_perplexity_mean"]):
        mark = " *" if m["model"] == sel["best"] else " †" if m["model"] in sel["excluded"] else ""
        t.add_row(m["model"] + mark, f"{m['log_likelihood']:,.1f}", _f(m["log_likelihood_per_session"]),
                  _f(m["perplexity_mean"]), _f(m["conditional_perplexity_mean"]), _f(m["fit_seconds"], 2))
    con.print(t)
    k = max((len(m["conditional_perplexity"]) for m in fitted), default=0)
    for key, name in (("conditional_perplexity", "Conditional"), ("perplexity", "Full")):
        r = Table(title=f"{name} perplexity per rank", title_justify="left")
        r.add_column("model")
        for rank in range(1, k + 1):
            r.add_column(str(rank), justify="right")
        for m in sorted(fitted, key=lambda m: m["conditional_perplexity_mean"]):
            r.add_row(m["model"], *[_f(x, 3) for x in m[key]])
        con.print(r)
    for name, why in sel["excluded"].items():
        con.print(f"† {name}: {why}", highlight=False)
    for m in sel["models"]:
        if m.get("error"):
            con.print(f"[yellow]{m['model']}: not fitted[/] ({m['error']})", highlight=False)
    con.print(f"identifiability: {sel['identifiability']} ({sel['identifiability_detail']['reason']})",
              highlight=False)
    con.print(f"[bold]recommended: {sel['best'] or 'none'}[/] ({sel['why']}); `ubi process --model auto` "
              "makes its judgments", highlight=False)
