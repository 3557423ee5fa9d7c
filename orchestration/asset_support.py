"""What every asset shares: partitions, the retry policy, failure wording, data versions, the
dataset guard and links to MLflow. Expected failures (a missing input, a refused config or
credential, a dataset that fails its checks) raise ``dg.Failure`` with the one-line cause and
no retry; flaky ones (networks, the cluster) are retried by the step's RetryPolicy, with backoff.
"""

import contextlib
import warnings
from collections.abc import Iterator

import dagster as dg

from orchestration.quality import dataset_outcomes, require
from orchestration.resources import MlflowResource
from orchestration.settings import Settings
from schemas.errors import MmlinksError

DIY = "diy"
SYNTHETIC = "synthetic"
CANDIDATE = "candidate"

# The roles of the per-objective assets, in graph order.
MODEL, EVALUATION, PRODUCTION = "model", "evaluation", "production"
LINKED, ARCHIVE_INDEX = "linked", "archive_index"


def objective_key(role: str, objective: str) -> dg.AssetKey:
    """``<role>_<objective>`` (``model_ap``, ``evaluation_ap``), one path component: the UI's
    asset graph labels a box with its key's last component only, so the keys ``["model", "ap"]``
    and ``["evaluation", "ap"]`` showed two boxes both named ``ap`` (issue #46)."""
    return dg.AssetKey(f"{role}_{objective}")


def objective_of(key: dg.AssetKey, role: str) -> str:
    """The objective of a per-objective asset key of ``role`` (``evaluation_ap`` -> ``ap``)."""
    name = key.path[-1]
    if not name.startswith(f"{role}_"):
        raise ValueError(f"{key.to_user_string()} is not a {role} asset")
    return name.removeprefix(f"{role}_")


def source_partitions(settings: Settings) -> dg.StaticPartitionsDefinition:
    return dg.StaticPartitionsDefinition(list(settings.sources))


def month_partitions(settings: Settings) -> dg.MonthlyPartitionsDefinition:
    """r/DIY by creation month, from the first month of the paper's crawl to the current one
    (``end_offset=1``: the month in progress is the one the weekly crawl adds to)."""
    return dg.MonthlyPartitionsDefinition(start_date=settings.diy_first_month, fmt="%Y-%m", end_offset=1)


def retry_policy(settings: Settings) -> dg.RetryPolicy:
    return dg.RetryPolicy(
        max_retries=settings.max_retries,
        delay=settings.retry_delay_s,
        backoff=dg.Backoff.EXPONENTIAL,
        jitter=dg.Jitter.PLUS_MINUS,
    )


# Exceptions behind a one-line MmlinksError that a later attempt may not meet: the network, a
# server's 5xx or 429 (prawcore's names; the CLI's crawl wraps them with the credential scrubbed).
TRANSIENT_CAUSES = ("RequestException", "ServerError", "TooManyRequests", "Timeout", "ReadTimeout")


def is_transient(exc: BaseException) -> bool:
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, ConnectionError | TimeoutError) or type(cause).__name__ in TRANSIENT_CAUSES:
            return True
        cause = cause.__cause__
    return False


def versioned(value: dict, version: str, metadata: dict) -> dg.Output:
    """An output with a data version (the fingerprint, dataset version or model version), which
    drives the UI's "upstream changed" markers; Dagster 1.13 still calls the parameter beta."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=dg.BetaWarning)
        return dg.Output(value, data_version=dg.DataVersion(version), metadata=metadata)


@contextlib.contextmanager
def failures_explained(what: str) -> Iterator[None]:
    """Expected errors become a Dagster Failure with their one-line cause. Those a retry cannot
    fix (a refused option, input or credential) skip the retry policy; network and cluster
    hiccups keep it. Anything unexpected propagates as itself, and is retried."""
    from orchestration.ray_jobs import RayJobError

    try:
        yield
    except RayJobError as exc:
        raise dg.Failure(
            description=f"{what}: {exc}",
            metadata={"cause": str(exc), "ray_job_id": exc.job_id or ""},
            allow_retries=exc.transient,
        ) from exc
    except MmlinksError as exc:
        raise dg.Failure(
            description=f"{what}: {exc}", metadata={"cause": str(exc)}, allow_retries=is_transient(exc)
        ) from exc


def current_dataset(ref: dict, thresholds) -> None:
    """The guard every consumer of a dataset runs: the manifest on disk is still the version the
    upstream asset produced, and it passes the dataset checks (which a run started later, by a
    sensor or by hand, cannot otherwise see)."""
    from schemas.manifest import Manifest

    manifest = Manifest.read(ref["path"])
    if manifest.dataset_version != ref["dataset_version"]:
        raise MmlinksError(
            f"dataset {ref['source']} is now version {manifest.dataset_version}, not the "
            f"{ref['dataset_version']} the dataset asset recorded: materialize dataset[{ref['source']}] again"
        )
    require(
        dataset_outcomes(manifest, ref["path"], thresholds),
        f"dataset {ref['source']} {ref['dataset_version']}",
    )


def alias_version(client, name: str, alias: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower():
            return None
        raise MmlinksError(f"cannot read {name}@{alias}: {exc.message}") from exc


def report_links(mlflow: MlflowResource, run_id: str, report: str) -> dict:
    """Where to read the HTML evaluation report: the MLflow server's copy and the file."""
    out: dict = {}
    url = mlflow.artifact_url(run_id, "report.html")
    if url:
        out["report_url"] = dg.MetadataValue.url(url)
        run = mlflow.run_url(run_id)
        if run:
            out["mlflow_run"] = dg.MetadataValue.url(run)
    if report:
        out["report"] = dg.MetadataValue.path(report)
    return out
