"""Names and defaults that the ``ubi`` subcommands offer as choices, defined here so that building the parser
(``ubi --help``) imports no numeric library. The modules that use them import them from here; each is defined
once. ``tests/schemas/test_cli_names.py`` checks the copies that mirror a registry (click models, scenarios).
"""

from __future__ import annotations

#: judgment sources of ``ubi process --model`` (``ubi_pipeline.processors.labels.implicit``), and the value that chooses one
#: gctr and rctr are left out: they give every pair the same (or a rank-only) score
JUDGMENT_MODELS: tuple[str, ...] = ("ctr", "coec", "pbm", "ubm", "cascade", "dcm", "sdbn", "dbn")
#: ``ubi process --model auto``: the model with the best held-out conditional perplexity, per application,
#: among the candidates of ``ubi_pipeline.processors.click_models.selection`` (not coec: ``NOT_CANDIDATES``)
AUTO = "auto"
#: the click-model registry's names without aliases (``ubi_pipeline.processors.click_models.registry.MODEL_NAMES``)
CLICK_MODEL_NAMES: tuple[str, ...] = ("gctr", "rctr", "dctr", "coec", "pbm", "ubm", "cascade", "dcm", "sdbn", "dbn")
#: ``ubi select``'s default share of queries held out (``ubi_pipeline.processors.click_models.selection``)
DEFAULT_HOLDOUT = 0.25
#: position-bias estimators of ``ubi propensity`` (``ubi_pipeline.processors.propensity``)
PROPENSITY_METHODS: tuple[str, ...] = ("em", "marginal", "harvest", "randomized")
#: click models of the traffic simulator and its named scenarios (``ubi_pipeline.processors.simulation.traffic``)
TRAFFIC_MODELS: tuple[str, ...] = ("pbm", "cascade", "dbn", "trust")
SCENARIO_NAMES: tuple[str, ...] = ("demo", "hard")
#: counterfactual estimators, their default bootstrap replicates and IPS weight cap (``ubi_pipeline.processors.counterfactual``)
COUNTERFACTUAL_METHODS: tuple[str, ...] = ("dm", "ips", "snips", "dr")
DEFAULT_REPLICATES = 200
DEFAULT_CLIP = 20.0
#: ``--position-base`` of ``ubi process``, ``ubi propensity`` and ``ubi report`` (``ubi_pipeline.processors.clicks.ordinal_base``)
POSITION_BASE_CHOICES: tuple[str, ...] = ("auto", "0", "1")
POSITION_BASE_HELP = ("base of position.ordinal: auto (default: detected per application from ordinals checked "
                      "against hit lists), 0 or 1 for every application; UBI_POSITION_BASE_BY_APPLICATION "
                      "entries always win")

# ---- the report subcommands' names (``ubi report``, ``ubi evaluate``, ``ubi judgments``) ----

#: nDCG gains (``ubi_pipeline.reports.metrics.names``)
GAINS: tuple[str, ...] = ("linear", "exponential")
#: the metric names ``parse_metric`` knows, as shown in help and errors (``ubi_pipeline.reports.metrics.names``)
KNOWN_METRICS = "p@k, recall[@k], mrr / rr[@k], map / ap[@k], ndcg[@k], ndcg_exp[@k], judged[@k]"
#: ``ubi evaluate``'s default metrics (``ubi_pipeline.reports.metrics``)
DEFAULT_METRICS = "ndcg@10,recall@10,mrr,map,p@5,judged@10"
#: which label source wins when several grade a pair (``ubi_pipeline.processors.labels.merge``)
DEFAULT_PRECEDENCE: tuple[str, ...] = ("human", "reviewed", "implicit")
#: search fields that split one logged system into several (``ubi_pipeline.reports.systems``)
DEFAULT_SPLIT_KEYS: tuple[str, ...] = ("ranker", "experiment")
#: query-set sampling strategies (``ubi_pipeline.processors.labels.queryset``)
STRATEGIES: tuple[str, ...] = ("top", "random", "pptss")
#: judgment and query-set file formats (``ubi_pipeline.formats.qrels``)
QRELS_FORMATS: tuple[str, ...] = ("jsonl", "trec", "workbench")
QUERYSET_FORMATS: tuple[str, ...] = ("jsonl", "workbench")

#: bootstrap replicates of ``ubi report``'s counterfactual predictions (``ubi predict`` uses 200): each replicate
#: refits the click model once per predicted system, so the report keeps fewer (``--predict-replicates``)
DEFAULT_REPORT_REPLICATES = 50
