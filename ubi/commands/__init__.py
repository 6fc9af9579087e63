"""The ``ubi`` subcommands, one module per stage: each parses its flags and calls the stage's plain functions."""
