"""Per news objective: ``archive_index_<obj>[source]``, the FAISS index of every image of the
source's current dataset under the objective's production model.

Why versioned by both: it is rebuilt when ``dataset`` or ``production_<obj>`` moves, into
``ROOT/archive/<source>/<obj>/<model version>@<dataset version>``, which the served model picks up
through ``MMLINKS_NEWS_ARCHIVE``. The build is checkpointed there, so a retried run resumes it."""

import dagster as dg
from dagster import AssetExecutionContext

from orchestration.asset_support import (
    ARCHIVE_INDEX,
    LINKED,
    PRODUCTION,
    current_dataset,
    failures_explained,
    objective_key,
    versioned,
)
from orchestration.resources import MlflowResource, StorageResource
from orchestration.settings import Settings


def is_news_objective(settings: Settings, objective: str) -> bool:
    from training.objectives.registry import get_objective

    name = settings.objectives[objective].get("objective", objective)
    return get_objective(name).packaging == "news-archive"


def served_objectives(settings: Settings) -> list[str]:
    """The objectives whose production model feeds an asset: ``linked_<obj>`` (linking) or
    ``archive_index_<obj>`` (news); coherence retrieval models feed nothing downstream."""
    links = set(settings.link_objectives())
    return [o for o in settings.objectives if o in links or is_news_objective(settings, o)]


def serving_key(settings: Settings, objective: str) -> dg.AssetKey:
    """What the production model of ``objective`` feeds: ``archive_index_<obj>`` for a news
    objective, ``linked_<obj>`` otherwise (the link job and sensor materialise it)."""
    return objective_key(ARCHIVE_INDEX if is_news_objective(settings, objective) else LINKED, objective)


def archive_index_asset(
    settings: Settings, objective: str, sources: dg.StaticPartitionsDefinition, retry: dg.RetryPolicy
) -> dg.AssetsDefinition:
    @dg.asset(
        key=objective_key(ARCHIVE_INDEX, objective),
        partitions_def=sources,
        group_name="news",
        kinds={"faiss", "mlflow"},
        retry_policy=retry,
        deps=[dg.AssetKey("dataset"), objective_key(PRODUCTION, objective)],
        description=f"The image archive index (FAISS) of the current dataset version under the {objective} "
        f"model's '{PRODUCTION}' version, under ROOT/archive/<source>/{objective}/<version>@<dataset>.",
    )
    def archive_index(
        context: AssetExecutionContext, storage: StorageResource, mlflow: MlflowResource
    ) -> dg.Output[dict]:
        return build_current_archive(context, settings, objective, storage, mlflow)

    return archive_index


def build_current_archive(
    context: AssetExecutionContext,
    settings: Settings,
    objective: str,
    storage: StorageResource,
    mlflow: MlflowResource,
) -> dg.Output[dict]:
    from models.news_archive import build_model_archive
    from schemas.manifest import Manifest

    source = context.partition_key
    name = settings.registered_model_name(source, objective)
    data = storage.dataset_path(source)
    with failures_explained(f"archive_index {objective} on {source}"):
        manifest = Manifest.read(data)
        ref = {"source": source, "path": data, "dataset_version": manifest.dataset_version}
        current_dataset(ref, settings.thresholds_config())
        out = storage.archive_path(source, objective)
        summary = build_model_archive(
            f"models:/{name}@{PRODUCTION}", data, out, mlflow.uri(), kind=settings.archive_index_kind
        )
    context.log.info(f"archive index of {summary['images']} images -> {summary['path']}")
    metadata = {
        "model_version": summary["model_version"],
        "mlflow_run_id": summary["run_id"] or "",
        "dataset_version": summary["dataset_version"],
        "images": int(summary["images"]),
        "index_kind": summary["kind"],
        "index": dg.MetadataValue.path(summary["path"]),
        # the index's own version and fingerprint (also tags on the model version in MLflow)
        "index_version": int(summary["index_version"]),
        "index_fingerprint": summary["fingerprint"],
        "index_search_fingerprint": summary["search_fingerprint"],  # with its nprobe / re-rank
        "index_size_mb": round(summary["index_bytes"] / 2**20, 3),
        "deleted_images": int(summary["deleted"]),
    }
    return versioned(summary, f"{summary['model_version']}@{summary['dataset_version']}", metadata)
