"""Per objective: ``model_<obj>[source]`` (train + register as candidate) -> ``evaluation_<obj>``
(the registered version scored on the frozen split) -> ``production_<obj>`` (the gated alias).
Linking and retrieval objectives alike: the library functions dispatch on the model's family
(``models.registry``), the split comes from ``Settings.split_for``."""

from dataclasses import asdict

import dagster as dg
from dagster import AssetExecutionContext

from orchestration.asset_support import (
    CANDIDATE,
    EVALUATION,
    MODEL,
    PRODUCTION,
    alias_version,
    current_dataset,
    failures_explained,
    objective_key,
    report_links,
    versioned,
)
from orchestration.quality import check_evaluation_floor, require
from orchestration.resources import MlflowResource, StorageResource, TrainingResource
from orchestration.settings import Settings
from schemas.errors import MmlinksError


def objective_assets(
    settings: Settings, objective: str, sources: dg.StaticPartitionsDefinition, retry: dg.RetryPolicy
) -> list[dg.AssetsDefinition]:
    model_key = objective_key(MODEL, objective)
    evaluation_key = objective_key(EVALUATION, objective)

    @dg.asset(
        key=model_key,
        partitions_def=sources,
        group_name="training",
        kinds={"ray", "pytorch", "mlflow"},
        retry_policy=retry,
        ins={"dataset": dg.AssetIn("dataset")},
        description=f"The {objective} model trained on the dataset (training.experiment.run_experiment: Ray "
        f"Train, best checkpoint by validation loss, MLflow run, registered as '{CANDIDATE}'); on a Ray "
        "cluster through the Ray Jobs API when MMLINKS_RAY_ADDRESS is set.",
    )
    def model(
        context: AssetExecutionContext,
        dataset: dict,
        training: TrainingResource,
        mlflow: MlflowResource,
        storage: StorageResource,
    ) -> dg.Output[dict]:
        return train_model(context, settings, objective, dataset, training, mlflow, storage)

    @dg.asset(
        key=evaluation_key,
        partitions_def=sources,
        group_name="training",
        kinds={"mlflow"},
        ins={"model": dg.AssetIn(model_key), "dataset": dg.AssetIn("dataset")},
        description=f"The registered {objective} version scored through its pyfunc model on the frozen "
        f"{settings.split_for(objective)} split (models.registry.evaluate_model_uri, what promotion uses)"
        + (
            ": MedR and R@1/5/10 over fixed pools of 500."
            if settings.family(objective) == "retrieval"
            else ", next to the Random baseline of its training run."
        ),
    )
    def evaluation(
        context: AssetExecutionContext, model: dict, dataset: dict, mlflow: MlflowResource
    ) -> dg.Output[dict]:
        return evaluate_model(settings, objective, model, dataset, mlflow)

    @dg.asset(
        key=objective_key(PRODUCTION, objective),
        partitions_def=sources,
        group_name="promotion",
        kinds={"mlflow"},
        ins={"evaluation": dg.AssetIn(evaluation_key), "dataset": dg.AssetIn("dataset")},
        description=f"The 'production' alias of the {objective} model: moved to the candidate only "
        "through models.registry.promote's gate (candidate vs production on the same split, "
        + (
            "MedR rise and R@10 drop, MedR ceiling"
            if settings.family(objective) == "retrieval"
            else "AUC and p@1 drops, AUC floor"
        )
        + "), under the registry's promotion lock. A refused promotion fails here.",
    )
    def production(
        context: AssetExecutionContext, evaluation: dict, dataset: dict, mlflow: MlflowResource
    ) -> dg.Output[dict]:
        return promote_model(settings, objective, evaluation, dataset, mlflow)

    return [model, evaluation, production]


def train_model(
    context: AssetExecutionContext,
    settings: Settings,
    objective: str,
    dataset: dict,
    training: TrainingResource,
    mlflow: MlflowResource,
    storage: StorageResource,
) -> dg.Output[dict]:
    """Train ``objective`` on the dataset (here or as a Ray job) and register it as candidate."""
    source = context.partition_key
    name = settings.registered_model_name(source, objective)
    with failures_explained(f"model {objective} on {source}"):
        current_dataset(dataset, settings.thresholds_config())
        cfg = settings.train_config(objective, dataset["path"], **training.defaults())
        cfg.validate()
        where = f"Ray cluster {training.ray_address}" if training.on_cluster() else "in-process Ray"
        context.log.info(f"training {cfg.label} on {source} {dataset['dataset_version']} ({where})")
        outcome = training.train(
            cfg,
            model_name=name,
            alias=CANDIDATE,
            tracking_uri=mlflow.uri(),
            report_dir=storage.reports_path(),
            log=context.log.info,
            job_metadata={
                "dagster_run_id": context.run_id,
                "asset": objective_key(MODEL, objective).to_user_string(),
                "source": source,
            },
        )
    res = outcome.result
    for warning in res.warnings:  # e.g. a flat within-document signal (training.metrics)
        context.log.warning(f"{name}: {warning}")
    test, rand = res.test or {}, res.random or {}
    ref = {
        "source": source,
        "objective": objective,
        "model_name": name,
        "model_version": str(res.model_version),
        "model_uri": res.model_uri,
        "run_id": res.run_id,
        "dataset_version": dataset["dataset_version"],
        "dataset_path": dataset["path"],
        "test": test,
        "random": rand,
        "report": res.report_path,
        "ray_job_id": outcome.ray_job_id,
        "warnings": res.warnings,
    }
    metadata = {
        "mlflow_run_id": res.run_id,
        "model_name": name,
        "model_version": ref["model_version"],
        "model_uri": res.model_uri,
        "best_epoch": res.best_epoch,
        "dataset_version": dataset["dataset_version"],
        "train_config": dg.MetadataValue.json(cfg.public_dict()),
        **_test_metrics(test, rand),
        "tracking_uri": mlflow.uri(),
        **report_links(mlflow, res.run_id, ref["report"]),
    }
    if outcome.ray_job_id:
        metadata["ray_job_id"] = outcome.ray_job_id
    if res.warnings:
        metadata["warnings"] = " | ".join(res.warnings)
    return versioned(ref, f"{name}/{ref['model_version']}", metadata)


