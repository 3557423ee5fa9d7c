"""Baselines of Hessel et al. 2019 that need no trained link model: Random and Object Detection
(docs/evaluation.md; NoStruct is a trained objective).

Object Detection applies the CNN's ImageNet classifier to the stored pooled features, so nothing
is recomputed from pixels. Why K is chosen on validation: the paper's best-test K is an oracle,
reported beside it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.shards import read_table
from schemas.text import tokenize
from training.data import TRAINING_COLUMNS, iter_documents
from training.metrics import DocMetrics, document_metrics, random_per_doc, summarize

K_MAX = 20


# ------------------------------------------------------------------------------ word vectors


class WordVectors:
    """Word -> vector lookup for mean-of-word-vector representations.

    Unlike the model's embedding matrix, unknown words are left out (not given random vectors):
    a baseline should not score noise. Tokens without a letter or digit (punctuation) are left
    out too; a hyphenated or apostrophe compound missing from the vectors falls back to its
    parts ("hen-of-the-woods" -> hen, of, the, woods).
    """

    def __init__(self, words: list[str], vectors: np.ndarray, name: str = ""):
        self.index = {w: i for i, w in enumerate(words)}
        self.vectors = vectors
        self.dim = int(vectors.shape[1])
        self.name = name

    @classmethod
    def load(cls, spec: str = "glove", texts: Iterable[str] = ()) -> WordVectors:
        """``glove`` (GloVe 6B 50-d from the installed package), or any vectors file that
        ``training.word_vectors`` reads (word2vec/GloVe text, word2vec binary, fastText .bin;
        e.g. the paper's word2vec GoogleNews file). A file is streamed and only the words of
        ``texts`` (and the parts of their compounds) are kept, so name every text to be scored."""
        if spec == "glove":
            from training.text import load_glove

            words, vectors = load_glove()
            return cls(words, vectors, "glove-6b-50d")
        from training.word_vectors import load_vectors

        wanted = set()
        for text in texts:
            for tok in tokenize(text):
                wanted.add(tok)
                wanted.update(tok.replace("'", "-").split("-"))
        found, dim, stats = load_vectors(spec, sorted(wanted))
        words = sorted(found)
        vectors = np.stack([found[w] for w in words]) if words else np.zeros((0, dim), np.float32)
        return cls(words, vectors, f"{Path(stats.path).name} ({stats.format})")

    def token_rows(self, text: str) -> list[int]:
        rows = []
        for tok in tokenize(text):
            if not any(c.isalnum() for c in tok):
                continue
            if tok in self.index:
                rows.append(self.index[tok])
            else:
                rows += [self.index[p] for p in tok.replace("'", "-").split("-") if p in self.index]
        return rows

    def mean(self, text: str) -> np.ndarray | None:
        """Mean vector of the known words of ``text``; None when it has none."""
        rows = self.token_rows(text)
        if not rows:
            return None
        return np.asarray(self.vectors[sorted(rows)], dtype=np.float64).mean(0)

    def sentence_matrix(self, sentences: list[str]) -> np.ndarray:
        """[n, dim] mean word vectors; zero rows for sentences without a known word."""
        out = np.zeros((len(sentences), self.dim))
        for i, s in enumerate(sentences):
            v = self.mean(s)
            if v is not None:
                out[i] = v
        return out


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1; zero rows stay zero (their cosine with anything is 0)."""
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x, dtype=np.float64), where=norm > 0)


# ---------------------------------------------------------------------------- the classifier


