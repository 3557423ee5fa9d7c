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
