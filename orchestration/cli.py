"""``mmlinks``: the command line over the dataset pipelines and the training stack.

Every command prints human-readable output by default and exactly one JSON object on stdout
with ``--json``. Expected failures (missing paths, bad manifests, unknown schema versions) end
with a one-line ``mmlinks: error: ...`` and exit code 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

from features.registry import DEFAULT_EXTRACTOR, describe_extractors
from pipelines.sources import source_names
from schemas.errors import MmlinksError

EPILOG = "Every command accepts --json (one JSON object on stdout) and --help."


def _quiet_libraries() -> None:
    """Keep library chatter (Beam's optional-dependency warnings, Ray banners) off the console."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    for name in ("apache_beam", "root", "alembic", "mlflow", "ray"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _existing_dir(value: str) -> str:
    if not Path(value).exists():
        raise MmlinksError(f"{value} does not exist")
    if not Path(value).is_dir():
        raise MmlinksError(f"{value} is not a directory")
    return value


# ---------------------------------------------------------------------------------- commands


def cmd_synth(args) -> dict:
    from tqdm import tqdm

    from pipelines.synthetic_corpus import SynthConfig, write_corpus

    cfg = SynthConfig(
        docs=args.docs,
        seed=args.seed,
        images_min=args.images_min,
        images_max=args.images_max,
        extra_sentence_rate=args.extra_sentence_rate,
        extra_image_rate=args.extra_image_rate,
        palette_similarity=args.palette_similarity,
        image_size=args.image_size,
    )
    if cfg.docs < 1 or cfg.images_min < 1 or cfg.images_max < cfg.images_min:
        raise MmlinksError("need --docs >= 1 and 1 <= --images-min <= --images-max")
    if cfg.image_size < 32:
        raise MmlinksError("--image-size must be >= 32")
    _writable_dir(args.out)
    with tqdm(total=cfg.docs, desc="synth", unit="doc", file=sys.stderr, disable=args.quiet) as bar:
        path = write_corpus(args.out, cfg, bar.update)
    return {"corpus": str(path.parent), "documents": cfg.docs, "seed": cfg.seed}


def _split_ratios(text: str) -> dict[str, float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise MmlinksError(f"--split wants three numbers like 0.8,0.1,0.1, not {text!r}") from None
    if len(values) != 3 or min(values) < 0 or sum(values) <= 0:
        raise MmlinksError(f"--split wants three non-negative numbers with a positive sum, not {text!r}")
    return dict(zip(("train", "val", "test"), values, strict=True))


def _writable_dir(value: str) -> str:
    if Path(value).exists() and not Path(value).is_dir():
        raise MmlinksError(f"{value} exists and is not a directory")
    return value


def _key_values(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MmlinksError(f"{flag} wants KEY=VALUE, not {item!r}")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def _split_sizes(text: str | None) -> dict[str, int] | None:
    if not text:
        return None
    try:
        sizes = {k: int(v) for k, v in _key_values(text.split(","), "--split-sizes").items()}
    except ValueError:
        raise MmlinksError(f"--split-sizes wants counts like val=500,test=1000, not {text!r}") from None
    if any(n < 0 for n in sizes.values()):
        raise MmlinksError(f"--split-sizes wants non-negative counts, not {text!r}")
    return sizes


def _dedupe_threshold(text: str) -> int | None:
    if text.lower() == "off":
        return None
    try:
        return int(text)
    except ValueError:
        raise MmlinksError(f"--dedupe-threshold wants a number of bits or 'off', not {text!r}") from None


def cmd_build(args) -> dict:
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig

    if "://" not in args.input and not Path(args.input).exists():  # remote: checked by the source
        raise MmlinksError(f"--input {args.input} does not exist")
    extractor_options = _key_values(args.extractor_option, "--extractor-option")
    if args.weights:
        extractor_options["weights"] = args.weights
    region_options = _key_values(args.region_option, "--region-option")
    if args.region_weights:
        region_options["weights"] = args.region_weights
    # Only what the user said: the rest comes from the source's defaults (filter preset,
    # near-duplicate removal, split ratios), then BuildConfig's.
    cfg = BuildConfig.for_source(
        args.source,
        args.input,
        args.out,
        extractor=args.extractor,
        regions=None if args.regions in (None, "none") else args.regions,
        extractor_options=extractor_options,
        region_options=region_options,
        precision=args.precision,
        split_ratios=_split_ratios(args.split) if args.split else None,
        split_sizes=_split_sizes(args.split_sizes),
        **({"dedupe_threshold": _dedupe_threshold(args.dedupe_threshold)} if args.dedupe_threshold else {}),
        dedupe_policy=args.dedupe_policy,
        filter_preset=args.filter,
        filter_options=_key_values(args.filter_option, "--filter-option"),
        max_shard_rows=args.max_shard_rows,
        max_shard_mb=args.max_shard_mb,
        image_store=args.image_store,
        placeholder_images=args.placeholder_images,
        runner=args.runner,
        direct_workers=args.direct_workers,
        device=args.device,
        cpu_threads=args.cpu_threads,
        batch_size=args.batch_size,
        beam_args=[*(args.beam_arg or []), *[a for a in (args.beam_options or []) if a != "--"]],
        source_options=_key_values(args.source_option, "--source-option"),
        crawl_state=args.crawl_state,
    )
    from orchestration.output import heartbeat

    cfg.check()  # option errors as one line, before anything is printed or created
    print(f"building {cfg.source} dataset with Beam ({cfg.runner}) -> {cfg.out}", file=sys.stderr)
    with heartbeat("beam build"):
        manifest = build_dataset(cfg)
    from pipelines import fileio
    from pipelines.commit import last_build

    summary = {"manifest": fileio.join(cfg.out, "manifest.json"), **_manifest_summary(manifest)}
    summary["dead_letter"] = fileio.join(cfg.out, manifest.dead_letter) if manifest.dead_letter else None
    return {**summary, "build": last_build(cfg.out)}


def cmd_import_hessel(args) -> dict:
    """`data import-hessel`: a shortcut for `data build --source hessel` with the three files named."""
    args.source = "hessel"
    args.input = args.docs.rsplit("/", 1)[0] if "/" in args.docs else "."  # keeps gs:// URIs whole
    args.source_option = [
        *(args.source_option or []),
        f"docs={args.docs}",
        f"features={args.features}",
        f"id2row={args.id2row}",
        *([f"name={args.name}"] if args.name else []),
    ]
    return cmd_build(args)


def cmd_crawl(args) -> dict:
    """`data crawl diy`: the incremental crawl of new posts, checkpointed between runs."""
    from datetime import UTC, datetime

    import praw.exceptions
    import prawcore.exceptions

    from pipelines.crawl_state import CrawlState
    from pipelines.sources.base import env_credential
    from pipelines.sources.reddit import (
        DEFAULT_OVERLAP_S,
        REDDIT_CREDENTIALS,
        crawl_new_posts,
        make_reddit,
    )

    overlap_s = getattr(args, "overlap_s", None)
    print(f"crawling r/{args.subreddit}/new -> {args.out}", file=sys.stderr)
    try:
        reddit = make_reddit(args.reddit_api_base)  # credentials from the environment, or one clear error
        result = crawl_new_posts(
            CrawlState(args.state),
            args.out,
            subreddit=args.subreddit,
            reddit=reddit,
            limit=args.limit,
            overlap_s=DEFAULT_OVERLAP_S if overlap_s is None else overlap_s,
        )
    except (prawcore.exceptions.PrawcoreException, praw.exceptions.PRAWException) as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        detail = " ".join(str(exc).split())[:300]
        for name in REDDIT_CREDENTIALS:  # never echo a credential, whatever the message holds
            value = env_credential(name)
            if value:
                detail = detail.replace(value, "***")
        hint = ""
        if status == 401 or isinstance(exc, prawcore.exceptions.OAuthException):
            hint = " (check praw_client_id and praw_client_secret: a read-only 'script' app's id and secret)"
        elif status == 403:
            hint = " (forbidden: a private, quarantined or banned subreddit?)"
        elif status == 404 or isinstance(exc, prawcore.exceptions.Redirect):
            hint = " (no such subreddit?)"
        elif isinstance(exc, prawcore.exceptions.RequestException):
            hint = " (network: Reddit could not be reached)"
        raise MmlinksError(
            f"the Reddit API failed during the crawl of r/{args.subreddit}: {type(exc).__name__}: "
            f"{detail}{hint}; the checkpoint did not move, rerun to retry"
        ) from exc
    if result.get("gap_possible"):
        gap = result.get("gap") or {}

        def utc(ts) -> str:
            return "?" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")

        if gap.get("checkpoint_kept"):
            what = "a run without --limit fetches them (the checkpoint stays)"
        else:
            what = "the listing cannot reach them any more: backfill that range from the dumps"
        print(
            f"warning: gap_possible: posts of r/{args.subreddit} created between "
            f"{utc(gap.get('after_utc'))} and {utc(gap.get('before_utc'))} may be missing; {what}",
            file=sys.stderr,
        )
    return {"source": args.source, "subreddit": args.subreddit, **result}


def cmd_sources(args) -> dict:
    from pipelines.sources import get_spec

    out = {}
    for name in source_names():
        spec = get_spec(name)
        out[name] = {
            "summary": spec.summary,
            "options": {o.name: {"default": o.default, "help": o.help} for o in spec.options},
            "credentials": list(spec.credentials),
            "build_defaults": spec.build_defaults,
        }
    return {"sources": out}


def cmd_migrate(args) -> dict:
    from schemas.migrate import migrate_dataset

    _existing_dir(args.dir)
    manifest, changed = migrate_dataset(args.dir)
    return {"migrated": changed, **_manifest_summary(manifest)}


def _manifest_summary(m) -> dict:
    return {
        "dataset_version": m.dataset_version,
        "schema_version": m.schema_version,
        "source": m.source,
        "splits": m.counts.get("splits", {}),
        "dropped": m.counts.get("dropped", {}),
        "feature_extractor": vars(m.feature_extractor),
        "region_extractor": vars(m.region_extractor) if m.region_extractor else None,
        "feature_dtype": m.feature_dtype,
        "shards": len(m.shards),
    }


def cmd_inspect(args) -> dict:
    import json

    from schemas.manifest import Manifest

    if not Path(args.dir).exists():
        raise MmlinksError(f"{args.dir} does not exist")
    m = Manifest.read(args.dir)
    return json.loads(m.to_json())


def train_config_from_args(args, **overrides):
    """The TrainConfig that `train` and `demo` build from their shared flags."""
    from training.config import TrainConfig

    values = dict(
        data=getattr(args, "data", ""),
        objective=args.objective,
        k=args.k,
        objectives=args.objectives,
        backbone=args.backbone,
        sub_fraction=args.sub_fraction,
        warmup_steps=args.warmup_steps,
        transformer_layers=args.transformer_layers,
        transformer_heads=args.transformer_heads,
        max_regions=args.max_regions,
        negatives=args.negatives,
        batch_docs=args.batch_docs,
        lr=args.lr,
        epochs=args.epochs,
        d_multi=args.d_multi,
        max_tokens=args.max_tokens,
        min_word_count=args.min_word_count,
        word_vectors=args.word_vectors,
        seed=args.seed,
        num_workers=args.workers,
        use_gpu=args.gpu,
        max_failures=args.max_failures,
        cache_data=args.cache_data,
        storage_path=args.storage_path,
        ray_address=args.ray_address,
        run_name=args.run_name,
        ray_logs=args.debug,
    )
    values.update(overrides)
    return TrainConfig(**values)


def cmd_train(args) -> dict:
    from schemas.manifest import Manifest
    from training.experiment import run_experiment
    from training.tracking import tracking_uri

    if getattr(args, "grid", None):
        from orchestration.grid_command import cmd_train_grid

        return cmd_train_grid(args)
    if not args.data:
        raise MmlinksError("train needs --data DIR (or --grid with --grid-data NAME=DIR)")
    _existing_dir(args.data)
    Manifest.read(args.data)
    if args.alias == "production":
        raise MmlinksError(
            "--alias production would skip the gate; register a candidate and run `mmlinks promote`"
        )
    cfg = train_config_from_args(args)
    cfg.validate()
    model_name = f"mmlinks-{cfg.objective}" if args.model_name is None else args.model_name
    res = run_experiment(
        cfg, tracking_uri(args.workdir), model_name or None, args.alias or None, progress=True
    )
    return res.to_dict()


def cmd_promote(args) -> dict:
    from mlflow.tracking import MlflowClient

    from training.registry import Gate, promote, rollback
    from training.tracking import tracking_uri

    client = MlflowClient(tracking_uri(args.workdir))
    if args.rollback:
        was, now = rollback(client, args.model_name)
        return {"rolled_back": True, "name": args.model_name, "from_version": was, "to_version": now}
    if not args.data:
        raise MmlinksError("--data DIR is required (the dataset both models are scored on)")
    _existing_dir(args.data)
    gate = Gate(args.max_auc_drop, args.max_p1_drop, args.min_auc)
    result = promote(client, args.model_name, args.data, gate, args.split).to_dict()
    if not result["promoted"]:
        args.exit_code = 1
    return result


def cmd_report(args) -> dict:
    from training.report import report_for_run, write_report
    from training.tracking import tracking_uri

    uri = tracking_uri(args.workdir)
    run_id, html = report_for_run(uri, args.run, args.data)
    path = write_report(args.out or Path(args.workdir) / "reports" / f"{run_id}.html", html)
    if not args.no_log:
        from mlflow.tracking import MlflowClient

        MlflowClient(uri).log_text(run_id, html, "report.html")
    return {"run_id": run_id, "report": str(path.resolve())}


def _per_doc_path(args, stem: str) -> Path:
    """--per-doc-out, else a fresh WORKDIR/evaluations/STEM-SPLIT-TIME.jsonl (never overwritten)."""
    import time

    if args.per_doc_out:
        return Path(args.per_doc_out)
    base = Path(args.workdir) / "evaluations" / f"{stem}-{args.split}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base.with_suffix(".jsonl"), 1
    while path.exists():
        path, n = Path(f"{base}-{n}.jsonl"), n + 1
    return path


def cmd_evaluate(args) -> dict:
    from training.evaluate import evaluate, load_checkpoint, load_model_uri, write_per_doc
    from training.tracking import tracking_uri

    _existing_dir(args.data)
    if args.checkpoint:
        _existing_dir(args.checkpoint)
        model, vocab, max_tokens = load_checkpoint(args.checkpoint, args.vocab)
    else:
        model, vocab, max_tokens = load_model_uri(args.model_uri, tracking_uri(args.workdir))
    scores = evaluate(
        model,
        vocab,
        args.data,
        args.split,
        max_tokens,
        seed=args.seed,
        spread=args.spread,
        word_vectors=args.word_vectors,
    )
    path = write_per_doc(scores["per_doc"], _per_doc_path(args, "model"))
    out = {
        **scores["model"],
        "split": args.split,
        "model": args.model_uri or str(Path(args.checkpoint).resolve()),
        "random": scores["random"],
        "n_skipped": scores["n_skipped"],
        "per_doc": str(path.resolve()),
    }
    if args.spread:
        out["spread"] = scores["spread"]
    return out


def cmd_baseline(args) -> dict:
    from training.baselines import object_detection_baseline, random_scores_baseline
    from training.evaluate import write_per_doc

    _existing_dir(args.data)
    if args.method == "random":
        out = random_scores_baseline(args.data, args.split, args.seed)
    elif args.method == "object-detection":
        out = object_detection_baseline(args.data, args.split, args.k_max, args.word_vectors, args.weights)
    else:
        out = _nostruct_baseline(args)
    rows = out.pop("per_doc_metrics", None)
    if rows is not None:  # DocMetrics (random, object-detection) or dicts (nostruct)
        rows = [r if isinstance(r, dict) else r.__dict__ for r in rows]
        out["per_doc"] = str(write_per_doc(rows, _per_doc_path(args, args.method)).resolve())
    return out


def _nostruct_baseline(args) -> dict:
    """Train the NoStruct objective (one random sentence and image per document) and score it
    on the test split, tracked in MLflow like any training run but not registered."""
    from schemas.manifest import Manifest
    from training.config import TrainConfig
    from training.experiment import run_experiment
    from training.tracking import tracking_uri

    if args.split != "test":
        raise MmlinksError("--method nostruct trains a model and scores it on the test split; drop --split")
    Manifest.read(args.data)
    cfg = TrainConfig(
        data=str(Path(args.data).resolve()),  # Ray workers run in another directory
        objective="nostruct",
        epochs=args.epochs,
        d_multi=args.d_multi,
        batch_docs=args.batch_docs,
        lr=args.lr,
        min_word_count=args.min_word_count,
        word_vectors=args.word_vectors,
        seed=args.seed,
        num_workers=args.workers,
    )
    cfg.validate()
    uri = tracking_uri(args.workdir)
    res = run_experiment(cfg, uri, model_name=None, alias=None, progress=True)
    out = {
        "method": "nostruct",
        "split": "test",
        **res.test,
        "random": res.random,
        "run_id": res.run_id,
        "model_uri": res.model_uri,
        "best_epoch": res.best_epoch,
        "tracking_uri": uri,
        "report": res.report_path,
    }
    if args.per_doc_out:  # the run's own test evaluation (also its test_per_document.json artifact)
        out["per_doc_metrics"] = res.per_doc
    return out


def cmd_demo(args) -> dict:
    from orchestration.demo import run_demo

    _writable_dir(args.workdir)
    return run_demo(args)


# ---------------------------------------------------------------------------------- parser


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--debug", action="store_true", help="show tracebacks and library logs")


def _add_gate_args(p: argparse.ArgumentParser, auc_drop: float = 0.5, p1_drop: float = 0.0) -> None:
    g = p.add_argument_group("promotion gate (metric points, x100 scale)")
    g.add_argument(
        "--max-auc-drop",
        type=float,
        default=auc_drop,
        help=f"refuse if candidate AUC is more than this below production's (default: {auc_drop:g})",
    )
    g.add_argument(
        "--max-p1-drop",
        type=float,
        default=p1_drop,
        help=f"refuse if candidate p@1 is more than this below production's (default: {p1_drop:g})",
    )
    g.add_argument("--min-auc", type=float, default=0.0, help="absolute AUC floor (default: 0)")


def _add_train_args(p: argparse.ArgumentParser, epochs: int, d_multi: int, lr: float) -> None:
    g = p.add_argument_group("model and objective (defaults: Hessel et al. 2019 unless noted)")
    g.add_argument(
        "--objective",
        choices=["nostruct", "dc", "tk", "ap", "li2021"],
        default="ap",
        help="training objective: the NoStruct baseline, Hessel 2019's DC, TK or AP (assignment) "
        "document similarity, or Li et al. 2021 (default: ap)",
    )
    # the pre-#5 spelling, still accepted
    g.add_argument("--similarity", dest="objective", choices=["dc", "tk", "ap"], help=argparse.SUPPRESS)
    g.add_argument("--k", choices=["full", "half"], default="full", help="k for TK/AP (default: full)")
    g.add_argument(
        "--negatives",
        choices=["hard", "mean"],
        default="hard",
        help="pool in-batch negatives by max (hard) or mean (default: hard)",
    )
    g.add_argument(
        "--objectives",
        default="C",
        choices=["C", "C+I", "C+D", "C+I+D"],
        help="li2021 terms: C cross-document, I intra-document NegTK, D dropout sub-document (default: C)",
    )
    g.add_argument(
        "--backbone",
        choices=["gru", "transformer"],
        default="gru",
        help="text/image encoders: GRU + projected CNN feature (Hessel 2019), or Transformers over "
        "words and over region features + concept tokens (Li 2021; needs a dataset built with --regions)",
    )
    g.add_argument(
        "--sub-fraction",
        type=float,
        default=0.8,
        help="li2021 D: share of sentences and images kept in a sub-document (default: 0.8)",
    )
    g.add_argument(
        "--warmup-steps",
        type=int,
        default=0,
        help="linear learning-rate warm-up steps (default: 0; Li: 3000)",
    )
    g.add_argument("--transformer-layers", type=int, default=3, help="transformer layers (default: 3)")
    g.add_argument("--transformer-heads", type=int, default=8, help="attention heads (default: 8)")
    g.add_argument("--max-regions", type=int, default=36, help="regions per image, by score (default: 36)")
    g.add_argument("--batch-docs", type=int, default=11, help="documents per batch, B (default: 11)")
    g.add_argument("--lr", type=float, default=lr, help=f"Adam learning rate (default: {lr:g})")
    g.add_argument("--epochs", type=int, default=epochs, help=f"epochs (default: {epochs})")
    g.add_argument(
        "--d-multi",
        type=int,
        default=d_multi,
        help=f"joint space width = GRU units (default: {d_multi}; paper: 1024)",
    )
    g.add_argument("--max-tokens", type=int, default=20, help="tokens kept per sentence (default: 20)")
    g.add_argument("--min-word-count", type=int, default=5, help="vocabulary min count (default: 5)")
    g.add_argument(
        "--word-vectors",
        default="glove",
        help="'glove' (offline GloVe 6B 50-d), 'random', or a file: word2vec/GloVe/fastText text, word2vec "
        "binary (.bin) or a fastText model (.bin); force a format with text:, word2vec-bin: or fasttext:",
    )
    g.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    r = p.add_argument_group("Ray Train")
    r.add_argument("--workers", type=int, default=2, help="Ray Train workers, each one process (default: 2)")
    r.add_argument("--gpu", action="store_true", help="one GPU per worker")
    r.add_argument(
        "--max-failures", type=int, default=0, help="worker failures to retry from the last checkpoint"
    )
    r.add_argument(
        "--storage-path", default="", help="Ray Train storage (path or URI; default: next to the data)"
    )
    r.add_argument("--ray-address", default="", help="existing Ray cluster address (default: local Ray)")
    r.add_argument(
        "--cache-data",
        choices=["auto", "yes", "no"],
        default="auto",
        help="keep the training shards in Ray's object store between epochs (auto: if <= 2 GiB on "
        "disk) or stream them from the shards every epoch (no: for data larger than memory)",
    )
    r.add_argument(
        "--run-name",
        default="",
        help="Ray Train run name; reuse one (with the same --storage-path) to resume it",
    )
    t = p.add_argument_group("MLflow")
    t.add_argument(
        "--model-name",
        help="registered model name (default: mmlinks-OBJECTIVE, e.g. mmlinks-ap; '' = do not register)",
    )
    t.add_argument(
        "--alias",
        default="candidate",
        help="alias for the new version (default: candidate; `mmlinks promote` moves production)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmlinks",
        description="Discover links between the images and sentences of multimodal documents "
        "(Hessel, Lee & Mimno, EMNLP 2019): build datasets with Apache Beam, train with Ray "
        "Train, track and register models with MLflow.",
        epilog="Start with `mmlinks demo` (offline, about 4 min on 2 cores). " + EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    _add_train_args(demo, epochs=20, d_multi=256, lr=1e-3)
    _add_gate_args(demo, auc_drop=1.0, p1_drop=5.0)  # reruns differ by shuffle noise
    _add_common(demo)
    demo.set_defaults(func=cmd_demo)

    data = sub.add_parser(
        "data",
        help="dataset commands: synth, build, inspect",
        description="Create, build and inspect datasets.",
        epilog=EPILOG,
    )
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

    synth = dsub.add_parser(
        "synth",
        help="generate a synthetic corpus with known links",
        description="Write rendered object photos and sentences that describe some of them "
        "(plus distractor sentences and images) in the raw format `data build` reads.",
        epilog=EPILOG,
    )
    synth.add_argument("--out", required=True, help="output directory")
    synth.add_argument("--docs", type=int, default=600, help="number of documents (default: 600)")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    synth.add_argument(
        "--images-min", type=int, default=3, help="min linked images per document (default: 3)"
    )
    synth.add_argument(
        "--images-max", type=int, default=6, help="max linked images per document (default: 6)"
    )
    synth.add_argument(
        "--extra-sentence-rate",
        type=float,
        default=0.3,
        help="distractor sentences per linked image (default: 0.3)",
    )
    synth.add_argument(
        "--extra-image-rate",
        type=float,
        default=0.2,
        help="distractor images per linked image (default: 0.2)",
    )
    synth.add_argument(
        "--palette-similarity",
        type=float,
        default=0.2,
        help="share of documents whose objects share a 2-colour palette; higher is harder (default: 0.2)",
    )
    synth.add_argument("--image-size", type=int, default=128, help="image side in pixels (default: 128)")
    synth.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(synth)
    synth.set_defaults(func=cmd_synth)

    build = dsub.add_parser(
        "build",
        help="build Parquet document shards + manifest with Apache Beam",
        description="Read a raw source, validate images and sentences (bad ones go to "
        "dead_letter.jsonl with a reason), compute perceptual hashes and CNN features with "
        "Beam RunInference, assign deterministic splits, and write shards + manifest.json.",
        epilog=EPILOG,
    )
    build.add_argument(
        "--source",
        default="synthetic",
        choices=source_names(),
        help="raw source format (see `mmlinks data sources` for each one's input, options and credentials)",
    )
    build.add_argument("--input", required=True, help="raw source folder or file (per source)")
    build.add_argument(
        "--source-option",
        action="append",
        metavar="KEY=VALUE",
        help="option of --source, repeatable, e.g. start=2013-01 min_score=25 (see `mmlinks data sources`)",
    )
    build.add_argument(
        "--crawl-state",
        metavar="URI",
        help="where the source keeps crawl progress and its HTTP cache between builds "
        "(default: OUT/crawl-state/SOURCE)",
    )
    build.add_argument("--out", required=True, help="dataset output directory or URI (gs://..., s3://...)")
    feats = build.add_argument_group("features")
    feats.add_argument(
        "--extractor",
        default=DEFAULT_EXTRACTOR,
        help=f"global CNN features (default {DEFAULT_EXTRACTOR}): {describe_extractors('global')}",
    )
    feats.add_argument(
        "--regions",
        default=None,
        help="region features for the Li et al. 2021 model (default: none): "
        + describe_extractors("regions"),
    )
    feats.add_argument(
        "--weights", help="weight file of --extractor (default: $MMLINKS_WEIGHTS_DIR, then the torch cache)"
    )
    feats.add_argument("--extractor-option", action="append", metavar="KEY=VALUE", help="--extractor option")
    feats.add_argument("--region-weights", help="weight file of --regions (e.g. Faster R-CNN COCO weights)")
    feats.add_argument(
        "--region-option",
        action="append",
        metavar="KEY=VALUE",
        help="option of --regions, e.g. grid=6 or num_regions=36",
    )
    feats.add_argument(
        "--precision", default="float32", choices=["float32", "float16"], help="feature storage dtype"
    )
    feats.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="feature extraction device")
    feats.add_argument("--batch-size", type=int, default=32, help="images per inference batch (default: 32)")
    feats.add_argument(
        "--image-store",
        help="content-addressed image store root (default: OUT/image-store); share it between builds",
    )
    feats.add_argument(
        "--cpu-threads",
        type=int,
        help="torch threads per worker (default: cores / workers); recorded with the dataset, "
        "since CPU features differ in the last bits with the thread count",
    )
    feats.add_argument(
        "--placeholder-images",
        metavar="DIR",
        help="folder of example 'image removed' pictures; images within 2 phash bits are rejected",
    )
    docs = build.add_argument_group("documents")
    docs.add_argument(
        "--split", help="train,val,test ratios for documents the source leaves unsplit (default: 0.8,0.1,0.1)"
    )
    docs.add_argument(
        "--split-sizes", help="fixed split sizes instead of ratios, e.g. val=500,test=1000 (rest: train)"
    )
    docs.add_argument(
        "--dedupe-threshold",
        help="near-duplicate Hamming distance in bits, or 'off' (default: 3; off for the crowd-labelled "
        "sets, whose images recur across documents on purpose)",
    )
    docs.add_argument(
        "--dedupe-policy",
        default="drop_all",
        choices=["drop_all", "keep_first"],
        help="drop every document with a near-duplicate image (paper), or keep the earliest",
    )
    docs.add_argument("--filter", help="filter preset: none, diy, wiki, recipeqa (default: the source's)")
    docs.add_argument(
        "--filter-option",
        action="append",
        metavar="KEY=VALUE",
        help="override a filter rule, e.g. max_images=20",
    )
    out = build.add_argument_group("shards and runner")
    out.add_argument(
        "--max-shard-rows", type=int, default=1000, help="documents per shard at most (default: 1000)"
    )
    out.add_argument(
        "--max-shard-mb", type=float, default=256.0, help="estimated MB per shard at most (default: 256)"
    )
    out.add_argument(
        "--runner",
        default="DirectRunner",
        choices=["DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner"],
        help="Beam runner (default: DirectRunner); cluster runners need their options after --",
    )
    out.add_argument(
        "--direct-workers",
        type=int,
        help="DirectRunner: N local worker processes (default: one per core; 1 = in-process)",
    )
    out.add_argument(
        "--beam-arg",
        action="append",
        metavar="ARG",
        help="extra Beam pipeline option, repeatable (e.g. --beam-arg=--direct_num_workers=2)",
    )
    out.add_argument(
        "beam_options",
        nargs=argparse.REMAINDER,
        help="Beam pipeline options after `--`, passed through verbatim (e.g. -- --project=p --region=r)",
    )
    _add_common(build)
    build.set_defaults(func=cmd_build)

    imp = dsub.add_parser(
        "import-hessel",
        help="import the original authors' prebuilt dataset (docs.json + features.npy + id2row.json)",
        description="Write the authors' published documents, splits and image features (any "
        "feature size, e.g. DenseNet169's 1664) into versioned shards + manifest, without "
        "re-scraping or re-extracting anything. Same as `data build --source hessel`.",
        epilog=EPILOG,
    )
    imp.add_argument("--docs", required=True, help="docs.json: {train, val, test} lists of documents")
    imp.add_argument("--features", required=True, help="features.npy: N x D image feature matrix")
    imp.add_argument("--id2row", required=True, help="id2row.json: image id -> row of features.npy")
    imp.add_argument("--out", required=True, help="dataset output directory or URI")
    imp.add_argument("--name", help="dataset name for metadata, e.g. diy (default: the docs folder's name)")
    imp.add_argument("--precision", default="float32", choices=["float32", "float16"], help="feature dtype")
    imp.add_argument("--max-shard-rows", type=int, default=1000, help="documents per shard at most")
    imp.add_argument("--max-shard-mb", type=float, default=256.0, help="estimated MB per shard at most")
    imp.add_argument("--direct-workers", type=int, help="DirectRunner worker processes (default: per core)")
    imp.set_defaults(
        **{
            k: None
            for k in (
                "regions weights extractor_option region_weights region_option device cpu_threads "
                "image_store placeholder_images split split_sizes dedupe_threshold filter "
                "filter_option beam_arg beam_options source_option crawl_state"
            ).split()
        },
        extractor=DEFAULT_EXTRACTOR,
        batch_size=32,
        dedupe_policy="drop_all",
        runner="DirectRunner",
    )
    _add_common(imp)
    imp.set_defaults(func=cmd_import_hessel)

    crawl = dsub.add_parser(
        "crawl",
        help="incremental crawl of a web source (diy: new Reddit posts since the last run)",
        description="Fetch the posts made since the last run (praw, read-only OAuth app: set "
        "praw_client_id, praw_client_secret and praw_user_agent in the environment) and write "
        "them as zstd ndjson files in the dump format under OUT/<YYYY-MM>/; then rebuild with "
        "`data build --source diy --input <folder holding dumps and OUT>`. The checkpoint in "
        "--state advances only after the files are written. Reddit listings stop after about "
        "1000 posts: run it at least that often (a schedule does).",
        epilog=EPILOG,
    )
    crawl.add_argument("source", choices=["diy"], help="the source to crawl")
    crawl.add_argument("--out", required=True, help="folder (or URI) for the new submission files")
    crawl.add_argument("--state", required=True, help="crawl-state folder (or URI) holding the checkpoint")
    crawl.add_argument("--subreddit", default="DIY", help="subreddit (default: DIY)")
    crawl.add_argument("--limit", type=int, help="at most this many posts from the listing (default: all)")
    crawl.add_argument(
        "--overlap-s",
        type=int,
        default=86400,
        help="also re-read this many seconds below the checkpoint, for posts approved late (default: 1 day)",
    )
    crawl.add_argument(
        "--reddit-api-base", help="replace https://oauth.reddit.com and www.reddit.com (proxies, tests)"
    )
    _add_common(crawl)
    crawl.set_defaults(func=cmd_crawl)

    sources = dsub.add_parser(
        "sources",
        help="list the raw sources, their options and the credentials they read",
        description="List every --source of `mmlinks data build`: what its --input is, its "
        "--source-option settings with defaults, the environment variables it reads for "
        "credentials, and the build defaults it brings (filter preset, near-duplicate removal, splits).",
        epilog=EPILOG,
    )
    _add_common(sources)
    sources.set_defaults(func=cmd_sources)

    inspect = dsub.add_parser(
        "inspect",
        help="print a dataset manifest",
        description="Print the manifest of a built dataset.",
        epilog=EPILOG,
    )
    inspect.add_argument("dir", help="dataset directory (or its manifest.json)")
    _add_common(inspect)
    inspect.set_defaults(func=cmd_inspect)

    migrate = dsub.add_parser(
        "migrate",
        help="upgrade a dataset written by an older schema version",
        description="Rewrite the shards of an older schema version in the current layout as a new "
        "dataset version in the same directory, then switch its manifest to it.",
        epilog=EPILOG,
    )
    migrate.add_argument("dir", help="dataset directory")
    _add_common(migrate)
    migrate.set_defaults(func=cmd_migrate)

    train = sub.add_parser(
        "train",
        help="train a model with Ray Train, evaluate on test, register in MLflow",
        description="Train on a built dataset, keep the checkpoint with the lowest unsupervised "
        "validation loss, evaluate it on the test split, log everything to MLflow "
        "(MLFLOW_TRACKING_URI, or sqlite under --workdir) and register the model.",
        epilog=EPILOG,
    )
    train.add_argument(
        "--data", help="dataset directory (holds manifest.json); required unless --grid-data is given"
    )
    train.add_argument("--workdir", default=".", help="where the default mlflow.db lives (default: .)")
    _add_train_args(train, epochs=50, d_multi=1024, lr=1e-4)
    from orchestration.grid_command import add_grid_args

    add_grid_args(train.add_argument_group("paper grids (Ray Tune: one trial per grid point and dataset)"))
    _add_common(train)
    train.set_defaults(func=cmd_train)

    prom = sub.add_parser(
        "promote",
        help="move 'production' to the 'candidate' version if it passes the gate (or --rollback)",
        description="Score the candidate and the current production version of a registered "
        "model on the same frozen split of a dataset; move the 'production' alias to the "
        "candidate only if every gate holds, recording the previous version so --rollback can "
        "restore it. Exit code 1 when the gate refuses (the reasons are printed).",
        epilog=EPILOG,
    )
    prom.add_argument("--model-name", default="mmlinks-ap", help="registered model (default: mmlinks-ap)")
    prom.add_argument("--data", help="dataset directory to evaluate on (required unless --rollback)")
    prom.add_argument("--split", default="test", help="split of --data to evaluate on (default: test)")
    prom.add_argument("--workdir", default=".", help="where the default mlflow.db lives (default: .)")
    prom.add_argument("--rollback", action="store_true", help="restore the previous production version")
    _add_gate_args(prom)
    _add_common(prom)
    prom.set_defaults(func=cmd_promote)

    rep = sub.add_parser(
        "report",
        help="render the HTML evaluation report of a run or registered model",
        description="Metrics vs Random, learning curves (val loss vs val AUC by epoch), the "
        "per-document AUC histogram and document cards with predicted and true links; written to "
        "disk and logged to the run as report.html.",
        epilog=EPILOG,
    )
    rep.add_argument("run", help="MLflow run id or model URI (models:/NAME@ALIAS, models:/NAME/VERSION)")
    rep.add_argument("--workdir", default=".", help="where the default mlflow.db lives (default: .)")
    rep.add_argument("--data", help="dataset for the document cards (default: the run's dataset)")
    rep.add_argument("--out", help="output HTML file (default: WORKDIR/reports/RUN_ID.html)")
    rep.add_argument("--no-log", action="store_true", help="do not log the report to the MLflow run")
    _add_common(rep)
    rep.set_defaults(func=cmd_report)

    ev = sub.add_parser(
        "evaluate",
        help="score a trained model on a dataset split: AUC, p@1, p@5 per document and averaged",
        description="Score every labelled document of a split with a trained model (a registered "
        "or logged MLflow model, or a training checkpoint folder): AUC over all sentence-image "
        "pairs, p@1 and p@5 of the highest-scoring pairs, averaged over documents (x100), next to "
        "Random. The per-document values go to a JSON Lines file for your own analysis; --spread "
        "adds each document's image/text spread and how much of the AUC variance spread and "
        "content explain (OLS R^2). See docs/evaluation.md.",
        epilog=EPILOG,
    )
    ev.add_argument("--data", required=True, help="dataset directory (holds manifest.json)")
    ev.add_argument("--split", default="test", help="split to score (default: test)")
    which = ev.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--model-uri",
        help="MLflow model, e.g. models:/mmlinks-ap@production, models:/NAME/3, runs:/RUN/model",
    )
    which.add_argument(
        "--checkpoint",
        help="training checkpoint folder (holds state.pt and meta.json), e.g. from ray_results",
    )
    ev.add_argument(
        "--vocab",
        help="vocabulary of --checkpoint (default: vocab.json inside or next to it; the run's "
        "config/vocab.json artifact works too)",
    )
    ev.add_argument(
        "--per-doc-out",
        metavar="FILE",
        help="where to write the per-document JSON Lines "
        "(default: WORKDIR/evaluations/model-SPLIT-TIME.jsonl)",
    )
    ev.add_argument(
        "--spread", action="store_true", help="add the spread analysis (per-document spread, OLS R^2)"
    )
    ev.add_argument(
        "--word-vectors",
        default="glove",
        help="sentence vectors for --spread: 'glove' (offline GloVe 6B 50-d) or a word2vec/GloVe text file",
    )
    ev.add_argument(
        "--seed", type=int, default=0, help="seed of the Random baseline shown alongside (default: 0)"
    )
    ev.add_argument("--workdir", default=".", help="where the default mlflow.db lives (default: .)")
    _add_common(ev)
    ev.set_defaults(func=cmd_evaluate)

    base = sub.add_parser(
        "baseline",
        help="score a baseline on a dataset split: random, object-detection or nostruct",
        description="The paper's baselines. random: uniform random scores (about 50 AUC). "
        "object-detection: each image is the mean word vector of its top-K ImageNet class names "
        "(from the classifier of the CNN that made the dataset's features), each sentence the mean "
        "word vector of its words, scored by cosine, for every K in 1..--k-max; K is chosen on the "
        "val split and the test-set best K (the paper's post-hoc choice, an upper bound) is shown "
        "too. nostruct: trains the NoStruct objective (one random sentence and image per document) "
        "with Ray Train and scores it on test, tracked in MLflow but not registered.",
        epilog=EPILOG,
    )
    base.add_argument("--data", required=True, help="dataset directory (holds manifest.json)")
    base.add_argument(
        "--method", required=True, choices=["random", "object-detection", "nostruct"], help="which baseline"
    )
    base.add_argument("--split", default="test", help="split to score (default: test)")
    base.add_argument(
        "--per-doc-out",
        metavar="FILE",
        help="per-document JSON Lines (default: WORKDIR/evaluations/METHOD-SPLIT-TIME.jsonl; "
        "nostruct: only when given)",
    )
    base.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    base.add_argument(
        "--word-vectors",
        default="glove",
        help="'glove' (offline GloVe 6B 50-d) or a word2vec/GloVe text file (the paper: word2vec)",
    )
    base.add_argument("--workdir", default=".", help="output folder and the default mlflow.db (default: .)")
    od = base.add_argument_group("object-detection")
    od.add_argument(
        "--k-max", type=int, default=20, help="try K = 1..K_MAX class names per image (default: 20)"
    )
    od.add_argument(
        "--weights",
        help="weight file of the dataset's CNN, for its ImageNet classifier (densenet169 needs one; "
        "efficientnet-lite0 uses the installed package's)",
    )
    ns = base.add_argument_group("nostruct training (other settings: Hessel et al. 2019 defaults)")
    ns.add_argument("--epochs", type=int, default=50, help="epochs (default: 50)")
    ns.add_argument("--d-multi", type=int, default=1024, help="joint space width (default: 1024)")
    ns.add_argument("--batch-docs", type=int, default=11, help="documents per batch (default: 11)")
    ns.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate (default: 1e-4)")
    ns.add_argument("--min-word-count", type=int, default=5, help="vocabulary min count (default: 5)")
    ns.add_argument("--workers", type=int, default=2, help="Ray Train workers (default: 2)")
    _add_common(base)
    base.set_defaults(func=cmd_baseline)
    return parser


def _print_human(args, result: dict) -> None:
    import json

    from orchestration.output import table

    command = args.command if args.command != "data" else args.data_command
    if command == "demo":
        return  # the demo prints its own summary
    if command == "synth":
        print(f"wrote {result['documents']} documents to {result['corpus']}")
    elif command in ("build", "import-hessel"):
        version = f"{result['dataset_version']} (schema v{result['schema_version']})"
        print(f"dataset {version} -> {result['manifest']}")
        print("documents per split: " + ", ".join(f"{k}={v}" for k, v in result["splits"].items()))
        dropped = result["dropped"]
        print("dropped: " + (", ".join(f"{k}={v}" for k, v in dropped.items()) if dropped else "nothing"))
        b = result.get("build") or {}
        if b:
            print(
                f"this build: {b['images_fetched']} images fetched, {b['images_from_store']} from the store, "
                f"{b['features_computed']} features computed, {b['features_cached']} cached, {b['seconds']} s"
            )
        print(f"details of every drop: {result['dead_letter'] or 'dead_letter.jsonl'}")
    elif command == "crawl":
        print(f"{result['new_posts']} new posts -> {', '.join(result['files']) or 'no file'}")
    elif command == "sources":
        for name, info in result["sources"].items():
            print(f"{name}: {info['summary']}")
            if info["credentials"]:
                print(f"  credentials (environment): {', '.join(info['credentials'])}")
            for key, value in sorted(info["build_defaults"].items()):
                print(f"  build default: {key}={value}")
            for opt, o in info["options"].items():
                default = "" if o["default"] is None else f" (default: {o['default']})"
                print(f"  --source-option {opt}=...  {o['help']}{default}")
    elif command == "migrate":
        done = "migrated to" if result["migrated"] else "already at"
        print(f"{done} schema v{result['schema_version']}: dataset {result['dataset_version']}")
    elif command == "inspect":
        _print_manifest(result)
    elif command == "promote":
        if result.get("rolled_back"):
            moved = f"{result['from_version']} to {result['to_version']}"
            print(f"{result['name']}: production moved back from {moved}")
        elif result["promoted"]:
            print(
                f"{result['name']}: production -> version {result['candidate_version']} "
                f"(was {result['production_version']}); candidate {result['candidate_metrics']}"
            )
        else:
            print(f"{result['name']}: promotion of version {result['candidate_version']} refused:")
            for reason in result["failures"]:
                print(f"  - {reason}")
    elif command == "report":
        print(f"report of run {result['run_id']}: {result['report']}")
    elif command in ("evaluate", "baseline"):
        _print_evaluation(command, result)
    elif command == "train" and "table_text" in result:
        from orchestration.grid_command import print_grid

        print_grid(result)
    elif command == "train" and result["test"] is None:
        print(f"best epoch {result['best_epoch']}; the test split has no labelled document: not evaluated")
        print(f"model: {result['model_uri']}   run: {result['run_id']}   tracking: {result['tracking_uri']}")
    elif command == "train":
        t, r = result["test"], result["random"]
        rows = [
            ["model", *(f"{t[k]:.1f}" for k in ("auc", "p_at_1", "p_at_5"))],
            ["Random", *(f"{r[k]:.1f}" for k in ("auc", "p_at_1", "p_at_5"))],
        ]
        print(f"test split, {t['n_docs']} documents (best epoch {result['best_epoch']}):")
        print(table(rows, ["method", "AUC", "p@1", "p@5"]))
        print(f"model: {result['model_uri']}   run: {result['run_id']}   tracking: {result['tracking_uri']}")
    else:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))


