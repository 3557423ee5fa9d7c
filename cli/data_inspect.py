"""`mmlinks data sources`, `inspect`, `confound` and `migrate`: what there is, what a dataset holds, and
its changes in place."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from cli.common import EPILOG, add_common, existing_dir
from pipelines.sources import source_names
from schemas.errors import MmlinksError


def add_parsers(dsub) -> None:
    """Its subcommands under `mmlinks data`."""
    _add_listings(dsub)


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
        "image-side candidate briefly at the demo's settings (d_multi 256, lr 1e-3, 10 epochs), continue "
        "the best two to the 10 epochs and print every candidate's within-document score and the pick "
        "(about a minute per 1,000 training documents on 2 cores; docs/training.md, 'The image side')",
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
    # as such a run chooses (its trials on all its documents up to KEPT_TRIAL_DOCS, the pick's then
    # its run: image_side.choose's keep), the pick's trial left in a folder thrown away
    with tempfile.TemporaryDirectory(prefix="mmlinks-choose-") as tmp:
        choice = choose_settings(inp, keep=str(Path(tmp) / "run"))
    if choice is None:
        raise MmlinksError(
            f"{data}: nothing to choose (the default backbone's image side is measured only for linking)"
        )
    choice.trial_kept = ""  # thrown away with its folder: the run would keep it
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
