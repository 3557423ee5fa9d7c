"""The Dagster layer, in-process: definitions load and validate, the synthetic corpus goes
synth -> build (real Beam) -> train (real Ray Train) -> evaluate -> promote (real MLflow SQLite
registry), failing checks and a bad cluster address stop the right asset with the cause, and the
schedule, sensors and monthly DIY partitions do what automation needs."""

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from orchestration.definitions import build_definitions
from orchestration.resources import MlflowResource, RedditResource, StorageResource, TrainingResource
from orchestration.settings import Settings
from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from tests.conftest import free_port, tracking_uri

ROOT = Path(__file__).resolve().parents[2]
MODEL, EVALUATION, PRODUCTION = (dg.AssetKey(f"{k}_ap") for k in ("model", "evaluation", "production"))
DATASET_CHECKS = {
    "schema_version",
    "min_documents",
    "split_sizes",
    "duplicate_rate",
    "dead_letter_rate",
    "feature_dim",
}


def settings(**overrides) -> Settings:
    """Small and fast: 30 synthetic documents, one in-process Beam worker, one tiny epoch. Such a
    model need not beat Random on 4 test documents, so the floors are off unless a test sets them."""
    base = dict(
        sources=["synthetic", "diy"],
        objectives={"ap": {"objective": "ap"}},
        train_base={
            "epochs": 1,
            "d_multi": 32,
            "batch_docs": 4,
            "lr": 3e-3,
            "min_word_count": 1,
            "word_vectors": "random",
        },
        synthetic={"docs": 30, "seed": 1, "image_size": 64},
        build_options={"*": {"direct_workers": 1, "split_ratios": {"train": 0.6, "val": 0.2, "test": 0.2}}},
        thresholds={
            "min_documents": 10,
            "min_split_documents": {"train": 5, "val": 2, "test": 2},
            "min_test_auc": 0,
            "min_auc_over_random": -100,
        },
        gate={"max_auc_drop": 100.0, "max_p_at_1_drop": 100.0},
        max_retries=1,
        retry_delay_s=0.1,
    )
    base.update(overrides)
    return Settings.from_dict(base)


@pytest.fixture(scope="module")
def env(tmp_path_factory, ray_local):
    """One Dagster instance, IO-manager folder, data root and MLflow store for the module."""
    tmp = tmp_path_factory.mktemp("dagster")
    (tmp / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp / "home")) as instance:
        resources = {
            "storage": StorageResource(root=str(tmp / "data")),
            "mlflow": MlflowResource(tracking_uri=tracking_uri(tmp)),
            # --workers 0: the loop in the Dagster process, no Ray Train worker processes
            "training": TrainingResource(storage_path=str(tmp / "ray"), num_workers=0),
            "reddit": RedditResource(dumps=str(tmp / "dumps"), api_base="http://127.0.0.1:9"),
            "io_manager": dg.FilesystemIOManager(base_dir=str(tmp / "io")),
        }
        yield {"tmp": tmp, "instance": instance, "resources": resources}


def materialize(env, defs: dg.Definitions, selection, partition: str, resources: dict | None = None):
    return dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=selection,
        partition_key=partition,
        instance=env["instance"],
        resources={**env["resources"], **(resources or {})},
        raise_on_error=False,
    )


def failures(result) -> dict[str, str]:
    """step key -> the failure text Dagster shows (description and error message)."""
    out = {}
    for event in result.all_events:
        if event.is_step_failure:
            data = event.step_failure_data
            text = data.error.message if data.error else ""
            if data.user_failure_data and data.user_failure_data.description:
                text = data.user_failure_data.description + " | " + text
            out[event.step_key] = text
    return out


def materialized(result) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def sensor_requests(defs, name: str, instance, cursor: str | None = None):
    sensor = defs.get_sensor_def(name)
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
    data = sensor.evaluate_tick(ctx)
    return data.run_requests or [], data.cursor


