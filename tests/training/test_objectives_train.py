"""The objective registry in the training loop: every objective trains, bad documents are
skipped and counted, a diverging loss stops with the last good checkpoint kept, and a killed
worker or a restarted job resumes to the same result as an uninterrupted run."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.shards import read_table, table_shard_bytes
from tests.conftest import resign_manifest, small_train_config, tracking_uri
from training.checkpoints import IncompatibleResumeError, check_resumable
from training.config import TrainConfig
from training.data import TRAINING_COLUMNS, one_pair_per_document
from training.driver import fit
from training.epoch_batches import drop_empty


def val_table(dataset) -> pa.Table:
    paths = Manifest.read(dataset).shard_paths(dataset, "val")
    return read_table(paths, columns=TRAINING_COLUMNS)


def test_nostruct_keeps_one_sentence_one_image_and_only_their_link(dataset):
    table = val_table(dataset)
    for rng in (np.random.default_rng(1), None):
        out = one_pair_per_document(table, rng)
        assert out.num_rows == table.num_rows
        for before, after in zip(table.to_pylist(), out.to_pylist(), strict=True):
            assert len(after["sentences"]) == 1 and len(after["images"]) == 1
            s = before["sentences"].index(after["sentences"][0])
            i = [im["content_id"] for im in before["images"]].index(after["images"][0]["content_id"])
            linked = any(d["sentence"] == s and d["image"] == i for d in before["links"])
            assert after["links"] == ([{"sentence": 0, "image": 0}] if linked else [])
    # validation draws are fixed by the document id; training draws change with the generator
    assert one_pair_per_document(table, None).equals(one_pair_per_document(table, None))
    draws = {
        str(one_pair_per_document(table, np.random.default_rng(seed)).column("sentences").to_pylist())
        for seed in range(4)
    }
    assert len(draws) > 1


def test_documents_without_sentences_or_images_are_dropped_and_counted(dataset):
    table = val_table(dataset).slice(0, 4)
    rows = table.to_pylist()
    rows[1]["sentences"] = []
    rows[3]["images"] = []
    bad = pa.Table.from_pylist(rows, schema=table.schema)
    kept, skipped = drop_empty(bad)
    assert skipped == 2
    assert kept.column("doc_id").to_pylist() == [rows[0]["doc_id"], rows[2]["doc_id"]]


def test_shards_without_any_image_are_refused_with_one_line(dataset, tmp_path):
    from training.driver import training_feature_stats

    src = pq.read_table(Manifest.read(dataset).shard_paths(dataset, "val")[0])
    rows = src.to_pylist()
    for r in rows:
        r["images"], r["links"] = [], []
    path = tmp_path / "no-images.parquet"
    table = pa.Table.from_pylist(rows, schema=src.schema)
    pq.write_table(table, path)
    with pytest.raises(MmlinksError, match="hold no image"):
        training_feature_stats([str(path)])


def test_failure_message_names_the_worker_error():
    from training.ray_session import failure_message

    text = (
        "Training failed due to worker errors:\n\n[Rank 0] Traceback (most recent call last):\n"
        '  File "x.py", line 3, in f\n    raise ValueError("bad")\nValueError: shard x is broken\n'
    )
    assert failure_message(RuntimeError(text)) == "ValueError: shard x is broken"
    assert failure_message(RuntimeError("x\nDivergedError: loss diverged (nan) at epoch 2")) == (
        "loss diverged (nan) at epoch 2"
    )


def test_resume_refuses_a_config_that_changes_the_model():
    saved = TrainConfig(data="d", objective="ap", d_multi=32, run_name="r").public_dict()
    check_resumable(saved, TrainConfig(data="d", objective="ap", d_multi=32, epochs=9, run_name="r"))
    with pytest.raises(IncompatibleResumeError, match=r"objective='ap' \(asked 'dc'\).*new --run-name"):
        check_resumable(saved, TrainConfig(data="d", objective="dc", d_multi=32, run_name="r"))
    # configs written before objectives existed name the similarity
    legacy = {k: v for k, v in saved.items() if k != "objective"}
    check_resumable(legacy, TrainConfig(data="d", objective="ap", d_multi=32, run_name="r"))


def test_resume_refuses_a_checkpoint_trained_before_a_default_changed():
    """A cmca run started with random batches and margin 0.3 (the defaults before issue #45) is
    not continued under today's: its next epoch would not be the one it would have trained."""
    saved = TrainConfig(
        data="d", objective="cmca", batch_sampling="random", retrieval_margin=0.3, run_name="r"
    ).public_dict()
    with pytest.raises(IncompatibleResumeError, match=r"batch_sampling='random' \(asked 'similar'\)"):
        check_resumable(saved, TrainConfig(data="d", objective="cmca", run_name="r"))
    with pytest.raises(IncompatibleResumeError, match=r"retrieval_margin=0.3 \(asked 0.5\)"):
        check_resumable(saved, TrainConfig(data="d", objective="cmca", batch_sampling="random", run_name="r"))
    check_resumable(
        saved,
        TrainConfig(data="d", objective="cmca", batch_sampling="random", retrieval_margin=0.3, run_name="r"),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        {"objective": "nostruct"},
        {"objective": "dc", "negatives": "mean", "cache_data": "no"},  # streamed every epoch
        {"objective": "tk", "k": "half"},
        {"objective": "ap", "k": "half"},
        {"objective": "li2021", "objectives": "C+I+D"},
    ],
    ids=lambda o: "-".join(str(v) for v in o.values()),
)
def test_every_objective_trains(dataset, tmp_path, ray_local, overrides):
    res = fit(small_train_config(dataset, tmp_path / "ray", epochs=1, **overrides))
    (epoch,) = res.history
    assert np.isfinite(epoch["train_loss"]) and np.isfinite(epoch["val_loss"])
    assert 0 <= epoch["val_auc"] <= 100 and epoch["skipped_docs"] == 0
    assert 0 <= epoch["data_wait_frac"] <= 1 and epoch["epoch_start_s"] >= 0
    if overrides.get("objectives") == "C+I+D":
        assert {"train_loss_C", "train_loss_I", "train_loss_D"} <= set(epoch)


