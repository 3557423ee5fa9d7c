"""Retrieval objectives in the Dagster layer: cmcm gets model -> evaluation -> production with the
gate's evaluation floor as a blocking check and no linked asset; evaluation and promotion run in
process on a real SQLite MLflow registry (validation MedR / R@10).

The Ray Train fit of ``model_cmcm`` is what ``model_ap`` runs (test_dagster_definitions.py) and
the CLI's slow test runs for cmcm; here the upstream ``dataset`` and ``model_cmcm`` outputs are
produced by two stand-in assets of the same keys writing what the real ones write (a dataset
reference and a registered candidate's reference), so no training runs and the test is cheap."""

from __future__ import annotations

import math

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from orchestration.asset_support import source_partitions
from orchestration.definitions import build_definitions
from orchestration.quality import Thresholds, check_evaluation_floor
from orchestration.resources import MlflowResource, RedditResource, StorageResource, TrainingResource
from orchestration.settings import Settings
from schemas.manifest import Manifest
from tests.models.test_retrieval_serving import register, write_pair_dataset

EVALUATION, PRODUCTION = (dg.AssetKey(f"{k}_cmcm") for k in ("evaluation", "production"))
NAME = "mmlinks-synthetic-cmcm"


def settings(**overrides) -> Settings:
    base = dict(
        sources=["synthetic"],
        objectives={"ap": {"objective": "ap"}, "cmcm": {"objective": "cmcm"}},
        max_retries=0,
        retry_delay_s=0.0,
    )
    return Settings.from_dict({**base, **overrides})


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dagster-retrieval")
    data = write_pair_dataset(tmp / "pairs")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    (tmp / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp / "home")) as instance:
        resources = {
            "storage": StorageResource(root=str(tmp / "data")),
            "mlflow": MlflowResource(tracking_uri=uri),
            "io_manager": dg.FilesystemIOManager(base_dir=str(tmp / "io")),
            # --workers 0: the loop in this process, no Ray Train worker processes
            "training": TrainingResource(storage_path=str(tmp / "ray"), num_workers=0),
            "reddit": RedditResource(dumps=str(tmp / "dumps"), api_base="http://127.0.0.1:9"),
        }
        yield {"tmp": tmp, "data": data, "uri": uri, "instance": instance, "resources": resources}


def stand_in_upstream(env, version: str) -> None:
    """Materialize ``dataset`` and ``model_cmcm`` for partition synthetic as the real assets
    would leave them (their output dicts, through the same IO manager)."""
    parts = source_partitions(settings())
    manifest = Manifest.read(env["data"])
    ref = {"source": "synthetic", "path": str(env["data"]), "dataset_version": manifest.dataset_version}

    @dg.asset(key="dataset", partitions_def=parts)
    def dataset() -> dict:
        return ref

    @dg.asset(key="model_cmcm", partitions_def=parts)
    def model() -> dict:
        return {
            "source": "synthetic",
            "objective": "cmcm",
            "model_name": NAME,
            "model_version": version,
            "run_id": "",
            "dataset_version": manifest.dataset_version,
            "test": {},
            "random": {},
        }

    result = dg.materialize(
        [dataset, model],
        partition_key="synthetic",
        instance=env["instance"],
        resources={"io_manager": env["resources"]["io_manager"]},
    )
    assert result.success


def run(env, defs):
    return dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=[EVALUATION, PRODUCTION],
        partition_key="synthetic",
        instance=env["instance"],
        resources=env["resources"],
        raise_on_error=False,
    )


def test_retrieval_objectives_get_the_promotion_path_but_no_link_job():
    s = settings()
    assert (s.family("cmcm"), s.split_for("cmcm"), s.split_for("ap")) == ("retrieval", "val", "test")
    assert s.link_objectives() == ["ap"]
    defs = build_definitions(s, {})
    keys = {k.to_user_string() for a in defs.assets for k in a.keys}
    assert {"model_cmcm", "evaluation_cmcm", "production_cmcm", "linked_ap"} <= keys
    assert "linked_cmcm" not in keys
    checks = {(k.asset_key.to_user_string(), k.name) for c in defs.asset_checks for k in c.check_keys}
    assert ("evaluation_cmcm", "metrics_above_floor") in checks and (
        "linked_cmcm",
        "link_quality",
    ) not in checks
    [spec] = [c for c in defs.asset_checks if EVALUATION in {k.asset_key for k in c.check_keys}]
    assert "MedR" in next(iter(spec.check_specs)).description
    only = build_definitions(settings(objectives={"cmcm": {"objective": "cmcm"}}), {})
    assert not any(k.path[0] == "linked" for a in only.assets for k in a.keys)


