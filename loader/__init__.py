"""The loader: Kafka topics into the store (``ubi consume``), exactly once.

``decode`` turns consumed records into stored-shape rows, ``targets`` writes them durably (the DuckDB
store, or a Parquet folder), ``consumer`` is the consumer-group loop that commits offsets only after a
write, and ``commands`` is ``ubi consume``. It imports ``store`` and ``schemas``, never ``collector``.
"""