def _weights(model) -> dict:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _same_run(a, b) -> None:
    assert [h["epoch"] for h in a.history] == [h["epoch"] for h in b.history]
    np.testing.assert_allclose(
        [h["val_loss"] for h in a.history], [h["val_loss"] for h in b.history], rtol=1e-6
    )
    assert a.best_epoch == b.best_epoch
    wa, wb = _weights(a.model), _weights(b.model)
    for k in wa:
        np.testing.assert_allclose(wa[k], wb[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.slow
def test_killed_worker_resumes_and_a_restarted_job_continues_to_the_uninterrupted_result(
    dataset, tmp_path, ray_local, trained, monkeypatch
):
    """A killed worker and a restarted job, in one chain of Ray Train runs (each run pays
    ~30 s of fixed start-up on 2 cores, whatever its epochs): the first run's worker is
    SIGKILLed after epoch 0 and Ray Train restarts it from that checkpoint; the job then
    refuses a config that changes the model, and restarted with the same run name continues
    from epoch 1's checkpoint. Both must end where `trained` (the same config, never
    interrupted) does: epochs 0-1 after the worker's restart, and the whole run after the job's."""
    storage, marker = tmp_path / "ray", tmp_path / "killed"
    with monkeypatch.context() as m:
        m.setenv("MMLINKS_TEST_KILL_AT_EPOCH", "0")
        m.setenv("MMLINKS_TEST_KILL_MARKER", str(marker))
        first = fit(small_train_config(dataset, storage, epochs=2, max_failures=1, num_workers=1))
    assert marker.read_text() == "0"  # the worker really died after epoch 0
    assert [h["epoch"] for h in first.history] == [0, 1]
    np.testing.assert_allclose(
        [h["val_loss"] for h in first.history], [h["val_loss"] for h in trained.history[:2]], rtol=1e-6
    )
    with pytest.raises(MmlinksError, match=r"cannot resume run 't'.*objective='ap' \(asked 'dc'\)"):
        fit(small_train_config(dataset, storage, epochs=3, objective="dc", num_workers=1))
    resumed = fit(small_train_config(dataset, storage, epochs=3, num_workers=1))  # same run name: continues
    _same_run(resumed, trained)


def _poison_train_features(data: Path) -> None:
    for path in Manifest.read(data).shard_paths(data, "train"):
        table = read_table([path])
        rows = table.to_pylist()
        for im in rows[0]["images"]:
            im["features"] = [float("nan")] * len(im["features"])
        path.write_bytes(table_shard_bytes(pa.Table.from_pylist(rows, schema=table.schema)))
    resign_manifest(data)  # poisoned on purpose: a rewrite the manifest knows of


@pytest.mark.slow
def test_a_diverging_loss_stops_the_run_and_keeps_the_last_good_checkpoint(dataset, tmp_path, ray_local):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(dataset, data)
    storage = tmp_path / "ray"
    fit(small_train_config(data, storage, epochs=1))
    _poison_train_features(data)  # a shard corrupted between two runs
    with pytest.raises(
        MmlinksError, match=r"loss diverged \(nan\) at epoch 1 .*last good checkpoint is epoch 0"
    ):
        fit(small_train_config(data, storage, epochs=2))
    kept = sorted((storage / "t").glob("checkpoint_*"))
    assert kept, "the good checkpoint of epoch 0 must stay"


@pytest.mark.slow
def test_a_test_split_without_labels_is_not_evaluated_but_the_model_is_registered(
    dataset, tmp_path, ray_local
):
    import shutil

    from mlflow.tracking import MlflowClient

    from models.experiment import run_experiment

    data = tmp_path / "data"
    shutil.copytree(dataset, data)
    for path in Manifest.read(data).shard_paths(data, "test"):  # an unlabelled corpus's test split
        table = pq.read_table(path)
        i = table.schema.get_field_index("links")
        pq.write_table(
            table.set_column(i, table.schema.field(i), pa.nulls(table.num_rows, table.schema.field(i).type)),
            path,
        )
    resign_manifest(data)
    uri = tracking_uri(tmp_path)
    res = run_experiment(
        small_train_config(data, tmp_path / "ray", epochs=1), uri, model_name="m", alias="candidate"
    )
    assert res.test is None and res.random is None
    client = MlflowClient(uri)
    assert "test_auc" not in client.get_run(res.run_id).data.metrics
    assert "no labelled document" in client.get_run(res.run_id).data.tags["mmlinks.test"]
    assert str(client.get_model_version_by_alias("m", "candidate").version) == res.model_version
