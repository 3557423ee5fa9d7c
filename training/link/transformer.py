"""The Li et al. (2021) backbone: Transformers over words and over region features + concepts
(paper Eq. 8-9; a global CNN token stands in for an image without regions).

Departures from the paper, each a ``TransformerConfig`` switch: regions and pooled vectors are
standardised by running statistics (``pool_norm``: without it unrelated images start at cosine
~0.8 and validation AUC stayed ~55 instead of ~97), and layers are pre-LayerNorm (stable at the
larger learning rates a small corpus wants)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.data import DocBatch
from training.regions import RegionBatch

SEGMENTS = {"region": 0, "concept": 1, "global": 2}


@dataclass
class TransformerConfig:
    vocab_size: int
    word_dim: int = 300
    image_dim: int = 1280  # global CNN feature (fallback token)
    region_dim: int = 1280
    d_multi: int = 1024
    layers: int = 3
    heads: int = 8
    max_tokens: int = 20  # position embeddings
    max_regions: int = 36
    dropout: float = 0.1
    ffn_mult: int = 4  # feed-forward width = ffn_mult * d_multi
    global_token: bool = False  # True: every image also sees its global CNN feature
    # Standardise pooled vectors with running statistics before L2 (see ``_standardise``).
    pool_norm: bool = True
    backbone: str = "transformer"

    def to_dict(self) -> dict:
        return asdict(self)


def _stack(cfg: TransformerConfig) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(
        cfg.d_multi,
        cfg.heads,
        dim_feedforward=cfg.ffn_mult * cfg.d_multi,
        dropout=cfg.dropout,
        activation="gelu",
        batch_first=True,
        norm_first=True,
    )
    # The nested-tensor fast path is inference-only and warns for pre-LN layers.
    return nn.TransformerEncoder(
        layer, cfg.layers, norm=nn.LayerNorm(cfg.d_multi), enable_nested_tensor=False
    )


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    w = mask.to(x.dtype).unsqueeze(-1)
    return (x * w).sum(1) / w.sum(1).clamp(min=1)


class TransformerLink(nn.Module):
    def __init__(
        self,
        cfg: TransformerConfig,
        embeddings: np.ndarray | None = None,
        feature_stats: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_multi
        self.embed = nn.Embedding(cfg.vocab_size, cfg.word_dim, padding_idx=0)
        if embeddings is not None:
            self.embed.weight.data.copy_(torch.from_numpy(np.asarray(embeddings, dtype=np.float32)))
        self.pos = nn.Embedding(cfg.max_tokens, cfg.word_dim)
        nn.init.uniform_(self.pos.weight, -0.02, 0.02)  # paper: U(-0.02, 0.02)
        self.word_norm = nn.LayerNorm(cfg.word_dim)
        self.w_t = nn.Linear(cfg.word_dim, d)  # W_T: shared by sentence words and concepts
        self.text = _stack(cfg)

        self.segment = nn.Embedding(len(SEGMENTS), d)
        self.segment_norm = nn.LayerNorm(d)
        # Running mean/var over real regions (no affine): standardised inputs without a
        # separate pass over the training shards to compute region statistics.
        self.region_stats = nn.BatchNorm1d(cfg.region_dim, affine=False)
        self.w_v = nn.Linear(cfg.region_dim, d)
        self.region_norm = nn.LayerNorm(d)
        self.concept_norm = nn.LayerNorm(d)
        self.register_buffer("feature_mean", torch.zeros(cfg.image_dim))
        self.register_buffer("feature_std", torch.ones(cfg.image_dim))
        if feature_stats is not None:
            self.set_feature_stats(*feature_stats)
        self.w_g = nn.Linear(cfg.image_dim, d)
        self.global_norm = nn.LayerNorm(d)
        self.image = _stack(cfg)
        # Mean-pooled Transformer outputs share a large common direction (constant segment
        # embeddings, recurring concept labels, LayerNorm biases): at init two unrelated images
        # have cosine ~0.8 and the hinge barely moves (measured on the synthetic corpus).
        # Removing it per dimension, as the GRU model does for its CNN inputs, fixes that.
        self.text_out = nn.BatchNorm1d(d, affine=False) if cfg.pool_norm else None
        self.image_out = nn.BatchNorm1d(d, affine=False) if cfg.pool_norm else None

    def set_feature_stats(self, mean: np.ndarray, std: np.ndarray) -> None:
        self.feature_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.feature_std.copy_(torch.as_tensor(np.maximum(std, 1e-6), dtype=torch.float32))

    def _standardise(self, x: torch.Tensor, bn: nn.BatchNorm1d | None) -> torch.Tensor:
        """Rows [K, D] standardised by ``bn`` (batch statistics need at least 2 rows). ``bn``'s
        own mode decides, not the model's: a DDP padding step freezes the statistics of the norm
        layers alone (``training.loop.frozen_running_stats``) while the rest stays in training."""
        if bn is None:
            return x
        training = bn.training and len(x) > 1
        return F.batch_norm(x, bn.running_mean, bn.running_var, None, None, training, bn.momentum, bn.eps)

    def _segment(self, name: str) -> torch.Tensor:
        return self.segment_norm(self.segment.weight[SEGMENTS[name]])

    def encode_text(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """tokens [N, T] (0-padded, T <= max_tokens), lengths [N] -> unit vectors [N, d_multi]."""
        T = tokens.shape[1]
        n_tokens = lengths.to(tokens.device).clamp(min=1)
        mask = torch.arange(T, device=tokens.device)[None, :] < n_tokens[:, None]
        h = self.word_norm(self.embed(tokens) + self.pos.weight[:T])
        h = self.text(self.w_t(h), src_key_padding_mask=~mask)
        return F.normalize(self._standardise(_masked_mean(h, mask), self.text_out), dim=-1)

    def encode_images(self, features: torch.Tensor, regions: RegionBatch) -> torch.Tensor:
        """Global features [N, D], regions [N, R, ...] -> unit vectors [N, d_multi]."""
        mask = regions.mask
        R = mask.shape[1]
        tokens, masks = [], []
        if R:
            real = self._standardise(regions.features[mask], self.region_stats)
            x = regions.features.masked_scatter(mask.unsqueeze(-1), real)
            tokens.append((self.region_norm(self.w_v(x)) + self._segment("region")) / 2)
            words = self.embed(regions.tokens)  # [N, R, L, word_dim]; PAD rows are zero
            n_words = (regions.tokens > 0).sum(-1, keepdim=True).clamp(min=1)
            concept = self.concept_norm(self.w_t(words.sum(2) / n_words))
            tokens.append((concept + self._segment("concept")) / 2)
            masks += [mask, mask]
        g = (features - self.feature_mean) / self.feature_std
        tokens.append(((self.global_norm(self.w_g(g)) + self._segment("global")) / 2).unsqueeze(1))
        use_global = torch.ones_like(mask[:, :1]) if self.cfg.global_token else ~mask.any(1, keepdim=True)
        masks.append(use_global)
        seq, seq_mask = torch.cat(tokens, 1), torch.cat(masks, 1)
        h = self.image(seq, src_key_padding_mask=~seq_mask)
        return F.normalize(self._standardise(_masked_mean(h, seq_mask), self.image_out), dim=-1)

    def forward(self, batch: DocBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """A ``DocBatch`` with ``regions`` -> (sentences [N_sent, d_multi], images [N_img, d_multi]).

        The batch goes through ``forward`` (not only ``encode``) because DDP syncs gradients
        only for calls of its own forward."""
        if batch.regions is None:
            raise ValueError("the transformer backbone needs region tensors: make_batch(..., regions=True)")
        s = self.encode_text(batch.tokens, batch.lengths)
        return s, self.encode_images(batch.features, batch.regions)

    def encode(self, batch: DocBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self(batch)
