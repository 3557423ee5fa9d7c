"""`mmlinks evaluate` (a trained model) and `mmlinks baseline` (random, object-detection, nostruct,
clip-zero-shot)."""

from __future__ import annotations

from pathlib import Path

from cli.common import EPILOG, add_common, existing_dir, per_doc_path
from schemas import config_fields
from schemas.errors import MmlinksError
from training.link.baseline_names import BASELINES

# The TrainConfig flags of `baseline --method nostruct` (the rest keep TrainConfig's defaults).
NOSTRUCT_FLAGS = ["epochs", "d_multi", "batch_docs", "lr", "min_word_count", "num_workers", "ray_address"]


def add_parsers(sub) -> None:
    _add_evaluate(sub)
    _add_baseline(sub)


def _add_evaluate(sub) -> None:
    from training.config import TrainConfig  # the defaults of the settings it shares with training

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
        default="glove",  # a measurement of word spread, not a model's start (TrainConfig's 'auto')
        help="sentence vectors for --spread: 'glove' (offline GloVe 6B 50-d, the default) or a "
        "word2vec/GloVe text file",
    )
    ev.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the Random baseline shown alongside, and of a retrieval model's pools (default: 0)",
    )
    ret = ev.add_argument_group(
        "retrieval models (--objective cmca|cmcm|cmcm-c|news): MedR and R@K both directions over pools, "
        "per relation and relation AP (cmcm), and on pairs with attribute truth (synth-coherence "
        "--salience graded) the top-5 match per named attribute beside a linear probe of the frozen "
        "image features and the attribute oracle's MedR; the per-query file holds each text's rank "
        "(and top-5 images)"
    )
    ret.add_argument(
        "--compare-uri",
        help="a second retrieval model scored beside the first (e.g. CMCA beside CMCM), also in --report",
    )
    ret.add_argument(
        "--report",
        metavar="FILE",
        help="write the HTML report: metrics and, for a few texts, the true image and each model's top 5",
    )
    pool_size, pools = (config_fields.default_value(TrainConfig, n) for n in ("pool_size", "n_pools"))
    ret.add_argument(
        "--pool-size",
        type=int,
        default=pool_size,
        help=f"candidates per pool (default: {pool_size}, the paper's)",
    )
    ret.add_argument(
        "--pools", type=int, default=pools, help=f"random pools averaged over (default: {pools})"
    )
    ev.add_argument("--workdir", default=".", help="where the default mlflow.db lives (default: .)")
    add_common(ev)
    ev.set_defaults(func=cmd_evaluate, show=show_evaluation)


def _add_baseline(sub) -> None:
    from training.config import TrainConfig

    base = sub.add_parser(
        "baseline",
        help="score a baseline on a dataset split: random, object-detection, nostruct or clip-zero-shot",
        description="The paper's baselines. random: uniform random scores (about 50 AUC). "
        "object-detection: each image is the mean word vector of its top-K ImageNet class names "
        "(from the classifier of the CNN that made the dataset's features), each sentence the mean "
        "word vector of its words, scored by cosine, for every K in 1..--k-max; K is chosen on the "
        "val split and the test-set best K (the paper's post-hoc choice, an upper bound) is shown "
        "too. nostruct: trains the NoStruct objective (one random sentence and image per document) "
        "with Ray Train and scores it on test, tracked in MLflow but not registered. clip-zero-shot: "
        "mmc4's linker: cosine of CLIP text embeddings and the dataset's CLIP image embeddings (a "
        "dataset built with --extractor clip-vit-b32 --weights FILE; pass the same --weights), links "
        "by one max-weight assignment per document.",
        epilog=EPILOG,
    )
    base.add_argument("--data", required=True, help="dataset directory (holds manifest.json)")
    base.add_argument("--method", required=True, choices=list(BASELINES), help="which baseline")
    base.add_argument("--split", default="test", help="split to score (default: test)")
    base.add_argument(
        "--per-doc-out",
        metavar="FILE",
        help="per-document JSON Lines (default: WORKDIR/evaluations/METHOD-SPLIT-TIME.jsonl; "
        "nostruct: only when given)",
    )
    config_fields.add_arguments(base, TrainConfig, ["seed", "word_vectors"], groups=False)
    base.add_argument("--workdir", default=".", help="output folder and the default mlflow.db (default: .)")
    od = base.add_argument_group("object-detection")
    od.add_argument(
        "--k-max", type=int, default=20, help="try K = 1..K_MAX class names per image (default: 20)"
    )
    od.add_argument(
        "--weights",
        help="weight file of the dataset's CNN, for its ImageNet classifier (densenet169 needs one; "
        "efficientnet-lite0 uses the installed package's); clip-zero-shot: the CLIP weight file",
    )
    zs = base.add_argument_group("clip-zero-shot")
    zs.add_argument(
        "--clip-model",
        default="ViT-B-32",
        help="open_clip architecture of --weights (default: ViT-B-32; OpenAI's file: ViT-B-32-quickgelu)",
    )
    zs.add_argument(
        "--min-score",
        type=float,
        default=-1.0,
        help="assigned links with a lower cosine are dropped from the link P/R/F1 (default: -1, none)",
    )
    ns = base.add_argument_group("nostruct training (other settings: TrainConfig's defaults)")
    config_fields.add_arguments(ns, TrainConfig, NOSTRUCT_FLAGS, groups=False)
    add_common(base)
    base.set_defaults(func=cmd_baseline, show=show_evaluation)


