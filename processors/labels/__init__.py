"""The label lifecycle: implicit judgments, grades, review, human labels in and out, merged with provenance."""
