"""archive_index_news in Dagster, in process: the production news model of a real MLflow SQLite
registry and the current dataset version give a versioned FAISS index that the served model
accepts; a news objective gets no linked/ asset or link check. A random model, no Ray fit."""

import json
import shutil

import dagster as dg
import mlflow
import pytest
from mlflow.tracking import MlflowClient

from archive.index import ArchiveIndex
from models.news_packaging import package_news_run
from orchestration.definitions import build_definitions
from orchestration.resources import MlflowResource, RedditResource, StorageResource, TrainingResource
from schemas.manifest import Manifest
from tests.orchestration.test_dagster_definitions import failures, materialize, settings
from tests.training.news.helpers import news_checkpoint, write_news_dataset
from training.tracking import configure

ARCHIVE = dg.AssetKey("archive_index_news")
MODEL_NAME = "mmlinks-news-jsonl-news"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dagster-news")
    data, docs = write_news_dataset(tmp / "data" / "datasets" / "news-jsonl")
    ckpt, vocab = news_checkpoint(tmp / "ckpt", docs)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=configure(uri, "news-archive-tests"))
    from training.checkpoints import load_checkpoint_model

    net = load_checkpoint_model(ckpt)[0]
    with mlflow.start_run() as run:  # what the experiment does after a news fit
        model_uri = package_news_run(str(ckpt), net, vocab, str(data), Manifest.read(data), run.info.run_id)
    version = mlflow.register_model(model_uri, MODEL_NAME).version
    MlflowClient(uri).set_registered_model_alias(MODEL_NAME, "production", version)
    mlflow.set_tracking_uri(None)
    (tmp / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp / "home")) as instance:
        resources = {
            "storage": StorageResource(root=str(tmp / "data")),
            "mlflow": MlflowResource(tracking_uri=uri),
            "training": TrainingResource(storage_path=str(tmp / "ray"), num_workers=1),  # unused here
            "reddit": RedditResource(dumps=str(tmp / "dumps"), api_base="http://127.0.0.1:9"),  # unused here
            "io_manager": dg.FilesystemIOManager(base_dir=str(tmp / "io")),
        }
        yield {
            "tmp": tmp,
            "instance": instance,
            "resources": resources,
            "run_id": run.info.run_id,
            "version": version,
        }
    shutil.rmtree(tmp / "io", ignore_errors=True)


def news_settings(**extra):
    limits = {"min_documents": 10, "min_split_documents": {"train": 5, "val": 2, "test": 2}}
    return settings(
        sources=["news-jsonl"], objectives={"news": {"objective": "news"}}, thresholds=limits, **extra
    )


def test_the_packaged_run_serves_its_whole_dataset_as_the_archive(env):
    import pandas as pd

    uri = env["resources"]["mlflow"].uri()
    mlflow.set_tracking_uri(uri)
    try:
        model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@production")
    finally:
        mlflow.set_tracking_uri(None)
    assert len(model.unwrap_python_model().archive) == 10  # every split's distinct photos
    out = model.predict(pd.DataFrame([{"language": "en", "headline": "red storm"}]), params={"top_k": 10})
    assert len(out["image_ids"][0]) == 10


def test_the_archive_index_of_the_production_news_model_is_built_and_versioned(env):
    defs = build_definitions(news_settings(), env["resources"])
    keys = {k.to_user_string() for a in defs.assets for k in a.keys}
    assert "archive_index_news" in keys and "linked_news" not in keys
    assert not [c for c in defs.asset_checks if any(k.name == "link_quality" for k in c.check_keys)]
    result = materialize(env, defs, [ARCHIVE], "news-jsonl")
    assert result.success, failures(result)
    value = result.output_for_node("archive_index_news")
    assert value["images"] == 10 and value["model_version"] == str(env["version"])  # every split's photos
    assert value["run_id"] == env["run_id"] and value["path"].endswith(
        f"{env['version']}@{value['dataset_version']}"
    )
    index = ArchiveIndex.load(value["path"])
    assert len(index) == 10 and index.info["run_id"] == env["run_id"]
    assert (
        json.loads(
            (env["tmp"] / "data" / "archive" / "news-jsonl" / "news")
            .joinpath(value["path"].rsplit("/", 1)[-1], "index.json")
            .read_text()
        )["kind"]
        == "flat"
    )
    # an archive of millions of images takes an approximate kind from the settings
    defs = build_definitions(news_settings(archive_index_kind="ivf"), env["resources"])
    result = materialize(env, defs, [ARCHIVE], "news-jsonl")
    assert result.success, failures(result)
    assert result.output_for_node("archive_index_news")["kind"] == "ivf"
    assert ArchiveIndex.load(value["path"]).kind == "ivf" and len(ArchiveIndex.load(value["path"])) == 10


