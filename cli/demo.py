"""``mmlinks demo``: the whole job offline, each step calling the same code as its command."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cli.common import EPILOG, add_common, writable_dir
from cli.models import add_gate_args
from cli.output import auc_noise, heartbeat, step, table
from cli.train_options import add_registration_args, add_train_args, demo_workers, train_config_from_args
from schemas import config_fields
from schemas.library_output import build_log_path, library_output_to

STEPS = 7
CONFOUNDS = ("style_strength", "topic_words", "topic_position")  # SynthConfig fields the demo offers


def add_parsers(sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="run synth -> build -> train -> evaluate -> register -> promote offline",
        description="The whole job on this machine with no servers and no network: generate a "
        "synthetic corpus, build Parquet shards with Beam, train the AP model with Ray Train "
        "(2 CPU workers), evaluate on the test split against Random, and register the model "
        "in a local MLflow (SQLite) as 'candidate', then promote it to 'production' through the "
        "evaluation gate.",
        epilog=EPILOG,
    )
    demo.add_argument(
        "--workdir", default="mmlinks-demo", help="where everything is written (default: ./mmlinks-demo)"
    )
    demo.add_argument("--docs", type=int, default=600, help="synthetic documents (default: 600)")
    demo.add_argument(
        "--family",
        choices=("link", "retrieval"),
        default="link",
        help="link: the Hessel et al. linking model (default); retrieval: the coherence-aware "
        "text-to-image retrieval family (synth-coherence -> build -> CMCA and CMCM -> report with "
        "CMCM's top 5 beside CMCA's -> promote CMCM on validation MedR -> query; --objective is ignored). "
        "Training flags not given take the family's defaults: link --epochs 20 --d-multi 256 --lr 1e-3; "
        "retrieval --epochs 8 --lr 3e-3 --batch-docs 16 --d-shared 64 --word-vectors random "
        "--min-word-count 1",
    )
    demo.add_argument(
        "--pairs",
        type=int,
        default=1000,
        help="--family retrieval: synthetic text-image pairs (default: 1000)",
    )
    from pipelines.synthetic_corpus import SynthConfig
    from schemas import config_fields

    # documents with a style of their own (docs/training.md, "Confounded documents")
    config_fields.add_arguments(demo, SynthConfig, CONFOUNDS, groups=False)
    add_train_args(demo)  # the family's own defaults (FAMILY_DEFAULTS) fill the flags not given
    add_registration_args(demo)
    # reruns differ by shuffle noise
    add_gate_args(demo, max_auc_drop=1.0, max_p_at_1_drop=5.0, max_medr_rise=1.0, max_r10_drop=5.0)
    add_common(demo)
    demo.set_defaults(func=cmd_demo, show=None)


# Each family's training defaults, for the flags not given (TrainConfig's own are for a full
# run). Retrieval: what reaches MedR <= 10% of the pool and R@10 >= 5x chance on the demo's
# 1,000 pairs in minutes (docs/benchmarks.md, "Coherence retrieval learns"); TrainConfig's
# (lr 1e-4, B 11, d 300, 50 epochs) learn too but take far longer on 2 cores.
FAMILY_DEFAULTS = {
    "link": {"epochs": 20, "d_multi": 256, "lr": 1e-3},
    "retrieval": {
        "epochs": 8,
        "lr": 3e-3,
        "batch_docs": 16,
        "d_shared": 64,
        "word_vectors": "random",
        "min_word_count": 1,
    },
}


def cmd_demo(args) -> dict:
    writable_dir(args.workdir)
    for name, value in FAMILY_DEFAULTS[args.family].items():
        if not hasattr(args, name):  # TrainConfig flags default to "not given" (argparse.SUPPRESS)
            setattr(args, name, value)
    if args.family == "retrieval":
        from cli.demo_retrieval import run_retrieval_demo

        return run_retrieval_demo(args)
    return run_demo(args)


def query_production(uri: str, model_uri: str, dataset: Path) -> dict:
    """Load the production model the way a downstream stage does and link one test document."""
    import mlflow
    import pandas as pd

    from schemas.manifest import Manifest
    from schemas.shards import read_table
    from training.data import features_of

    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(model_uri)
    paths = Manifest.read(dataset).shard_paths(dataset, "test")
    doc = read_table(paths[:1], columns=["doc_id", "sentences", "images", "links"]).slice(0, 1)
    feats, _ = features_of(doc)
    out = model.predict(
        pd.DataFrame([{"sentences": doc.column("sentences")[0].as_py(), "image_features": feats[0].tolist()}])
    )
    truth = [[lk["sentence"], lk["image"]] for lk in (doc.column("links")[0].as_py() or [])]
    return {"doc_id": doc.column("doc_id")[0].as_py(), "links": out["links"][0], "true_links": sorted(truth)}


def run_demo(args) -> dict:
    from models.experiment import run_experiment
    from training.tracking import tracking_uri

    t0 = time.perf_counter()
    stage_s: dict[str, float] = {}
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    corpus, dataset = work / "corpus", work / "dataset"
    cfg = train_config_from_args(args, data=str(dataset), **demo_workers(args))
    if not cfg.storage_path:
        cfg.storage_path = str(work / "ray_results")

    _corpus(corpus, args.docs, cfg.seed, {k: getattr(args, k) for k in CONFOUNDS if hasattr(args, k)})
    stage_s["synth"] = time.perf_counter() - t0
    t = time.perf_counter()
    manifest = _build(corpus, dataset, debug=args.debug)
    stage_s["build"] = time.perf_counter() - t

    uri = tracking_uri(work)
    step(
        3,
        STEPS,
        f"training {cfg.objective.upper()} with Ray Train ({cfg.num_workers} workers), "
        f"up to {cfg.epochs} epochs; metrics -> MLflow",
    )
    name = args.model_name or "mmlinks-ap"
    t = time.perf_counter()
    res = run_experiment(
        cfg, uri, model_name=name, alias="candidate", progress=True, report_dir=work / "reports"
    )
    stage_s["train_evaluate_register"] = time.perf_counter() - t
    for warning in res.warnings:  # e.g. a flat within-document signal
        print(f"warning: {warning}", file=sys.stderr)
    step(
        4, STEPS, f"evaluated best checkpoint (epoch {res.best_epoch}) on {res.test['n_docs']} test documents"
    )
    step(5, STEPS, f"registered {name} version {res.model_version} as 'candidate' (run {res.run_id})")
    t = time.perf_counter()
    promotion, query = _promote_and_query(args, uri, name, dataset, res.model_version)
    stage_s["promote"] = time.perf_counter() - t

    wall = time.perf_counter() - t0
    # Metrics are those of the model this run trained (the candidate); "production_version"
    # says which version serves models:/NAME@production after the gate.
    summary = {
        "auc": res.test["auc"],
        "p_at_1": res.test["p_at_1"],
        "p_at_5": res.test["p_at_5"],
        "n_test_docs": res.test["n_docs"],
        "auc_se": res.test.get("auc_se"),
        "random_auc": res.random["auc"],
        "random_p_at_1": res.random["p_at_1"],
        "random_p_at_5": res.random["p_at_5"],
        "best_epoch": res.best_epoch,
        "model_uri": f"models:/{name}@production",
        "model_version": res.model_version,
        "promoted": promotion.promoted,
        "promotion_failures": promotion.failures,
        "production_version": res.model_version if promotion.promoted else promotion.production_version,
        "run_id": res.run_id,
        "tracking_uri": uri,
        "dataset_manifest": str(dataset / "manifest.json"),
        "dataset_version": manifest.dataset_version,
        "report": res.report_path,
        "warnings": res.warnings,
        "production_query": query,
        "wall_time_s": round(wall, 1),
        "stage_s": {k: round(v, 1) for k, v in stage_s.items()},
    }
    if not args.json:
        _show(summary, cfg.objective, res, dataset)
    return summary


def _corpus(corpus: Path, docs: int, seed: int, confounds: dict) -> None:
    from tqdm import tqdm

    from pipelines.synthetic_corpus import SynthConfig, corpus_matches, write_corpus

    synth_cfg = SynthConfig(docs=docs, seed=seed, **confounds)
    if corpus_matches(corpus, synth_cfg):
        step(1, STEPS, f"synthetic corpus: reusing {corpus}")
        return
    step(1, STEPS, f"synthetic corpus: {synth_cfg.docs} documents -> {corpus}")
    with tqdm(total=synth_cfg.docs, unit="doc", file=sys.stderr) as bar:
        write_corpus(corpus, synth_cfg, bar.update)


def _build(corpus: Path, dataset: Path, debug: bool = False):
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig

    step(2, STEPS, "dataset build (Apache Beam, DirectRunner): validate, phash, CNN features, shards")
    with library_output_to(None if debug else build_log_path(str(dataset))), heartbeat("beam build"):
        manifest = build_dataset(BuildConfig(source="synthetic", input=str(corpus), out=str(dataset)))
    dropped = sum(manifest.counts.get("dropped", {}).values())
    print(
        f"    {manifest.counts['splits']} documents, {dropped} dropped, version {manifest.dataset_version}",
        file=sys.stderr,
    )
    return manifest


def _promote_and_query(args, uri: str, name: str, dataset: Path, version: str | None):
    """The gate, then (if there is a production model) one query the way a downstream job makes it."""
    from mlflow.tracking import MlflowClient

    from models.gate import Gate
    from models.registry import promote

    promotion = promote(MlflowClient(uri), name, dataset, config_fields.from_args(Gate, args))
    model_uri = f"models:/{name}@production"
    if promotion.promoted:
        step(6, STEPS, f"promoted: {model_uri} -> version {version} (gate passed)")
    else:
        refused = "; ".join(promotion.failures)
        step(
            6, STEPS, f"promotion refused, production stays version {promotion.production_version}: {refused}"
        )
    if not (promotion.promoted or promotion.production_version):  # the first candidate was refused
        step(7, STEPS, f"no production version of {name} yet; nothing to query")
        return promotion, None
    query = query_production(uri, model_uri, dataset)
    step(7, STEPS, f"queried {model_uri}: document {query['doc_id']} -> links {query['links']}")
    return promotion, query


def _show(summary: dict, objective: str, res, dataset: Path) -> None:
    def cells(m: dict) -> list[str]:
        return [f"{m[k]:.1f}" for k in ("auc", "p_at_1", "p_at_5")]

    rows = [[f"{objective.upper()} (this run)", *cells(res.test)], ["Random", *cells(res.random)]]
    print(f"\nTest split, {res.test['n_docs']} documents (macro-averaged, x100{auc_noise(res.test)}):")
    print(table(rows, ["method", "AUC", "p@1", "p@5"]))
    print(f"\nmodel:     {summary['model_uri']}  (version {summary['production_version']})")
    print(f"manifest:  {dataset / 'manifest.json'}   (mmlinks data inspect {dataset})")
    uri = summary["tracking_uri"]
    ui = f"mlflow ui --backend-store-uri {uri}" if uri.startswith("sqlite") else uri
    print(f"MLflow UI: {ui}")
    print(f"report:    {res.report_path}")
    print(f"wall time: {summary['wall_time_s']:.0f} s")
