"""HTTP in, durable write: the UBI collector (FastAPI) and the embedded DuckDB store."""
