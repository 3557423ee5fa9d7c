"""MulLink (Hessel et al. 2019): a GRU sentence encoder and a projected CNN image encoder.

Both sides land on the unit sphere in a shared d_multi space, so a sentence-image score is a
cosine. Defaults are the paper's (GRU and d_multi 1024, image dropout 0.4); the demo uses a
smaller width to fit a 2-core laptop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from training.text_pooling import TEXT_POOLING

# What the image encoder sees of a document's images (issue #33): "none" = each image alone
# (the paper); "doc" = each image minus its document's mean image; "doc+raw" = both, concatenated.
IMAGE_CENTRING = ("none", "doc", "doc+raw", "balanced")
# "balanced": the within-document part and the document-mean part of the feature, each standardised
# over the training split, summed with the mean part weighted by ``image_mean_weight``.


def document_sizes(x: torch.Tensor, n_images: list[int] | None) -> list[int]:
    """The images of each of ``x``'s consecutive documents (None: one document), checked on the
    host against ``x``'s rows: ``document_rows`` gives ``repeat_interleave`` its output size, which
    a GPU then trusts (a CPU raises on a mismatch; a GPU reads past or leaves rows unset)."""
    sizes = [len(x)] if n_images is None else list(n_images)
    if sum(sizes) != len(x):
        raise ValueError(f"image counts sum to {sum(sizes)}, the batch has {len(x)} image rows")
    return sizes


def document_rows(counts: torch.Tensor, n: int) -> torch.Tensor:
    """counts [B] (images per document, summing to ``n``: ``document_sizes``) -> each of the ``n``
    rows' document [n]. ``output_size`` given: on a GPU ``repeat_interleave`` would otherwise copy
    the counts' sum to the host, a synchronisation per batch."""
    return torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts, output_size=n)


def document_means(x: torch.Tensor, n_images: list[int] | None) -> torch.Tensor:
    """x [N, D], consecutive documents of ``n_images`` images (None: one document) -> each row's
    document mean [N, D]."""
    counts = torch.as_tensor(document_sizes(x, n_images), device=x.device)
    doc = document_rows(counts, len(x))  # [N]
    sums = torch.zeros(len(counts), x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, doc, x)
    return (sums / counts.clamp(min=1)[:, None].to(x.dtype))[doc]


