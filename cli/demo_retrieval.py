"""``mmlinks demo --family retrieval``: the coherence-retrieval family end to end offline.

synth-coherence -> build -> train CMCA and CMCM -> report (Figure 6) -> register -> promote CMCM
through the gate -> query the production model's gallery; each step calls its own command's code."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cli.output import heartbeat, step, table
from cli.train_options import demo_workers, train_config_from_args
from schemas import config_fields
from schemas.library_output import build_log_path, library_output_to

STEPS = 7
# the two objectives the demo trains and compares (Figure 6: CMCM's top 5 beside CMCA's); the
# second is the one promoted. Their models get the registry's default names (mmlinks-cmca, ...).
COMPARED = ("cmca", "cmcm")


def _corpus_and_build(work: Path, pairs: int, seed: int, debug: bool):
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.coherence_corpus import CoherenceSynthConfig, write_coherence_corpus

    corpus, dataset = work / "coherence-corpus", work / "coherence-dataset"
    step(1, STEPS, f"synthetic coherence corpus: {pairs} text-image pairs -> {corpus}")
    write_coherence_corpus(corpus, CoherenceSynthConfig(pairs=pairs, seed=seed))
    step(2, STEPS, "pair dataset build (Apache Beam, DirectRunner): CNN features, shards, relations")
    with library_output_to(None if debug else build_log_path(str(dataset))), heartbeat("beam build"):
        manifest = build_dataset(
            BuildConfig(
                source="synthetic",
                input=str(corpus),
                out=str(dataset),
                split_ratios={"train": 0.6, "val": 0.2, "test": 0.2},
            )
        )
    print(f"    {manifest.counts['splits']} pairs, relations {manifest.relations}", file=sys.stderr)
    return dataset, manifest


def _query(uri: str, model_uri: str, dataset: Path) -> dict:
    """One test text against the production model's gallery, the way a downstream job asks."""
    import mlflow
    import pandas as pd

    from schemas.manifest import Manifest
    from training.retrieval.pairs import split_pairs

    ids, texts, _ = split_pairs(Manifest.read(dataset).shard_paths(dataset, "test"))
    mlflow.set_tracking_uri(uri)
    out = mlflow.pyfunc.load_model(model_uri).predict(pd.DataFrame([{"text": texts[0]}]), params={"top_k": 5})
    top = list(out.iloc[0]["candidates"])
    return {"text": texts[0], "true": ids[0], "top5": top, "hit": ids[0] in top}


def run_retrieval_demo(args) -> dict:
    from mlflow.tracking import MlflowClient

    from models.experiment import run_experiment
    from models.gate import Gate
    from models.registry import promote
    from training.objectives.registry import default_model_name
    from training.report import write_report
    from training.retrieval.report import evaluate_retrieval_split, load_registered, retrieval_report
    from training.tracking import tracking_uri

    t0 = time.perf_counter()
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    seed = train_config_from_args(args, data=str(work / "coherence-dataset"), objective=COMPARED[0]).seed
    dataset, manifest = _corpus_and_build(work, args.pairs, seed, args.debug)
    uri = tracking_uri(work)
    runs = {}
    for k, objective in enumerate(COMPARED):
        cfg = train_config_from_args(args, data=str(dataset), objective=objective, **demo_workers(args))
        if not cfg.storage_path:
            cfg.storage_path = str(work / "ray_results")
        step(3 + k, STEPS, f"training {objective.upper()} with Ray Train, up to {cfg.epochs} epochs")
        runs[objective] = run_experiment(
            cfg,
            uri,
            default_model_name(objective),
            "candidate",
            progress=not args.json,
            report_dir=work / "reports",
        )
    step(5, STEPS, "test metrics of both models and the report (CMCM's top 5 beside CMCA's)")
    results = {}
    for objective, res in runs.items():
        loaded = load_registered(objective.upper(), res.model_uri, uri)
        results[loaded.name] = evaluate_retrieval_split(loaded, dataset, "test", seed=seed)
    meta = {"dataset": f"{manifest.source} {manifest.dataset_version}", "split": "test"}
    html = retrieval_report("mmlinks retrieval demo: CMCM vs CMCA", dataset, "test", results, meta)
    report = write_report(work / "reports" / "retrieval-demo.html", html)
    promoted_name = default_model_name(COMPARED[1])
    promotion = promote(MlflowClient(uri), promoted_name, dataset, config_fields.from_args(Gate, args))
    production = f"models:/{promoted_name}@production"
    if promotion.promoted:
        step(
            6,
            STEPS,
            f"promoted {production} -> version {runs[COMPARED[1]].model_version} (validation MedR gate)",
        )
    else:
        step(6, STEPS, f"promotion refused: {'; '.join(promotion.failures)}")
    query = None
    if promotion.promoted or promotion.production_version:
        query = _query(uri, production, dataset)
        step(7, STEPS, f"queried {production}: true image in the top 5: {query['hit']}")
    summary = {
        "family": "retrieval",
        "test": {name: r["metrics"] for name, r in results.items()},
        "model_uris": {o: r.model_uri for o, r in runs.items()},
        "model_versions": {o: r.model_version for o, r in runs.items()},
        "promoted": promotion.promoted,
        "promotion_failures": promotion.failures,
        "validation_metrics": promotion.candidate_metrics,
        "production_query": query,
        "report": str(report),
        "tracking_uri": uri,
        "dataset_manifest": str(dataset / "manifest.json"),
        "wall_time_s": round(time.perf_counter() - t0, 1),
    }
    if not args.json:
        _show(summary)
    return summary


def _show(summary: dict) -> None:
    rows = []
    for name, m in summary["test"].items():
        rows.append([name, *(f"{m['t2i'][k]:.1f}" for k in ("medr", "r1", "r5", "r10"))])
        if "t2i_refined" in m:
            rows.append(
                [f"{name} refined", *(f"{m['t2i_refined'][k]:.1f}" for k in ("medr", "r1", "r5", "r10"))]
            )
    pool = next(iter(summary["test"].values()))["t2i"]["pool_size"]
    print(f"\nText -> image, test split, pools of {pool} (MedR: lower is better):")
    print(table(rows, ["model", "MedR", "R@1", "R@5", "R@10"]))
    print(f"\nreport:    {summary['report']}")
    print(f"promoted:  {summary['promoted']}  {'; '.join(summary['promotion_failures'])}")
    print(f"wall time: {summary['wall_time_s']:.0f} s")