def latest_storage_id(instance, key: dg.AssetKey) -> int:
    records = instance.fetch_materializations(key, limit=1).records
    return records[0].storage_id if records else 0


# ------------------------------------------------------------------------------ definitions


def test_definitions_hold_every_asset_check_job_schedule_and_sensor():
    defs = build_definitions(
        settings(objectives={"ap": {"objective": "ap"}, "nostruct": {"objective": "nostruct"}})
    )
    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {
        "diy_submissions",
        "raw_snapshot",
        "dataset",
        *(
            f"{kind}_{o}"
            for kind in ("model", "evaluation", "production", "linked")
            for o in ("ap", "nostruct")
        ),
    }
    checks = {(c.asset_key.to_user_string(), c.name) for c in defs.resolve_asset_graph().asset_check_keys}
    assert {name for asset, name in checks if asset == "dataset"} == DATASET_CHECKS
    assert ("evaluation_ap", "metrics_above_floor") in checks and (
        "evaluation_nostruct",
        "metrics_above_floor",
    ) in checks
    assert ("linked_ap", "link_quality") in checks
    assert {j.name for j in defs.jobs} >= {
        "diy_crawl_job",
        "rebuild_job",
        "train_job",
        "promote_job",
        "link_job",
    }
    assert [s.name for s in defs.schedules] == ["weekly_diy_crawl"]
    assert {s.name for s in defs.sensors} == {
        "diy_rebuild_sensor",
        "training_sensor",
        "promotion_sensor",
        "linking_sensor",
    }
    graph = defs.resolve_asset_graph()
    # lineage: raw -> dataset -> model -> evaluation -> production, and the monthly DIY snapshots
    assert dg.AssetKey("diy_submissions") in graph.get(dg.AssetKey("raw_snapshot")).parent_keys
    assert dg.AssetKey("dataset") in graph.get(MODEL).parent_keys
    assert MODEL in graph.get(EVALUATION).parent_keys and EVALUATION in graph.get(PRODUCTION).parent_keys
    assert graph.get(dg.AssetKey("linked_ap")).parent_keys == {dg.AssetKey("dataset"), PRODUCTION}
    # training and promotion jobs carry the blocking checks of what they materialize
    train = defs.resolve_job_def("train_job")
    assert (
        dg.AssetCheckKey(EVALUATION, "metrics_above_floor") in train.asset_layer.asset_graph.asset_check_keys
    )
    assert all(spec.blocking for checks_def in defs.asset_checks for spec in checks_def.check_specs)


def two_objectives() -> dg.Definitions:
    return build_definitions(
        settings(objectives={"ap": {"objective": "ap"}, "nostruct": {"objective": "nostruct"}})
    )


def test_the_asset_graph_labels_tell_every_asset_apart():
    """The UI labels an asset's box with its key's last component only: with keys model/ap and
    evaluation/ap the training group showed ap, ap, nostruct, nostruct (issue #46)."""
    labels = [k.path[-1] for k in two_objectives().resolve_asset_graph().get_all_asset_keys()]
    assert len(labels) == len(set(labels)), sorted(labels)
    assert {"model_ap", "evaluation_ap", "model_nostruct", "evaluation_nostruct"} <= set(labels)


def test_docs_name_every_job_schedule_and_sensor_and_where_the_data_goes():
    """docs/orchestration.md's "UI on a laptop" names what the UI shows (it promised four jobs and
    three sensors while there were five and four) and the variable that moves the data."""
    text = (ROOT / "docs" / "orchestration.md").read_text()
    laptop = text.split("## The UI on a laptop", 1)[1].split("\n## ", 1)[0]
    defs = two_objectives()
    names = [j.name for j in defs.jobs if not j.name.startswith("__")]
    names += [s.name for s in defs.schedules] + [s.name for s in defs.sensors]
    missing = [n for n in names if f"`{n}`" not in laptop]
    assert not missing, f"the UI section does not name {missing}"
    counts = {"jobs": len(defs.jobs), "sensors": len(defs.sensors)}
    for kind, n in counts.items():
        for word, wrong in enumerate(["no", "one", "two", "three", "four", "five", "six", "seven"]):
            if word != n:
                assert f"{wrong} {kind}" not in laptop, f"the UI section says {wrong} {kind}; there are {n}"
    assert "MMLINKS_DATASETS_URI" in laptop


