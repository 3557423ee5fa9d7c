"""The paper's hyperparameter grids as parallel Ray Tune trials, one nested MLflow run each.

What the paper ran (Hessel, Lee & Mimno 2019, Sec. 4.1 and supplement Sec. 3): b in {10, 20, 30}
in-batch negatives, DC / TK / AP, k = min(n, m) or half of it for TK and AP, hard negatives or not.
The supplement's Tables S1-S4 list ten trained rows per b (1/2 k only with hard negatives). The
main Tables 2 and 3 show b = 10; their structured rows are the hard-negative ones ("AP + hard neg
in these tables is the same as the AP described in the main paper"), while their NoStruct row
matches the supplement's NoStruct *without* hard negatives (e.g. MSCOCO AUC 87.5 / 88.3 vs 51.8
with them), so that is the one shown. Table 3 (RQA, DIY) uses 50 tokens per sentence; WIKI has
no ground truth, so no row.

The paper does not pick among variants: every configuration is its own row, and the validation
loss only picks each run's checkpoint (as ``training.driver.fit`` does). Random comes from each
test split; the Obj Detect row has no counterpart here and is left out. Each (dataset, grid
point) is one Tune trial calling ``run_experiment``: the trial is only a driver (a small CPU
fraction), the TorchTrainer inside it asks for the workers. The retrieval family's grids run
the same way (``training/grid/retrieval.py``).
"""

from training.grid.render import build_table, format_table
from training.grid.results import METRICS, GridResult, TrialResult
from training.grid.retrieval import RETRIEVAL_METRICS, RETRIEVAL_ROWS, expand_points, method_name
from training.grid.rows import (
    ALL_ROWS,
    GRIDS,
    MAIN_ROWS,
    PAPER_B,
    PAPER_VARIANTS,
    GridSpec,
    all_rows,
    main_rows,
    paper_points,
    paper_variants,
    point_b,
    point_key,
    row_name,
    variant,
)
from training.grid.tune_driver import TRIAL_DRIVER_CPUS, default_max_concurrent, run_grid

__all__ = [
    "ALL_ROWS",
    "GRIDS",
    "MAIN_ROWS",
    "METRICS",
    "PAPER_B",
    "PAPER_VARIANTS",
    "RETRIEVAL_METRICS",
    "RETRIEVAL_ROWS",
    "TRIAL_DRIVER_CPUS",
    "GridResult",
    "GridSpec",
    "TrialResult",
    "all_rows",
    "build_table",
    "default_max_concurrent",
    "expand_points",
    "format_table",
    "main_rows",
    "method_name",
    "paper_points",
    "paper_variants",
    "point_b",
    "point_key",
    "row_name",
    "run_grid",
    "variant",
]
