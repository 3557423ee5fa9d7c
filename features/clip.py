"""CLIP (open_clip architectures) from a local weight file: image embeddings as an extractor,
and the loader the CLIP text tower and the zero-shot baseline share (files: docs/training.md).

Why an ordinary global feature: the zero-shot baseline and the ``clip`` backbone then read it
through the same RunInference and feature-cache path as any extractor. Nothing is downloaded;
the manifest's version is ``<model>-<sha256[:8]>`` of the weight file."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from PIL import Image
from torch import nn

from features.base import GlobalExtractor, find_weights, register, resolve_device, weights_version
from features.registry import CLIP_VIT_B32
from schemas.errors import MmlinksError

DEFAULT_CLIP_MODEL = "ViT-B-32"
WEIGHT_FILES = (f"{CLIP_VIT_B32.name}.pt", "open_clip_pytorch_model.bin")


def clip_model_name(model: str) -> str:
    """open_clip's name for ``model``: a built-in name as is, or a JSON config file (registered
    with open_clip under its file stem, in this process), e.g. a tiny architecture for tests."""
    import open_clip

    if model.endswith(".json"):
        path = Path(model).expanduser()
        if not path.is_file():
            raise MmlinksError(f"CLIP config file {path} does not exist")
        if path.stem not in open_clip.list_models():
            open_clip.add_model_config(path)
        return path.stem
    if model not in open_clip.list_models():
        raise MmlinksError(f"unknown CLIP architecture {model!r}; open_clip knows e.g. ViT-B-32, ViT-L-14")
    return model


def clip_config(model: str) -> dict:
    """open_clip's config of ``model`` (embed_dim, vision_cfg, text_cfg)."""
    import open_clip

    return open_clip.get_model_config(clip_model_name(model))


def find_clip_weights(weights: str | None) -> Path:
    return find_weights(CLIP_VIT_B32.name, weights or None, WEIGHT_FILES)


def clip_version(model: str, path: Path) -> str:
    """``<model>-<label>-<sha8>``: the architecture and the exact file (another file, or the
    same file read as another architecture, gives other embeddings)."""
    return f"{clip_model_name(model)}-{weights_version(path)}"


@lru_cache(maxsize=4)
def _load(model: str, path: str, size: int, mtime_ns: int) -> nn.Module:
    import open_clip

    name = clip_model_name(model)
    net = open_clip.create_model(name, pretrained=None, device="cpu")  # random init, no download
    try:
        open_clip.load_checkpoint(net, path, strict=True)
    except Exception as exc:  # not a CLIP file, another architecture's, corrupt
        detail = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        raise MmlinksError(f"CLIP {name}: weights {path} do not load: {detail}") from exc
    return net.eval()


def load_clip(model: str, path: Path) -> nn.Module:
    """The open_clip model with the file's weights (read once per process and file version);
    callers that change it (a tower being fine-tuned) must copy it."""
    st = Path(path).stat()
    return _load(model, str(path), st.st_size, st.st_mtime_ns)


def clip_tokenizer(model: str):
    """open_clip's tokenizer of ``model`` (the BPE vocabulary ships inside the package)."""
    import open_clip

    return open_clip.get_tokenizer(clip_model_name(model))


class ClipImageTower(nn.Module):
    """[B, 3, H, W] -> [B, embed_dim] CLIP image embeddings (``encode_image``, unnormalised)."""

    def __init__(self, clip: nn.Module):
        super().__init__()
        self.visual = clip.visual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.visual(x)


@register
class ClipViTB32Extractor(GlobalExtractor):
    name = CLIP_VIT_B32.name
    kind = CLIP_VIT_B32.kind

    def __init__(
        self, *, weights: str | None = None, model: str = DEFAULT_CLIP_MODEL, precision: str = "float32"
    ):
        super().__init__(precision=precision)
        self.model_name = clip_model_name(model)
        self.model_arg = model
        self.weights_path = find_clip_weights(weights)
        self._options["model"] = self.model_name

    @property
    def version(self) -> str:
        return clip_version(self.model_arg, self.weights_path)

    @property
    def dim(self) -> int:
        return int(clip_config(self.model_arg)["embed_dim"])

    def preprocess(self, img: Image.Image) -> torch.Tensor:
        from open_clip import image_transform

        size = clip_config(self.model_arg)["vision_cfg"].get("image_size", 224)
        return image_transform(size, is_train=False)(img.convert("RGB"))

    def load_model(self, device: str = "cpu") -> torch.nn.Module:
        clip = load_clip(self.model_arg, self.weights_path)
        return ClipImageTower(clip).to(resolve_device(device)).eval()