def test_without_a_production_model_the_asset_fails_with_the_cause(env):
    client = MlflowClient(env["resources"]["mlflow"].uri())
    client.delete_registered_model_alias(MODEL_NAME, "production")
    try:
        result = materialize(
            env, build_definitions(news_settings(), env["resources"]), [ARCHIVE], "news-jsonl"
        )
        assert not result.success
        assert "archive_index news on news-jsonl" in failures(result)["archive_index_news"]
    finally:
        client.set_registered_model_alias(MODEL_NAME, "production", env["version"])


def test_the_asset_builds_the_compressed_kind_and_versions_it_next_to_the_model(env, monkeypatch):
    """ivfpq (issue #38) through the asset: the index's version and fingerprint in the asset's
    metadata and as tags of the model version; a withdrawn image bumps the version, which the
    next materialisation of the same model and dataset reports without rebuilding."""
    import pandas as pd

    from models.news_serving import ARCHIVE_ENV

    defs = build_definitions(news_settings(archive_index_kind="ivfpq"), env["resources"])
    result = materialize(env, defs, [ARCHIVE], "news-jsonl")
    assert result.success, failures(result)
    value = result.output_for_node("archive_index_news")
    index = ArchiveIndex.load(value["path"], mmap=True)
    assert value["kind"] == index.kind == "ivfpq" and len(index) == value["images"] == 10
    assert value["index_version"] == index.version == 1 and value["fingerprint"] == index.fingerprint
    meta = result.asset_materializations_for_node("archive_index_news")[0].metadata
    assert meta["index_version"].value == 1 and meta["index_fingerprint"].value == index.fingerprint
    assert meta["deleted_images"].value == 0 and meta["index_size_mb"].value > 0
    uri = env["resources"]["mlflow"].uri()
    tags = MlflowClient(uri).get_model_version(MODEL_NAME, env["version"]).tags
    assert tags["archive_index_version"] == "1" and tags["archive_index_fingerprint"] == index.fingerprint
    assert tags["archive_index_path"] == value["path"]
    # the calibrated search settings too: a re-calibration changes this one, not the fingerprint
    assert tags["archive_index_search_fingerprint"] == index.search_fingerprint != index.fingerprint
    assert meta["index_search_fingerprint"].value == index.search_fingerprint

    writable = ArchiveIndex.load(value["path"])
    gone = writable.ids[0]
    writable.delete([gone])
    writable.save(value["path"])
    monkeypatch.setenv(ARCHIVE_ENV, value["path"])  # the served model takes the folder, mapped
    mlflow.set_tracking_uri(uri)
    try:
        model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@production")
    finally:
        mlflow.set_tracking_uri(None)
    served = model.unwrap_python_model().archive
    assert served.kind == "ivfpq" and served.mmapped and len(served) == 9
    out = model.predict(pd.DataFrame([{"language": "en", "headline": "red storm"}]), params={"top_k": 10})
    assert len(out["image_ids"][0]) == 9 and gone not in out["image_ids"][0]

    again = materialize(env, defs, [ARCHIVE], "news-jsonl")
    assert again.success, failures(again)
    meta = again.asset_materializations_for_node("archive_index_news")[0].metadata
    assert meta["index_version"].value == 2 and meta["deleted_images"].value == 1
    assert meta["images"].value == 9
