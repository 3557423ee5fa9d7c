"""A training run's model, packaged and registered: the one call from a run's end into models/.

``training.experiment.run_experiment`` trains and evaluates; it never imports this layer, so it
is handed ``package_run`` (a ``training.experiment.Packager``) and calls it once, inside the
run's MLflow run, with the best checkpoint: the pyfunc of the objective's packaging
(``ObjectiveSpec.packaging``) is logged to the run and, with a model name, registered under its
alias. ``run_experiment`` here is that call with ``package_run`` handed over: what
``mmlinks train``, the demo, the Ray job (``models.job``) and Dagster run. The grid hands
``package_run`` to its trials the same way (``cli/grid.py``).

Packagings: "link" (``models/packaging.py``: the sentence x image link matrix), "pairs"
(``models/retrieval_serving.py``: a text -> the test split's images ranked), "news-archive"
(``models/news_packaging.py``: an article -> the whole dataset's images ranked through a FAISS
archive index).
"""

from __future__ import annotations

from pathlib import Path

from training import experiment, tracking
from training.config import TrainConfig
from training.experiment import ExperimentResult


def run_experiment(
    cfg: TrainConfig,
    tracking_uri: str,
    model_name: str | None = "mmlinks-ap",
    alias: str | None = "candidate",
    progress: bool = False,
    report_dir: str | Path | None = None,
    parent_run_id: str | None = None,
) -> ExperimentResult:
    """``training.experiment.run_experiment`` with this layer's ``package_run``: train, evaluate,
    log the packaged model, register it as ``model_name``@``alias`` (None: logged, not
    registered)."""
    return experiment.run_experiment(
        cfg, tracking_uri, model_name, alias, progress, report_dir, parent_run_id, package=package_run
    )


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
    model_uri = PACKAGERS[packaging](ckpt_dir, cfg, manifest, run, result, **details)
    version = None
    if model_name:
        version = tracking.register(model_uri, model_name, alias, tracking_uri)
        model_uri = f"models:/{model_name}@{alias}" if alias else f"models:/{model_name}/{version}"
    return model_uri, version


def _package_link(ckpt_dir, cfg, manifest, run, result, example: dict | None = None) -> str:
    """The link pyfunc, with the training data's extractor recorded (name, version and the
    build's options: a CLIP architecture, ...; never the weight path), so the served model runs
    the same extractor on raw images."""
    from models.packaging import log_link_model

    fe = manifest.feature_extractor
    options = dict(manifest.build_params.get("extractor_options") or {})
    return log_link_model(ckpt_dir, result.vocab, example, fe.name, fe.version, options)


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
