"""Judgment, run and query-set files: JSONL, TREC and Workbench, one reader and writer per format."""