def _evaluation(model) -> str:
    """How `mmlinks evaluate` scores ``model``: its backbone's ``BackboneSpec.evaluation`` ("links",
    "pairs", "news"); a model that records no known backbone is scored as a link model."""
    from training.backbone import backbone_names, get_backbone

    name = getattr(getattr(model, "cfg", None), "backbone", None)
    return get_backbone(name).evaluation if name in backbone_names() else "links"


def _retrieval_model(name: str, model, vocab, max_tokens: int, linker=None):
    """A ``LoadedRetrieval`` when ``model`` is a retrieval network (the coherence backbone),
    else None; a registered model brings its packaged refinement, a checkpoint the defaults."""
    from training.config import TrainConfig
    from training.retrieval.report import LoadedRetrieval

    if _evaluation(model) != "pairs":
        return None
    lam = getattr(linker, "refine_lambda", config_fields.default_value(TrainConfig, "refine_lambda"))
    threshold = getattr(
        linker, "refine_threshold", config_fields.default_value(TrainConfig, "refine_threshold")
    )
    return LoadedRetrieval(name, model, vocab, max_tokens, lam, threshold)


def _fill_bank(model, checkpoint: str, data: str, vocab, max_tokens: int) -> None:
    """A training checkpoint's query bank, drawn as ``finish_run`` draws it when the run ends:
    from its training dataset's train split (``--data``'s when that dataset is gone)."""
    import json
    import sys

    from schemas.manifest import Manifest
    from training.retrieval.query_bank import fill_query_bank

    meta = json.loads((Path(checkpoint) / "meta.json").read_text())
    trained_on = (meta.get("train") or {}).get("data")
    source = trained_on if trained_on and (Path(trained_on) / "manifest.json").is_file() else data
    if not fill_query_bank(model, source, Manifest.read(source), vocab, max_tokens) and model.cfg.query_bank:
        print(f"note: {source} has no training captions for the query bank: plain cosine", file=sys.stderr)


def _load_any(args, uri: str | None, checkpoint: str | None):
    """(model, vocab, max_tokens, the LoadedRetrieval or None) of a model URI or checkpoint."""
    from training.evaluate import load_checkpoint, load_linker
    from training.tracking import tracking_uri

    if checkpoint:
        existing_dir(checkpoint)
        model, vocab, max_tokens = load_checkpoint(checkpoint, args.vocab)
        found = _retrieval_model(Path(checkpoint).name, model, vocab, max_tokens)
        if found is not None and not len(getattr(model, "query_bank", [None])):
            _fill_bank(model, checkpoint, args.data, vocab, max_tokens)
        return model, vocab, max_tokens, found
    linker = load_linker(uri, tracking_uri(args.workdir))
    if not all(hasattr(linker, a) for a in ("model", "vocab", "max_tokens")):
        raise MmlinksError(f"{uri} is not an mmlinks model")
    name = uri.split("models:/", 1)[-1]
    found = _retrieval_model(name, linker.model, linker.vocab, int(linker.max_tokens), linker)
    return linker.model, linker.vocab, int(linker.max_tokens), found


