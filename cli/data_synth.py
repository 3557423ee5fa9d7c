"""`mmlinks data synth`, `synth-coherence`, `synth-news` and `synth-features`: the synthetic corpora."""

from __future__ import annotations

import sys

from cli.common import EPILOG, add_common, writable_dir
from schemas import config_fields


def add_parsers(dsub) -> None:
    """Its subcommands under `mmlinks data`."""
    from pipelines.coherence_corpus import CoherenceSynthConfig
    from pipelines.feature_corpus import FeatureCorpusConfig
    from pipelines.news_corpus import NewsSynthConfig
    from pipelines.synthetic_corpus import SynthConfig

    _add(
        dsub,
        "synth",
        SynthConfig,
        cmd_synth,
        help="generate a synthetic corpus with known links",
        description="Write rendered object photos and sentences that describe some of them "
        "(plus distractor sentences and images) in the raw format `data build` reads.",
    )
    _add(
        dsub,
        "synth-coherence",
        CoherenceSynthConfig,
        cmd_synth_coherence,
        help="generate a synthetic text-image pair corpus labelled with coherence relations",
        description="Write text-image pairs (one step of a painting project each: the image shows "
        "the result, relation Visible, or the step in progress, Action; some texts are anecdotes, "
        "Story) in the raw format `data build --source synthetic` reads; the build puts the "
        "relation vocabulary in the manifest. For the retrieval objectives (cmca, cmcm, cmcm-c).",
    )
    _add(
        dsub,
        "synth-news",
        NewsSynthConfig,
        cmd_synth_news,
        help="generate a synthetic multi-source, bilingual news corpus (news image selection)",
        description="Write news articles (headline, lead, body, one or two captioned photos of "
        "rendered objects; sources of different informativeness, some missing; English and a "
        "German-like language with an aligned lexicon; dated) in the news JSONL layout that "
        "`data build --source news-jsonl` reads. For --objective news.",
    )
    _add(
        dsub,
        "synth-features",
        FeatureCorpusConfig,
        cmd_synth_features,
        show=show_synth_features,
        help="generate a feature-level linking corpus (digits, topics, shared looks) as a dataset",
        description="Write a dataset (shards + manifest, or the authors' docs.json layout with "
        "--layout hessel) whose images are real handwritten-digit features and whose sentences name "
        "their image's digit, with no rendering and no Beam: topics, who shares an image look, how it "
        "mixes and how strong it is are options (docs/training.md, 'A family of corpora'). Fast enough "
        "for 1M documents.",
    )


def _add(dsub, name: str, config, func, show=None, **text) -> None:
    """One synthetic-corpus subcommand: --out, the flags of its config dataclass, --quiet."""
    synth = dsub.add_parser(name, epilog=EPILOG, **text)
    synth.add_argument("--out", required=True, help="output directory")
    config_fields.add_arguments(synth, config)
    synth.add_argument("--quiet", action="store_true", help="no progress bar")
    add_common(synth)
    synth.set_defaults(func=func, show=show or show_synth)


def _write(args, config, write, total: int, unit: str):
    """(config, the corpus file) after writing it under ``--out`` with a progress bar."""
    from tqdm import tqdm

    cfg = config_fields.from_args(config, args)
    writable_dir(args.out)
    with tqdm(total=total(cfg), desc="synth", unit=unit, file=sys.stderr, disable=args.quiet) as bar:
        return cfg, write(args.out, cfg, bar.update)


def cmd_synth(args) -> dict:
    from pipelines.synthetic_corpus import SynthConfig, write_corpus

    cfg, path = _write(args, SynthConfig, write_corpus, lambda c: c.docs, "doc")
    return {"corpus": str(path.parent), "documents": cfg.docs, "seed": cfg.seed}


def cmd_synth_coherence(args) -> dict:
    from pipelines.coherence_corpus import CoherenceSynthConfig, corpus_relations, write_coherence_corpus

    cfg, path = _write(args, CoherenceSynthConfig, write_coherence_corpus, lambda c: c.pairs, "pair")
    return {
        "corpus": str(path.parent),
        "documents": cfg.pairs,
        "seed": cfg.seed,
        "relations": list(corpus_relations(cfg)),
    }


def cmd_synth_news(args) -> dict:
    from pipelines.news_corpus import NewsSynthConfig, write_news_corpus

    cfg, path = _write(args, NewsSynthConfig, write_news_corpus, lambda c: c.articles, "article")
    return {"corpus": str(path.parent), "documents": cfg.articles, "seed": cfg.seed}


def cmd_synth_features(args) -> dict:
    from pipelines.feature_corpus import FeatureCorpusConfig, write_feature_corpus

    def total(c):
        return c.docs + c.val_docs + c.test_docs

    cfg, path = _write(args, FeatureCorpusConfig, write_feature_corpus, total, "doc")
    return {"corpus": str(path.parent), "layout": cfg.layout, "documents": total(cfg), "seed": cfg.seed}


def show_synth_features(result: dict) -> None:
    what = "dataset" if result["layout"] == "dataset" else "docs.json + features.npy + id2row.json"
    print(f"wrote {result['documents']} documents ({what}) to {result['corpus']}")


def show_synth(result: dict) -> None:
    print(f"wrote {result['documents']} documents to {result['corpus']}")
