"""From shard rows to padded tensors: the only place that knows the batch layout.

A batch of B documents becomes flat sentence tokens and image features plus per-document
offsets; ``pad_documents`` then scatters the encoded vectors into [B, n_max, d] / [B, m_max, d]
with masks, which is what the similarity functions take.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from schemas.errors import MmlinksError
from schemas.feature_bytes import feature_values
from training.text import Vocabulary

TRAINING_COLUMNS = ["doc_id", "sentences", "images", "links"]


@dataclass
class DocBatch:
    doc_ids: list[str]
    tokens: torch.Tensor  # [N_sentences, T]
    lengths: torch.Tensor  # [N_sentences]
    features: torch.Tensor  # [N_images, D]
    n_sentences: list[int]
    n_images: list[int]
    links: list[list[tuple[int, int]] | None]
    # Region features and concept tokens per image (training/regions.py), for backbones that
    # read regions; None otherwise.
    regions: object | None = None
    # Per-document metadata (when the table has the column: the retrieval objectives' relations)
    metadata: list[dict] | None = None
    # Every sentence as text, flattened in order [N_sentences] (pretrained text towers tokenise
    # them their own way, training/link/towers.py)
    sentences: list[str] | None = None

    def __len__(self) -> int:
        return len(self.doc_ids)


def features_of(table: pa.Table) -> tuple[list[np.ndarray], list[int]]:
    """Per-document feature matrices from the nested ``images`` column, without Python loops
    over individual floats; the column as stored (bytes) or as ``read_table`` gives it
    (``schemas.feature_bytes.feature_values``)."""
    if table.num_rows == 0:
        return [], []
    try:
        values, counts = feature_values(table)
    except ValueError as exc:  # mixed widths, a missing or damaged vector: no training on them
        raise MmlinksError(f"cannot read the image features of these documents: {exc}") from None
    values = values.astype(np.float32)  # a copy: the batch's arrays are writable
    return np.split(values, np.cumsum(counts)[:-1]), counts.tolist()


def iter_documents(table: pa.Table) -> Iterator[tuple[str, list[str], np.ndarray, list | None]]:
    """(doc_id, sentences, image features [m, D], links as (sentence, image) pairs or None) per
    row: what every scorer outside the training loop walks over."""
    feats, _ = features_of(table)
    for doc_id, sentences, f, links in zip(
        table.column("doc_id").to_pylist(),
        table.column("sentences").to_pylist(),
        feats,
        table.column("links").to_pylist(),
        strict=True,
    ):
        yield doc_id, sentences, f, None if links is None else [(d["sentence"], d["image"]) for d in links]


def _take_one(column: pa.ChunkedArray, chosen: np.ndarray) -> pa.Array:
    """list<x> column -> list<x> of exactly the ``chosen[d]``-th element of each row."""
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    flat = pc.list_flatten(column)
    values = flat.take(pa.array(starts + chosen))
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return pa.ListArray.from_arrays(pa.array(np.arange(len(chosen) + 1), pa.int32()), values)


def one_pair_per_document(table: pa.Table, rng: np.random.Generator | None) -> pa.Table:
    """NoStruct (Hessel 2019): each document becomes ONE random sentence and ONE random image.

    ``rng`` given: a fresh draw (training, redrawn every epoch); None: a draw fixed by the
    document id (validation, so its loss is comparable between epochs). A link survives only
    if it joined the two kept items.
    """
    n_s = pc.list_value_length(table.column("sentences")).to_numpy(zero_copy_only=False)
    n_i = pc.list_value_length(table.column("images")).to_numpy(zero_copy_only=False)
    if rng is None:
        seeds = [zlib.crc32(d.encode()) for d in table.column("doc_id").to_pylist()]
        u = np.array([np.random.default_rng(s).random(2) for s in seeds]).reshape(-1, 2)
    else:
        u = rng.random((table.num_rows, 2))
    si = np.minimum((u[:, 0] * n_s).astype(np.int64), n_s - 1)
    ii = np.minimum((u[:, 1] * n_i).astype(np.int64), n_i - 1)
    out = table.set_column(
        table.schema.get_field_index("sentences"), "sentences", _take_one(table.column("sentences"), si)
    )
    out = out.set_column(
        out.schema.get_field_index("images"), "images", _take_one(table.column("images"), ii)
    )
    if "links" in table.column_names:
        kept = [
            None
            if lk is None
            else [{"sentence": 0, "image": 0}] * any(d["sentence"] == s and d["image"] == i for d in lk)
            for lk, s, i in zip(table.column("links").to_pylist(), si, ii, strict=True)
        ]
        out = out.set_column(
            out.schema.get_field_index("links"), "links", pa.array(kept, table.schema.field("links").type)
        )
    return out


def encode_sentences(
    sentences: list[list[str]], vocab: Vocabulary, max_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every document's sentences, flattened in order -> (tokens [N, T] 0-padded, lengths [N]):
    the text half of a batch, shared by training batches and batch linking (linking/)."""
    encoded = [vocab.encode(s, max_tokens) for doc in sentences for s in doc]
    T = max((len(e) for e in encoded), default=1)
    tokens = np.zeros((len(encoded), T), dtype=np.int64)
    for i, e in enumerate(encoded):
        tokens[i, : len(e)] = e
    return torch.from_numpy(tokens), torch.tensor([len(e) for e in encoded], dtype=torch.int64)