def _evaluate_retrieval(args, first) -> dict:
    """`mmlinks evaluate` of a retrieval model (and --compare-uri beside it)."""
    from training.evaluate import write_per_doc
    from training.retrieval.report import evaluate_retrieval_split, retrieval_report

    models = [first]
    if args.compare_uri:
        other = _load_any(args, args.compare_uri, None)[3]
        if other is None:
            raise MmlinksError(f"--compare-uri {args.compare_uri} is not a retrieval model")
        models.append(other)
    results = {
        m.name: evaluate_retrieval_split(m, args.data, args.split, args.pool_size, args.pools, args.seed)
        for m in models
    }
    rows = [{"model": name, **q} for name, r in results.items() for q in r["per_query"]]
    path = write_per_doc(rows, per_doc_path(args, "retrieval"))
    out = {
        "family": "retrieval",
        "split": args.split,
        "models": {name: r["metrics"] for name, r in results.items()},
        "per_doc": str(path.resolve()),
    }
    if args.report:
        meta = {"dataset": str(Path(args.data).resolve()), "split": args.split}
        html = retrieval_report("mmlinks retrieval evaluation", args.data, args.split, results, meta)
        from training.report import write_report

        out["report"] = str(write_report(args.report, html).resolve())
    return out


def _evaluate_news(args, model, vocab, max_tokens: int) -> dict:
    """`mmlinks evaluate` of a news image selection model: R@1/5/10 and MedR both directions
    over the split's samples (complete inputs), pools of --pool-size; each sample's rank goes to
    the per-sample file."""
    from schemas.manifest import Manifest
    from training.evaluate import write_per_doc
    from training.news.evaluation import news_split_metrics

    if args.compare_uri or args.report or args.spread:
        raise MmlinksError("--compare-uri, --report and --spread are not available for news models")
    paths = [str(p) for p in Manifest.read(args.data).shard_paths(args.data, args.split)]
    if not paths:
        raise MmlinksError(f"{args.data} has no {args.split!r} shards to evaluate on")
    m = news_split_metrics(model, vocab, max_tokens, paths, args.pool_size, args.pools, args.seed)
    rows = [{"doc_id": d, "t2i_rank": int(r)} for d, r in zip(m["doc_ids"], m["ranks"], strict=True)]
    name = args.model_uri or str(Path(args.checkpoint).resolve())
    return {
        "family": "retrieval",
        "split": args.split,
        "models": {name: {"t2i": m["t2i"], "i2t": m["i2t"], "pairs": m["pairs"]}},
        "per_doc": str(write_per_doc(rows, per_doc_path(args, "news")).resolve()),
    }


def cmd_evaluate(args) -> dict:
    from training.evaluate import evaluate, write_per_doc

    existing_dir(args.data)
    model, vocab, max_tokens, retrieval = _load_any(args, args.model_uri, args.checkpoint)
    if retrieval is not None:
        return _evaluate_retrieval(args, retrieval)
    if _evaluation(model) == "news":
        return _evaluate_news(args, model, vocab, max_tokens)
    if args.compare_uri or args.report:
        raise MmlinksError("--compare-uri and --report are for retrieval models (cmca, cmcm, cmcm-c)")
    scores = evaluate(model, vocab, args.data, args.split, max_tokens, seed=args.seed)
    if args.spread:  # the link family's error analysis, added to the per-document rows
        from training.link.spread import add_spread

        scores["spread"] = add_spread(scores["per_doc"], args.data, args.split, args.word_vectors)
    path = write_per_doc(scores["per_doc"], per_doc_path(args, "model"))
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


def _baseline_options(args):
    """The training options the baselines share (seed, word vectors, NoStruct's training)."""
    from training.config import TrainConfig

    # Ray workers run in another directory: the dataset path must be absolute.
    return config_fields.from_args(
        TrainConfig, args, data=str(Path(args.data).resolve()), objective="nostruct"
    )


def cmd_baseline(args) -> dict:
    from training.evaluate import write_per_doc
    from training.link.baselines import object_detection_baseline, random_scores_baseline

    existing_dir(args.data)
    opts = _baseline_options(args)
    if args.method == "random":
        out = random_scores_baseline(args.data, args.split, opts.seed)
    elif args.method == "object-detection":
        # class names against sentences need pretrained vectors: auto is GloVe here (random
        # vectors, the link training default, would make every similarity noise)
        words = "glove" if getattr(args, "word_vectors", "auto") == "auto" else opts.word_vectors
        out = object_detection_baseline(args.data, args.split, args.k_max, words, args.weights)
    elif args.method == "clip-zero-shot":
        from training.link.zero_shot import clip_zero_shot_baseline

        out = clip_zero_shot_baseline(args.data, args.split, args.weights, args.clip_model, args.min_score)
    else:
        out = _nostruct_baseline(args, opts)
    rows = out.pop("per_doc_metrics", None)
    if rows is not None:  # DocMetrics (random, object-detection) or dicts (nostruct)
        rows = [r if isinstance(r, dict) else r.__dict__ for r in rows]
        out["per_doc"] = str(write_per_doc(rows, per_doc_path(args, args.method)).resolve())
    return out


