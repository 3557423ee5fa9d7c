"""`mmlinks data build`, `import-hessel` and `crawl`: a dataset built from a source, and a source crawled."""

from __future__ import annotations

import sys
from pathlib import Path

from cli.common import EPILOG, add_beam_args, add_common, beam_args_of, key_values
from cli.data_inspect import manifest_summary
from schemas import config_fields
from schemas.errors import MmlinksError


def add_parsers(dsub) -> None:
    """Its subcommands under `mmlinks data`."""
    _add_build(dsub)
    _add_import_hessel(dsub)
    _add_crawl(dsub)


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
    add_beam_args(out, "--beam-arg=--direct_num_workers=2")
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
    beam = beam_args_of(args)
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
