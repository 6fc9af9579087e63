"""Renderers of a :class:`ubi_pipeline.reports.joint.Report`: terminal (rich), Markdown, JSON, one self-contained HTML file,
and per-query dashboard rows. Each takes the report and returns text or bytes; none computes a metric."""
