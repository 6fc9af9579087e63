"""Judgments merged with provenance, offline and online metrics, agreement, comparison, gates, rendering."""
