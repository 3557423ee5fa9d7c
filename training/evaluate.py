"""Evaluate a trained model on a split: per-document metrics and the Random baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.shards import read_table
from training.data import TRAINING_COLUMNS, make_batch
from training.metrics import DocMetrics, document_metrics, random_baseline, summarize
from training.model import MulLink
from training.text import Vocabulary
from training.train import link_scores


def evaluate(
    model: MulLink,
    vocab: Vocabulary,
    data: str | Path,
    split: str = "test",
    max_tokens: int = 20,
    batch_docs: int = 64,
    seed: int = 0,
) -> dict:
    """{"model": {...}, "random": {...}, "per_doc": [...]} on ``split`` of the dataset."""
    manifest = Manifest.read(data)
    paths = manifest.shard_paths(data, split)
    if not paths:
        raise MmlinksError(f"{data} has no {split!r} shards")
    table = read_table(paths, columns=TRAINING_COLUMNS).sort_by("doc_id")
    model.eval()
    per_doc: list[DocMetrics] = []
    shapes, predictions = [], []
    with torch.no_grad():
        for start in range(0, table.num_rows, batch_docs):
            batch = make_batch(table.slice(start, batch_docs), vocab, max_tokens)
            for doc_id, scores, links in zip(
                batch.doc_ids, link_scores(model, batch), batch.links, strict=True
            ):
                shapes.append((doc_id, *scores.shape, links))
                predictions.append({"doc_id": doc_id, "scores": np.round(scores, 4).tolist()})
                m = document_metrics(doc_id, scores, links)
                if m is not None:
                    per_doc.append(m)
    if not per_doc:
        raise MmlinksError(f"no labelled {split} document to evaluate (links are null or trivial)")
    return {
        "model": summarize(per_doc),
        "random": random_baseline(shapes, seed),
        "per_doc": [m.__dict__ for m in per_doc],
        "predictions": predictions,
    }
