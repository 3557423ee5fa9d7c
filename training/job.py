"""Alias of ``models.job``, where issue #61 moved the job entry point (a run is packaged and
registered through ``models/``): ``python -m training.job --config ...``, the command earlier
docs, Ray jobs and scripts name, runs ``python -m models.job`` unchanged."""

import sys

from models.job import load_config, main, parse_args, run

__all__ = ["load_config", "main", "parse_args", "run"]

if __name__ == "__main__":
    sys.exit(main())
