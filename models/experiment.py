"""A training run's model, packaged and registered: the one call from a run's end into models/.

Why handed over: ``training.experiment.run_experiment`` never imports this layer, so it is given
``package_run`` and calls it once, inside the run's MLflow run, with the best checkpoint.
``run_experiment`` here is that call with ``package_run`` handed over (``mmlinks train``, the
demo, the Ray job, Dagster); the grid hands ``package_run`` to its trials the same way."""

from __future__ import annotations

from pathlib import Path

from schemas.errors import NOTE_PREFIX
from training import experiment, tracking
from training.config import TrainConfig
from training.experiment import ExperimentResult
from training.run_inputs import RunInputs


def run_experiment(
    cfg: TrainConfig | RunInputs,
    tracking_uri: str,
    model_name: str | None = "mmlinks-ap",
    alias: str | None = "candidate",
    progress: bool = False,
    report_dir: str | Path | None = None,
    parent_run_id: str | None = None,
) -> ExperimentResult:
    """``training.experiment.run_experiment`` (of a config, or of what ``read_inputs`` read of
    one) with this layer's ``package_run``: registered as ``model_name``@``alias`` (None: logged,
    not registered)."""
    args = (tracking_uri, model_name, alias, progress, report_dir, parent_run_id)
    return experiment.run_experiment(cfg, *args, package=package_run)


def package_run(
    packaging: str,
    ckpt_dir: str,
    cfg: TrainConfig,
    manifest,
    run,
    result,
    model_name: str | None,
    alias: str | None,
    tracking_uri: str,
    **details,
) -> tuple[str, str | None]:
    """Log the run's pyfunc (``packaging``: "link", "pairs", "news-archive") into the active run
    and register it when ``model_name`` is given: (model URI, registered version or None). The
    URI is ``models:/NAME@ALIAS`` (``models:/NAME/VERSION`` without an alias) once registered."""
    try:
        model_uri = PACKAGERS[packaging](ckpt_dir, cfg, manifest, run, result, **details)
    except Exception as exc:  # a full disk, a lost server: no half-copied model stays unnamed
        exc.add_note(
            NOTE_PREFIX + discard_unfinished_models(run.info.experiment_id, run.info.run_id, tracking_uri)
        )
        raise
    version = None
    if model_name:
        version = tracking.register(model_uri, model_name, alias, tracking_uri)
        model_uri = f"models:/{model_name}@{alias}" if alias else f"models:/{model_name}/{version}"
    return model_uri, version


def discard_unfinished_models(experiment_id: str, run_id: str, tracking_uri: str | None = None) -> str:
    """Remove the files of the run's logged models that never finished, and say what was done.

    MLflow marks a ``log_model`` that raised as FAILED but keeps whatever it had copied (issue #62:
    a full disk left a half-copied, unregistered model folder behind). Local folders are removed
    and the logged model deleted; what cannot be removed (a remote store, the server gone) is
    named, so the user can remove it."""
    import contextlib
    import shutil

    import mlflow
    from mlflow.entities import LoggedModelStatus
    from mlflow.utils.file_utils import local_file_uri_to_path

    try:
        client = mlflow.MlflowClient(tracking_uri)
        found = client.search_logged_models(
            experiment_ids=[experiment_id], filter_string=f"source_run_id = '{run_id}'"
        )
    except Exception:  # the store itself failed: nothing can be looked up
        return "no model version was registered; the run's half-written model files could not be looked up"
    removed, left = [], []
    for model in found:
        if model.status == LoggedModelStatus.READY:
            continue
        location = model.artifact_location or ""
        path = local_file_uri_to_path(location) if location.startswith("file:") else location
        try:
            if "://" in path:
                raise OSError("not a local folder")
            if Path(path).exists():
                shutil.rmtree(path)
            with contextlib.suppress(OSError):  # the model's own folder, once empty
                Path(path).parent.rmdir()
            client.delete_logged_model(model.model_id)
            removed.append(path)
        except Exception:
            left.append(location)
    parts = ["no model version was registered"]
    if removed:
        parts.append(f"the half-written model files were removed ({', '.join(removed)})")
    if left:
        parts.append(f"remove the half-written model files at {', '.join(left)}")
    return "; ".join(parts)


def _package_link(ckpt_dir, cfg, manifest, run, result, test_paths: list[str]) -> str:
    """The link pyfunc, with the training data's extractor recorded (name, version and the
    build's options: a CLIP architecture, ...; never the weight path), so the served model runs
    the same extractor on raw images; its input example is the first test document."""
    from models.packaging import log_link_model

    fe = manifest.feature_extractor
    options = dict(manifest.build_params.get("extractor_options") or {})
    example = input_example(cfg, test_paths)
    return log_link_model(ckpt_dir, result.vocab, example, fe.name, fe.version, options)


def input_example(cfg: TrainConfig, test_paths: list[str]) -> dict | None:
    """A packaged model's input example: the first test document, for backbones that serve
    feature-only requests (a transformer model refuses them, models/packaging.py); None without
    test shards."""
    from schemas.shards import read_table
    from training.backbone import get_backbone

    if not test_paths or not get_backbone(cfg.backbone).feature_only_requests:
        return None
    first = read_table(test_paths[:1], ["sentences", "images"]).slice(0, 1)
    features = [im["features"] for im in first.column("images")[0].as_py()]
    return {
        "sentences": list(first.column("sentences")[0].as_py()),
        "image_features": [list(map(float, f)) for f in features],
    }


def _package_pairs(ckpt_dir, cfg, manifest, run, result, test_paths: list[str], refine: dict) -> str:
    """The "pairs" pyfunc: a text -> the test split's images ranked, with the refinement chosen
    on validation and the trained net's query bank."""
    from models.retrieval_serving import log_retrieval_model
    from training.retrieval.objective import _net
    from training.retrieval.pairs import split_pairs

    fe = manifest.feature_extractor
    ids, _, feats = split_pairs(test_paths)
    bank = getattr(_net(result.model), "query_bank", None)
    return log_retrieval_model(ckpt_dir, result.vocab, ids, feats, refine, fe.name, fe.version, bank)


def _package_news_archive(ckpt_dir, cfg, manifest, run, result, test_paths: list[str], refine: dict) -> str:
    """The "news-archive" pyfunc: an article -> the whole dataset's images ranked through a FAISS
    archive index built from the run's model."""
    from models.news_packaging import package_news_run

    return package_news_run(ckpt_dir, result.model, result.vocab, cfg.data, manifest, run.info.run_id)


PACKAGERS = {"link": _package_link, "pairs": _package_pairs, "news-archive": _package_news_archive}