def _print_evaluation(command: str, r: dict) -> None:
    """Tables of `evaluate` and `baseline` (``--json`` prints every field)."""
    from orchestration.output import table

    def cells(m: dict) -> list[str]:
        return [f"{m[k]:.1f}" if m.get(k) is not None else "-" for k in ("auc", "p_at_1", "p_at_5")]

    header = ["method", "AUC", "p@1", "p@5"]
    if command == "evaluate":
        print(f"{r['split']} split, {r['n_docs']} labelled documents ({r['n_skipped']} skipped)")
        print(f"model: {r['model']}")
        print(table([["model", *cells(r)], ["Random", *cells(r["random"])]], header))
        sp = r.get("spread")
        if sp:
            for key, what in (("spread", "image + text spread"), ("spread_content", "spread + content")):
                fit = sp.get(key)
                if fit:
                    adj = "n/a (too few documents)" if fit["adj_r2"] is None else f"{fit['adj_r2']:.3f}"
                    print(f"R^2 of per-document AUC on {what}: {fit['r2']:.3f} (adjusted {adj})")
    else:
        name = {"random": "Random", "object-detection": "Obj Detect", "nostruct": "NoStruct"}[r["method"]]
        print(f"{r['split']} split, {r['n_docs']} labelled documents")
        if r["method"] == "object-detection":
            rows = [[f"K={p['k']}", *cells(p[r["split"]])] for p in r["per_k"]]
            print(table(rows, ["K", "AUC", "p@1", "p@5"]))
            oracle = r["oracle"]
            print(f"{name}: K={r['best_k']} chosen on {r['selected_on']}; test-best K={oracle['k']}")
            rows = [[f"{name} K={r['best_k']}", *cells(r)], [f"oracle K={oracle['k']}", *cells(oracle)]]
            print(table(rows, header))
        else:
            print(table([[name, *cells(r)]], header))
        if r.get("run_id"):
            print(f"run: {r['run_id']}   tracking: {r['tracking_uri']}")
    if r.get("per_doc"):
        print(f"per-document values: {r['per_doc']}")


