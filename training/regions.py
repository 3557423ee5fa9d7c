"""Region features and concept tokens per image, for the Li et al. (2021) Transformer backbone.

A batch keeps each image's top ``max_regions`` regions by score, in ``DocBatch.features``' image
order, with a mask. Why labels become words of the text vocabulary: a concept shares its
embedding with the sentences that mention it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from training.text import Vocabulary

LABEL_TOKENS = 4  # words kept per label ("German short-haired pointer" is 3 tokens)
_VECTORS_COLUMN = "images.list.element.regions.vectors"


@dataclass
class RegionBatch:
    features: torch.Tensor  # [N_images, R, D_r] float32 region vectors (0 where masked)
    tokens: torch.Tensor  # [N_images, R, L] concept-label token ids, 0-padded
    mask: torch.Tensor  # [N_images, R] bool: a real region

    def to(self, device: torch.device | str) -> RegionBatch:
        return RegionBatch(self.features.to(device), self.tokens.to(device), self.mask.to(device))


def _lengths(arr: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def _starts(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


def regions_of(
    table: pa.Table,
    perms: list[np.ndarray] | None,
    vocab: Vocabulary,
    max_regions: int,
    label_tokens: int = LABEL_TOKENS,
) -> RegionBatch:
    """Dense region tensors for the images of ``table`` (nested ``images`` column).

    Image j of document d in the output is the document's image ``perms[d][j]`` (None: shard
    order), matching ``make_batch``. Per image the ``max_regions`` highest-scoring regions are
    kept (ties and missing scores: shard order). R = the most regions any kept image has, so a
    region-less batch gives R = 0.
    """
    images = table.column("images").combine_chunks()
    per_doc = _lengths(images)
    flat = pc.list_flatten(images)  # one row per image, shard order
    n_img = len(flat)
    image_type = flat.type
    if image_type.get_field_index("regions") < 0 or not pa.types.is_struct(image_type.field("regions").type):
        # No region column at all (e.g. a served document of global features only).
        tokens = torch.zeros(n_img, 0, label_tokens, dtype=torch.long)
        return RegionBatch(torch.zeros(n_img, 0, 0), tokens, torch.zeros(n_img, 0, dtype=torch.bool))
    regions = pc.struct_field(flat, "regions")  # null slots stay null in every child
    vectors = pc.struct_field(regions, "vectors")
    labels = pc.struct_field(regions, "labels")
    scores = pc.struct_field(regions, "scores")
    counts = _lengths(vectors)
    label_counts, score_counts = _lengths(labels), _lengths(scores)
    if np.any((label_counts != counts) & (label_counts != 0)) or np.any(
        (score_counts != counts) & (score_counts != 0)
    ):
        raise ValueError("region labels or scores do not match the region vectors in count")

    position = _output_positions(per_doc, perms, n_img)

    # One row per region: its image, its index in the image, its score.
    total = int(counts.sum())
    owner = np.repeat(np.arange(n_img), counts)
    index_in_image = np.arange(total) - np.repeat(_starts(counts), counts)
    score = np.zeros(total, np.float64)
    has_scores = np.repeat(score_counts == counts, counts)
    score[has_scores] = pc.list_flatten(scores).to_numpy(zero_copy_only=False)
    ranked = np.lexsort((index_in_image, -score, owner))  # by image, best score first
    rank = np.empty(total, np.int64)
    rank[ranked] = np.arange(total) - np.repeat(_starts(counts), counts)
    keep = rank < max_regions
    R = int(min(max_regions, counts.max(initial=0)))

    flat_vectors = pc.list_flatten(vectors)
    dims = _lengths(flat_vectors)
    D = int(dims.max(initial=0))
    if total and dims.min() != D:
        raise ValueError("regions in one batch have vectors of different lengths")
    values = pc.list_flatten(flat_vectors).to_numpy(zero_copy_only=False).astype(np.float32).reshape(total, D)
    slot_img, slot_rank = position[owner[keep]], rank[keep]
    features = np.zeros((n_img, R, D), np.float32)
    features[slot_img, slot_rank] = values[keep]
    mask = np.zeros((n_img, R), bool)
    mask[slot_img, slot_rank] = True

    tokens = np.zeros((n_img, R, label_tokens), np.int64)
    if total:
        label_ids = _concept_tokens(labels, label_counts == counts, counts, vocab, label_tokens)
        tokens[slot_img, slot_rank] = label_ids[keep]
    return RegionBatch(torch.from_numpy(features), torch.from_numpy(tokens), torch.from_numpy(mask))


def _output_positions(per_doc: np.ndarray, perms: list[np.ndarray] | None, n_img: int) -> np.ndarray:
    """Output slot of every shard-order image: document d's slot j holds image ``perms[d][j]``."""
    doc_start = _starts(per_doc)
    order = (
        np.arange(n_img)
        if perms is None
        else np.concatenate([doc_start[d] + np.asarray(p, np.int64) for d, p in enumerate(perms)] or [[]])
    ).astype(np.int64)
    if len(order) != n_img:
        raise ValueError(f"perms cover {len(order)} images; the table has {n_img}")
    position = np.empty(n_img, np.int64)
    position[order] = np.arange(n_img)
    return position


def _concept_tokens(
    labels: pa.Array, image_has_labels: np.ndarray, counts: np.ndarray, vocab: Vocabulary, label_tokens: int
) -> np.ndarray:
    """[total_regions, label_tokens] token ids, one row per region in shard order.

    Each distinct label is tokenised once; an image without a label list reads as ``<unk>``.
    """
    total = int(counts.sum())
    flat_labels = np.zeros(total, np.int64)
    coded = pc.dictionary_encode(pc.fill_null(pc.list_flatten(labels), ""))
    table_ids = np.zeros((len(coded.dictionary), label_tokens), np.int64)
    for i, label in enumerate(coded.dictionary.to_pylist()):
        ids = vocab.encode(label, label_tokens)
        table_ids[i, : len(ids)] = ids
    has_labels = np.repeat(image_has_labels, counts)
    flat_labels[has_labels] = coded.indices.to_numpy(zero_copy_only=False)
    label_ids = np.where(has_labels[:, None], table_ids[flat_labels], 0)
    label_ids[~has_labels, 0] = vocab.index.get("<unk>", 1)
    return label_ids


def region_dim(paths: list[str]) -> int | None:
    """Length of the region vectors in the shards; None when no image carries regions.

    Reads the vectors leaf batch by batch and stops at the first region found, so a
    region-bearing dataset costs one small read.
    """
    from schemas.shards import check_shards

    check_shards(paths)
    for p in paths:
        for batch in pq.ParquetFile(p).iter_batches(columns=[_VECTORS_COLUMN], batch_size=64):
            regs = pc.struct_field(pc.list_flatten(batch.column(0)), "regions")
            vecs = pc.list_flatten(pc.struct_field(regs, "vectors"))
            if len(vecs):
                return int(pc.list_value_length(vecs[:1])[0].as_py())
    return None