def test_module_defs_load_from_the_environment(monkeypatch):
    monkeypatch.setenv("MMLINKS_OBJECTIVES", json.dumps({"dc": {"objective": "dc", "negatives": "mean"}}))
    monkeypatch.setenv("MMLINKS_SOURCES", "synthetic,recipeqa")
    monkeypatch.setenv("MMLINKS_RAY_ADDRESS", "http://ray-head:8265")
    defs = build_definitions()
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert "model_dc" in keys and "model_ap" not in keys
    assert not defs.schedules  # no diy partition, no DIY schedule
    assert defs.get_job_def("rebuild_job").partitions_def.get_partition_keys() == ["synthetic", "recipeqa"]


def test_settings_refuse_typos_before_anything_runs(monkeypatch):
    with pytest.raises(MmlinksError, match=r"unknown TrainConfig field.*epochz"):
        settings(objectives={"ap": {"objective": "ap", "epochz": 3}})
    with pytest.raises(MmlinksError, match="objective"):
        settings(objectives={"x": {"objective": "cosine"}})
    with pytest.raises(MmlinksError, match="unknown source"):
        settings(sources=["synthetic", "reddit-all"])
    with pytest.raises(MmlinksError, match="unknown threshold"):
        settings(thresholds={"min_docs": 3})
    with pytest.raises(MmlinksError, match=r"archive_index_kind 'annoy'.*known: flat, hnsw, ivf, pq, ivfpq"):
        settings(archive_index_kind="annoy")
    monkeypatch.setenv("MMLINKS_OBJECTIVES", "{not json")
    with pytest.raises(MmlinksError, match="MMLINKS_OBJECTIVES is not JSON"):
        Settings.from_env()


def test_the_beam_runner_setting_picks_dask_for_builds_and_link_jobs():
    address = "tcp://mmlinks-dask-scheduler:8786"
    s = settings(beam_runner={"runner": "dask", "dask_address": address})
    build = s.build_config_options("synthetic")
    assert build["runner"] == "dask" and build["dask_address"] == address
    link = s.link_config("data", "models:/m@production", "out")
    assert (link.runner, link.dask_address, link.workers()) == ("DaskRunner", address, None)
    with pytest.raises(MmlinksError, match="beam_runner may set"):
        settings(beam_runner={"runer": "dask"})
    with pytest.raises(MmlinksError, match=r"build_options for synthetic: .*dask_address"):
        settings(beam_runner={"runner": "dask", "dask_address": "nowhere"})


def test_refusals_skip_the_retry_policy_and_network_hiccups_keep_it():
    from orchestration.asset_support import failures_explained

    def failure(cause: Exception) -> dg.Failure:
        with pytest.raises(dg.Failure) as err, failures_explained("dataset diy"):
            raise MmlinksError("the Reddit API failed") from cause
        return err.value

    assert failure(ConnectionError("connection reset")).allow_retries
    refused = failure(ValueError("401"))
    assert not refused.allow_retries and refused.description == "dataset diy: the Reddit API failed"


@pytest.mark.slow
def test_dagster_definitions_validate_from_the_repository_root(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMLINKS_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(home), MMLINKS_DAGSTER_CONFIG=str(ROOT / "orchestration/dagster-local.json"))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Validation successful for code location mmlinks" in out


