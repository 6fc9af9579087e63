"""Names and defaults that the ``ubi`` subcommands offer as choices, defined here so that building the parser
(``ubi --help``) imports no numeric library. The modules that use them import them from here; each is defined
once. ``tests/processors/test_cli_names.py`` checks the copies that mirror a registry (click models, scenarios).
"""

from __future__ import annotations

#: judgment sources of ``ubi process --model`` (``processors.judgments``), and the value that chooses one
#: gctr and rctr are left out: they give every pair the same (or a rank-only) score
JUDGMENT_MODELS: tuple[str, ...] = ("ctr", "coec", "pbm", "ubm", "cascade", "dcm", "sdbn", "dbn")
#: ``ubi process --model auto``: the model with the best held-out conditional perplexity, per application,
#: among the candidates of ``processors.selection`` (not coec: ``NOT_CANDIDATES``)
AUTO = "auto"
#: the click-model registry's names without aliases (``processors.click_models.registry.MODEL_NAMES``)
CLICK_MODEL_NAMES: tuple[str, ...] = ("gctr", "rctr", "dctr", "coec", "pbm", "ubm", "cascade", "dcm", "sdbn", "dbn")
#: ``ubi select``'s default share of queries held out (``processors.selection``)
DEFAULT_HOLDOUT = 0.25
#: position-bias estimators of ``ubi propensity`` (``processors.propensity``)
PROPENSITY_METHODS: tuple[str, ...] = ("em", "marginal", "harvest", "randomized")
#: click models of the traffic simulator and its named scenarios (``processors.simulation.traffic``)
TRAFFIC_MODELS: tuple[str, ...] = ("pbm", "cascade", "dbn", "trust")
SCENARIO_NAMES: tuple[str, ...] = ("demo", "hard")
#: counterfactual estimators, their default bootstrap replicates and IPS weight cap (``processors.counterfactual``)
COUNTERFACTUAL_METHODS: tuple[str, ...] = ("dm", "ips", "snips", "dr")
DEFAULT_REPLICATES = 200
DEFAULT_CLIP = 20.0
#: ``--position-base`` of ``ubi process``, ``ubi propensity`` and ``ubi report`` (``processors.ordinal_base``)
POSITION_BASE_CHOICES: tuple[str, ...] = ("auto", "0", "1")
POSITION_BASE_HELP = ("base of position.ordinal: auto (default: detected per application from ordinals checked "
                      "against hit lists), 0 or 1 for every application; UBI_POSITION_BASE_BY_APPLICATION "
                      "entries always win")
