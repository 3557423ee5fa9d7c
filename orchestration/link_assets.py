"""Per objective: ``linked_<obj>[source]``, every document of the source's current dataset
version linked by the objective's production model (``linking.job.link_documents``).

Why it reads neither upstream's output: it links what is current when it runs, which is what
``linking_sensor`` asks for whenever either moves; the dataset guard runs first."""

import dagster as dg
from dagster import AssetExecutionContext

from orchestration.asset_support import (
    LINKED,
    PRODUCTION,
    current_dataset,
    failures_explained,
    objective_key,
    versioned,
)
from orchestration.resources import MlflowResource, StorageResource
from orchestration.settings import Settings


def linked_asset(
    settings: Settings, objective: str, sources: dg.StaticPartitionsDefinition, retry: dg.RetryPolicy
) -> dg.AssetsDefinition:
    @dg.asset(
        key=objective_key(LINKED, objective),
        partitions_def=sources,
        group_name="linking",
        kinds={"beam", "mlflow", "parquet"},
        retry_policy=retry,
        deps=[dg.AssetKey("dataset"), objective_key(PRODUCTION, objective)],
        description=f"Every document of the current dataset version linked by the {objective} model's "
        f"'{PRODUCTION}' version (linking.job.link_documents: Beam, RunInference, one-to-one matching by "
        "default), as versioned link shards + manifest under ROOT/linked/<source>/<objective>.",
    )
    def linked(
        context: AssetExecutionContext, storage: StorageResource, mlflow: MlflowResource
    ) -> dg.Output[dict]:
        return link_current(context, settings, objective, storage, mlflow)

    return linked


def link_current(
    context: AssetExecutionContext,
    settings: Settings,
    objective: str,
    storage: StorageResource,
    mlflow: MlflowResource,
) -> dg.Output[dict]:
    from linking.job import link_documents
    from schemas.library_output import build_log_path, library_output_to
    from schemas.manifest import Manifest

    source = context.partition_key
    name = settings.registered_model_name(source, objective)
    data = storage.dataset_path(source)
    with failures_explained(f"linked {objective} on {source}"):
        manifest = Manifest.read(data)
        ref = {"source": source, "path": data, "dataset_version": manifest.dataset_version}
        current_dataset(ref, settings.thresholds_config())
        cfg = settings.link_config(
            data,
            f"models:/{name}@{PRODUCTION}",
            storage.linked_uri(source, objective),
            tracking_uri=mlflow.uri(),
        )
        # Beam's workers print their harness INFO to stderr: beside the link shards, not the run's log
        log = build_log_path(cfg.out.rstrip("/").rsplit("/", 1)[0], f"{objective}-link.log")
        context.log.info(f"linking {source} {manifest.dataset_version} with {cfg.model} (Beam's log: {log})")
        with library_output_to(log):
            result = link_documents(cfg)
    summary = result.summary()
    model = summary["model"]
    keys = ("documents_read", "documents_linked", "documents_dead_lettered", "images", "images_linked")
    value = {
        "source": source,
        "objective": objective,
        **{
            k: summary[k]
            for k in ("manifest", "link_version", "dataset_version", "link_rate", "dead_letter_rate")
        },
        "model_name": model["name"],
        "model_version": model["version"],
        "run_id": model["run_id"],
        **{k: summary[k] for k in keys},
    }
    metadata = {
        "model_name": model["name"],
        "model_version": model["version"],
        "mlflow_run_id": model["run_id"] or "",
        "dataset_version": summary["dataset_version"],
        "link_version": summary["link_version"],
        "link_rate": float(summary["link_rate"]),
        "dead_letter_rate": float(summary["dead_letter_rate"]),
        **{k: int(summary[k]) for k in keys},
        "seconds": float(summary["seconds"]),
        "manifest": dg.MetadataValue.path(summary["manifest"]),
        "library_log": dg.MetadataValue.path(str(log)),
    }
    return versioned(value, f"{model['version']}@{summary['dataset_version']}", metadata)
