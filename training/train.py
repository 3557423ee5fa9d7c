"""Training with Ray Train: the names callers import, re-exported from where they live.

- ``training/driver.py``: ``fit`` (the Ray driver), ``TrainResult``, ``connect_ray``.
- ``training/loop.py``: the per-worker loop (``train_epoch``, ``validate_epoch``).
- ``training/checkpoints.py``: checkpoint files and the resume rules.
- ``training/fault_hooks.py``: the test-only kill hook.
"""

from __future__ import annotations

from training.checkpoints import (
    CHECKPOINT_FILE,
    IncompatibleResumeError,
    check_resumable,
    load_checkpoint_model,
    saved_train_config,
)
from training.driver import (
    TrainResult,
    connect_ray,
    failure_message,
    fit,
    model_config,
    training_dataset,
    training_feature_stats,
    training_sentences,
)
from training.fault_hooks import KILL_AT_EPOCH_ENV, KILL_MARKER_ENV
from training.loop import (
    DivergedError,
    batch_loss,
    document_batches,
    epoch_seed,
    link_scores,
    train_loop_per_worker,
    validation_batches,
)

__all__ = [
    "CHECKPOINT_FILE",
    "KILL_AT_EPOCH_ENV",
    "KILL_MARKER_ENV",
    "DivergedError",
    "IncompatibleResumeError",
    "TrainResult",
    "batch_loss",
    "check_resumable",
    "connect_ray",
    "document_batches",
    "epoch_seed",
    "failure_message",
    "fit",
    "link_scores",
    "load_checkpoint_model",
    "model_config",
    "saved_train_config",
    "train_loop_per_worker",
    "training_dataset",
    "training_feature_stats",
    "training_sentences",
    "validation_batches",
]
