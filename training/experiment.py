"""One tracked experiment: train with Ray, evaluate the best checkpoint, log and register it.

The model is packaged and registered by the layer above: ``run_experiment`` is handed a
``Packager`` (``models.experiment.package_run``) and calls it once, inside the run, with the best
checkpoint; training never imports ``models/``. Callers use ``models.experiment.run_experiment``,
which hands it over."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlflow

from pipelines.confounds import shards_confounds
from schemas.shards import has_labels
from training import tracking
from training.checkpoints import resume_line
from training.config import TrainConfig
from training.driver import fit_inputs
from training.evaluate import evaluate_shards
from training.family_hooks import run_finish, run_plan
from training.metrics import flat_within_warning
from training.run_inputs import RunInputs, read_inputs

EXPERIMENT = tracking.EXPERIMENT  # the MLflow experiment of every training run

# How a finished run's model is packaged as an MLflow pyfunc and registered (the layer above
# provides it: ``models.experiment.package_run``): ``package(packaging, ckpt_dir, cfg, manifest,
# run, result, model_name, alias, tracking_uri, **details) -> (model URI, registered version or
# None)``, called inside the run's MLflow run. ``packaging`` is the objective's
# ``ObjectiveSpec.packaging`` ("link", "pairs", "news-archive"); ``details``: the run's
# ``test_paths`` (a link run's input example is its first document; [] for none) and a retrieval
# run's ``refine``.
Packager = Callable[..., tuple[str, str | None]]


@dataclass
class ExperimentResult:
    run_id: str
    # models:/<name>@<alias> when registered, else runs:/...; None: not packaged (objective packaging "none")
    model_uri: str | None
    model_version: str | None
    best_epoch: int
    test: dict | None  # None: the test split has no labelled document
    random: dict | None
    tracking_uri: str
    report_path: str = ""
    per_doc: list[dict] = dataclasses.field(default_factory=list)  # test metrics per document
    warnings: list[str] = dataclasses.field(default_factory=list)  # e.g. a flat within-document signal
    # a staged run's parent run (run_id is then its last stage's, the one that registered the model)
    parent_run_id: str | None = None
    # the run named by --run-name had already finished: nothing was trained or registered
    already_finished: bool = False
    # what the backbone chose by measuring the corpus (the gru image side, issue #60), as a dict
    choice: dict | None = None

    def to_dict(self) -> dict:
        """What ``mmlinks train --json`` prints and the Dagster asset records (no per-doc list)."""
        return {
            "already_finished": self.already_finished,
            "run_id": self.run_id,
            "model_uri": self.model_uri,
            "model_version": self.model_version,
            "best_epoch": self.best_epoch,
            "test": self.test,
            "random": self.random,
            "tracking_uri": self.tracking_uri,
            "report": self.report_path,
            "warnings": self.warnings,
            **({"choice": self.choice} if self.choice else {}),
            **({"parent_run_id": self.parent_run_id} if self.parent_run_id else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> ExperimentResult:
        """The inverse of ``to_dict`` (a job's JSON line back into a typed result); the per-doc
        list is not part of that dict and comes back empty unless given as ``per_doc``."""
        try:
            return cls(
                run_id=data["run_id"],
                model_uri=data["model_uri"],
                model_version=data.get("model_version"),
                best_epoch=int(data["best_epoch"]),
                test=data.get("test"),
                random=data.get("random"),
                tracking_uri=data.get("tracking_uri", ""),
                report_path=data.get("report", data.get("report_path", "")) or "",
                per_doc=list(data.get("per_doc") or []),
                warnings=list(data.get("warnings") or []),
                parent_run_id=data.get("parent_run_id"),
                choice=data.get("choice"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            from schemas.errors import MmlinksError

            raise MmlinksError(f"not an experiment result: {exc!r} in {sorted(data)}") from None

    @classmethod
    def from_json(cls, text: str) -> ExperimentResult:
        """From the JSON line ``python -m models.job`` prints (the last JSON line of ``text``)."""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("{")]
        if not lines:
            from schemas.errors import MmlinksError

            raise MmlinksError("no JSON result line in the job's output")
        return cls.from_dict(json.loads(lines[-1]))


def log_model(
    packaging: str, cfg, manifest, run, result, model_name, alias, tracking_uri, package: Packager, **details
) -> tuple[str | None, str | None]:
    """Log vocabulary, history and, through ``package``, the model of the objective's
    ``packaging`` (every family's run ends here; "none" packages nothing), registered when
    ``model_name`` is given: (model URI or None, registered version or None)."""
    mlflow.log_dict({"words": result.vocab.words}, "config/vocab.json")
    mlflow.log_dict({"history": result.history}, "training_history.json")
    if packaging == "none":
        mlflow.set_tag("mmlinks.model", f"not packaged (objective {cfg.objective})")
        return None, None
    with result.checkpoint.as_directory() as ckpt_dir:  # works for local and remote storage
        args = (ckpt_dir, cfg, manifest, run, result, model_name, alias, tracking_uri)
        return package(packaging, *args, **details)


def _log_scores(scores: dict, best_epoch: int) -> None:
    mlflow.log_metrics({f"test_{k}": v for k, v in scores["model"].items() if not math.isnan(v)})
    mlflow.log_metrics({f"random_{k}": v for k, v in scores["random"].items() if not math.isnan(v)})
    mlflow.log_metric("best_epoch", best_epoch)
    with tempfile.TemporaryDirectory() as tmp:
        per_doc = Path(tmp) / "test_per_document.json"
        per_doc.write_text(json.dumps(scores["per_doc"], indent=1))
        mlflow.log_artifact(str(per_doc))
        preds = Path(tmp) / "test_predictions.json"  # every test document's score matrix
        preds.write_text(json.dumps(scores["predictions"]))
        mlflow.log_artifact(str(preds))


# Documents of the training split the confound figures read (a bounded read of a large corpus).
CONFOUND_SAMPLE = 5000


def _report(inputs: RunInputs, run, result, scores, report_dir, warnings: list[str], confounds=None) -> str:
    """The HTML evaluation report, logged to MLflow and written to ``report_dir``; its path."""
    from training.report import document_cards, render_report, write_report

    cfg = inputs.cfg
    objective = inputs.objective
    manifest = inputs.manifest
    info = {
        "run": run.info.run_id,
        "objective": objective.text(cfg),
        "dataset": f"{manifest.source} {manifest.dataset_version}",
        "features": f"{manifest.feature_extractor.name}",
        "best epoch": str(result.best_epoch),
    }
    if confounds is not None:
        ratio = "-" if confounds.image_ratio is None else f"{confounds.image_ratio:.2f}"
        share = "-" if confounds.text_share is None else f"{confounds.text_share:.2f}"
        info["training confounds"] = f"image ratio {ratio}, text share {share} (docs/training.md)"
    if getattr(result, "choice", None) is not None:
        info["image side (measured)"] = result.choice.summary()
    cards = document_cards(result.model, result.vocab, inputs.test_paths, cfg.max_tokens, scores["per_doc"])
    html = render_report(
        f"mmlinks evaluation: {run.info.run_name}",
        scores["model"],
        scores["random"],
        result.history,
        scores["per_doc"],
        cards,
        info,
        warnings,
    )
    mlflow.log_text(html, "report.html")
    folder = Path(report_dir or Path(cfg.data).resolve().parent / "reports")
    return str(write_report(folder / f"{run.info.run_id}.html", html))


def run_experiment(
    cfg: TrainConfig | RunInputs,
    tracking_uri: str,
    model_name: str | None = "mmlinks-ap",
    alias: str | None = "candidate",
    progress: bool = False,
    report_dir: str | Path | None = None,
    parent_run_id: str | None = None,
    *,
    package: Packager,
) -> ExperimentResult:
    """Train, evaluate, log and register the run of ``cfg``: a config, or what ``read_inputs``
    read of one (``mmlinks train`` reads first, for one-line errors before anything heavy loads;
    every stage below uses that one read). The report goes to MLflow and ``report_dir``
    (default: ``reports/`` by the dataset); ``parent_run_id`` nests the run (a grid's trials);
    ``package`` logs and registers the model. An objective with a staged run plan
    (``family_hooks.run_plan``) trains each stage as a run nested under one parent, and returns
    the last stage's result."""
    inputs = cfg if isinstance(cfg, RunInputs) else read_inputs(cfg)
    cfg = inputs.cfg
    # the objective's family hooks, looked up once: a staged run plan, the family's end of a run
    plan = run_plan(cfg.objective)
    finish = run_finish(inputs.objective.family)
    if plan is not None:
        staged = plan(cfg, tracking_uri, model_name, alias, progress, report_dir, parent_run_id, package)
        if staged is not None:
            return staged
    storage = inputs.storage
    if inputs.resume_key:
        resuming = resume_line(cfg.run_name, storage, cfg.epochs)  # from its checkpoints on disk
        done = tracking.finished_run(inputs.resume_key, cfg.epochs, tracking_uri)
        if done is not None:  # the same command again: nothing to train, nothing new to register
            run_id, model_uri, version, best_epoch = done
            return ExperimentResult(
                run_id, model_uri, version, best_epoch, None, None, tracking_uri, already_finished=True
            )
        if progress and resuming:  # one line on stderr: from which epoch the run goes on
            print(resuming, file=sys.stderr, flush=True)
    manifest = inputs.manifest
    with tracking.open_run(inputs, tracking_uri, parent_run_id) as run:
        with tracking.epoch_progress(tracking_uri, run.info.run_id, cfg.epochs, progress):
            result = fit_inputs(inputs, mlflow_run_id=run.info.run_id, mlflow_tracking_uri=tracking_uri)
        if finish is not None:  # the family's own end of a run (retrieval and news)
            return finish(cfg, manifest, run, result, tracking_uri, model_name, alias, report_dir, package)
        # the training split's confound figures (``pipelines.confounds``), logged to the run
        confounds = shards_confounds(inputs.train_paths, max_documents=CONFOUND_SAMPLE)
        logged = {"train_image_ratio": confounds.image_ratio, "train_text_share": confounds.text_share}
        mlflow.log_metrics({k: v for k, v in logged.items() if v is not None})
        warnings = [w for w in [flat_within_warning(result.history, confounds=confounds)] if w]
        if warnings:
            mlflow.set_tag("mmlinks.warning", " | ".join(warnings))
        if has_labels(inputs.test_paths):
            scores = evaluate_shards(
                result.model, result.vocab, inputs.test_paths, cfg.max_tokens, seed=cfg.seed
            )
            _log_scores(scores, result.best_epoch)
            report_path = _report(inputs, run, result, scores, report_dir, warnings, confounds)
            args = (cfg, manifest, run, result, model_name, alias, tracking_uri, package)
            model_uri, version = log_model("link", *args, test_paths=inputs.test_paths)
            return ExperimentResult(
                run_id=run.info.run_id,
                model_uri=model_uri,
                model_version=version,
                best_epoch=result.best_epoch,
                test=scores["model"],
                random=scores["random"],
                tracking_uri=tracking_uri,
                report_path=report_path,
                per_doc=scores["per_doc"],
                warnings=warnings,
                choice=result.choice.to_dict() if result.choice is not None else None,
            )
        # A corpus without ground truth (e.g. DIY beyond its labelled subset): the model is still
        # logged and registered; there is nothing to score it against.
        mlflow.set_tag("mmlinks.test", "not evaluated: the test split has no labelled document")
        mlflow.log_metric("best_epoch", result.best_epoch)
        args = (cfg, manifest, run, result, model_name, alias, tracking_uri, package)
        model_uri, version = log_model("link", *args, test_paths=[])
        return ExperimentResult(
            run.info.run_id,
            model_uri,
            version,
            result.best_epoch,
            None,
            None,
            tracking_uri,
            warnings=warnings,
        )
