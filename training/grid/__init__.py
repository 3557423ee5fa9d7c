"""The paper's hyperparameter grids as parallel Ray Tune trials, one nested MLflow run each.

Modules: ``rows`` (variants and row names from the objective registry, the grid specs),
``retrieval`` (Alikhani et al.'s Tables 4 / 5: rows, seeds, the table with MedR's sd),
``plan`` (the spec, trial specs, input checks), ``tune_driver`` (``run_grid``: Tune trials, Ray
session, collection), ``tracking`` (MLflow bookkeeping of the parent run), ``render`` (the
table as data and text), ``results``.

What the paper ran (Hessel, Lee & Mimno 2019, Sec. 4.1 and supplement Sec. 3): every
combination of b in {10, 20, 30} in-batch negatives, similarity DC / TK / AP, k = min(n, m) or
ceil(min(n, m) / 2) for TK and AP, and hard-negative mining (max) or not (mean). The
supplement's Tables S1-S4 list exactly ten trained rows per b: NoStruct, NoStruct + hard neg,
DC, DC + hard neg, TK, TK + hard neg, TK + hard neg + 1/2 k, AP, AP + hard neg,
AP + hard neg + 1/2 k (1/2 k only with hard negatives). The main Tables 2 and 3 show b = 10 and
the rows NoStruct, DC, TK, TK + 1/2 k, AP, AP + 1/2 k; the structured rows there are the
hard-negative ones ("AP + hard neg in these tables is the same as the AP described in the
main paper"), while the main NoStruct row matches the supplement's NoStruct *without* hard
negatives (e.g. MSCOCO AUC 87.5 / 88.3 vs 51.8 for NoStruct + hard neg), so that is the one
shown. Table 2 covers the crowd-labelled MSCOCO, Story-DII, Story-SIS and DII-Stress; Table 3
covers RQA and DIY with 50 tokens per sentence (WIKI has no ground truth, so no table row).

The paper does not pick among variants: every configuration is its own row, and the
validation loss only picks each run's checkpoint (the lowest-validation-loss epoch, which
``training.driver.fit`` already does). The table here follows that. Random comes from each
dataset's test split (``evaluate``'s random baseline); the Obj Detect row (DenseNet class
names + word2vec, best K chosen on test) has no counterpart in this code base and is left out.

Each (dataset, grid point) is one Tune trial whose function calls ``run_experiment``; the trial
is only a driver (a small CPU fraction), the TorchTrainer inside it asks for the workers.

The retrieval family's grids (``coherence-table4``, ``coherence-table5``) run the same way: one
trial per (dataset, model, seed), see ``training/grid/retrieval.py``.
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