def make_batch(
    table: pa.Table,
    vocab: Vocabulary,
    max_tokens: int,
    rng: np.random.Generator | None = None,
    regions: bool = False,
    max_regions: int = 36,
) -> DocBatch:
    """``rng`` given: shuffle image order inside each document (links are remapped).
    ``regions``: also gather region features and concept tokens, in the same image order."""
    feats, n_img = features_of(table)
    sentences = table.column("sentences").to_pylist()
    links = table.column("links").to_pylist() if "links" in table.column_names else [None] * len(sentences)
    doc_ids = table.column("doc_id").to_pylist()
    out_feats, out_links, perms = [], [], []
    for f, lk in zip(feats, links, strict=True):
        perm = rng.permutation(len(f)) if rng is not None else np.arange(len(f))
        perms.append(perm)
        out_feats.append(f[perm])
        if lk is None:
            out_links.append(None)
        else:
            inv = np.argsort(perm)  # old image index -> new position
            out_links.append([(d["sentence"], int(inv[d["image"]])) for d in lk])
    tokens, lengths = encode_sentences(sentences, vocab, max_tokens)
    region_batch = None
    if regions:
        from training.regions import regions_of

        region_batch = regions_of(table, perms, vocab, max_regions)
    metadata = None
    if "metadata" in table.column_names:
        metadata = [dict(m or []) for m in table.column("metadata").to_pylist()]
    return DocBatch(
        metadata=metadata,
        doc_ids=doc_ids,
        tokens=tokens,
        lengths=lengths,
        features=torch.from_numpy(np.concatenate(out_feats)),
        n_sentences=[len(doc) for doc in sentences],
        n_images=n_img,
        links=out_links,
        regions=region_batch,
        sentences=[s for doc in sentences for s in doc],
    )


def pad_documents(flat: torch.Tensor, counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[sum(counts), d] -> ([B, max(counts), d], mask [B, max(counts)])."""
    B, L = len(counts), max(counts)
    counts_t = torch.tensor(counts, device=flat.device)
    mask = torch.arange(L, device=flat.device)[None, :] < counts_t[:, None]
    out = flat.new_zeros(B, L, flat.shape[-1])
    out[mask] = flat
    return out, mask


def link_scores(model, batch: DocBatch) -> list[np.ndarray]:
    """Per-document sentence x image cosine matrices."""
    s, v = model.encode(batch)
    out, so, vo = [], 0, 0
    for n, m in zip(batch.n_sentences, batch.n_images, strict=True):
        out.append((s[so : so + n] @ v[vo : vo + m].T).detach().cpu().numpy())
        so, vo = so + n, vo + m
    return out


def structure_measurable(val_paths: list[str]) -> bool:
    """Whether a validation document has the sentences and images ``link_structure`` needs (three
    each): else it is None for every document, each epoch's ``val_structure`` and every candidate
    of the image-side choice alike. Reads the sentences and one small leaf of the images (their
    ids: the list lengths, not the features), shard by shard until one document qualifies."""
    import pyarrow.parquet as pq

    from schemas.shards import check_shards
    from training.metrics import STRUCTURE_MIN_SIDE as SIDE

    for path in val_paths:
        check_shards([path])
        try:
            t = pq.ParquetFile(path).read(columns=["sentences", "images.list.element.content_id"])
        except (OSError, pa.ArrowInvalid) as exc:
            raise MmlinksError(f"cannot read shard {path}: {exc}") from exc
        n, m = (pc.list_value_length(t[c]) for c in ("sentences", "images"))
        if pc.any(pc.and_(pc.greater_equal(n, SIDE), pc.greater_equal(m, SIDE))).as_py():
            return True
    return False
