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