def test_loading_the_code_location_prints_no_library_warnings(tmp_path):
    """Beam's optional-dependency checks log at import ("Failed to import GCSFileSystem", "apitools
    not found"); every process that loads the code location printed them, 11 times a run (issue
    #46). They go to DAGSTER_HOME/mmlinks-libraries.log instead."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMLINKS_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", "import orchestration.definitions"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stderr[-3000:]
    log = (tmp_path / "mmlinks-libraries.log").read_text()
    assert "apache_beam" in log, log


def test_raw_snapshot_says_what_it_does_while_it_generates(tmp_path):
    """Generating the demo's corpus takes a minute: the step logs its progress (issue #46)."""
    defs = build_definitions(settings(synthetic={"docs": 12, "seed": 3, "image_size": 48}))
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        wanted = (dg.AssetKey("raw_snapshot"), dg.AssetKey("diy_submissions"))
        raw = [a for a in defs.assets if a.key in wanted]
        result = dg.materialize(
            raw,
            selection=[dg.AssetKey("raw_snapshot")],
            partition_key="synthetic",
            instance=instance,
            resources={
                "storage": StorageResource(root=str(tmp_path / "data")),
                "reddit": RedditResource(dumps=str(tmp_path / "dumps"), api_base="http://127.0.0.1:9"),
                "io_manager": dg.FilesystemIOManager(base_dir=str(tmp_path / "io")),
            },
            raise_on_error=False,
        )
        assert result.success, failures(result)
        messages = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]
    progress = [m for m in messages if m.startswith("synthetic corpus: ")]
    assert progress[0].startswith("synthetic corpus: generating 12 documents")
    assert any(m.startswith("synthetic corpus: 12 of 12 documents") for m in progress), progress
    assert len(progress) >= 5  # a line each tenth (12 documents: every 2)
    assert any(m.startswith("raw synthetic: ") and "fingerprint" in m for m in messages), messages


# ------------------------------------------------------------------------- the pipeline path


@pytest.fixture(scope="module")
def pipeline(env):
    """synth -> build -> train -> evaluate -> promote, one in-process run of partition 'synthetic'."""
    defs = build_definitions(settings(), env["resources"])
    before = latest_storage_id(env["instance"], dg.AssetKey("dataset"))
    chain = [dg.AssetKey("raw_snapshot"), dg.AssetKey("dataset"), MODEL, EVALUATION, PRODUCTION]
    result = materialize(env, defs, chain, "synthetic")
    return {"defs": defs, "result": result, "cursor_before": before}


def test_the_six_dataset_checks_run_as_one_step(pipeline):
    """Six check steps were six processes under the multiprocess executor, each loading the code
    location again (150 s of wall time for ~10 s of work, issue #46): one step now yields all six."""
    result = pipeline["result"]
    steps = {
        e.step_key
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
        and e.asset_check_evaluation_data.asset_key == dg.AssetKey("dataset")
    }
    assert steps == {"dataset_checks"}
    checks = result.get_asset_check_evaluations()
    assert {c.check_name for c in checks if c.asset_key == dg.AssetKey("dataset")} == DATASET_CHECKS


