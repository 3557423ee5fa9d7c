"""`mmlinks data synth`, `synth-coherence`, `synth-news` and `synth-features`: the synthetic corpora."""

from __future__ import annotations

import sys

from cli.common import EPILOG, add_common, writable_dir
from schemas import config_fields


def add_parsers(dsub) -> None:
    """Its subcommands under `mmlinks data`."""
    _add_synth(dsub)
    _add_synth_coherence(dsub)
    _add_synth_news(dsub)
    _add_synth_features(dsub)


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


def show_synth(result: dict) -> None:
    print(f"wrote {result['documents']} documents to {result['corpus']}")