def document_medians(x: torch.Tensor, n_images: list[int] | None) -> torch.Tensor:
    """x [N, D] as in ``document_means`` -> each row's document median per channel [N, D] (the
    mean of the two middle values for an even count, as ``numpy.median``: two images' median is
    their mean). The documents are padded with +inf to the longest and sorted once, so a batch
    costs one sort, not a loop over its documents."""
    sizes = document_sizes(x, n_images)
    if not len(x):
        return x.clone()
    counts = torch.as_tensor(sizes, device=x.device)
    doc = document_rows(counts, len(x))  # [N]
    pos = torch.arange(len(x), device=x.device) - (torch.cumsum(counts, 0) - counts)[doc]  # [N]
    # the longest document from the host's list: counts.max() read back would synchronise a GPU
    padded = x.new_full((len(counts), max(sizes), x.shape[1]), float("inf"))  # [B, max n, D]
    padded[doc, pos] = x
    ordered = padded.sort(dim=1).values
    rows = torch.arange(len(counts), device=x.device)
    low, high = ordered[rows, ((counts - 1) // 2).clamp(min=0)], ordered[rows, counts // 2]  # [B, D]
    return ((low + high) / 2)[doc]


# What centring takes as a document's shared look (``image_centre``): the per-channel mean of its
# images, or their per-channel median (issue #60), which one odd image (a close-up among room shots)
# does not move.
DOCUMENT_CENTRES = {"mean": document_means, "median": document_medians}


@dataclass
class ModelConfig:
    vocab_size: int
    word_dim: int = 300
    image_dim: int = 1280
    d_multi: int = 1024  # GRU units = joint space width
    image_dropout: float = 0.4
    backbone: str = "gru"
    text_pooling: str = "last"  # one of TEXT_POOLING; configs saved before it were "last"
    image_centring: str = "none"  # one of IMAGE_CENTRING; configs saved before it were "none"
    image_mean_weight: float = 0.5  # "balanced" only; configs saved before it were 0.5
    image_centre: str = "mean"  # one of DOCUMENT_CENTRES; configs saved before it were "mean"

    def to_dict(self) -> dict:
        return asdict(self)


class TextEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig, embeddings: np.ndarray | None = None):
        super().__init__()
        if cfg.text_pooling not in TEXT_POOLING:
            raise ValueError(f"unknown text pooling {cfg.text_pooling!r}; known: {', '.join(TEXT_POOLING)}")
        self.pooling = cfg.text_pooling
        self.embed = nn.Embedding(cfg.vocab_size, cfg.word_dim, padding_idx=0)
        if embeddings is not None:
            self.embed.weight.data.copy_(torch.from_numpy(np.asarray(embeddings, dtype=np.float32)))
        if self.pooling == "bag":
            self.proj = nn.Linear(cfg.word_dim, cfg.d_multi)
        elif self.pooling == "bigru":
            self.gru = nn.GRU(cfg.word_dim, max(1, cfg.d_multi // 2), batch_first=True, bidirectional=True)
        else:
            self.gru = nn.GRU(cfg.word_dim, cfg.d_multi, batch_first=True)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """tokens [N, T] (0-padded), lengths [N] -> unit vectors [N, d_multi]."""
        x = self.embed(tokens)  # [N, T, word_dim]
        T = tokens.shape[1]
        valid = lengths.to(tokens.device).clamp(min=1)  # lengths may live on the host (for packing)
        mask = torch.arange(T, device=tokens.device)[None, :] < valid[:, None]  # [N, T]
        if self.pooling == "bag":
            mean = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            return F.normalize(self.proj(mean), dim=-1)
        packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        states, h = self.gru(packed)
        if self.pooling == "last":
            return F.normalize(h[-1], dim=-1)
        if self.pooling == "bigru":
            return F.normalize(torch.cat([h[-2], h[-1]], dim=-1), dim=-1)
        out, _ = pad_packed_sequence(states, batch_first=True, total_length=T)  # [N, T, d_multi]
        if self.pooling == "mean":
            pooled = (out * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        else:  # max
            pooled = out.masked_fill(~mask[..., None], float("-inf")).amax(1)
        return F.normalize(pooled, dim=-1)


class ImageEncoder(nn.Module):
    """Standardise -> (document centring) -> dropout -> linear -> L2.

    CNN features after ReLU and pooling share a large common component; without
    standardising it (training-set mean and std, kept as buffers so they travel with the
    weights) every image projects to nearly the same direction and the hinge loss stalls at
    2 x margin.

    Document centring (``image_centring``, issue #33): when a document's images share a strong
    look (one room, light and camera), that look is most of each vector and what tells its
    images apart is a small remainder; a projection of the raw vector keeps the look, and the
    document's images land on nearly one point. Subtracting the document's mean image removes
    whatever all of them share, using only the document itself (so it applies at test time and
    in serving without labels), or their per-channel median (``image_centre``), which one odd
    image does not drag towards itself and so off the others; the centred part is rescaled by
    its training-set spread (``centred_std``) so that it is on the raw part's scale.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.centring = getattr(cfg, "image_centring", "none")
        self.mean_weight = float(getattr(cfg, "image_mean_weight", 0.5))
        if self.centring not in IMAGE_CENTRING:
            raise ValueError(f"unknown image centring {self.centring!r}; known: {', '.join(IMAGE_CENTRING)}")
        centre = getattr(cfg, "image_centre", "mean")
        if centre not in DOCUMENT_CENTRES:
            raise ValueError(f"unknown image centre {centre!r}; known: {', '.join(DOCUMENT_CENTRES)}")
        self.document_centres = DOCUMENT_CENTRES[centre]
        self.register_buffer("feature_mean", torch.zeros(cfg.image_dim))
        self.register_buffer("feature_std", torch.ones(cfg.image_dim))
        if self.centring != "none":
            self.register_buffer("centred_std", torch.ones(cfg.image_dim))
        if self.centring == "balanced":
            self.register_buffer("between_std", torch.ones(cfg.image_dim))
        self.dropout = nn.Dropout(cfg.image_dropout)
        width = cfg.image_dim * (2 if self.centring == "doc+raw" else 1)
        self.proj = nn.Linear(width, cfg.d_multi)

    def set_feature_stats(
        self,
        mean: np.ndarray,
        std: np.ndarray,
        centred_std: np.ndarray | None = None,
        between_std: np.ndarray | None = None,
    ) -> None:
        self.feature_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.feature_std.copy_(torch.as_tensor(np.maximum(std, 1e-6), dtype=torch.float32))
        if centred_std is not None and self.centring != "none":
            self.centred_std.copy_(torch.as_tensor(np.maximum(centred_std, 1e-6), dtype=torch.float32))
        if between_std is not None and self.centring == "balanced":
            self.between_std.copy_(torch.as_tensor(np.maximum(between_std, 1e-6), dtype=torch.float32))

    def forward(self, features: torch.Tensor, n_images: list[int] | None = None) -> torch.Tensor:
        """features [N, image_dim] of consecutive documents with ``n_images`` images each (None:
        all of one document) -> unit vectors [N, d_multi]."""
        x = (features - self.feature_mean) / self.feature_std
        if self.centring != "none":
            means = self.document_centres(x, n_images)  # the "mean" part: a mean or a median
            centred = (x - means) / self.centred_std
            if self.centring == "balanced":
                x = centred + self.mean_weight * means / self.between_std
            else:
                x = centred if self.centring == "doc" else torch.cat([centred, x], dim=-1)
        return F.normalize(self.proj(self.dropout(x)), dim=-1)


class MulLink(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        embeddings: np.ndarray | None = None,
        feature_stats: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        super().__init__()
        self.cfg = cfg
        self.text = TextEncoder(cfg, embeddings)
        self.image = ImageEncoder(cfg)
        if feature_stats is not None:
            self.image.set_feature_stats(*feature_stats)

    def forward(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """A ``DocBatch`` -> (sentence vectors [N_sentences, d], image vectors [N_images, d]).

        Every backbone takes the batch in ``forward`` (DDP only syncs gradients of calls that go
        through its own forward) and offers the same as ``encode``."""
        return self.text(batch.tokens, batch.lengths), self.image(batch.features, batch.n_images)

    def encode(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        return self(batch)