def test_synth_build_train_evaluate_promote_in_process(env, pipeline):
    result = pipeline["result"]
    assert result.success, failures(result)
    assert materialized(result) == {"raw_snapshot", "dataset", "model_ap", "evaluation_ap", "production_ap"}
    checks = result.get_asset_check_evaluations()
    assert {c.check_name for c in checks if c.asset_key == dg.AssetKey("dataset")} == DATASET_CHECKS
    assert all(c.passed for c in checks), [(c.check_name, c.description) for c in checks if not c.passed]

    dataset = result.output_for_node("dataset")
    manifest = Manifest.read(dataset["path"])
    assert dataset["dataset_version"] == manifest.dataset_version
    meta = {
        e.asset_key.to_user_string(): e.materialization.metadata
        for e in result.get_asset_materialization_events()
    }
    assert meta["dataset"]["dataset_version"].value == manifest.dataset_version
    assert meta["dataset"]["documents"].value == sum(manifest.counts["splits"].values()) > 0
    assert meta["raw_snapshot"]["files"].value > 30  # documents.jsonl + images

    model = result.output_for_node("model_ap")
    assert model["dataset_version"] == manifest.dataset_version
    client = MlflowClient(env["resources"]["mlflow"].tracking_uri)
    run = client.get_run(meta["model_ap"]["mlflow_run_id"].value)
    assert run.data.params["dataset_version"] == manifest.dataset_version
    assert meta["model_ap"]["model_name"].value == "mmlinks-synthetic-ap"
    assert Path(meta["model_ap"]["report"].value).is_file()  # the HTML report the link points at
    evaluation = result.output_for_node("evaluation_ap")
    assert 0 <= evaluation["auc"] <= 100 and evaluation["n_docs"] > 0
    production = client.get_model_version_by_alias("mmlinks-synthetic-ap", "production")
    assert (
        str(production.version) == model["model_version"] == meta["production_ap"]["candidate_version"].value
    )

    # A new dataset version landed in a run whose checks passed: the sensor asks for training.
    requests, _ = sensor_requests(
        pipeline["defs"], "training_sensor", env["instance"], str(pipeline["cursor_before"])
    )
    assert [(r.partition_key, r.run_key) for r in requests] == [
        ("synthetic", f"train-synthetic-{manifest.dataset_version}")
    ]
    assert requests[0].job_name in (None, "train_job")
    promote, _ = sensor_requests(
        pipeline["defs"], "promotion_sensor", env["instance"], str(pipeline["cursor_before"])
    )
    assert [r.asset_selection for r in promote] == [[PRODUCTION]]


def test_failing_check_blocks_downstream_in_the_run_and_later(env, pipeline):
    strict = build_definitions(settings(thresholds={"min_documents": 10_000}), env["resources"])
    client = MlflowClient(env["resources"]["mlflow"].tracking_uri)
    runs_before = len(client.search_runs([client.get_experiment_by_name("mmlinks").experiment_id]))
    cursor = latest_storage_id(env["instance"], dg.AssetKey("dataset"))

    result = materialize(env, strict, [dg.AssetKey("dataset"), MODEL, EVALUATION, PRODUCTION], "synthetic")
    assert not result.success
    failed = {c.check_name: c for c in result.get_asset_check_evaluations() if not c.passed}
    assert set(failed) == {"min_documents"}
    assert "< 10000" in failed["min_documents"].description
    assert materialized(result) == {"dataset"}  # nothing downstream ran
    assert not {"model_ap", "evaluation_ap", "production_ap"} & {
        e.step_key for e in result.get_step_success_events()
    }
    assert len(client.search_runs([client.get_experiment_by_name("mmlinks").experiment_id])) == runs_before

    # The sensor does not train on it...
    requests, new_cursor = sensor_requests(strict, "training_sensor", env["instance"], str(cursor))
    assert requests == [] and int(new_cursor) > cursor
    # ...and a training run started by hand refuses it too, naming the rule.
    later = materialize(env, strict, [MODEL], "synthetic")
    assert not later.success
    text = failures(later)["model_ap"]
    assert "model ap on synthetic" in text and "fails its checks: min_documents" in text


def test_misconfigured_ray_address_fails_the_model_asset_with_the_cause(env, pipeline):
    address = f"http://127.0.0.1:{free_port()}"
    defs = build_definitions(settings(), env["resources"])
    result = materialize(
        env,
        defs,
        [MODEL, EVALUATION, PRODUCTION],
        "synthetic",
        {"training": TrainingResource(ray_address=address, num_workers=1)},
    )
    assert not result.success
    fails = failures(result)
    assert set(fails) == {"model_ap"}  # evaluation and promotion never started
    assert f"cannot reach the Ray cluster at {address} (MMLINKS_RAY_ADDRESS)" in fails["model_ap"]
    assert not materialized(result)


