"""What a grid run returns: one result per trial, and the grid's result with its table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

METRICS = ("auc", "p_at_1", "p_at_5")


@dataclass
class TrialResult:
    dataset: str
    key: str  # e.g. ap-half-hard-b10
    method: str  # the supplement's row name, e.g. "AP + hard neg + 1/2 k"
    b: int
    overrides: dict
    status: str  # ok | error
    run_id: str | None = None
    test: dict = field(default_factory=dict)
    random: dict = field(default_factory=dict)
    best_epoch: int | None = None
    best_val_loss: float | None = None
    seconds: float | None = None  # the trial's wall time (train, evaluate, log)
    error: str = ""
    seed: int | None = None  # the point's seed (the retrieval grids repeat each model over seeds)
    row: str = ""  # the table row the trial is a repeat of ("" = its own row, ``key``)


@dataclass
class GridResult:
    grid: str
    parent_run_id: str
    tracking_uri: str
    datasets: dict[str, str]
    trials: list[TrialResult]
    table: dict
    seconds: float = 0.0

    @property
    def failed(self) -> list[TrialResult]:
        return [t for t in self.trials if t.status != "ok"]

    def to_dict(self) -> dict:
        return {
            "grid": self.grid,
            "parent_run_id": self.parent_run_id,
            "tracking_uri": self.tracking_uri,
            "datasets": self.datasets,
            "trials": [asdict(t) for t in self.trials],
            "failed_trials": len(self.failed),
            "table": self.table,
            "seconds": self.seconds,
        }
