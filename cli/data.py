"""`mmlinks data ...`: synth, build, import-hessel, crawl, sources, inspect, migrate."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli.common import EPILOG, add_common, existing_dir, key_values, writable_dir
from pipelines.sources import source_names
from schemas import config_fields
from schemas.errors import MmlinksError


def add_parsers(sub) -> None:
    data = sub.add_parser(
        "data",
        help="dataset commands: synth, build, inspect",
        description="Create, build and inspect datasets.",
        epilog=EPILOG,
    )
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

    _add_synth(dsub)
    _add_synth_coherence(dsub)
    _add_synth_news(dsub)
    _add_synth_features(dsub)
    _add_build(dsub)
    _add_import_hessel(dsub)

    _add_crawl(dsub)
    _add_listings(dsub)


def _add_synth(dsub) -> None:
    synth = dsub.add_parser(
        "synth",
        help="generate a synthetic corpus with known links",
        description="Write rendered object photos and sentences that describe some of them "
        "(plus distractor sentences and images) in the raw format `data build` reads.",
        epilog=EPILOG,
    )
    synth.add_argument("--out", required=True, help="output directory")
    from pipelines.synthetic_corpus import SynthConfig

    config_fields.add_arguments(synth, SynthConfig)
    synth.add_argument("--quiet", action="store_true", help="no progress bar")
    add_common(synth)
    synth.set_defaults(func=cmd_synth, show=show_synth)


def _add_synth_coherence(dsub) -> None:
    synth = dsub.add_parser(
        "synth-coherence",
        help="generate a synthetic text-image pair corpus labelled with coherence relations",
        description="Write text-image pairs (one step of a painting project each: the image shows "
        "the result, relation Visible, or the step in progress, Action; some texts are anecdotes, "
        "Story) in the raw format `data build --source synthetic` reads; the build puts the "
        "relation vocabulary in the manifest. For the retrieval objectives (cmca, cmcm, cmcm-c).",
        epilog=EPILOG,
    )
    synth.add_argument("--out", required=True, help="output directory")
    from pipelines.coherence_corpus import CoherenceSynthConfig

    config_fields.add_arguments(synth, CoherenceSynthConfig)
    synth.add_argument("--quiet", action="store_true", help="no progress bar")
    add_common(synth)
    synth.set_defaults(func=cmd_synth_coherence, show=show_synth)


def _add_synth_news(dsub) -> None:
    synth = dsub.add_parser(
        "synth-news",
        help="generate a synthetic multi-source, bilingual news corpus (news image selection)",
        description="Write news articles (headline, lead, body, one or two captioned photos of "
        "rendered objects; sources of different informativeness, some missing; English and a "
        "German-like language with an aligned lexicon; dated) in the news JSONL layout that "
        "`data build --source news-jsonl` reads. For --objective news.",
        epilog=EPILOG,
    )
    synth.add_argument("--out", required=True, help="output directory")
    from pipelines.news_corpus import NewsSynthConfig

    config_fields.add_arguments(synth, NewsSynthConfig)
    synth.add_argument("--quiet", action="store_true", help="no progress bar")
    add_common(synth)
    synth.set_defaults(func=cmd_synth_news, show=show_synth)


def _add_crawl(dsub) -> None:
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
    from pipelines.sources.reddit.config import DEFAULT_OVERLAP_S

    crawl.add_argument(
        "--overlap-s",
        type=int,
        default=DEFAULT_OVERLAP_S,
        help="also re-read this many seconds below the checkpoint, for posts approved late "
        f"(default: {DEFAULT_OVERLAP_S})",
    )
    crawl.add_argument(
        "--reddit-api-base", help="replace https://oauth.reddit.com and www.reddit.com (proxies, tests)"
    )
    add_common(crawl)
    crawl.set_defaults(func=cmd_crawl, show=show_crawl)


def _add_listings(dsub) -> None:
    """`data sources`, `data inspect`, `data migrate`."""
    sources = dsub.add_parser(
        "sources",
        help="list the raw sources, their options and the credentials they read",
        description="List every --source of `mmlinks data build`: what its --input is, its "
        "--source-option settings with defaults, the environment variables it reads for "
        "credentials, and the build defaults it brings (filter preset, near-duplicate removal, splits).",
        epilog=EPILOG,
    )
    add_common(sources)
    sources.set_defaults(func=cmd_sources, show=show_sources)

    inspect = dsub.add_parser(
        "inspect",
        help="print a dataset manifest",
        description="Print the manifest of a built dataset.",
        epilog=EPILOG,
    )
    inspect.add_argument("dir", help="dataset directory (or its manifest.json)")
    inspect.add_argument(
        "--confounds",
        action="store_true",
        help="also measure, per split, how much a document's images look alike (image ratio: between- / "
        "within-document variance of the image features, plain and corrected for images per document; "
        "similarity gap: same- minus other-document cosine, which sees a look of any form) and how much "
        "its sentences share words (text share); reads every shard (docs/training.md, 'Confounded "
        "documents')",
    )
    inspect.add_argument(
        "--choose",
        action="store_true",
        help="also run the choice `mmlinks train` makes by default (--image-centring auto): train each "
        "image-side candidate briefly at the demo's settings (d_multi 256, lr 1e-3, 10 epochs) and print "
        "every candidate's within-document score and the pick (about a minute per 1,000 training "
        "documents on 2 cores; docs/training.md, 'The image side')",
    )
    add_common(inspect)
    inspect.set_defaults(func=cmd_inspect, show=show_manifest)

    confound = dsub.add_parser(
        "confound",
        help="derive a dataset whose images share a per-document look (feature-level, for stress tests)",
        description="Write a new dataset: DIR's shards with every image feature blended towards its "
        "document's look, the same extractor's features of a crop of a real photo drawn per document: "
        "v' = (1 - w) v + w look. A feature-level confound, for testing a linking model on documents "
        "whose photos share a room, light and camera (issue #33); pixel-level rendering cannot reach "
        "the real regime. Measured image ratios on `data synth` corpora: w 0.5 -> ~2.8, 0.7 -> ~8.7, "
        "0.8 -> ~21 (`data inspect --confounds`).",
        epilog=EPILOG,
    )
    confound.add_argument("dir", help="the source dataset directory (left unchanged)")
    confound.add_argument("--out", required=True, help="directory of the new dataset")
    confound.add_argument(
        "--image-look",
        type=float,
        required=True,
        metavar="W",
        help="blend weight w of the document's look, in [0, 1)",
    )
    confound.add_argument("--seed", type=int, default=0, help="which looks the documents draw")
    confound.add_argument("--quiet", action="store_true", help="no progress bar")
    add_common(confound)
    confound.set_defaults(func=cmd_confound, show=show_confound)

    migrate = dsub.add_parser(
        "migrate",
        help="upgrade a dataset written by an older schema version",
        description="Rewrite the shards of an older schema version in the current layout as a new "
        "dataset version in the same directory, then switch its manifest to it.",
        epilog=EPILOG,
    )
    migrate.add_argument("dir", help="dataset directory")
    add_common(migrate)
    migrate.set_defaults(func=cmd_migrate, show=show_migrate)


def cmd_synth(args) -> dict:
    from tqdm import tqdm

    from pipelines.synthetic_corpus import SynthConfig, write_corpus

    cfg = config_fields.from_args(SynthConfig, args)
    writable_dir(args.out)
    with tqdm(total=cfg.docs, desc="synth", unit="doc", file=sys.stderr, disable=args.quiet) as bar:
        path = write_corpus(args.out, cfg, bar.update)
    return {"corpus": str(path.parent), "documents": cfg.docs, "seed": cfg.seed}


def cmd_synth_coherence(args) -> dict:
    from tqdm import tqdm

    from pipelines.coherence_corpus import CoherenceSynthConfig, corpus_relations, write_coherence_corpus

    cfg = config_fields.from_args(CoherenceSynthConfig, args)
    writable_dir(args.out)
    with tqdm(total=cfg.pairs, desc="synth", unit="pair", file=sys.stderr, disable=args.quiet) as bar:
        path = write_coherence_corpus(args.out, cfg, bar.update)
    return {
        "corpus": str(path.parent),
        "documents": cfg.pairs,
        "seed": cfg.seed,
        "relations": list(corpus_relations(cfg)),
    }


def cmd_synth_news(args) -> dict:
    from tqdm import tqdm

    from pipelines.news_corpus import NewsSynthConfig, write_news_corpus

    cfg = config_fields.from_args(NewsSynthConfig, args)
    writable_dir(args.out)
    with tqdm(total=cfg.articles, desc="synth", unit="article", file=sys.stderr, disable=args.quiet) as bar:
        path = write_news_corpus(args.out, cfg, bar.update)
    return {"corpus": str(path.parent), "documents": cfg.articles, "seed": cfg.seed}


def _add_synth_features(dsub) -> None:
    synth = dsub.add_parser(
        "synth-features",
        help="generate a feature-level linking corpus (digits, topics, shared looks) as a dataset",
        description="Write a dataset (shards + manifest, or the authors' docs.json layout with "
        "--layout hessel) whose images are real handwritten-digit features and whose sentences name "
        "their image's digit, with no rendering and no Beam: topics, who shares an image look, how it "
        "mixes and how strong it is are options (docs/training.md, 'A family of corpora'). Fast enough "
        "for 1M documents.",
        epilog=EPILOG,
    )
    synth.add_argument("--out", required=True, help="output directory")
    from pipelines.feature_corpus import FeatureCorpusConfig

    config_fields.add_arguments(synth, FeatureCorpusConfig)
    synth.add_argument("--quiet", action="store_true", help="no progress bar")
    add_common(synth)
    synth.set_defaults(func=cmd_synth_features, show=show_synth_features)


def cmd_synth_features(args) -> dict:
    from tqdm import tqdm

    from pipelines.feature_corpus import FeatureCorpusConfig, write_feature_corpus

    cfg = config_fields.from_args(FeatureCorpusConfig, args)
    writable_dir(args.out)
    total = cfg.docs + cfg.val_docs + cfg.test_docs
    with tqdm(total=total, desc="synth", unit="doc", file=sys.stderr, disable=args.quiet) as bar:
        path = write_feature_corpus(args.out, cfg, bar.update)
    return {"corpus": str(path.parent), "layout": cfg.layout, "documents": total, "seed": cfg.seed}


def show_synth_features(result: dict) -> None:
    what = "dataset" if result["layout"] == "dataset" else "docs.json + features.npy + id2row.json"
    print(f"wrote {result['documents']} documents ({what}) to {result['corpus']}")


def _add_build(dsub) -> None:
    from pipelines.build_config import BuildConfig

    build = dsub.add_parser(
        "build",
        help="build Parquet document shards + manifest with Apache Beam",
        description="Read a raw source, validate images and sentences (bad ones go to "
        "dead_letter.jsonl with a reason), compute perceptual hashes and CNN features with "
        "Beam RunInference, assign deterministic splits, and write shards + manifest.json. "
        "Options not given take the source's own defaults (`mmlinks data sources`), then BuildConfig's.",
        epilog=EPILOG,
    )
    config_fields.add_arguments(build, BuildConfig, defaults={"source": "synthetic"})
    build.add_argument(
        "--source-option",
        action="append",
        metavar="KEY=VALUE",
        help="option of --source, repeatable, e.g. start=2013-01 min_score=25 (see `mmlinks data sources`)",
    )
    feats = build.add_argument_group("features")
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
    docs = build.add_argument_group("documents")
    docs.add_argument(
        "--filter-option",
        action="append",
        metavar="KEY=VALUE",
        help="override a filter rule, e.g. max_images=20",
    )
    out = build.add_argument_group("shards and runner")
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
    add_common(build)
    build.set_defaults(func=cmd_build, show=show_build)


def _add_import_hessel(dsub) -> None:
    from pipelines.build_config import BuildConfig

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
    imp.add_argument("--name", help="dataset name for metadata, e.g. diy (default: the docs folder's name)")
    config_fields.add_arguments(
        imp,
        BuildConfig,
        ["out", "precision", "max_shard_rows", "max_shard_mb", "direct_workers"],
        groups=False,
    )
    add_common(imp)
    imp.set_defaults(func=cmd_import_hessel, show=show_build)


def _explicit_build_options(args) -> dict:
    """The BuildConfig options the user gave (the rest: the source's defaults, then BuildConfig's)."""
    from pipelines.build_config import BuildConfig

    given = config_fields.given(args, BuildConfig)
    for key in ("source", "input", "out"):
        given.pop(key, None)
    maps = {
        "extractor_options": (getattr(args, "extractor_option", None), "--extractor-option", "weights"),
        "region_options": (getattr(args, "region_option", None), "--region-option", "region_weights"),
        "filter_options": (getattr(args, "filter_option", None), "--filter-option", None),
        "source_options": (getattr(args, "source_option", None), "--source-option", None),
    }
    for field, (items, flag, weights) in maps.items():
        values = key_values(items, flag)
        if weights and getattr(args, weights, None):
            values["weights"] = getattr(args, weights)
        if values:
            given[field] = values
    beam = [
        *(getattr(args, "beam_arg", None) or []),
        *[a for a in (getattr(args, "beam_options", None) or []) if a != "--"],
    ]
    if beam:
        given["beam_args"] = beam
    return given


def cmd_build(args) -> dict:
    from pipelines.build_config import BuildConfig

    if "://" not in args.input and not Path(args.input).exists():  # remote: checked by the source
        raise MmlinksError(f"--input {args.input} does not exist")
    cfg = BuildConfig.for_source(args.source, args.input, args.out, **_explicit_build_options(args))
    return run_build(cfg, debug=args.debug)


def run_build(cfg, debug: bool = False) -> dict:
    """Check ``cfg`` (one-line errors before anything is created), build, summarise.

    Library output (Beam workers' warnings and logs) goes to the build's log file, not the
    terminal; ``debug`` leaves it on the terminal."""
    from cli.output import heartbeat
    from pipelines.local_cluster import prestart_local_workers
    from schemas.library_output import build_log_path, library_output_to

    cfg.check()
    log_path = None if debug else build_log_path(cfg.out)
    shown = f" (library logs: {log_path})" if log_path else ""
    print(f"building {cfg.source} dataset with Beam ({cfg.runner}) -> {cfg.out}{shown}", file=sys.stderr)
    describe = cfg.spec().describe
    if describe is not None:
        print(describe(cfg.source_context()), file=sys.stderr)
    with library_output_to(log_path), heartbeat("beam build"):
        prestart_local_workers(cfg.runner, cfg.dask_address, "pipelines.build")
        from pipelines import fileio
        from pipelines.build import build_dataset
        from pipelines.commit import last_build

        manifest = build_dataset(cfg)
    summary = {"manifest": fileio.join(cfg.out, "manifest.json"), **manifest_summary(manifest)}
    summary["dead_letter"] = fileio.join(cfg.out, manifest.dead_letter) if manifest.dead_letter else None
    return {**summary, "build": last_build(cfg.out)}


def cmd_import_hessel(args) -> dict:
    """`data import-hessel`: `data build --source hessel` with the three files named."""
    from pipelines.build_config import BuildConfig

    files = {"docs": args.docs, "features": args.features, "id2row": args.id2row}
    if args.name:
        files["name"] = args.name
    root = args.docs.rsplit("/", 1)[0] if "/" in args.docs else "."  # keeps gs:// URIs whole
    options = {**_explicit_build_options(args), "source_options": files}
    return run_build(BuildConfig.for_source("hessel", root, args.out, **options), debug=args.debug)


def cmd_crawl(args) -> dict:
    """`data crawl diy`: the incremental crawl of new posts, checkpointed between runs."""
    from pipelines.sources.reddit.crawl import gap_warning, run_crawl

    print(f"crawling r/{args.subreddit}/new -> {args.out}", file=sys.stderr)
    result = run_crawl(
        args.state,
        args.out,
        subreddit=args.subreddit,
        limit=args.limit,
        overlap_s=args.overlap_s,
        api_base=args.reddit_api_base,
    )
    warning = gap_warning(args.subreddit, result)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
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

    existing_dir(args.dir)
    manifest, changed = migrate_dataset(args.dir)
    return {"migrated": changed, **manifest_summary(manifest)}


def manifest_summary(m) -> dict:
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
    out = json.loads(m.to_json())
    if getattr(args, "confounds", False):
        from pipelines.confounds import dataset_confounds

        out["confounds"] = {s: c.to_dict() for s, c in dataset_confounds(args.dir).items()}
    if getattr(args, "choose", False):
        out["image_side_choice"] = preview_choice(args.dir)
    return out


def preview_choice(data: str) -> dict:
    """What ``mmlinks train``'s default image side picks on ``data``, at the demo's settings."""
    from training.config import TrainConfig
    from training.driver import check_inputs, choose_settings

    inp = check_inputs(
        TrainConfig(data=str(Path(data).resolve()), epochs=10, d_multi=256, lr=1e-3, num_workers=0)
    )
    choice = choose_settings(inp)
    if choice is None:
        raise MmlinksError(
            f"{data}: nothing to choose (the default backbone's image side is measured only for linking)"
        )
    return {**choice.to_dict(), "summary": choice.summary()}


def cmd_confound(args) -> dict:
    from tqdm import tqdm

    from pipelines.confounds import dataset_confounds
    from pipelines.image_look import blend_look
    from schemas.manifest import Manifest

    existing_dir(args.dir)
    total = sum(Manifest.read(args.dir).counts.get("splits", {}).values())
    with tqdm(total=total, desc="confound", unit="doc", file=sys.stderr, disable=args.quiet) as bar:
        m = blend_look(args.dir, args.out, args.image_look, args.seed, bar.update)
    return {
        "dataset": str(args.out),
        "dataset_version": m.dataset_version,
        "image_look": m.build_params["image_look"],
        "confounds": {s: c.to_dict() for s, c in dataset_confounds(args.out).items()},
    }


def show_confounds(confounds: dict) -> None:
    from cli.output import table

    def fmt(v) -> str:
        return "-" if v is None else f"{v:.2f}"

    rows = [
        [
            s,
            str(c["documents"]),
            fmt(c["image_ratio"]),
            fmt(c.get("image_ratio_corrected")),
            fmt(c.get("image_residual")),
            fmt(c.get("image_similarity_gap")),
            str(c["image_documents"]),
            fmt(c["text_share"]),
        ]
        for s, c in confounds.items()
    ]
    head = ["split", "documents", "image ratio", "corrected", "residual", "similarity gap"]
    print(table(rows, [*head, "docs >= 2 images", "text share"]))
    print(
        "image ratio: ~0.2-0.5 photos of unrelated objects, >= 3 strongly confounded (a shared look); "
        "corrected: the same with each document mean's sampling spread taken out (compares corpora of "
        "2 and of 15 images per document); residual: the ratio without the look's 48 main directions, < 1 "
        "when a few dozen topics share the look; similarity gap: same- minus other-document cosine of the "
        "images, > 0.1 for a look of any form (a gain, one of several looks per image); text share: >= 0.2 "
        "topic words in most sentences. train's default measures its image side by training (--choose)"
    )


def show_confound(result: dict) -> None:
    print(f"wrote dataset {result['dataset_version']} -> {result['dataset']} (look {result['image_look']})")
    show_confounds(result["confounds"])


def show_synth(result: dict) -> None:
    print(f"wrote {result['documents']} documents to {result['corpus']}")


def show_build(result: dict) -> None:
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


def show_crawl(result: dict) -> None:
    print(f"{result['new_posts']} new posts -> {', '.join(result['files']) or 'no file'}")


def show_sources(result: dict) -> None:
    for name, info in result["sources"].items():
        print(f"{name}: {info['summary']}")
        if info["credentials"]:
            print(f"  credentials (environment): {', '.join(info['credentials'])}")
        for key, value in sorted(info["build_defaults"].items()):
            print(f"  build default: {key}={value}")
        for opt, o in info["options"].items():
            default = "" if o["default"] is None else f" (default: {o['default']})"
            print(f"  --source-option {opt}=...  {o['help']}{default}")


def show_migrate(result: dict) -> None:
    done = "migrated to" if result["migrated"] else "already at"
    print(f"{done} schema v{result['schema_version']}: dataset {result['dataset_version']}")


def show_manifest(m: dict) -> None:
    """A readable summary of a manifest (``--json`` prints all of it)."""
    from cli.output import table

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
    if "confounds" in m:
        show_confounds(m["confounds"])
    if "image_side_choice" in m:
        print(f"image side train's default picks: {m['image_side_choice']['summary']}")
