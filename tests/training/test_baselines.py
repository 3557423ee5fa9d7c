"""Random and Object-Detection baselines against independent brute-force computations.

The datasets here are written directly as shards + manifest (no Beam, no Ray): random CNN
features put through the real EfficientNet-Lite0 ImageNet head, and sentences made of common
words, so every number can be recomputed by a plain loop.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.document import SCHEMA_VERSION, Document, ImageRecord
from schemas.errors import MmlinksError
from schemas.manifest import FeatureExtractorInfo, Manifest, ShardInfo
from schemas.shards import write_shard
from schemas.text import tokenize
from training.link.baselines import (
    WordVectors,
    image_vectors_by_k,
    load_classifier,
    object_detection_baseline,
    random_scores_baseline,
)
from training.metrics import document_metrics, random_baseline

LITE0 = ("efficientnet-lite0", "imagenet-57934424", 1280)
WORDS = (
    "dog cat car boat tree house bird fish horse truck red blue green small big old new the a of "
    "and on in water road sky wooden metal"
).split()


def make_documents(split: str, n_docs: int, seed: int, dim: int = 1280, prefix: str = "") -> list[Document]:
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n_docs):
        n, m = int(rng.integers(2, 5)), int(rng.integers(2, 5))
        sentences = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 7)))) for _ in range(n)]
        if d % 5 == 0:
            sentences[0] = "!!! ???"  # no known word: a zero sentence vector, ties in the matrix
        images = [
            ImageRecord(
                content_id=f"{prefix}{split}{d}-{i}",
                uri="",
                width=8,
                height=8,
                phash=0,
                features=np.abs(rng.normal(0, 1, dim)).astype(np.float32).tolist(),
            )
            for i in range(m)
        ]
        links = [(i, i) for i in range(min(n, m) - 1)] or [(0, 0)]
        docs.append(Document(f"{prefix}{split}-{d:03d}", "synthetic", split, sentences, images, links))
    return docs


def write_dataset(root: Path, docs: list[Document], extractor=LITE0) -> Path:
    """Shards + manifest.json under ``root`` (one shard per split), readable by every command."""
    shards = []
    for split in ("train", "val", "test"):
        part = sorted((d for d in docs if d.split == split), key=lambda d: d.doc_id)
        if part:
            rel = f"shards/{split}-00000.parquet"
            rows, size, sha = write_shard(root / rel, part)
            shards.append(ShardInfo(rel, split, rows, size, sha))
    counts = {"splits": {s.split: s.rows for s in shards}, "dropped": {}}
    Manifest(
        SCHEMA_VERSION, "test-version", "synthetic", counts, FeatureExtractorInfo(*extractor), shards
    ).write(root)
    return root


@pytest.fixture(scope="module")
def od_dataset(tmp_path_factory) -> Path:
    docs = make_documents("test", 12, seed=1) + make_documents("val", 8, seed=2)
    return write_dataset(tmp_path_factory.mktemp("od"), docs)


@pytest.fixture(scope="module")
def glove() -> dict[str, np.ndarray]:
    from training.text import load_glove

    words, vectors = load_glove()
    return {w: np.asarray(vectors[i], dtype=np.float64) for i, w in enumerate(words)}


# ------------------------------------------------------------------------------ word vectors


def test_word_vectors_skip_punctuation_and_unknown_words_and_split_compounds(tmp_path):
    path = tmp_path / "vec.txt"
    path.write_text("hen 1 0\nwoods 0 1\nthe 1 1\n. 5 5\nsun 3 3\n")
    wv = WordVectors.load(str(path), ["The hen-of-the-woods.", "zzz"])
    assert set(wv.index) == {"hen", "woods", "the", "."}  # only words of the named texts are kept
    # tokens: the, hen-of-the-woods (-> hen, of, the, woods; "of" unknown), "." (punctuation: skipped)
    np.testing.assert_allclose(wv.mean("The hen-of-the-woods."), np.mean([[1, 1], [1, 0], [1, 1], [0, 1]], 0))
    assert wv.mean("zzz !!") is None
    np.testing.assert_allclose(wv.sentence_matrix(["zzz", "hen"]), [[0, 0], [1, 0]])


# ------------------------------------------------------------------ top-K label vectors


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_image_vectors_by_k_match_a_loop(m, k_max, seed):
    rng = np.random.default_rng(seed)
    n_classes, dim = 10, 3
    logits = rng.normal(size=(m, n_classes))
    labels = rng.normal(size=(n_classes, dim))
    known = rng.random(n_classes) < 0.7
    got = image_vectors_by_k(logits, labels, known, k_max)
    assert got.shape == (k_max, m, dim)
    for k in range(1, k_max + 1):
        for i in range(m):
            top = sorted(range(n_classes), key=lambda c: -logits[i, c])[:k]
            vecs = [labels[c] for c in top if known[c]]
            want = np.mean(vecs, 0) if vecs else np.zeros(dim)
            np.testing.assert_allclose(got[k - 1, i], want, atol=1e-12)


# ------------------------------------------------------------------ the whole baseline


def brute_force_scores(doc: dict, k: int, glove: dict, head: torch.nn.Linear, classes) -> np.ndarray:
    """The paper's definition, written out: top-K classes from the CNN's own head module."""

    def mean_vec(text: str):
        vecs = []
        for tok in tokenize(text):
            if not any(c.isalnum() for c in tok):
                continue
            parts = [tok] if tok in glove else tok.replace("'", "-").split("-")
            vecs += [glove[p] for p in parts if p in glove]
        return np.mean(vecs, 0) if vecs else None

    with torch.no_grad():
        logits = head(torch.tensor([im["features"] for im in doc["images"]], dtype=torch.float32))
    image_vecs = []
    for row in logits:
        names = [classes[c] for c in torch.topk(row, k).indices.tolist()]
        vecs = [v for v in map(mean_vec, names) if v is not None]
        image_vecs.append(np.mean(vecs, 0) if vecs else None)
    out = np.zeros((len(doc["sentences"]), len(image_vecs)))
    for s, sentence in enumerate(doc["sentences"]):
        a = mean_vec(sentence)
        for i, b in enumerate(image_vecs):
            if a is not None and b is not None and np.linalg.norm(a) and np.linalg.norm(b):
                out[s, i] = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    return out


def test_object_detection_matches_brute_force_for_every_k(od_dataset, glove):
    from features.efficientnet_lite import load_pretrained
    from features.lite0 import imagenet_categories
    from schemas.shards import read_table

    res = object_detection_baseline(od_dataset, k_max=20)
    head, classes = load_pretrained()._fc, imagenet_categories()
    test = read_table(Manifest.read(od_dataset).shard_paths(od_dataset, "test")).to_pylist()
    val = read_table(Manifest.read(od_dataset).shard_paths(od_dataset, "val")).to_pylist()

    def summary(rows, k):
        per = [
            document_metrics(
                d["doc_id"],
                brute_force_scores(d, k, glove, head, classes),
                [(x["sentence"], x["image"]) for x in d["links"]],
            )
            for d in rows
        ]
        per = [p for p in per if p is not None]
        return 100 * np.mean([p.auc for p in per]), 100 * np.mean([p.p_at_1 for p in per])

    by_k = {p["k"]: p for p in res["per_k"]}
    assert sorted(by_k) == list(range(1, 21))
    for k in (1, 2, 7, 20):
        auc, p1 = summary(test, k)
        assert by_k[k]["test"]["auc"] == pytest.approx(auc, abs=1e-6)
        assert by_k[k]["test"]["p_at_1"] == pytest.approx(p1, abs=1e-6)
        assert by_k[k]["val"]["auc"] == pytest.approx(summary(val, k)[0], abs=1e-6)
    # K is chosen on val (mean AUC, smallest K on a tie); the oracle on test; headline = test at K
    val_auc = [by_k[k]["val"]["auc"] for k in range(1, 21)]
    test_auc = [by_k[k]["test"]["auc"] for k in range(1, 21)]
    assert res["best_k"] == 1 + int(np.argmax(val_auc)) and res["selected_on"] == "val"
    assert res["oracle"]["k"] == 1 + int(np.argmax(test_auc))
    assert res["auc"] == by_k[res["best_k"]]["test"]["auc"]
    assert res["oracle"]["auc"] == max(test_auc)
    assert len(res["per_doc_metrics"]) == res["n_docs"] == 12
    assert res["classifier"] == "efficientnet-lite0@imagenet-57934424"


def test_without_val_labels_the_choice_is_the_oracle_and_says_so(tmp_path):
    root = write_dataset(tmp_path, make_documents("test", 6, seed=4))
    res = object_detection_baseline(root, k_max=3)
    assert res["best_k"] == res["oracle"]["k"]
    assert "oracle" in res["selected_on"]
    assert [p["k"] for p in res["per_k"]] == [1, 2, 3] and "val" not in res["per_k"][0]


def test_densenet169_classifier_comes_from_its_weight_file(tmp_path):
    from features.base import weights_version

    rng = np.random.default_rng(0)
    weights = tmp_path / "densenet169.pth"
    state = {
        "classifier.weight": torch.tensor(rng.normal(size=(1000, 1664)), dtype=torch.float32),
        "classifier.bias": torch.zeros(1000),
    }
    torch.save(state, weights)
    version = weights_version(weights, {"b2777c0a": "imagenet"})
    root = write_dataset(
        tmp_path / "ds", make_documents("test", 4, seed=5, dim=1664), ("densenet169", version, 1664)
    )
    clf = load_classifier(Manifest.read(root), str(weights))
    feats = rng.normal(size=(3, 1664)).astype(np.float32)
    np.testing.assert_allclose(clf.logits(feats), feats @ state["classifier.weight"].numpy().T, rtol=1e-5)
    res = object_detection_baseline(root, k_max=2, weights=str(weights))
    assert res["n_docs"] == 4 and res["classifier"] == f"densenet169@{version}"

    torch.save({"features.conv0.weight": torch.zeros(1)}, weights)  # no classifier in the file
    manifest = Manifest.read(root)
    manifest.feature_extractor.version = weights_version(weights, {})
    with pytest.raises(MmlinksError, match="no ImageNet classifier"):
        load_classifier(manifest, str(weights))


@pytest.mark.parametrize(
    "extractor, match",
    [
        (("hessel-prebuilt:diy", "prebuilt-0123", 1664), "has none here"),
        (("efficientnet-lite0", "sha256-deadbeef", 1280), "pass the weight file"),
    ],
)
def test_features_without_a_matching_classifier_are_refused(tmp_path, extractor, match):
    root = write_dataset(tmp_path, make_documents("test", 2, seed=6, dim=extractor[2]), extractor)
    with pytest.raises(MmlinksError, match=match) as info:
        object_detection_baseline(root)
    assert "\n" not in str(info.value)


def test_densenet169_without_weights_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("MMLINKS_WEIGHTS_DIR", raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    root = write_dataset(tmp_path, make_documents("test", 2, seed=7, dim=1664), ("densenet169", "x", 1664))
    with pytest.raises(MmlinksError, match="no weights found"):
        object_detection_baseline(root)


def test_random_baseline_is_the_metrics_random_baseline(od_dataset):
    from schemas.shards import read_table

    rows = read_table(Manifest.read(od_dataset).shard_paths(od_dataset, "test")).to_pylist()
    docs = [
        (
            d["doc_id"],
            len(d["sentences"]),
            len(d["images"]),
            [(x["sentence"], x["image"]) for x in d["links"]],
        )
        for d in sorted(rows, key=lambda d: d["doc_id"])
    ]
    res = random_scores_baseline(od_dataset, "test", seed=3)
    want = random_baseline(docs, seed=3)
    assert {k: res[k] for k in want} == want
    assert [m.doc_id for m in res["per_doc_metrics"]] == [d[0] for d in docs]
    assert json.dumps(res["per_doc_metrics"][0].__dict__)  # plain values: ready for the JSONL file
