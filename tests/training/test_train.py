"""Training through Ray Train on the built fixture dataset, and the MLflow tracking around it."""

import json
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from models.experiment import run_experiment
from tests.conftest import expected_within_epoch, param_digests, small_train_config, tracking_uri
from training.config import TrainConfig
from training.driver import check_inputs, fit, worker_loop_config
from training.link.image_side import CANDIDATES


def small_cfg(dataset, tmp_path, **kw) -> TrainConfig:
    return small_train_config(dataset, tmp_path / "ray", **kw)


def test_fit_keeps_the_lowest_validation_loss_checkpoint(trained):
    res = trained
    losses = {int(h["epoch"]): h["val_loss"] for h in res.history}
    assert sorted(losses) == [0, 1, 2]
    assert res.best_epoch == min(losses, key=losses.get)
    assert res.best_val_loss == pytest.approx(min(losses.values()))
    assert res.model.cfg.image_dim == 1280 and res.model.cfg.d_multi == 32
    # feature standardisation statistics travel with the weights
    assert not np.allclose(res.model.image.feature_mean.numpy(), 0)


def test_select_by_val_structure_keeps_the_latest_epoch_near_the_most_link_structure(dataset, tmp_path):
    """Issue #60: the link structure (scale-free, chance subtracted) is logged every epoch beside
    the raw gap and, under ``--select-by val_structure``, is the checkpoint's and the plateau's
    signal, with the raw gap's rule (the latest epoch within tolerance of the widest so far)."""
    cfg = small_cfg(dataset, tmp_path, select_by="val_structure", epochs=4, negatives_warmup=1)
    res = fit(cfg)
    structure = [h["val_structure"] for h in res.history]
    assert len(structure) == 4 and np.isfinite(structure).all(), res.history
    assert res.best_epoch == expected_within_epoch(res.history, "val_structure", 1, 4) >= 1


def test_select_by_val_structure_refuses_a_validation_split_it_cannot_measure(tmp_path):
    """One sentence and one image a document: no link structure to keep an epoch by, so the run
    is refused in one line before it trains, instead of keeping an arbitrary epoch."""
    from schemas.errors import MmlinksError
    from tests.training.test_ddp_uneven import write_dataset

    data = write_dataset(tmp_path / "pairs", "retrieval")
    with pytest.raises(MmlinksError, match=r"no validation document .* has three sentences and three images"):
        fit(small_cfg(data, tmp_path, objective="ap", select_by="val_structure"))


def test_select_by_val_structure_refuses_documents_of_two_images(tmp_path):
    """Two images a document: every document's centred scores are one row and its negative, so
    ``link_structure`` has nothing to measure (a 2 x 2 read exactly 0 whatever was linked): refused
    in one line, where two sentences and two images used to pass."""
    from pipelines.feature_corpus import FeatureCorpusConfig, write_feature_corpus
    from schemas.errors import MmlinksError

    data = tmp_path / "two"
    write_feature_corpus(
        data, FeatureCorpusConfig(docs=40, val_docs=10, test_docs=10, images_min=2, images_max=2)
    )
    with pytest.raises(MmlinksError, match=r"no validation document .* has three sentences and three images"):
        fit(small_cfg(data, tmp_path, objective="ap", select_by="val_structure"))


def test_an_in_process_gpu_run_trains_on_the_first_gpu(dataset, tmp_path, monkeypatch):
    """``--workers 0 --gpu``: the config is valid anywhere (a checkpoint's, resumed on another
    machine); the run hands ``cuda:0`` to its worker, which moves the model there before its
    optimizer is built (on the ``meta`` device here: no GPU on this machine)."""
    import training.loop
    from schemas.errors import MmlinksError

    cfg = small_cfg(dataset, tmp_path, num_workers=0, use_gpu=True)
    assert TrainConfig.from_dict(cfg.to_dict()).use_gpu  # no GPU needed to hold the config
    seen = []

    def recording(config, rank, world, prepare_model=None, device=None, checkpoint=None):
        seen.append(device)
        raise RuntimeError("stop here")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(training.loop, "make_worker", recording)
    with pytest.raises(MmlinksError, match="stop here"):
        fit(cfg)
    assert seen == [torch.device("cuda", 0)]
    monkeypatch.undo()
    config, _ = worker_loop_config(check_inputs(small_cfg(dataset, tmp_path, num_workers=0)), "meta-run")
    w = training.loop.make_worker(config, 0, 1, device=torch.device("meta"))
    assert {p.device.type for p in w.model.parameters()} == {"meta"}
    assert {p.device.type for g in w.opt.param_groups for p in g["params"]} == {"meta"}


