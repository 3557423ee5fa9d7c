"""The paper's hyperparameter grids as parallel Ray Tune trials, one nested MLflow run each.

Hessel et al. 2019's grids (b in {10, 20, 30}, DC / TK / AP, full or half k, hard negatives or
not; the rows of its Tables 2-3 and supplement S1-S4: ``rows.py``). The paper does not
pick among variants: every configuration is its own row and validation loss picks only each
run's checkpoint. Each trial is only a driver calling ``run_experiment``; its TorchTrainer asks
for the workers."""

from training.grid.render import build_table, format_table
from training.grid.results import GridResult, TrialResult
from training.grid.rows import GRIDS, MAIN_ROWS, PAPER_VARIANTS, GridSpec, point_b, variant
from training.grid.tune_driver import run_grid

__all__ = [
    "GRIDS",
    "MAIN_ROWS",
    "PAPER_VARIANTS",
    "GridResult",
    "GridSpec",
    "TrialResult",
    "build_table",
    "format_table",
    "point_b",
    "run_grid",
    "variant",
]
