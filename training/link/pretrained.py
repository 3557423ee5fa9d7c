"""TowerLink: structured fine-tuning on pretrained towers (issue #20; docs/training.md).

A pretrained sentence encoder (``towers.py``) and a projected image feature, trained by every
objective unchanged. Why a frozen encoder sits outside the module tree: state_dict, DDP and the
optimizer never see it, so checkpoints stay small; its sentence vectors are cached per process.
CLIP starts as identity heads, so training starts from zero-shot CLIP."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from schemas.errors import MmlinksError
from training.model import ImageEncoder

TUNINGS = ("frozen", "heads", "last-blocks")
CACHE_MAX = 1_000_000  # cached sentence vectors per process (frozen encoders)


@dataclass
class TowerConfig:
    image_dim: int
    d_multi: int  # the joint width (the encoder's own under "frozen" and for CLIP)
    text_tower: str = "minilm"  # "minilm" | "clip"
    text_dim: int = 384
    tuning: str = "heads"
    unfreeze_blocks: int = 2
    encoder_lr_scale: float = 0.1
    image_dropout: float = 0.4
    standardize: bool = True  # standardise the image feature (CNN features); CLIP: no
    identity_init: bool = False  # heads start as the identity (CLIP: zero-shot at step 0)
    tower_version: str = ""  # the encoder weights it was trained from
    clip_model: str = ""
    clip_weights: str = ""
    backbone: str = "minilm"

    def to_dict(self) -> dict:
        return asdict(self)


class TowerLink(nn.Module):
    def __init__(self, cfg: TowerConfig, feature_stats: tuple[np.ndarray, np.ndarray] | None = None):
        super().__init__()
        from training.link.towers import build_tower, tower_version

        if cfg.tuning not in TUNINGS:
            raise ValueError(f"unknown tuning {cfg.tuning!r}; known: {', '.join(TUNINGS)}")
        self.cfg = cfg
        found = tower_version(cfg.text_tower, cfg.clip_model, cfg.clip_weights)
        if cfg.tower_version and found != cfg.tower_version:
            raise MmlinksError(
                f"this model was trained on the {cfg.text_tower} weights {cfg.tower_version}, but this "
                f"machine has {found}; install or point to the same weights"
            )
        encoder = build_tower(cfg.text_tower, cfg.clip_model, cfg.clip_weights)
        for p in encoder.parameters():
            p.requires_grad_(False)
        self.trains_encoder = cfg.tuning == "last-blocks" and cfg.unfreeze_blocks > 0
        if self.trains_encoder:
            self.encoder = encoder
            for block in encoder.blocks()[-cfg.unfreeze_blocks :]:
                for p in block.parameters():
                    p.requires_grad_(True)
        else:
            # outside the module tree: no state_dict entry, no DDP sync, no optimizer slot
            object.__setattr__(self, "_frozen", encoder.eval())
            self._cache: dict[str, torch.Tensor] = {}
        self.text_head = None if cfg.tuning == "frozen" else nn.Linear(encoder.dim, cfg.d_multi)
        self.image = ImageEncoder(cfg)
        if cfg.identity_init:
            self._identity_heads()
        if feature_stats is not None and cfg.standardize:
            self.image.set_feature_stats(*feature_stats)

    def _identity_heads(self) -> None:
        with torch.no_grad():
            for lin in (self.text_head, self.image.proj):
                if lin is not None and lin.weight.shape[0] == lin.weight.shape[1]:
                    lin.weight.copy_(torch.eye(lin.weight.shape[0]))
                    lin.bias.zero_()

    def _apply(self, fn, recurse: bool = True):
        """``.to(device)`` also moves a frozen encoder kept outside the module tree."""
        out = super()._apply(fn, recurse)
        if "_frozen" in self.__dict__:
            self._frozen._apply(fn, recurse)
            self._cache.clear()
        return out

    def encode_text(self, sentences: list[str]) -> torch.Tensor:
        """sentences -> encoder vectors [N, text_dim] (cached when the encoder is frozen)."""
        if self.trains_encoder:
            return self.encoder(sentences)
        missing = sorted({s for s in sentences if s not in self._cache})
        if missing:
            with torch.no_grad():
                vecs = self._frozen(missing).detach()
            if len(self._cache) + len(missing) > CACHE_MAX:
                self._cache.clear()
            self._cache.update(zip(missing, vecs, strict=True))
        if not sentences:
            return torch.zeros(0, self.cfg.text_dim)
        return torch.stack([self._cache[s] for s in sentences])

    def forward(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """A ``DocBatch`` (with its raw ``sentences``) -> (sentences [N, d], images [M, d]), unit rows."""
        if batch.sentences is None:
            raise ValueError("a pretrained text tower needs the batch's raw sentences (make_batch sets them)")
        s = self.encode_text(batch.sentences)
        if self.text_head is not None:
            s = F.normalize(self.text_head(s), dim=-1)
        return s, self.image(batch.features)

    def encode(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        return self(batch)

    def param_groups(self, lr: float) -> list[dict]:
        """The heads at ``lr``, the unfrozen encoder blocks at ``lr x encoder_lr_scale``."""
        heads = [p for n, p in self.named_parameters() if not n.startswith("encoder.") and p.requires_grad]
        groups = [{"params": heads, "lr": lr, "lr_scale": 1.0}]
        if self.trains_encoder:
            enc = [p for p in self.encoder.parameters() if p.requires_grad]
            scale = self.cfg.encoder_lr_scale
            groups.append({"params": enc, "lr": lr * scale, "lr_scale": scale})
        return groups


# ------------------------------------------------------------------ backbone registry glue


def minilm_config(cfg, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
    from training.link.towers import MINILM_DIM, tower_version

    text_dim = MINILM_DIM
    return TowerConfig(
        image_dim=manifest.feature_extractor.dim,
        d_multi=text_dim if cfg.tower_tuning == "frozen" else cfg.d_multi,
        text_tower="minilm",
        text_dim=text_dim,
        tuning=cfg.tower_tuning,
        unfreeze_blocks=cfg.unfreeze_blocks,
        encoder_lr_scale=cfg.encoder_lr_scale,
        image_dropout=cfg.image_dropout,
        tower_version=tower_version("minilm"),
        backbone="minilm",
    ).to_dict()


def clip_config(cfg, manifest, vocab_size: int, word_dim: int, train_paths: list[str]) -> dict:
    """CLIP towers: the dataset's image features must be the same CLIP's image embeddings."""
    from features.clip import clip_config as arch
    from features.clip import find_clip_weights
    from features.registry import CLIP_VIT_B32
    from training.link.towers import tower_version

    fe = manifest.feature_extractor
    weights = str(find_clip_weights(cfg.clip_weights or None).resolve())
    version = tower_version("clip", cfg.clip_model, weights)
    if fe.name != CLIP_VIT_B32.name or fe.version != version:
        raise MmlinksError(
            f"--backbone clip needs image features from the same CLIP: {cfg.data} holds "
            f"{fe.name}@{fe.version}, "
            f"the text tower is {CLIP_VIT_B32.name}@{version}; build the dataset with --extractor "
            f"{CLIP_VIT_B32.name} --weights {weights}"
        )
    width = int(arch(cfg.clip_model)["embed_dim"])
    return TowerConfig(
        image_dim=fe.dim,
        d_multi=width,
        text_tower="clip",
        text_dim=width,
        tuning=cfg.tower_tuning,
        unfreeze_blocks=cfg.unfreeze_blocks,
        encoder_lr_scale=cfg.encoder_lr_scale,
        image_dropout=cfg.image_dropout,
        standardize=False,
        identity_init=True,
        tower_version=version,
        clip_model=cfg.clip_model,
        clip_weights=weights,
        backbone="clip",
    ).to_dict()


def build(model_cfg: dict, embeddings=None, feature_stats=None) -> TowerLink:
    return TowerLink(TowerConfig(**model_cfg), feature_stats)