def test_evaluation_below_the_floor_blocks_promotion(env, pipeline):
    strict = build_definitions(settings(thresholds={"min_test_auc": 101.0}), env["resources"])
    client = MlflowClient(env["resources"]["mlflow"].tracking_uri)
    production_before = client.get_model_version_by_alias("mmlinks-synthetic-ap", "production").version
    result = materialize(env, strict, [EVALUATION, PRODUCTION], "synthetic")
    assert not result.success
    [check] = result.get_asset_check_evaluations()
    assert not check.passed and "below the floor 101.00" in check.description
    assert materialized(result) == {"evaluation_ap"}
    assert (
        client.get_model_version_by_alias("mmlinks-synthetic-ap", "production").version == production_before
    )


# ------------------------------------------------------------------ DIY months and automation


def _write_dump(path: Path, month: str) -> bytes:
    import zstandard

    posts = [
        {
            "id": f"p{i}",
            "subreddit": "DIY",
            "created_utc": int(datetime.fromisoformat(f"{month}-02").timestamp()),
            "url": f"https://imgur.com/a/abc{i}",
            "score": 40,
            "title": "a shelf",
        }
        for i in range(2)
    ]
    data = zstandard.ZstdCompressor().compress("".join(json.dumps(p) + "\n" for p in posts).encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def test_diy_months_backfill_from_dumps_crawl_needs_credentials_and_trigger_the_rebuild(env, monkeypatch):
    import hashlib

    defs = build_definitions(settings(), env["resources"])
    job = defs.resolve_job_def("diy_crawl_job")
    months = job.partitions_def.get_partition_keys()
    assert months[0] == "2013-01" and months[-1] == datetime.now(UTC).strftime("%Y-%m")  # backfill range
    data = _write_dump(env["tmp"] / "dumps" / "RS_2013-02.zst", "2013-02")
    cursor = latest_storage_id(env["instance"], dg.AssetKey("diy_submissions"))

    result = materialize(env, defs, [dg.AssetKey("diy_submissions")], "2013-02")
    assert result.success, failures(result)
    copy = env["tmp"] / "data" / "raw" / "diy" / "2013-02" / "RS_2013-02.zst"
    assert copy.read_bytes() == data
    [event] = result.get_asset_materialization_events()
    assert event.materialization.metadata["sha256"].value == hashlib.sha256(data).hexdigest()
    assert event.materialization.metadata["mode"].value == "dump"

    # The month landed: the rebuild sensor asks for the diy dataset.
    requests, _ = sensor_requests(defs, "diy_rebuild_sensor", env["instance"], str(cursor))
    assert [(r.partition_key, r.job_name) for r in requests] in ([("diy", None)], [("diy", "rebuild_job")])

    # A past month without a dump cannot be crawled.
    result = materialize(env, defs, [dg.AssetKey("diy_submissions")], "2013-03")
    assert "no dump RS_2013-03.zst" in failures(result)["diy_submissions"]

    # The current month is crawled: without the Reddit credentials it fails on this asset, naming
    # the missing variable and never the value that is set.
    secret = "id-7f2a9c-not-to-be-logged"
    monkeypatch.setenv("praw_client_id", secret)
    monkeypatch.delenv("praw_client_secret", raising=False)
    result = materialize(env, defs, [dg.AssetKey("diy_submissions")], months[-1])
    text = failures(result)["diy_submissions"]
    assert "praw_client_secret" in text
    logs = "\n".join(str(e.message) for e in env["instance"].all_logs(result.run_id))
    assert secret not in logs and secret not in text


def test_weekly_schedule_crawls_the_current_month():
    defs = build_definitions(settings())
    schedule = defs.get_schedule_def("weekly_diy_crawl")
    assert schedule.cron_schedule == "0 3 * * 1" and schedule.execution_timezone == "UTC"
    ctx = dg.build_schedule_context(
        scheduled_execution_time=datetime(2026, 3, 2, 3, 0, tzinfo=UTC),
        repository_def=defs.get_repository_def(),
    )
    [request] = schedule.evaluate_tick(ctx).run_requests
    assert request.partition_key == "2026-03" and request.run_key == "diy-crawl-20260302T0300"
    assert schedule.job_name == "diy_crawl_job"
