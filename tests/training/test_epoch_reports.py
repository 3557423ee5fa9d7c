"""An epoch's metrics reach MLflow in one request (issue #63: a ``log_metric`` per metric cost
~14 x the time on SQLite)."""

import math

from mlflow.tracking import MlflowClient

from tests.conftest import tracking_uri
from training.epoch_reports import log_metrics


class CountingClient(MlflowClient):
    """A real SQLite client that counts the requests that write metrics."""

    calls: list[str]

    def log_metric(self, *args, **kwargs):
        self.calls.append("log_metric")
        return super().log_metric(*args, **kwargs)

    def log_batch(self, *args, **kwargs):
        self.calls.append("log_batch")
        return super().log_batch(*args, **kwargs)


def test_an_epoch_logs_its_finite_metrics_in_one_request_at_its_step(tmp_path):
    client = CountingClient(tracking_uri(tmp_path))  # a copy of the empty store, not ~130 migrations
    client.calls = []
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    for epoch in range(3):
        metrics = {"epoch": epoch, "best_epoch": 0, "best_val_loss": 1.0, "train_loss": 2.0 - epoch,
                   "val_auc": 50.0 + epoch, "val_within": math.nan, "seconds": 3}  # fmt: skip
        log_metrics(client, run_id, metrics, epoch)
    assert client.calls == ["log_batch"] * 3
    logged = client.get_run(run_id).data.metrics
    assert set(logged) == {"train_loss", "val_auc", "seconds"}  # no bookkeeping, no NaN
    history = client.get_metric_history(run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(0, 2.0), (1, 1.0), (2, 0.0)]


def test_an_epoch_with_nothing_finite_sends_nothing(tmp_path):
    client = CountingClient(tracking_uri(tmp_path))  # a copy of the empty store, not ~130 migrations
    client.calls = []
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    log_metrics(client, run_id, {"epoch": 0, "val_within": math.nan}, 0)
    assert client.calls == [] and client.get_run(run_id).data.metrics == {}
