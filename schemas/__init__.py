"""Record types and versioned Arrow/Parquet schemas shared by pipelines and training (import the
modules: the package itself imports nothing, so a light module such as ``config_fields`` stays light)."""