def _test_metrics(test: dict, rand: dict) -> dict[str, float]:
    """The headline test metrics of a training run: AUC, p@1 and Random's AUC (linking), or
    text-to-image MedR and R@1/5/10 (retrieval, whose test results carry a "t2i" block), with
    the refined MedR when the model has a Coherence Aware Module to refine with."""
    nan = float("nan")
    if "t2i" in test:
        out = {f"test_{k}": float(test["t2i"].get(k, nan)) for k in ("medr", "r1", "r5", "r10")}
        if "t2i_refined" in test:
            out["test_refined_medr"] = float(test["t2i_refined"].get("medr", nan))
        return out
    return {
        "test_auc": float(test.get("auc", nan)),
        "test_p_at_1": float(test.get("p_at_1", nan)),
        "random_auc": float(rand.get("auc", nan)),
    }


def evaluate_model(
    settings: Settings, objective: str, model: dict, dataset: dict, mlflow: MlflowResource
) -> dg.Output[dict]:
    """The registered version scored through its pyfunc on the promotion split."""
    from models.registry import evaluate_model_uri

    split = settings.split_for(objective)
    with failures_explained(f"evaluation {objective} on {dataset['source']}"):
        if model["dataset_version"] != dataset["dataset_version"]:
            raise MmlinksError(
                f"model {model['model_name']} v{model['model_version']} was trained on dataset "
                f"{model['dataset_version']}, the dataset is now {dataset['dataset_version']}: "
                "train again"
            )
        uri = f"models:/{model['model_name']}/{model['model_version']}"
        scores = evaluate_model_uri(uri, dataset["path"], split, mlflow.uri())
    rand = model.get("random", {})
    ref = {
        **{k: model[k] for k in ("source", "objective", "model_name", "model_version", "run_id")},
        "dataset_version": dataset["dataset_version"],
        "split": split,
        **{k: float(v) for k, v in scores.items()},
        "random_auc": float(rand.get("auc", float("nan"))),
        "random_p_at_1": float(rand.get("p_at_1", float("nan"))),
    }
    metadata = {
        **{k: float(v) for k, v in scores.items()},
        "random_auc": ref["random_auc"],
        "split": split,
        "model_version": model["model_version"],
        "mlflow_run_id": model["run_id"],
        **report_links(mlflow, model["run_id"], model.get("report", "")),
    }
    return dg.Output(ref, metadata=metadata)


def promote_model(
    settings: Settings, objective: str, evaluation: dict, dataset: dict, mlflow: MlflowResource
) -> dg.Output[dict]:
    """Move production to the evaluated candidate through the gate, or fail with the reasons."""
    from models.registry import promote

    name = evaluation["model_name"]
    client = mlflow.client()
    with failures_explained(f"promotion of {name}"):
        require([check_evaluation_floor(evaluation, settings.thresholds_config())], f"{name} evaluation")
        candidate = alias_version(client, name, CANDIDATE)
        if candidate != evaluation["model_version"]:
            raise MmlinksError(
                f"{name}'s candidate is version {candidate}, the evaluation scored version "
                f"{evaluation['model_version']}: evaluate the current candidate first"
            )
        result = promote(client, name, dataset["path"], settings.gate_config(), settings.split_for(objective))
    meta = {
        "model_name": name,
        "candidate_version": result.candidate_version,
        "previous_production_version": result.production_version or "",
        "candidate_metrics": dg.MetadataValue.json(result.candidate_metrics),
        "production_metrics": dg.MetadataValue.json(result.production_metrics or {}),
        "gate": dg.MetadataValue.json(asdict(settings.gate_config())),
    }
    if not result.promoted:
        raise dg.Failure(
            description=f"promotion of {name} version {result.candidate_version} refused: "
            + "; ".join(result.failures),
            metadata={**meta, "failures": dg.MetadataValue.json(result.failures)},
            allow_retries=False,
        )
    ref = {
        "model_name": name,
        "production_version": result.candidate_version,
        "previous_version": result.production_version,
        "model_uri": f"models:/{name}@production",
        "dataset_version": dataset["dataset_version"],
        "metrics": result.candidate_metrics,
    }
    return versioned(ref, f"{name}/{result.candidate_version}", {**meta, "model_uri": ref["model_uri"]})
