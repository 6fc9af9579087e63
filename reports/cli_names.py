"""Names and defaults that the ``ubi`` report subcommands offer as choices, defined here so that building the
parser (``ubi --help``) imports neither numpy nor duckdb. The modules that use them import them from here; each is
defined once.
"""

from __future__ import annotations

#: nDCG gains (``reports.metrics.names``)
GAINS: tuple[str, ...] = ("linear", "exponential")
#: the metric names ``parse_metric`` knows, as shown in help and errors (``reports.metrics.names``)
KNOWN_METRICS = "p@k, recall[@k], mrr / rr[@k], map / ap[@k], ndcg[@k], ndcg_exp[@k], judged[@k]"
#: ``ubi evaluate``'s default metrics (``reports.metrics``)
DEFAULT_METRICS = "ndcg@10,recall@10,mrr,map,p@5,judged@10"
#: which label source wins when several grade a pair (``reports.merge``)
DEFAULT_PRECEDENCE: tuple[str, ...] = ("human", "reviewed", "implicit")
#: search fields that split one logged system into several (``reports.systems``)
DEFAULT_SPLIT_KEYS: tuple[str, ...] = ("ranker", "experiment")
#: query-set sampling strategies (``reports.queryset``)
STRATEGIES: tuple[str, ...] = ("top", "random", "pptss")
#: judgment and query-set file formats (``processors.qrels``)
QRELS_FORMATS: tuple[str, ...] = ("jsonl", "trec", "workbench")
QUERYSET_FORMATS: tuple[str, ...] = ("jsonl", "workbench")

#: bootstrap replicates of ``ubi report``'s counterfactual predictions (``ubi predict`` uses 200): each replicate
#: refits the click model once per predicted system, so the report keeps fewer (``--predict-replicates``)
DEFAULT_REPORT_REPLICATES = 50