@dataclass
class Classifier:
    """The CNN's ImageNet head: logits = features @ weight.T + bias."""

    name: str
    weight: np.ndarray  # [classes, feature_dim]
    bias: np.ndarray  # [classes]
    classes: tuple[str, ...]

    def logits(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(features, dtype=np.float32) @ self.weight.T + self.bias


def load_classifier(manifest: Manifest, weights: str | None = None) -> Classifier:
    """The ImageNet classifier of the CNN that computed the dataset's stored features.

    efficientnet-lite0: the head ships in the installed weights package (or ``weights``);
    densenet169: from ``weights`` (or $MMLINKS_WEIGHTS_DIR / the torch cache). The weight file's
    version must match the one recorded in the manifest: another file's classifier would not
    fit the stored features. Extractors without an ImageNet head (the authors' prebuilt
    features, region extractors) are refused.
    """
    import torch

    from features.base import find_weights, load_state_dict, weights_version
    from features.lite0 import imagenet_categories
    from features.registry import DENSENET169, LITE0

    fe = manifest.feature_extractor
    if fe.name == LITE0.name:
        from features import lite0

        path = find_weights(fe.name, weights, lite0._Lite0Base.weight_files, lite0._packaged_weights())
        version, keys = weights_version(path, lite0.KNOWN_WEIGHTS), ("_fc.weight", "_fc.bias")
    elif fe.name == DENSENET169.name:
        from features.densenet import DenseNet169Extractor

        path = find_weights(fe.name, weights, DenseNet169Extractor.weight_files)
        version = weights_version(path, {"b2777c0a": "imagenet"})
        keys = ("classifier.weight", "classifier.bias")
    else:
        raise MmlinksError(
            f"the object-detection baseline needs the ImageNet classifier of the CNN behind the stored "
            f"features; {fe.name!r} has none here (it works on {LITE0.name} or {DENSENET169.name} datasets)"
        )
    if version != fe.version:
        raise MmlinksError(
            f"{fe.name}: the dataset's features come from weights {fe.version}, but {path} is {version}; "
            "pass the weight file the dataset was built with (--weights)"
        )
    state = load_state_dict(path, fe.name)
    if not all(k in state for k in keys):
        raise MmlinksError(f"{fe.name}: {path} has no ImageNet classifier ({keys[0]})")
    w = state[keys[0]].to(torch.float32).numpy()
    b = state[keys[1]].to(torch.float32).numpy()
    classes = imagenet_categories()
    if w.shape != (len(classes), fe.dim):
        raise MmlinksError(f"{fe.name}: classifier shape {tuple(w.shape)} does not fit {fe.dim}-d features")
    return Classifier(f"{fe.name}@{version}", w, b, classes)


# ------------------------------------------------------------------------ object detection


def label_vectors(classes: Iterable[str], words: WordVectors) -> tuple[np.ndarray, np.ndarray]:
    """([classes, dim] mean word vector of each class name, [classes] whether it has one)."""
    classes = list(classes)
    out, known = np.zeros((len(classes), words.dim)), np.zeros(len(classes), dtype=bool)
    for c, name in enumerate(classes):
        v = words.mean(name)
        if v is not None:
            out[c], known[c] = v, True
    return out, known


def image_vectors_by_k(
    logits: np.ndarray, labels: np.ndarray, known: np.ndarray, k_max: int = K_MAX
) -> np.ndarray:
    """[k_max, m, dim]: entry K-1 is each image's mean label vector over its top-K classes.

    Classes whose names have no known word count towards K but add no vector; an image none of
    whose top-K names is known gets a zero vector (cosine 0 with every sentence).
    """
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k_max]  # [m, k_max], most probable first
    vecs = labels[top] * known[top][..., None]  # [m, k_max, dim]
    sums = np.cumsum(vecs, axis=1)
    counts = np.cumsum(known[top], axis=1)[..., None]
    means = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
    return means.transpose(1, 0, 2)


def _links(raw) -> list[tuple[int, int]] | None:
    return None if raw is None else [(d["sentence"], d["image"]) for d in raw]


def _sentences(table) -> list[str]:
    return [] if table is None else [s for doc in table.column("sentences").to_pylist() for s in doc]


def _split_table(data: str | Path, split: str, required: bool = True):
    manifest = Manifest.read(data)
    paths = manifest.shard_paths(data, split)
    if not paths:
        if required:
            raise MmlinksError(f"{data} has no {split!r} shards")
        return None
    return read_table(paths, columns=TRAINING_COLUMNS).sort_by("doc_id")


