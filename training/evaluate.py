"""Evaluate a trained model on a split: per-document metrics, the Random baseline, spread.

The summary is the macro average x100 (``training.metrics``). Why per-document rows as JSON
Lines (``write_per_doc``): error analysis reads them with pandas or jq, line by line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.shards import iter_tables
from training.backbone import needs_regions
from training.data import TRAINING_COLUMNS, link_scores, make_batch
from training.metrics import document_metrics, random_baseline, summarize
from training.text import Vocabulary


def evaluate(
    model,
    vocab: Vocabulary,
    data: str | Path,
    split: str = "test",
    max_tokens: int = 20,
    batch_docs: int = 64,
    seed: int = 0,
) -> dict:
    """{"model", "random", "per_doc", "predictions"} on ``split`` of the dataset: the model
    checked against the dataset's features, then ``evaluate_shards`` on the split's shards.

    ``per_doc`` holds one dict per labelled document (doc_id, auc, p_at_1, p_at_5 on a 0..1
    scale, n_sentences, n_images, n_links); ``training.link.spread.add_spread`` adds each one's
    image and text spread and the OLS analysis (``mmlinks evaluate --spread``).
    """
    manifest = Manifest.read(data)
    paths = manifest.shard_paths(data, split)
    if not paths:
        raise MmlinksError(f"{data} has no {split!r} shards")
    image_dim = getattr(getattr(model, "cfg", None), "image_dim", None)
    if image_dim is not None and image_dim != manifest.feature_extractor.dim:
        raise MmlinksError(
            f"the model takes {image_dim}-d image features, but {data} has "
            f"{manifest.feature_extractor.dim}-d {manifest.feature_extractor.name} features"
        )
    return evaluate_shards(model, vocab, paths, max_tokens, batch_docs, seed, split)


def evaluate_shards(
    model,
    vocab: Vocabulary,
    paths: list,
    max_tokens: int = 20,
    batch_docs: int = 64,
    seed: int = 0,
    split: str = "test",
) -> dict:
    """``evaluate`` on a split's shards (``paths``) with a model made for their features (a
    training run's own model on its test split); ``split`` names it in the error."""
    model_cfg = getattr(model, "cfg", None)
    regions = model_cfg is not None and needs_regions(model_cfg.to_dict())  # the Li 2021 transformer
    max_regions = int(getattr(model_cfg, "max_regions", 36))
    model.eval()
    # Shard by shard, ``batch_docs`` rows at a time: the split's features are never in memory
    # together (a 100K-document test split of 1280-d features is ~3 GB), only each document's
    # small results. They are put in doc-id order at the end, as a sorted read gave them (the
    # Random baseline draws in that order).
    rows: list[tuple[str, np.ndarray, list | None]] = []  # (doc_id, scores, links)
    with torch.no_grad():
        for table in iter_tables(paths, batch_docs, TRAINING_COLUMNS):
            batch = make_batch(table, vocab, max_tokens, None, regions, max_regions)
            for doc_id, scores, links in zip(
                batch.doc_ids, link_scores(model, batch), batch.links, strict=True
            ):
                rows.append((doc_id, scores, links))
    rows.sort(key=lambda r: r[0])
    per_doc = [m for m in (document_metrics(d, s, lk) for d, s, lk in rows) if m is not None]
    if not per_doc:
        raise MmlinksError(f"no labelled {split} document to evaluate (links are null or trivial)")
    return {
        "model": summarize(per_doc),
        "random": random_baseline([(d, *s.shape, lk) for d, s, lk in rows], seed),
        "per_doc": [dict(m.__dict__) for m in per_doc],
        "predictions": [{"doc_id": d, "scores": np.round(s, 4).tolist()} for d, s, _ in rows],
        "n_skipped": len(rows) - len(per_doc),
    }


def write_per_doc(rows: list[dict], path: str | Path) -> Path:
    """One JSON object per line; NaN (a diverged model) is written as null, which JSON has."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def clean(v):
        return None if isinstance(v, float) and math.isnan(v) else v

    with path.open("w") as fh:
        for r in rows:
            fh.write(json.dumps({k: clean(v) for k, v in r.items()}, sort_keys=True) + "\n")
    return path


def read_vocab(path: str | Path) -> Vocabulary:
    """A vocabulary file: a JSON list of words (model artifact ``vocab.json``) or the run
    artifact ``config/vocab.json`` ({"words": [...]})."""
    try:
        words = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise MmlinksError(f"cannot read the vocabulary {path}: {exc}") from exc
    if isinstance(words, dict):
        words = words.get("words")
    if not isinstance(words, list) or len(words) < 2 or not all(isinstance(w, str) for w in words):
        raise MmlinksError(f"{path} is not a vocabulary (a JSON list of words)")
    return Vocabulary(words)


def load_checkpoint(path: str | Path, vocab: str | Path | None = None) -> tuple[object, Vocabulary, int]:
    """(model, vocabulary, max_tokens) from a training checkpoint directory.

    The vocabulary is ``vocab``, else ``vocab.json`` inside the checkpoint or next to it (the
    layout of a logged model's artifacts: ``checkpoint/`` beside ``vocab.json``).
    """
    from training.checkpoints import load_checkpoint_model

    path = Path(path)
    if not (path / "meta.json").is_file():
        raise MmlinksError(f"{path} is not a training checkpoint (no meta.json)")
    candidates = [Path(vocab)] if vocab else [path / "vocab.json", path.parent / "vocab.json"]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise MmlinksError(
            f"no vocabulary for checkpoint {path} (looked for {', '.join(map(str, candidates))}); "
            "pass --vocab FILE, e.g. the run's artifact config/vocab.json"
        )
    try:
        model, meta = load_checkpoint_model(path)
    except (OSError, KeyError, RuntimeError, ValueError) as exc:
        raise MmlinksError(f"cannot load checkpoint {path}: {type(exc).__name__}: {exc}") from exc
    voc = read_vocab(found)
    n_vocab = getattr(getattr(model, "cfg", None), "vocab_size", len(voc))
    if n_vocab != len(voc):
        raise MmlinksError(f"{found} has {len(voc)} words but the checkpoint's model has {n_vocab}")
    return model, voc, int(meta.get("train", {}).get("max_tokens", 20))


def load_linker(model_uri: str, tracking_uri: str | None = None):
    """The ``LinkModel`` behind a logged or registered pyfunc model (``models:/NAME@ALIAS``,
    ``models:/NAME/VERSION``, ``runs:/RUN/model``), with load failures as one-line errors."""
    import mlflow
    from mlflow.exceptions import MlflowException

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)  # models:/ URIs resolve against the global registry
    try:
        linker = mlflow.pyfunc.load_model(model_uri).unwrap_python_model()
    except MlflowException as exc:
        raise MmlinksError(f"cannot load {model_uri}: {exc.message}") from exc
    except Exception as exc:  # a corrupt or missing artifact surfaces from load_context as anything
        raise MmlinksError(f"cannot load {model_uri}: {type(exc).__name__}: {exc}") from exc
    return linker