def _print_manifest(m: dict) -> None:
    """A readable summary of a manifest (``--json`` prints all of it)."""
    from orchestration.output import table

    print(f"dataset {m['dataset_version']} (schema v{m['schema_version']}), source {m['source']}")
    fe, re_ = m["feature_extractor"], m.get("region_extractor")
    features = f"{fe['name']}@{fe['version']} ({fe['dim']}-d, {m.get('feature_dtype', 'float32')})"
    regions = f"; regions {re_['name']}@{re_['version']} ({re_['dim']}-d)" if re_ else ""
    print(f"features: {features}{regions}")
    splits = m["counts"].get("splits", {})
    shards = m["shards"]
    rows = [[s, str(n), str(sum(1 for x in shards if x["split"] == s))] for s, n in splits.items()]
    print(table(rows, ["split", "documents", "shards"]))
    pipeline = m["counts"].get("pipeline", {})
    print(f"inputs: {pipeline.get('documents_in', '?')} documents, {pipeline.get('images_in', '?')} images")
    dropped = m["counts"].get("dropped", {})
    if dropped:
        print(table([[k, str(v)] for k, v in sorted(dropped.items())], ["dropped (kind:reason)", "count"]))
    else:
        print("dropped: nothing")
    print(f"dead letters: {m.get('dead_letter')}; all fields: --json")


def main(argv: list[str] | None = None) -> int:
    from orchestration.output import emit_json, stdout_to_stderr

    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.debug:
        _quiet_libraries()
    try:
        with stdout_to_stderr(args.json):
            result = args.func(args)
    except MmlinksError as exc:
        if args.debug:
            raise
        print(f"mmlinks: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mmlinks: interrupted", file=sys.stderr)
        return 130
    if args.json:
        emit_json(result)
    else:
        _print_human(args, result)
    return getattr(args, "exit_code", 0)


if __name__ == "__main__":
    sys.exit(main())