def object_detection_scores(
    table, classifier: Classifier, words: WordVectors, k_max: int = K_MAX
) -> list[tuple[str, list[np.ndarray], list[tuple[int, int]] | None]]:
    """Per document: (doc_id, [score matrix for K = 1..k_max], links)."""
    labels, known = label_vectors(classifier.classes, words)
    out = []
    for doc_id, sentences, f, links in iter_documents(table):
        s = unit_rows(words.sentence_matrix(sentences))
        v = unit_rows(image_vectors_by_k(classifier.logits(f), labels, known, k_max))
        out.append((doc_id, [s @ v_k.T for v_k in v], links))
    return out


def _per_k(scored, k_max: int) -> list[list[DocMetrics]]:
    per_k = []
    for k in range(k_max):
        docs = [document_metrics(d, mats[k], lk) for d, mats, lk in scored]
        per_k.append([m for m in docs if m is not None])
    return per_k


def _best_k(summaries: list[dict]) -> int:
    """1-based K with the highest mean AUC (the smallest such K on a tie); NaN never wins."""
    aucs = np.array([s["auc"] for s in summaries], dtype=np.float64)
    if np.isnan(aucs).all():
        raise MmlinksError("no K gives a finite AUC")
    return int(np.nanargmax(aucs)) + 1


def object_detection_baseline(
    data: str | Path,
    split: str = "test",
    k_max: int = K_MAX,
    word_vectors: str = "glove",
    weights: str | None = None,
    select_split: str | None = "val",
) -> dict:
    """The Object-Detection baseline for every K in 1..k_max.

    Returns the test figures at the K chosen on ``select_split`` (mean AUC; falls back to the
    oracle choice on ``split`` when that split has no labelled document), the oracle K chosen on
    ``split`` itself (the paper's protocol), every K, and the per-document metrics at the chosen K.
    """
    if not 1 <= k_max <= 1000:
        raise MmlinksError("--k-max must be between 1 and 1000")
    manifest = Manifest.read(data)
    classifier = load_classifier(manifest, weights)
    test_table = _split_table(data, split)
    val_table = None
    if select_split and select_split != split:
        val_table = _split_table(data, select_split, required=False)
    texts = [*classifier.classes, *_sentences(test_table), *_sentences(val_table)]
    words = WordVectors.load(word_vectors, texts)
    test = _per_k(object_detection_scores(test_table, classifier, words, k_max), k_max)
    test_sum = [summarize(p) for p in test]
    if not test[0]:
        raise MmlinksError(f"no labelled {split} document to evaluate (links are null or trivial)")
    oracle_k = _best_k(test_sum)
    val_sum = None
    if val_table is not None and val_table.num_rows:
        val = _per_k(object_detection_scores(val_table, classifier, words, k_max), k_max)
        val_sum = [summarize(p) for p in val] if val[0] else None
    if val_sum is not None:
        best_k, selected_on = _best_k(val_sum), select_split
    else:
        best_k, selected_on = oracle_k, f"{split} (oracle: no labelled {select_split} document)"
    return {
        "method": "object-detection",
        "split": split,
        **test_sum[best_k - 1],
        "best_k": best_k,
        "selected_on": selected_on,
        "oracle": {"k": oracle_k, **test_sum[oracle_k - 1]},
        "per_k": [
            {"k": k, split: test_sum[k - 1], **({select_split: val_sum[k - 1]} if val_sum else {})}
            for k in range(1, k_max + 1)
        ],
        "classifier": classifier.name,
        "word_vectors": words.name,
        "per_doc_metrics": test[best_k - 1],
    }


def random_scores_baseline(data: str | Path, split: str = "test", seed: int = 0) -> dict:
    """Uniform random scores (the paper's Random row; about 50 AUC)."""
    import pyarrow.compute as pc

    table = _split_table(data, split)
    n_img = pc.list_value_length(table.column("images")).to_pylist()
    docs = [
        (d, len(s), m, _links(lk))
        for d, s, m, lk in zip(
            table.column("doc_id").to_pylist(),
            table.column("sentences").to_pylist(),
            n_img,
            table.column("links").to_pylist(),
            strict=True,
        )
    ]
    per_doc = random_per_doc(docs, seed)
    if not per_doc:
        raise MmlinksError(f"no labelled {split} document to evaluate (links are null or trivial)")
    return {
        "method": "random",
        "split": split,
        "seed": seed,
        **summarize(per_doc),
        "per_doc_metrics": per_doc,
    }
