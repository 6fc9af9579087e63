"""The shared vocabulary of ubi-pipeline: UBI records, judgments, storage tables, settings, errors.

``schemas`` imports nothing else of ours; every other package imports from here.
"""
