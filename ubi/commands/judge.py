"""``ubi judge``: grades proposed by a language model through an OpenAI-compatible chat-completions endpoint."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ubi_pipeline.schemas.errors import UbiError

_EPILOG = """\
Nothing is sent anywhere unless --endpoint and --model are given: there is no default endpoint. The pairs asked
about are the review queue's, in its order (as `ubi review serve` serves them: the held-out sample first, then
where sources disagree most); pairs this model already graded are skipped (--rejudge asks again). Each answer is
stored in the judgments table as source model:<name> (grade NULL when the answer could not be read), with the
model, prompt version, rubric digest, raw answer, reason and any failure in the row's parameters. `ubi report`
then measures the source against the human grades like an implicit source; no default precedence uses it.

The request: POST {endpoint}/chat/completions {"model", "messages", "temperature": 0}; the answer asked for is
{"grade": n, "reason": "..."}. 429 and 5xx answers, timeouts and refused connections are retried with
exponential backoff (Retry-After honoured); at most --concurrency requests at once.

examples:
  ubi judge --endpoint https://api.openai.com/v1 --model gpt-4o-mini --api-key-env OPENAI_API_KEY --limit 200
  ubi judge --endpoint http://localhost:11434/v1 --model llama3.1:8b --rubric rubric.txt --docs catalog.jsonl
  ubi judge --endpoint http://localhost:8000/v1 --model Qwen/Qwen2.5-7B-Instruct --dry-run
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "judge", help="ask a chat-completions model (OpenAI-compatible endpoint) for grades: source model:<name>",
        description="Ask an OpenAI-compatible chat-completions endpoint to grade the candidate judgments' pairs, "
                    "and store its grades apart from the human ones, as source model:<name>.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--endpoint", required=True, metavar="URL",
                   help="base URL of the API, up to /v1 (https://api.openai.com/v1, http://localhost:11434/v1)")
    p.add_argument("--model", required=True, metavar="NAME", help="the model name the endpoint knows")
    p.add_argument("--source", metavar="model:NAME", help="source name to store under (default model:<--model>)")
    p.add_argument("--rubric", type=Path, metavar="FILE",
                   help="grading instructions sent with every pair (default: the built-in rubric `ubi review serve` "
                        "shows people, an exact/substitute/complement/irrelevant scale)")
    p.add_argument("--docs", type=Path, metavar="FILE",
                   help="document catalogue, JSONL {\"doc_id\", \"title\", \"description\", \"url\"} (the file "
                        "`ubi review serve --docs` reads; image is not sent): shown to the model (without it the "
                        "model sees the doc id only)")
    p.add_argument("--limit", type=int, metavar="N", help="ask about at most N pairs")
    p.add_argument("--rejudge", action="store_true", help="ask again about pairs this model already graded")
    p.add_argument("--api-key-env", metavar="VAR",
                   help="environment variable holding the API key (sent as a Bearer token; never stored)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds per request (default 60)")
    p.add_argument("--retries", type=int, default=4, metavar="N", help="retries of a request (default 4)")
    p.add_argument("--concurrency", type=int, default=4, metavar="N", help="requests at once (default 4)")
    p.add_argument("--dry-run", action="store_true", help="print the pairs and the first prompt; call nothing")
    p.add_argument("--db", type=Path, help="DuckDB file of the store (default: $UBI_DB or ./ubi.duckdb)")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary (JSON)")
    p.set_defaults(func=cmd_judge)


#: pairs a text dry run lists (``--json`` lists every one)
DRY_RUN_SHOWN = 50


def cmd_judge(args: argparse.Namespace) -> int:
    from ubi_pipeline.processors.labels import model_judge as mj
    from ubi_pipeline.processors.labels.catalog import read_docs
    from ubi_pipeline.processors.labels.grades import default_rubric_text
    from ubi_pipeline.schemas.settings import Settings
    from ubi_pipeline.store.client import load_derived, reading

    settings = Settings.from_flags(args, only=("db",))
    for flag, value, low in (("--limit", args.limit, 1), ("--concurrency", args.concurrency, 1),
                             ("--retries", args.retries, 0)):
        if value is not None and value < low:
            raise UbiError(f"{flag} must be at least {low}, got {value}")
    if args.timeout <= 0:
        raise UbiError(f"--timeout must be positive, got {args.timeout}")
    source = mj.source_for(args.model, args.source)
    # the review page's built-in rubric: people and the model grade under one text, recorded under one digest
    rubric, rubric_name = default_rubric_text(settings.grade_max), "builtin"
    if args.rubric is not None:
        try:
            rubric, rubric_name = args.rubric.read_text(encoding="utf-8"), args.rubric.name
        except OSError as exc:
            raise UbiError(f"--rubric {args.rubric}: cannot read: {exc.strerror}") from exc
    docs = read_docs(args.docs) if args.docs is not None else None
    api_key = None
    if args.api_key_env:
        # the variable is named on the command line, so it cannot be a Settings field; the key is never stored
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise UbiError(f"--api-key-env {args.api_key_env}: the variable is not set or empty")
    cfg = mj.ClientSettings(endpoint=args.endpoint, model=args.model, api_key=api_key, timeout_s=args.timeout,
                            retries=args.retries, concurrency=args.concurrency)
    cfg.url()
    with reading(settings.db, settings) as con:
        pairs = mj.pairs_to_judge(con, source, limit=args.limit, rejudge=args.rejudge)
    if not pairs:
        raise mj.JudgeError(f"{settings.db}: no pairs to judge (no candidate judgments, or {source} graded them "
                            "all already: --rejudge asks again); run `ubi process` first")
    out = Console(highlight=False)
    if args.dry_run:
        first = mj.build_messages(*pairs[0], (docs or {}).get(pairs[0][1]), rubric, settings.grade_max)
        if args.json:
            print(json.dumps({"source": source, "pairs": len(pairs), "first_messages": first,
                              "queue": [{"query": q, "doc_id": d} for q, d in pairs]}, ensure_ascii=False))
        else:
            out.print(escape(f"would ask {cfg.url()} ({args.model}) about {len(pairs)} pairs as {source}, in this "
                             "order (query, tab, doc id):"))
            for q, d in pairs[:DRY_RUN_SHOWN]:
                print(f"{q}\t{d}")  # plain print: a tab-separated list to cut or grep, never wrapped
            if len(pairs) > DRY_RUN_SHOWN:
                out.print(escape(f"... and {len(pairs) - DRY_RUN_SHOWN:,} more (--json lists them all)"))
            out.print("the first prompt:")
            for m in first:
                out.print(escape(f"[{m['role']}]\n{m['content']}"))
        return 0
    answers = mj.judge_pairs(pairs, cfg, rubric=rubric, grade_max=settings.grade_max, docs=docs)
    table = mj.judgment_rows(answers, source, cfg, rubric=rubric, rubric_name=rubric_name)
    load_derived(settings.db, "judgments", table)
    run = mj.summarize(answers, source, args.model)
    if args.json:
        print(json.dumps({**run.as_dict(), "db": str(settings.db)}, ensure_ascii=False))
        return 0
    out.print(escape(f"{run.graded} of {run.pairs} pairs graded by {args.model} as {source} "
                     f"({run.fallback} read by the fallback parse), {run.failed} failed; stored in {settings.db}"))
    for failure, n in list(run.failures.items())[:5]:
        out.print(escape(f"  {n} x {failure}"))
    return 0