def test_an_in_process_worker_takes_every_core_unless_told_otherwise(dataset, tmp_path, monkeypatch):
    """Issue #63: ``--workers 0`` trained at one torch thread and left the other cores idle (the
    bare loop ran 1.65x faster at 2 threads on 2 cores). Auto (0) takes every core, or
    OMP_NUM_THREADS where set (Ray sets it in its workers to the CPUs they hold); a number wins."""
    import os

    import training.cores
    import training.loop

    config, _ = worker_loop_config(check_inputs(small_cfg(dataset, tmp_path, num_workers=0)), "threads")
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        training.loop.make_worker(config, 0, 1)
        assert torch.get_num_threads() == len(os.sched_getaffinity(0))
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        training.loop.make_worker(config, 0, 1)
        assert torch.get_num_threads() == 1
        assert training.cores.torch_threads(3) == 3 and training.cores.torch_threads(0) == 1
    finally:
        torch.set_num_threads(before)


def test_invalid_config_is_refused(dataset, tmp_path):
    from schemas.errors import MmlinksError

    with pytest.raises(MmlinksError, match="objective"):
        fit(small_cfg(dataset, tmp_path, objective="cosine"))
    with pytest.raises(MmlinksError, match="objectives"):
        fit(small_cfg(dataset, tmp_path, objective="li2021", objectives="I+D"))
    if not torch.cuda.is_available():  # --workers 0 --gpu trains on this process's GPU: none here
        with pytest.raises(MmlinksError, match=r"--gpu with --workers 0 .*none is visible"):
            fit(small_cfg(dataset, tmp_path, num_workers=0, use_gpu=True))
    with pytest.raises(MmlinksError, match="storage_path"):  # its checkpoints stay on local disk
        fit(small_cfg(dataset, tmp_path, num_workers=0, storage_path="s3://bucket/runs"))
    with pytest.raises(MmlinksError, match="num_workers"):
        fit(small_cfg(dataset, tmp_path, num_workers=-2))


def test_workers_auto_trains_in_this_process_on_one_machine_and_on_ray_where_only_ray_can(capsys):
    """Issue #63: ``--workers 0`` is as fast an epoch as two Ray workers on one machine and
    starts no Ray (117 s against 140 s a command), so auto (the default) takes it; a cluster, a
    remote storage path or retries need Ray Train's workers. A number given is kept, and the
    CLI reads ``auto``."""
    import argparse

    from schemas.config_fields import add_arguments, given
    from training.config import TrainConfig

    def workers(**kw) -> int:
        return TrainConfig(data="d", **kw).num_workers

    assert workers() == 0 and workers(use_gpu=True) == 0
    assert workers(ray_address="10.0.0.1:6379") == workers(max_failures=1) == 2
    assert workers(storage_path="s3://bucket/runs") == 2 and workers(storage_path="/tmp/runs") == 0
    assert workers(num_workers=1) == 1 and workers(num_workers=0, ray_address="auto") == 0
    parser = argparse.ArgumentParser()
    add_arguments(parser, TrainConfig)
    assert given(parser.parse_args(["--workers", "auto"]), TrainConfig)["num_workers"] == -1
    assert given(parser.parse_args(["--workers", "3"]), TrainConfig)["num_workers"] == 3
    with pytest.raises(SystemExit):  # argparse's one line, naming what --workers wants
        parser.parse_args(["--workers", "many"])
    assert "wants a number of workers (0 or more) or 'auto', not 'many'" in capsys.readouterr().err
    # a config resolved here and sent to a cluster (orchestration.ray_jobs) resolves there
    from orchestration.ray_jobs import train_command

    job = train_command(TrainConfig(data="d"), "m", "candidate")
    assert '"num_workers":2' in job[job.index("--config") + 1]


