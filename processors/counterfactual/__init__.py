"""Counterfactual evaluation: a candidate ranker's online metrics predicted from logs it never served.

``direct`` (click-model-based metrics), ``ips`` (IPS, SNIPS and doubly robust under the item-position model)
are pure numpy kernels; ``predict`` fits the click model on a log and bootstraps every figure.
"""