def test_retrieval_floor_rules():
    t = Thresholds(max_medr=5.0, min_r10=40.0)
    assert check_evaluation_floor({"medr": 3.0, "r10": 50.0}, t).passed
    bad = check_evaluation_floor({"medr": 7.0, "r10": 30.0}, t)
    assert (
        not bad.passed
        and "medr 7.0 is above the ceiling 5.0" in bad.description
        and "r10 30.0" in bad.description
    )
    assert not check_evaluation_floor({"medr": math.nan, "r10": 50.0}, t).passed
    assert check_evaluation_floor({"medr": 400.0, "r10": 0.0}, Thresholds()).passed  # off by default


@pytest.mark.slow
def test_cmcm_is_evaluated_on_validation_and_promoted_and_the_check_blocks(env):
    client = MlflowClient(env["uri"])
    v1 = register(env["uri"], env["tmp"], env["data"], seed=0, objective="cmcm", name=NAME)
    stand_in_upstream(env, v1)
    result = run(env, build_definitions(settings(), env["resources"]))
    assert result.success
    evaluation = result.output_for_node("evaluation_cmcm")
    assert evaluation["split"] == "val" and evaluation["pairs"] == 14 and 1 <= evaluation["medr"] <= 14
    [check] = result.get_asset_check_evaluations()
    assert check.passed and "medr" in check.description
    assert str(client.get_model_version_by_alias(NAME, "production").version) == v1

    # A new candidate, and a MedR ceiling it cannot meet: the blocking check stops promotion.
    v2 = register(env["uri"], env["tmp"], env["data"], seed=1, objective="cmcm", name=NAME)
    stand_in_upstream(env, v2)
    strict = build_definitions(settings(thresholds={"max_medr": 0.5}), env["resources"])
    blocked = run(env, strict)
    assert not blocked.success
    [check] = blocked.get_asset_check_evaluations()
    assert not check.passed and "above the ceiling 0.5" in check.description
    assert {e.asset_key for e in blocked.get_asset_materialization_events()} == {EVALUATION}
    assert str(client.get_model_version_by_alias(NAME, "production").version) == v1

    # The gate itself (candidate vs production on val MedR) refuses in the production asset.
    gated = run(env, build_definitions(settings(gate={"max_medr_rise": -1000.0}), env["resources"]))
    assert not gated.success
    text = next(
        e.step_failure_data.user_failure_data.description for e in gated.all_events if e.is_step_failure
    )
    assert f"promotion of {NAME} version {v2} refused: medr" in text
    assert str(client.get_model_version_by_alias(NAME, "production").version) == v1


def test_the_cmcm_model_asset_records_medr_and_recall_as_metadata(env, ray_local):
    """``model_cmcm`` materialized for real (in-process Ray Train on the session's Ray, one epoch
    on the 40-pair dataset, registered in the SQLite store): its asset metadata carries the test
    split's text-to-image MedR, R@1/5/10 and refined MedR, the MLflow run's own figures."""
    key = "cmcm1"  # its own registered model name, apart from the promotion test's
    tiny = {"epochs": 1, "d_shared": 16, "batch_docs": 4, "word_vectors": "random", "min_word_count": 1}
    small = {
        "min_documents": 40,
        "min_split_documents": {"train": 8, "val": 2, "test": 2},
    }  # 8 / 14 / 18 pairs
    s = settings(
        objectives={key: {"objective": "cmcm", "pool_size": 10, "n_pools": 2, **tiny}}, thresholds=small
    )
    manifest = Manifest.read(env["data"])
    ref = {"source": "synthetic", "path": str(env["data"]), "dataset_version": manifest.dataset_version}

    @dg.asset(key="dataset", partitions_def=source_partitions(s))
    def dataset() -> dict:
        return ref

    io = {"io_manager": env["resources"]["io_manager"]}
    upstream = dg.materialize([dataset], partition_key="synthetic", instance=env["instance"], resources=io)
    assert upstream.success
    defs = build_definitions(s, env["resources"])
    model_key = dg.AssetKey(f"model_{key}")
    result = dg.materialize(
        defs.assets,
        selection=[model_key],
        partition_key="synthetic",
        instance=env["instance"],
        resources=env["resources"],
    )
    assert result.success
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == model_key]
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    run = MlflowClient(env["uri"]).get_run(meta["mlflow_run_id"])
    for name in ("test_medr", "test_r1", "test_r5", "test_r10", "test_refined_medr"):
        assert meta[name] == pytest.approx(run.data.metrics[name]), name
    assert 1 <= meta["test_medr"] <= 10 and 0 <= meta["test_r1"] <= meta["test_r5"] <= meta["test_r10"] <= 100
    assert "test_auc" not in meta and meta["model_name"] == f"mmlinks-synthetic-{key}"
    output = result.output_for_node(f"model_{key}")
    assert output["test"]["t2i"]["medr"] == meta["test_medr"] and output["test"]["t2i"]["pool_size"] == 10