@pytest.mark.slow
def test_in_process_run_is_the_same_run_as_one_ray_worker_and_resumes(dataset, tmp_path, ray_local, trained):
    """``--workers 0`` runs the loop in this process (no Ray Train controller or workers):
    seeded, it trains the same model as one worker process, keeps checkpoints as Ray would (the
    best two by score and the latest, none half-written) and resumes from them."""
    from tests.training.test_objectives_train import _same_run

    storage = tmp_path / "ray"
    first = fit(small_cfg(dataset, tmp_path, num_workers=0, epochs=2))
    assert [h["epoch"] for h in first.history] == [0, 1]
    resumed = fit(small_cfg(dataset, tmp_path, num_workers=0))  # the same run name: continues
    _same_run(trained, resumed)
    losses = {int(h["epoch"]): h["val_loss"] for h in trained.history}
    kept = {f"checkpoint_{e:06d}" for e in [*sorted(losses, key=losses.get)[:2], max(losses)]}
    assert {p.name for p in (storage / "t").iterdir()} == kept
    assert Path(resumed.checkpoint_path).name == f"checkpoint_{resumed.best_epoch:06d}"


@pytest.mark.slow
def test_two_worker_ddp_run_with_mlflow_sqlite_and_registry(dataset, tmp_path, ray_local, monkeypatch):
    secret = "s3cr3t-token-7f2a9c"
    for var in ("MLFLOW_TRACKING_TOKEN", "praw_client_secret", "IMGUR_CLIENT_ID"):
        monkeypatch.setenv(var, secret)
    uri = tracking_uri(tmp_path)
    # batch_docs 3 gives the two workers different numbers of validation batches (a DDP trap)
    cfg = small_cfg(
        dataset,
        tmp_path,
        num_workers=2,
        epochs=2,
        batch_docs=3,
        storage_path=f"{tmp_path}/ray-{secret}",
        image_centring="auto",  # the default: chosen by training candidates in the driver (issue #60)
    )
    with param_digests(ray_local, tmp_path / "digests") as digests:
        res = run_experiment(cfg, uri, model_name="test-model", alias="production")
    # DDP: both ranks hold the same weights after every optimizer step (gradients all-reduced),
    # and the steps change them.
    assert sorted(name.split("-")[0] for name in digests) == ["rank0", "rank1"], digests
    rank0, rank1 = digests.values()
    assert len(rank0) >= 4 and rank0 == rank1
    assert len(set(rank0)) > 1
    assert res.model_uri == "models:/test-model@production"
    client = MlflowClient(uri)
    run = client.get_run(res.run_id)
    assert run.data.params["similarity"] == "ap"
    assert run.data.params["dataset_version"]
    assert len(run.data.params["dataset_manifest_sha256"]) == 64
    assert run.data.params["version.torch"] and run.data.params["git_commit"]
    assert [d.dataset.digest for d in run.inputs.dataset_inputs] == [run.data.params["dataset_version"]]
    # The options as given (auto: -1) and what they resolved to on this dataset (issue #44).
    assert run.data.params["image_centring"] == "auto" and run.data.params["image_dropout"] == "-1.0"
    # issue #60: what the default chose by training its candidates, and each one's score
    chosen = CANDIDATES[run.data.params["choice"]]
    bag = chosen.get("backbone") == "bag"
    assert run.data.params["model.image_centring"] == ("none" if bag else chosen["image_centring"])
    assert float(run.data.params["model.image_dropout"]) == (0.0 if bag else chosen["image_dropout"])
    assert {f"choice_score.{k.replace('+', '_')}" for k in CANDIDATES} <= set(run.data.metrics)
    # what the epoch bar showed before the first epoch (the trials' stages), the last one kept
    assert run.data.tags["mmlinks.stage"] == f"image side chosen: {run.data.params['choice']}"
    assert run.data.params["model.d_multi"] == str(cfg.d_multi)
    # Credentials from the environment (or inside a URI) never reach params, tags or artifacts.
    assert secret not in json.dumps(run.data.params) + json.dumps(run.data.tags)
    mlflow.set_tracking_uri(uri)
    run_files = mlflow.artifacts.download_artifacts(run_id=res.run_id, dst_path=str(tmp_path / "a"))
    model_files = mlflow.artifacts.download_artifacts(
        artifact_uri=res.model_uri, dst_path=str(tmp_path / "m")
    )
    files = [f for root in (run_files, model_files) for f in Path(root).rglob("*") if f.is_file()]
    assert any(f.name == "meta.json" for f in files)  # the checkpoint inside the model was scanned
    for f in files:
        assert secret.encode() not in f.read_bytes(), f
    tags = client.get_model_version("test-model", res.model_version).tags
    assert secret not in json.dumps(tags) + json.dumps(client.get_registered_model("test-model").tags)
    assert {"test_auc", "test_p_at_1", "test_p_at_5", "random_auc"} <= set(run.data.metrics)
    hist = client.get_metric_history(res.run_id, "val_loss")
    assert [m.step for m in hist] == [0, 1]  # one value per epoch, logged by rank 0 only
    # the label-free within-document signal, summed over both workers' validation documents
    within = client.get_metric_history(res.run_id, "val_within")
    assert [m.step for m in within] == [0, 1] and all(m.value >= 0 for m in within)
    structure = client.get_metric_history(res.run_id, "val_structure")  # scale-free, chance subtracted
    assert [m.step for m in structure] == [0, 1] and all(np.isfinite(m.value) for m in structure)
    assert str(client.get_model_version_by_alias("test-model", "production").version) == res.model_version

    # The registered model loads by alias in a fresh process and scores a document.
    code = (
        "import json, sys, mlflow, pandas as pd;"
        f"mlflow.set_tracking_uri({uri!r});"
        "m = mlflow.pyfunc.load_model('models:/test-model@production');"
        "doc = {'sentences': ['a big red star', 'thanks for reading'],"
        " 'image_features': [[0.1]*1280, [0.3]*1280, [0.0]*1280]};"
        "out = m.predict(pd.DataFrame([doc]));"
        "print(json.dumps({'scores': out['scores'][0], 'links': out['links'][0]}))"
    )
    # -P and a foreign cwd: only the installed package is importable, not this checkout
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    scores = np.asarray(out["scores"])
    assert scores.shape == (2, 3) and (np.abs(scores) <= 1 + 1e-6).all()
    assert all(len(link) == 2 for link in out["links"])
    mlflow.set_tracking_uri(None)


