"""The end of a retrieval run (and a news run: its family is "retrieval"): test evaluation, MLflow
metrics and artifacts, the packaged and registered model, the HTML report.

Why a hook: ``training.experiment.run_experiment`` reaches ``finish_run`` through
``training.family_hooks`` and never imports this family."""

from __future__ import annotations

import math
from pathlib import Path

import mlflow

from training.backbone import get_backbone
from training.config import TrainConfig
from training.experiment import ExperimentResult, Packager, log_model
from training.objectives.registry import get_objective


def flat_retrieval_metrics(scores: dict) -> dict[str, float]:
    """test_medr, test_r10, test_i2t_medr, test_refined_medr, test_<relation>_medr,
    test_ap_<relation>, ... from ``training.retrieval.objective.evaluate_pairs``."""
    out = {}
    keys = (
        ("t2i", "test_"),
        ("i2t", "test_i2t_"),
        ("t2i_refined", "test_refined_"),
        ("t2i_refined_tuned", "test_tuned_"),
    )
    for key, prefix in keys:
        for k, v in (scores.get(key) or {}).items():
            if k in ("medr", "medr_std", "medr_frac", "r1", "r5", "r10", "refine_lambda", "refine_threshold"):
                out[prefix + k] = v
    for rel, m in (scores.get("relations") or {}).items():
        out.update({f"test_{rel}_{k}": m[k] for k in ("medr", "r1", "r5", "r10") if k in m})
    for rel, ap in (scores.get("relation_ap") or {}).items():
        out[f"test_ap_{rel}"] = ap
    return {k: float(v) for k, v in out.items() if v is not None and not math.isnan(v)}


def finish_run(
    cfg: TrainConfig,
    manifest,
    run,
    result,
    tracking_uri: str,
    model_name: str | None,
    alias: str | None,
    report_dir=None,
    package: Packager | None = None,
) -> ExperimentResult:
    """A retrieval run's test evaluation (MedR/R@K, refined, per relation, relation AP), logged
    with the retrieval model ``package`` packages (``models/retrieval_serving.py``: its gallery
    is the test split's images, its refinement the lambda and T chosen on validation), registered
    under ``model_name`` as ``alias`` when a name is given."""
    from training.data import make_batch
    from training.epoch_batches import validation_batches
    from training.retrieval.objective import _net, evaluate_pairs, tune_refinement
    from training.retrieval.query_bank import fill_query_bank

    test_paths = [str(p) for p in manifest.shard_paths(cfg.data, "test")]
    tables = validation_batches(test_paths, cfg.batch_docs, 0, 1, ("metadata",))
    batches = [make_batch(t, result.vocab, cfg.max_tokens) for t in tables]
    val_paths = [str(p) for p in manifest.shard_paths(cfg.data, "val")]
    val = [
        make_batch(t, result.vocab, cfg.max_tokens)
        for t in validation_batches(val_paths, cfg.batch_docs, 0, 1, ("metadata",))
    ]
    # the bank of training captions the scores are normalised by, before anything ranks
    fill_query_bank(_net(result.model), cfg.data, manifest, result.vocab, cfg.max_tokens)
    tuned = tune_refinement(result.model, val, cfg) if val else None
    scores = evaluate_pairs(result.model, batches, cfg, list(manifest.relations or []), tuned)
    mlflow.log_metrics(flat_retrieval_metrics(scores))
    mlflow.log_metric("best_epoch", result.best_epoch)
    mlflow.log_dict(scores, "test_retrieval.json")
    refine = tuned or {"refine_lambda": cfg.refine_lambda, "refine_threshold": cfg.refine_threshold}
    warnings = _run_warnings(cfg, result.model)
    report_path = _retrieval_report(cfg, manifest, run, result, scores, batches, refine, report_dir, warnings)
    packaging = get_objective(cfg.objective).packaging
    args = (cfg, manifest, run, result, model_name, alias, tracking_uri, package)
    model_uri, version = log_model(packaging, *args, test_paths=test_paths, refine=refine)
    return ExperimentResult(
        run_id=run.info.run_id,
        model_uri=model_uri,
        model_version=version,
        best_epoch=result.best_epoch,
        test=scores,
        random=None,
        tracking_uri=tracking_uri,
        report_path=report_path,
        warnings=warnings,
    )


def _run_warnings(cfg: TrainConfig, model) -> list[str]:
    """The trained backbone's warnings about the run (``BackboneSpec.run_warnings``: a news
    model's texts cut by ``--news-max-tokens``), logged by the hook; [] for a backbone without."""
    hook = get_backbone(cfg.model_backbone).run_warnings
    return hook(model) if hook is not None else []


def _retrieval_report(cfg, manifest, run, result, scores, batches, refine, report_dir, warnings=()) -> str:
    """The retrieval run's HTML report (metrics, the first test queries with their top 5),
    logged to MLflow and written to ``report_dir``; its path."""
    from training.report import write_report
    from training.retrieval.report import LoadedRetrieval, per_query, retrieval_report

    name = cfg.label.upper()
    loaded = LoadedRetrieval(
        name, result.model, result.vocab, cfg.max_tokens, refine["refine_lambda"], refine["refine_threshold"]
    )
    results = {name: {"metrics": scores, "per_query": per_query(loaded, batches)}}
    meta = {"run": run.info.run_id, "dataset": f"{manifest.source} {manifest.dataset_version}"}
    if warnings:
        meta["warning"] = " | ".join(warnings)
    html = retrieval_report(
        f"mmlinks retrieval evaluation: {run.info.run_name}", cfg.data, "test", results, meta
    )
    mlflow.log_text(html, "report.html")
    folder = Path(report_dir or Path(cfg.data).resolve().parent / "reports")
    return str(write_report(folder / f"{run.info.run_id}.html", html))
