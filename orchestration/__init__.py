"""The Dagster code location over pipelines/ and training/: assets, checks, jobs, schedules,
sensors and resources (``definitions.py`` assembles them). It calls library functions, never
the CLI (``tests/test_layering.py``)."""
