"""The ``ubi`` command line: the composition root that assembles every stage's commands.

Nothing imports this package; it imports ``collector``, ``processors`` and ``reports``, each of which
contributes its own subcommands through a ``cli.register(subparsers)`` function.
"""