def _nostruct_baseline(args, cfg) -> dict:
    """Train the NoStruct objective (one random sentence and image per document) and score it
    on the test split, tracked in MLflow like any training run but not registered."""
    from models.experiment import run_experiment
    from schemas.manifest import Manifest
    from training.tracking import tracking_uri

    if args.split != "test":
        raise MmlinksError("--method nostruct trains a model and scores it on the test split; drop --split")
    Manifest.read(args.data)
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


def show_evaluation(r: dict) -> None:
    """Tables of `evaluate` and `baseline` (``--json`` prints every field)."""
    from cli.output import auc_noise, table

    def cells(m: dict) -> list[str]:
        return [f"{m[k]:.1f}" if m.get(k) is not None else "-" for k in ("auc", "p_at_1", "p_at_5")]

    header = ["method", "AUC", "p@1", "p@5"]
    if r.get("family") == "retrieval":
        _show_retrieval(r)
    elif "method" not in r:  # evaluate
        skipped = f"{r['n_skipped']} skipped{auc_noise(r)}"
        print(f"{r['split']} split, {r['n_docs']} labelled documents ({skipped})")
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
        name = BASELINES[r["method"]]
        print(f"{r['split']} split, {r['n_docs']} labelled documents")
        if r["method"] == "object-detection":
            rows = [[f"K={p['k']}", *cells(p[r["split"]])] for p in r["per_k"]]
            print(table(rows, ["K", "AUC", "p@1", "p@5"]))
            oracle = r["oracle"]
            print(f"{name}: K={r['best_k']} chosen on {r['selected_on']}; test-best K={oracle['k']}")
            rows = [[f"{name} K={r['best_k']}", *cells(r)], [f"oracle K={oracle['k']}", *cells(oracle)]]
            print(table(rows, header))
        elif r["method"] == "clip-zero-shot":
            print(table([[name, *cells(r)], ["Random", *cells(r["random"])]], header))
            lk = r["links"]
            print(
                f"assigned links (one-to-one, score >= {r['min_score']}): precision {lk['precision']:.1f}, "
                f"recall {lk['recall']:.1f}, F1 {lk['f1']:.1f} "
                f"({lk['predicted']} predicted, {lk['gold']} true)"
            )
        else:
            print(table([[name, *cells(r)]], header))
        if r.get("run_id"):
            print(f"run: {r['run_id']}   tracking: {r['tracking_uri']}")
    if r.get("per_doc"):
        print(f"per-document values: {r['per_doc']}")


def _show_attributes(name: str, m: dict) -> None:
    """The per-attribute table of a split with attribute truth (graded-salience corpora)."""
    from cli.output import table

    if not m.get("attributes"):
        return

    def pct(x) -> str:
        return "-" if x is None else f"{100 * x:.1f}"

    rows = [
        [
            a,
            str(x["queries"]),
            pct(x["top5_match"]),
            pct(x["chance"]),
            pct(x.get("probe")),
            "-" if x.get("match_over_probe") is None else f"{x['match_over_probe']:.2f}",
        ]
        for a, x in m["attributes"].items()
    ]
    print(f"{name}: top-5 match per named attribute (attribute oracle MedR {m['oracle']['medr']:.1f})")
    print(table(rows, ["attribute", "queries", "top-5 match %", "chance %", "probe %", "match / probe"]))


def _show_retrieval(r: dict) -> None:
    from cli.output import table

    def cells(m: dict) -> list[str]:
        return [f"{m[k]:.1f}" for k in ("medr", "r1", "r5", "r10")]

    rows = []
    for name, m in r["models"].items():
        rows += [[f"{name} text->image", *cells(m["t2i"])], [f"{name} image->text", *cells(m["i2t"])]]
        if "t2i_refined" in m:
            rows.append([f"{name} text->image refined", *cells(m["t2i_refined"])])
        rows += [[f"  {rel}", *cells(x)] for rel, x in (m.get("relations") or {}).items() if x.get("pools")]
    pool = next(iter(r["models"].values()))["t2i"]["pool_size"]
    print(f"{r['split']} split, pools of {pool} (MedR: lower is better)")
    print(table(rows, ["model / queries", "MedR", "R@1", "R@5", "R@10"]))
    for name, m in r["models"].items():
        _show_attributes(name, m)
        if m.get("relation_ap"):
            print(f"{name} relation AP: " + ", ".join(f"{k} {v:.2f}" for k, v in m["relation_ap"].items()))
    if r.get("report"):
        print(f"report: {r['report']}")
