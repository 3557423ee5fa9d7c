"""From shard rows to padded tensors: the only place that knows the batch layout.

A batch of B documents becomes flat sentence tokens and image features plus per-document
offsets; ``pad_documents`` then scatters the encoded vectors into [B, n_max, d] / [B, m_max, d]
with masks, which is what the similarity functions take.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

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

    def __len__(self) -> int:
        return len(self.doc_ids)


def features_of(table: pa.Table) -> tuple[list[np.ndarray], list[int]]:
    """Per-document feature matrices from the nested ``images`` column, without Python loops
    over individual floats."""
    images = table.column("images").combine_chunks()
    counts = pc.list_value_length(images).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(images)
    feats = pc.struct_field(flat, "features")
    dim = pc.list_value_length(feats)
    d = int(pc.max(dim).as_py() or 0)
    if pc.min(dim).as_py() != d:
        raise ValueError("images in one batch have feature vectors of different lengths")
    values = pc.list_flatten(feats).to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, d)
    splits = np.cumsum(counts)[:-1]
    return np.split(values, splits), counts.tolist()


def make_batch(
    table: pa.Table,
    vocab: Vocabulary,
    max_tokens: int,
    rng: np.random.Generator | None = None,
) -> DocBatch:
    """``rng`` given: shuffle image order inside each document (links are remapped)."""
    feats, n_img = features_of(table)
    sentences = table.column("sentences").to_pylist()
    links = table.column("links").to_pylist() if "links" in table.column_names else [None] * len(sentences)
    doc_ids = table.column("doc_id").to_pylist()
    out_feats, out_links = [], []
    for f, lk in zip(feats, links, strict=True):
        perm = rng.permutation(len(f)) if rng is not None else np.arange(len(f))
        out_feats.append(f[perm])
        if lk is None:
            out_links.append(None)
        else:
            inv = np.argsort(perm)  # old image index -> new position
            out_links.append([(d["sentence"], int(inv[d["image"]])) for d in lk])
    encoded = [vocab.encode(s, max_tokens) for doc in sentences for s in doc]
    T = max(len(e) for e in encoded)
    tokens = np.zeros((len(encoded), T), dtype=np.int64)
    for i, e in enumerate(encoded):
        tokens[i, : len(e)] = e
    return DocBatch(
        doc_ids=doc_ids,
        tokens=torch.from_numpy(tokens),
        lengths=torch.tensor([len(e) for e in encoded]),
        features=torch.from_numpy(np.concatenate(out_feats)),
        n_sentences=[len(doc) for doc in sentences],
        n_images=n_img,
        links=out_links,
    )


def pad_documents(flat: torch.Tensor, counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[sum(counts), d] -> ([B, max(counts), d], mask [B, max(counts)])."""
    B, L = len(counts), max(counts)
    counts_t = torch.tensor(counts, device=flat.device)
    mask = torch.arange(L, device=flat.device)[None, :] < counts_t[:, None]
    out = flat.new_zeros(B, L, flat.shape[-1])
    out[mask] = flat
    return out, mask
