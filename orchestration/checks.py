"""Asset checks: the rules of ``orchestration/quality.py`` shown on the assets in the UI.

Every check blocks the later steps of its run; later runs see the same rules through the guards
in ``orchestration/assets.py``."""

import warnings

import dagster as dg

from orchestration.asset_support import EVALUATION, LINKED, objective_key
from orchestration.quality import DATASET_CHECKS, Outcome, check_evaluation_floor, check_links
from orchestration.settings import Settings

DESCRIPTIONS = {
    "schema_version": "The manifest and every shard footer carry the schema version this code reads.",
    "min_documents": "At least thresholds.min_documents documents were kept.",
    "split_sizes": "Each split holds at least thresholds.min_split_documents[split] documents.",
    "duplicate_rate": "Near-duplicate and duplicate-id drops per document seen stay within the limit.",
    "dead_letter_rate": "Invalid input (not filtered by design, not duplicates) per record within the limit.",
    "feature_dim": "Stored feature vectors have the width the manifest declares (and the configured one).",
}


def _result(outcome: Outcome, asset: str | None = None, check_name: str | None = None) -> dg.AssetCheckResult:
    """A check's result; ``asset`` and ``check_name`` name it where one step yields several."""
    metadata = {"description": outcome.description}
    for key, value in outcome.metadata.items():
        metadata[key] = dg.MetadataValue.json(value) if isinstance(value, dict | list) else value
    return dg.AssetCheckResult(
        asset_key=asset,
        check_name=check_name,
        passed=outcome.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=outcome.description,
        metadata=metadata,
    )


def build_checks(settings: Settings, sources: dg.PartitionsDefinition) -> list[dg.AssetChecksDefinition]:
    checks = [_dataset_checks(settings, sources)]
    for objective in settings.objectives:
        checks.append(_evaluation_check(settings, sources, objective))
    for objective in settings.link_objectives():  # retrieval and news models link nothing
        checks.append(_link_check(settings, sources, objective))
    return checks


def _partitioned_check(**kwargs):
    """``dg.asset_check`` with a partitions_def, which Dagster 1.13 marks as preview: a check
    result per source partition is what these checks mean, so the warning is expected here."""

    def decorate(fn):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=dg.PreviewWarning)
            return dg.asset_check(**kwargs)(fn)

    return decorate


def _dataset_checks(settings: Settings, sources) -> dg.AssetChecksDefinition:
    """The six dataset rules as one step (``dataset_checks``) that reads the manifest once and
    yields a blocking result per rule. Six ``asset_check`` ops were six steps, and under the
    multiprocess executor six processes that each imported the code location again: about 150 s
    of wall time for ~10 s of work (issue #46). The UI still shows six checks on ``dataset``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=dg.PreviewWarning)
        specs = [
            dg.AssetCheckSpec(
                name, asset="dataset", blocking=True, description=DESCRIPTIONS[name], partitions_def=sources
            )
            for name in DATASET_CHECKS
        ]

        @dg.multi_asset_check(
            specs=specs,
            name="dataset_checks",
            ins={"dataset": dg.AssetIn("dataset")},
            description="The dataset rules of orchestration/quality.py, in one step.",
        )
        def dataset_checks(dataset: dict):
            from schemas.manifest import Manifest

            manifest = Manifest.read(dataset["path"])
            for name, rule in DATASET_CHECKS.items():
                outcome = rule(manifest, dataset["path"], settings.thresholds_config())
                yield _result(outcome, "dataset", name)

    return dataset_checks


def _evaluation_check(settings: Settings, sources, objective: str) -> dg.AssetChecksDefinition:
    @_partitioned_check(
        asset=objective_key(EVALUATION, objective),
        name="metrics_above_floor",
        blocking=True,
        partitions_def=sources,
        description=(
            "MedR at most thresholds.max_medr (when set; a rank, lower is better) and R@10 at least "
            "thresholds.min_r10 on the validation pairs; blocks promotion."
            if settings.family(objective) == "retrieval"
            else "AUC and p@1 at or above thresholds.min_test_auc / min_test_p_at_1, and AUC "
            "thresholds.min_auc_over_random above the Random baseline; blocks promotion."
        ),
    )
    def check(evaluation: dict) -> dg.AssetCheckResult:
        return _result(check_evaluation_floor(evaluation, settings.thresholds_config()))

    return check


def _link_check(settings: Settings, sources, objective: str) -> dg.AssetChecksDefinition:
    @_partitioned_check(
        asset=objective_key(LINKED, objective),
        name="link_quality",
        blocking=True,
        partitions_def=sources,
        description="Documents the link job dead-lettered at most thresholds.max_link_dead_letter_rate, "
        "and linked images per image within [thresholds.min_link_rate, thresholds.max_link_rate].",
    )
    def check(linked: dict) -> dg.AssetCheckResult:
        return _result(check_links(linked, settings.thresholds_config()))

    return check
