"""linked_<objective> in Dagster: the sensor asks for a link run when a dataset version is there
and again when the production alias moves; the asset links in-process with real Beam and a real
MLflow SQLite registry, records the model version and counts, and its blocking check holds the
link rate within bounds."""

import shutil

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from orchestration.definitions import build_definitions
from orchestration.resources import MlflowResource, RedditResource, StorageResource, TrainingResource
from schemas.links import LinkManifest
from schemas.manifest import Manifest
from tests.conftest import tracking_uri
from tests.linking.conftest import register_model
from tests.orchestration.test_dagster_definitions import failures, materialize, settings

LINKED = dg.AssetKey("linked_ap")
MODEL_NAME = "mmlinks-synthetic-ap"

pytestmark = pytest.mark.slow  # a registered model and a Beam link job per test


@pytest.fixture(scope="module")
def env(dataset, tmp_path_factory):
    """A storage root holding the session dataset as the synthetic source's current version, and
    an MLflow store whose mmlinks-synthetic-ap has a production version."""
    tmp = tmp_path_factory.mktemp("dagster-link")
    shutil.copytree(
        dataset, tmp / "data" / "datasets" / "synthetic", ignore=shutil.ignore_patterns("image-store")
    )
    (tmp / "home").mkdir()
    register_model(tmp, dataset, seed=0, name=MODEL_NAME)
    with dg.instance_for_test(temp_dir=str(tmp / "home")) as instance:
        resources = {
            "storage": StorageResource(root=str(tmp / "data")),
            "mlflow": MlflowResource(tracking_uri=tracking_uri(tmp)),
            "training": TrainingResource(storage_path=str(tmp / "ray"), num_workers=1),  # unused here
            "reddit": RedditResource(dumps=str(tmp / "dumps"), api_base="http://127.0.0.1:9"),  # unused here
            "io_manager": dg.FilesystemIOManager(base_dir=str(tmp / "io")),
        }
        yield {"tmp": tmp, "instance": instance, "resources": resources, "dataset": dataset}


def sensor_requests(defs, name: str, env: dict, cursor: str | None = None):
    """One tick of a sensor that takes resources (the storage root and the MLflow store)."""
    ctx = dg.build_sensor_context(
        instance=env["instance"], cursor=cursor, definitions=defs, resources=env["resources"]
    )
    data = defs.get_sensor_def(name).evaluate_tick(ctx)
    return data.run_requests or [], data.cursor


def link_settings(**thresholds):
    limits = {"min_documents": 10, "min_split_documents": {"train": 5, "val": 2, "test": 2}, **thresholds}
    return settings(sources=["synthetic"], link={"direct_workers": 1}, thresholds=limits)


def test_the_sensor_links_a_dataset_and_again_when_the_production_alias_moves(env):
    defs = build_definitions(link_settings(), env["resources"])
    version = Manifest.read(env["dataset"]).dataset_version
    requests, cursor = sensor_requests(defs, "linking_sensor", env)
    assert [(r.partition_key, r.asset_selection, r.run_key) for r in requests] == [
        ("synthetic", [LINKED], f"link-ap-synthetic-1@{version}")
    ]
    assert requests[0].job_name in (None, "link_job")
    again, cursor = sensor_requests(defs, "linking_sensor", env, cursor)
    assert again == []  # nothing moved

    # A promotion (or a rollback) moves the alias: the sensor asks for the new version's links.
    v2 = register_model(env["tmp"], env["dataset"], seed=1, name=MODEL_NAME, alias=None)
    MlflowClient(env["resources"]["mlflow"].tracking_uri).set_registered_model_alias(
        MODEL_NAME, "production", v2
    )
    moved, cursor = sensor_requests(defs, "linking_sensor", env, cursor)
    assert [r.run_key for r in moved] == [f"link-ap-synthetic-{v2}@{version}"]
    assert moved[0].tags["mmlinks/model_version"] == v2
    assert sensor_requests(defs, "linking_sensor", env, cursor)[0] == []


def test_the_linked_asset_records_the_model_version_and_counts_and_checks_the_link_rate(env):
    defs = build_definitions(link_settings(), env["resources"])
    production = MlflowClient(env["resources"]["mlflow"].tracking_uri).get_model_version_by_alias(
        MODEL_NAME, "production"
    )
    result = materialize(env, defs, [LINKED], "synthetic")
    assert result.success, failures(result)
    [event] = result.get_asset_materialization_events()
    meta = event.materialization.metadata
    assert meta["model_version"].value == str(production.version)
    assert meta["dataset_version"].value == Manifest.read(env["dataset"]).dataset_version
    assert meta["documents_linked"].value == sum(Manifest.read(env["dataset"]).counts["splits"].values())
    assert 0 < meta["link_rate"].value <= 1
    [check] = result.get_asset_check_evaluations()
    assert check.check_name == "link_quality" and check.passed
    links = LinkManifest.read(env["tmp"] / "data" / "linked" / "synthetic" / "ap")
    assert links.model.version == str(production.version) and links.model.uri.endswith("@production")

    # Bounds no model can meet: the blocking check fails the run, naming the rule.
    strict = build_definitions(link_settings(max_link_rate=0.01), env["resources"])
    result = materialize(env, strict, [LINKED], "synthetic")
    assert not result.success
    [check] = result.get_asset_check_evaluations()
    assert not check.passed and "outside [5.0%, 1.0%]" in check.description
