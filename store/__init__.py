"""The store: where validated UBI records live, and how every other stage reads and writes them.

``rows`` builds the stored shape (Arrow schemas, rows, ``failed_records`` rows, row status and counts);
``duckdb_store`` is the embedded DuckDB database (one writing process); ``parquet_store`` the folder of
Parquet files that Kafka loaders append to; ``failed`` pages through ``failed_records``; ``admin`` is the
one HTTP admin protocol (seal, load, failed, health) that the collector and the loader both serve;
``sealed`` the Parquet segments readers scan while a writer holds the file; ``client`` is what readers (processors, reports) call; ``judgment_params`` reads a judgment's
parameters back as one dict from its row and its run (``judgment_runs``); ``wire`` is the record format on the Kafka topics
and ``kafka_client`` the kafka-python boundary, shared by the collector's Kafka sink and the loader, as
are the connection flags of ``kafka_flags``.

Nothing here imports ``collector``, ``loader``, ``processors`` or ``reports``: they all import this.
"""