def test_the_epoch_progress_bar_reads_the_logged_epochs(capsys):
    from types import SimpleNamespace

    from mlflow.exceptions import MlflowException

    from training.tracking import epoch_progress, poll_epochs

    class Store:
        busy, epochs, tags = False, 2, None

        def get_metric_history(self, run_id, key):
            if self.busy:
                raise MlflowException("database is locked")
            values = {"val_loss": [0.5, 0.25], "val_auc": [60.0, 71.25], "val_within": [0.02, 0.1234]}[key]
            return [SimpleNamespace(value=v) for v in values[: self.epochs]]

        def get_run(self, run_id):
            return SimpleNamespace(data=SimpleNamespace(tags=self.tags or {}))

    store = Store()
    assert poll_epochs(store, "r") == (2, {"val_loss": "0.2500", "val_auc": "71.2", "val_within": "0.123"})
    # before the first epoch: what the run is doing (the image side's trials take minutes, issue #60)
    store.epochs = 0
    assert poll_epochs(store, "r") == (0, {})
    store.tags = {"mmlinks.stage": "choosing the image side: 4 candidates x 3 epochs"}
    assert poll_epochs(store, "r") == (0, {"stage": "choosing the image side: 4 candidates x 3 epochs"})
    store.busy = True
    assert poll_epochs(store, "r") is None  # a busy store only delays the bar
    with epoch_progress("sqlite:///unused.db", "r", 3, enabled=False):
        pass
    assert capsys.readouterr().err == ""  # --json callers: no bar
