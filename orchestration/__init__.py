"""Thin layers over pipelines/ and training/: the ``mmlinks`` CLI (and, later, Dagster)."""
