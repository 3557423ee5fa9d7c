"""A tiny news dataset in the real shard + manifest layout (random CNN features) and a randomly
initialised news model written as a training checkpoint: what the serving and archive tests
package, without a Beam build or a Ray fit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from schemas.document import SCHEMA_VERSION, Document, ImageRecord
from schemas.manifest import FeatureExtractorInfo, Manifest, ShardInfo
from schemas.shards import write_shard
from training.checkpoints import CHECKPOINT_FILE
from training.news.model import NewsConfig, NewsRetrieval
from training.text import Vocabulary

DIM = 8
WORDS = "red blue green cross dot storm rot blau grün kreuz".split()
SPLITS = ("train",) * 12 + ("val",) * 4 + ("test",) * 4


def _sample(i: int, split: str, rng) -> Document:
    words = rng.choice(WORDS, size=4)
    content = f"{i // 2:064x}"  # every two samples share a photo: the archive dedupes it
    return Document(
        doc_id=f"a{i:02d}#0",
        source="news-jsonl",
        split=split,
        sentences=[" ".join(words[:2]), " ".join(words[2:])],
        images=[ImageRecord(content, f"img/{content[-4:]}.jpg", 32, 32, i, rng.random(DIM).tolist())],
        links=[(0, 0), (1, 0)],
        metadata={"news_sources": "headline,caption", "language": ("en", "de")[i % 2], "article_id": f"a{i}"},
    )


def write_news_dataset(folder: Path) -> tuple[Path, list[Document]]:
    """20 samples (12 train, 4 val, 4 test; en and de; 10 distinct photos) + manifest.json."""
    rng = np.random.default_rng(0)
    docs = [_sample(i, split, rng) for i, split in enumerate(SPLITS)]
    shards = []
    for split in ("train", "val", "test"):
        rows, size, sha = write_shard(
            folder / f"{split}-00000.parquet", [d for d in docs if d.split == split]
        )
        shards.append(ShardInfo(f"{split}-00000.parquet", split, rows, size, sha))
    Manifest(
        schema_version=SCHEMA_VERSION,
        dataset_version=Manifest.version_id(shards, {}),
        source="news-jsonl",
        counts={
            "splits": {s: sum(d.split == s for d in docs) for s in ("train", "val", "test")},
            "dropped": {},
        },
        feature_extractor=FeatureExtractorInfo("random", "0", DIM),
        shards=shards,
    ).write(folder)
    return folder, docs


def news_checkpoint(folder: Path, docs: list[Document]) -> tuple[Path, Vocabulary]:
    """A random news model (attention fusion over the four sources) as a checkpoint folder."""
    vocab = Vocabulary.build((s for d in docs for s in d.sentences), 1)
    torch.manual_seed(0)
    cfg = NewsConfig(vocab_size=len(vocab.words), word_dim=16, image_dim=DIM, d=16, d_hidden=32)
    folder.mkdir(parents=True)
    net = NewsRetrieval(cfg).eval()
    torch.save(
        {"model": net.state_dict(), "epoch": 1, "val_loss": 0.0, "best_epoch": 1}, folder / CHECKPOINT_FILE
    )
    (folder / "meta.json").write_text(json.dumps({"model": cfg.to_dict(), "train": {"max_tokens": 20}}))
    return folder, vocab


ATTRIBUTE_VALUES = None  # filled on first use: every attribute value, in a fixed order


def _attribute_features(obj: str, rng, noise: float) -> list[float]:
    """The one-hot of an image's attributes (what the build's CNN feature of a rendered object
    tells apart), plus Gaussian noise: features with known content, without the extractor."""
    from pipelines.synthetic_corpus import COLOURS, PATTERNS, POSITIONS, SHAPES, SIZES

    size, colour, shape, *rest = obj.split()
    pos, pattern = " ".join(rest[:-1]), rest[-1]
    values = [*SIZES, *COLOURS, *SHAPES, *POSITIONS, *PATTERNS]
    out = np.zeros(len(values))
    for v in (size, colour, shape, pos, pattern):
        out[values.index(v)] = 1.0
    return (out + noise * rng.standard_normal(len(values))).round(4).tolist()


def write_learning_corpus(
    folder: Path, train: int = 240, val: int = 40, test: int = 80, seed: int = 0, noise: float = 0.1
) -> Path:
    """A news dataset in the real shard + manifest layout whose text is the synthetic news
    corpus's (``--complementary --names``: each source names other attributes of the photo,
    as invented names) and whose image features are the photo's attributes, one-hot, plus
    noise: a corpus a news model can learn from in seconds, with a known chance level (one
    photo per article; test pool = ``test``). Also ``folder/words.vec``: 16-d random vectors
    for its words (so a test's model stays small)."""
    from pipelines.news_corpus import NewsSynthConfig, generate_article
    from schemas.news import NEWS_SOURCES

    cfg = NewsSynthConfig(
        articles=train + val + test, seed=seed, second_image_rate=0.0, second_language_rate=0.0,
        image_size=32, complementary=True, names=True,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    docs, words = [], set()
    for i in range(cfg.articles):
        record, _ = generate_article(cfg, i)
        split = "train" if i < train else "val" if i < train + val else "test"
        image = record["images"][0]
        texts = {s: record.get(s) or "" for s in NEWS_SOURCES}
        texts["caption"] = image["caption"]
        present = [s for s in NEWS_SOURCES if texts[s]]
        words.update(w for s in present for w in texts[s].split())
        content = f"{seed:08x}{i:056x}"
        feats = _attribute_features(image["object"], rng, noise)
        docs.append(
            Document(
                doc_id=f"{record['article_id']}#0",
                source="news-jsonl",
                split=split,
                sentences=[texts[s] for s in present],
                images=[ImageRecord(content, image["uri"], 32, 32, i, feats)],
                links=[(k, 0) for k in range(len(present))],
                metadata={
                    "news_sources": ",".join(present),
                    "language": "en",
                    "article_id": record["article_id"],
                },
            )
        )
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for split in ("train", "val", "test"):
        chosen = [d for d in docs if d.split == split]
        rows, size, sha = write_shard(folder / f"{split}-00000.parquet", chosen)
        shards.append(ShardInfo(f"{split}-00000.parquet", split, rows, size, sha))
    Manifest(
        schema_version=SCHEMA_VERSION,
        dataset_version=Manifest.version_id(shards, {"seed": seed}),
        source="news-jsonl",
        counts={"splits": {"train": train, "val": val, "test": test}, "dropped": {}},
        feature_extractor=FeatureExtractorInfo("attributes", "0", len(docs[0].images[0].features)),
        shards=shards,
    ).write(folder)
    vec = np.random.default_rng(seed + 1).uniform(-0.5, 0.5, (len(words), 16)).round(4)
    lines = [f"{w} {' '.join(map(str, v))}" for w, v in zip(sorted(words), vec, strict=True)]
    (folder / "words.vec").write_text("\n".join(lines) + "\n")
    return folder
