"""mmc4's zero-shot linker as a baseline (``mmlinks baseline --method clip-zero-shot``).

Why a baseline: mmc4 (Zhu et al. 2023) links with CLIP cosines and one assignment per document,
no training; scored like a trained model on the dataset's stored ``clip-vit-b32`` features and
the text tower of the same weight file (its version must match the manifest)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.shards import read_table
from training.data import TRAINING_COLUMNS, iter_documents
from training.metrics import document_metrics, link_counts, link_prf, random_per_doc, summarize
from training.objectives.assignment import max_weight_matching

SENTENCE_CHUNK = 256  # sentences per text-tower forward


def clip_text_tower(manifest: Manifest, weights: str | None, model: str):
    """CLIP's text tower for a clip-vit-b32 dataset, from the same weights as its features."""
    from features.clip import clip_version, find_clip_weights
    from features.registry import CLIP_VIT_B32
    from training.link.towers import ClipTextTower

    fe = manifest.feature_extractor
    if fe.name != CLIP_VIT_B32.name:
        raise MmlinksError(
            f"clip-zero-shot scores CLIP image embeddings; this dataset holds {fe.name} features: build it "
            f"with --extractor {CLIP_VIT_B32.name} --weights FILE"
        )
    path = find_clip_weights(weights)
    version = clip_version(model, path)
    if version != fe.version:
        raise MmlinksError(
            f"the dataset's features come from CLIP {fe.version}, but {path} read as {model} is {version}; "
            "pass the weight file (--weights) and architecture (--clip-model) the dataset was built with"
        )
    return ClipTextTower(model, path).eval()


def encode_sentences(tower, sentences: list[str]) -> np.ndarray:
    """[n, d] unit text embeddings, in chunks."""
    out = []
    with torch.no_grad():
        for start in range(0, len(sentences), SENTENCE_CHUNK):
            out.append(tower(sentences[start : start + SENTENCE_CHUNK]).cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, tower.dim), np.float32)


def zero_shot_scores(table, tower) -> list[tuple[str, np.ndarray, list | None]]:
    """(doc_id, cosine matrix [n, m], links) for every document of ``table``."""
    out = []
    for doc_id, sentences, feats, links in iter_documents(table):
        if not sentences or len(feats) == 0:
            continue
        s = encode_sentences(tower, sentences)
        v = F.normalize(torch.from_numpy(np.asarray(feats, np.float32)), dim=-1).numpy()
        out.append((doc_id, s @ v.T, links))
    return out


def assigned_links(scores: np.ndarray, min_score: float) -> list[tuple[int, int]]:
    """mmc4's assignment: the max-weight one-to-one matching, links below ``min_score`` dropped."""
    rows, cols = max_weight_matching(scores)
    return [(int(r), int(c)) for r, c in zip(rows, cols, strict=True) if scores[r, c] >= min_score]


def clip_zero_shot_baseline(
    data: str | Path,
    split: str = "test",
    weights: str | None = None,
    model: str = "ViT-B-32",
    min_score: float = -1.0,
) -> dict:
    """Score ``split`` of a clip-vit-b32 dataset with zero-shot CLIP (the same keys as the
    other baselines, plus the assignment's link P/R/F1)."""
    manifest = Manifest.read(data)
    tower = clip_text_tower(manifest, weights, model)
    paths = manifest.shard_paths(data, split)
    if not paths:
        raise MmlinksError(f"{data} has no {split!r} shards")
    table = read_table(paths, columns=TRAINING_COLUMNS).sort_by("doc_id")
    scored = zero_shot_scores(table, tower)
    per_doc = [m for m in (document_metrics(d, s, lk) for d, s, lk in scored) if m is not None]
    if not per_doc:
        raise MmlinksError(f"no labelled {split} document to evaluate (links are null or trivial)")
    tp = n_pred = n_gold = 0
    for _, scores, links in scored:
        if links is not None:
            a, b, c = link_counts(assigned_links(scores, min_score), links)
            tp, n_pred, n_gold = tp + a, n_pred + b, n_gold + c
    return {
        "method": "clip-zero-shot",
        "split": split,
        **summarize(per_doc),
        "random": summarize(random_per_doc([(d, *s.shape, lk) for d, s, lk in scored])),
        "links": link_prf(tp, n_pred, n_gold),
        "min_score": min_score,
        "clip": f"{manifest.feature_extractor.name}@{manifest.feature_extractor.version}",
        "per_doc_metrics": per_doc,
    }
