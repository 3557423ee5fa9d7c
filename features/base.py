"""The extractor contract and registry: adding a backbone is one small registered class.

An :class:`Extractor` runs as ``preprocess`` -> RunInference -> ``postprocess``, giving
``"global"`` vectors or ``"regions"`` (boxes in original pixels); this package never imports Beam.
Why fixed forward chunks (``FORWARD_CHUNK``, zero-padded; detectors one image at a time): CPU
kernels differ by batch size and Beam sizes batches by timing, so a feature would otherwise
change in the last bits with the batch it lands in."""

from __future__ import annotations

import abc
import hashlib
import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image

from features.registry import BUILTIN_EXTRACTORS, load_builtin
from schemas.errors import MmlinksError

FORWARD_CHUNK = 8
# On a GPU, forwards of 8 images leave it idle: EfficientNet-Lite0 ran 1,200 images/s in chunks of 8
# vs 2,855 in batches of 64 on an H100 (docs/benchmarks.md, "On a GPU"). Still fixed-size, so an
# image's features do not depend on its batch there either; the feature cache keys on the device.
GPU_FORWARD_CHUNK = 64
WEIGHTS_DIR_ENV = "MMLINKS_WEIGHTS_DIR"
PRECISIONS = {"float32": np.float32, "float16": np.float16}
KINDS = ("global", "regions")
IMAGE_SIZE_ATTR = "image_size"  # (width, height) of the original image, set on preprocessed tensors

EXTRACTORS: dict[str, type[Extractor]] = {}


@dataclass(eq=False)
class ImageFeatures:
    """What an extractor gives for one image.

    ``features``: 1-D global vector (``None`` for region extractors).
    ``regions``: ``None`` for global extractors, else ``{"boxes": float32 [R, 4] (x0, y0, x1, y1 in
    original image pixels), "vectors": [R, dim], "labels": list[str] (R), "scores": float32 [R]}``.
    ``features`` and region ``vectors`` are float16 when the extractor's precision is float16.
    """

    features: np.ndarray | None = None
    regions: dict[str, Any] | None = None


# --------------------------------------------------------------------------- registry


def register(cls: type[Extractor]) -> type[Extractor]:
    """Class decorator: make ``cls`` available to :func:`get_extractor` under ``cls.name``."""
    if not getattr(cls, "name", None) or getattr(cls, "kind", None) not in KINDS:
        raise TypeError(f"{cls.__name__} needs a class attribute name and kind in {KINDS}")
    spec = BUILTIN_EXTRACTORS.get(cls.name)
    if spec is not None and (spec.kind != cls.kind or spec.class_name != cls.__name__):
        raise TypeError(f"{cls.__name__} does not match its spec in features.registry: {spec}")
    if cls.name in EXTRACTORS and EXTRACTORS[cls.name] is not cls:
        raise TypeError(f"feature extractor {cls.name!r} is already registered by {EXTRACTORS[cls.name]}")
    EXTRACTORS[cls.name] = cls
    return cls


def extractor_options(cls: type[Extractor]) -> list[str]:
    """The option names ``get_extractor(name, **options)`` accepts for ``cls``."""
    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def load_builtins() -> None:
    """Import (and so register) every extractor listed in ``features.registry``."""
    for spec in BUILTIN_EXTRACTORS.values():
        load_builtin(spec)


def get_extractor(name: str, **options: Any) -> Extractor:
    """The registered extractor ``name`` configured with ``options`` (one-line MmlinksError if bad)."""
    load_builtins()
    cls = EXTRACTORS.get(name)
    if cls is None:
        raise MmlinksError(f"unknown feature extractor {name!r}; known: {', '.join(sorted(EXTRACTORS))}")
    accepted = extractor_options(cls)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise MmlinksError(
            f"feature extractor {name!r} has no option {', '.join(unknown)}; options: {', '.join(accepted)}"
        )
    return cls(**options)


# --------------------------------------------------------------------------- option helpers


def int_option(option: str, value: Any, minimum: int = 1) -> int:
    try:
        out = int(value)
        ok = out == float(value) and out >= minimum
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise MmlinksError(f"option {option} must be an integer >= {minimum}, got {value!r}")
    return out


def float_option(option: str, value: Any, low: float, high: float) -> float:
    try:
        out = float(value)
        ok = low <= out <= high
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise MmlinksError(f"option {option} must be a number in [{low}, {high}], got {value!r}")
    return out


def resolve_device(device: str) -> str:
    """``"cpu"`` or ``"cuda"``/``"cuda:N"``; a clear error when CUDA is asked for but absent."""
    device = str(device).lower()
    if device == "cpu":
        return device
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        if not torch.cuda.is_available():
            raise MmlinksError(f"device {device!r} requested but CUDA is not available; use device 'cpu'")
        return device
    raise MmlinksError(f"unknown device {device!r}; use 'cpu' or 'cuda'")


@lru_cache(maxsize=32)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 of a file (cached while its size and mtime are unchanged)."""
    st = os.stat(path)
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


def find_weights(
    extractor: str, option: str | None, file_names: Sequence[str], fallback: Path | None = None
) -> Path:
    """Locate a weight file: ``weights=`` option, then ``$MMLINKS_WEIGHTS_DIR/<file>``, then the
    torch hub cache (``$TORCH_HOME/hub/checkpoints/<file>``), then ``fallback``; never downloads."""
    if option is not None:
        path = Path(option).expanduser()
        if not path.is_file():
            raise MmlinksError(f"{extractor}: weights file {path} does not exist")
        return path
    looked: list[Path] = []
    weights_dir = os.environ.get(WEIGHTS_DIR_ENV)
    if weights_dir:
        looked += [Path(weights_dir).expanduser() / f for f in file_names]
    looked.append(Path(torch.hub.get_dir()) / "checkpoints" / file_names[-1])
    for path in looked:
        if path.is_file():
            return path
    if fallback is not None and fallback.is_file():
        return fallback
    raise MmlinksError(
        f"{extractor}: no weights found (looked for {', '.join(map(str, looked))}); pass weights=PATH, "
        f"put {file_names[0]} in ${WEIGHTS_DIR_ENV}, or {file_names[-1]} in $TORCH_HOME/hub/checkpoints "
        "(nothing is downloaded)"
    )


# --------------------------------------------------------------------------- batched forwards


def _cat(parts: list[Any]) -> Any:
    if isinstance(parts[0], dict):
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    return torch.cat(parts)


def _take(out: Any, n: int) -> Any:
    if isinstance(out, dict):
        return {k: v[:n].cpu() for k, v in out.items()}
    return out[:n].cpu()


def unbatch(out: Any) -> list[Any]:
    """Split a batched output (tensor or dict of tensors) into per-image outputs.

    Each part is copied: a view would pickle the whole batch's storage whenever Beam encodes one
    result."""
    if isinstance(out, dict):
        n = len(next(iter(out.values())))
        return [{k: v[i].clone() for k, v in out.items()} for i in range(n)]
    return [row.clone() for row in out]


def fixed_chunk_forward(
    model: torch.nn.Module,
    x: torch.Tensor | Sequence[torch.Tensor],
    device: str = "cpu",
    chunk: int = FORWARD_CHUNK,
) -> Any:
    """Run ``model`` on fixed-size chunks of ``x`` (the last one zero-padded); outputs on the CPU.

    Every forward has the same shape, so an image's output does not depend on which other images
    share its batch. ``model`` may return a tensor or a dict of tensors (batch first).
    """
    if not isinstance(x, torch.Tensor):
        x = torch.stack(list(x))
    x = x.to(device)
    outs = []
    with torch.no_grad():
        for start in range(0, len(x), chunk):
            part = x[start : start + chunk]
            n = len(part)
            if n < chunk:
                part = torch.cat([part, part.new_zeros(chunk - n, *part.shape[1:])])
            outs.append(_take(model(part), n))
    return _cat(outs)


# --------------------------------------------------------------------------- the contract


class Extractor(abc.ABC):
    """One image backbone. Subclass, set ``name``/``kind``, implement the abstract members, and
    decorate with :func:`register`. Options are keyword-only ``__init__`` parameters."""

    name: ClassVar[str]
    kind: ClassVar[str]  # "global" | "regions"
    #: images per forward; None = one image per forward (inputs of different sizes)
    forward_chunk: ClassVar[int | None] = FORWARD_CHUNK

    def __init__(self, *, precision: str = "float32"):
        if precision not in PRECISIONS:
            raise MmlinksError(f"option precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.precision = precision
        self._options: dict[str, Any] = {"precision": precision}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"<{type(self).__name__} {self.name} {opts}>"

    @property
    def options(self) -> dict[str, Any]:
        """The effective options that shape the outputs (record them next to ``version``)."""
        return dict(self._options)

    @property
    @abc.abstractmethod
    def version(self) -> str:
        """Names the weights; file weights carry a sha256 prefix of the file."""

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Length of a feature vector (global) or of a region vector (regions)."""

    @abc.abstractmethod
    def preprocess(self, img: Image.Image) -> torch.Tensor:
        """A decoded RGB image -> the model's CHW float32 input (region extractors tag it with the
        original size, see :func:`with_image_size`)."""

    @abc.abstractmethod
    def load_model(self, device: str = "cpu") -> torch.nn.Module:
        """The model in eval mode on ``device`` (called once per Beam worker)."""

    @abc.abstractmethod
    def postprocess(self, inference: Any, image_size: tuple[int, int] | None = None) -> ImageFeatures:
        """One raw model output (or the PredictionResult holding it) -> ImageFeatures.

        ``image_size`` is the (width, height) of the original image; region extractors need it to
        report boxes in original pixels and, when omitted, use the size the preprocessed tensor
        carried through the model handler."""

    # ---- batched forward (the same function RunInference and the benchmark call)

    def chunk_for(self, device: str = "cpu") -> int | None:
        """Images per forward on ``device``: ``forward_chunk``, at least ``GPU_FORWARD_CHUNK`` on a
        GPU; None = one image per forward (detectors)."""
        if self.forward_chunk is None:
            return None
        if str(device).startswith("cuda"):
            return max(self.forward_chunk, GPU_FORWARD_CHUNK)
        return self.forward_chunk

    def forward(self, model: torch.nn.Module, batch: Sequence[torch.Tensor], device: str = "cpu") -> list:
        """Raw per-image outputs for a batch of preprocessed tensors, independent of batch size.

        Dict outputs (region extractors) also get the ``image_size`` the tensors carry."""
        if self.forward_chunk is None:
            with torch.no_grad():
                outs = [_take_one(model(x.to(device))) for x in batch]
        else:
            outs = unbatch(fixed_chunk_forward(model, batch, device, self.chunk_for(device)))
        for x, out in zip(batch, outs, strict=True):
            size = getattr(x, IMAGE_SIZE_ATTR, None)
            if isinstance(out, dict) and size is not None:
                out[IMAGE_SIZE_ATTR] = torch.tensor(size)
        return outs

    # ---- conveniences outside Beam (serving, tests)

    def extract(
        self, images: Sequence[Image.Image], device: str = "cpu", model: torch.nn.Module | None = None
    ) -> list[ImageFeatures]:
        """Preprocess, forward and postprocess ``images`` in-process."""
        device = resolve_device(device)
        model = model if model is not None else self.load_model(device)
        raw = self.forward(model, [self.preprocess(im) for im in images], device) if images else []
        return [self.postprocess(r, im.size) for r, im in zip(raw, images, strict=True)]

    def _cast(self, arr: np.ndarray | torch.Tensor) -> np.ndarray:
        if isinstance(arr, torch.Tensor):
            arr = arr.detach().cpu().numpy()
        return np.ascontiguousarray(arr, dtype=PRECISIONS[self.precision])


def _take_one(out: Any) -> Any:
    if isinstance(out, dict):
        return {k: v.cpu() for k, v in out.items()}
    return out.cpu()


def raw_inference(inference: Any) -> Any:
    """Accept a Beam PredictionResult or the bare model output."""
    return getattr(inference, "inference", inference)


def with_image_size(x: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """Tag a preprocessed tensor with the original (width, height); the tag survives pickling
    (Beam coders) and reaches postprocess through the raw inference, so region boxes can be
    mapped back to original pixels without carrying the size separately."""
    setattr(x, IMAGE_SIZE_ATTR, (int(image_size[0]), int(image_size[1])))
    return x


def need_image_size(extractor: Extractor, image_size: tuple[int, int] | None, raw: Any) -> tuple[int, int]:
    """The explicit ``image_size``, else the one carried in the raw inference."""
    if image_size is None and isinstance(raw, dict) and IMAGE_SIZE_ATTR in raw:
        image_size = tuple(int(v) for v in raw[IMAGE_SIZE_ATTR])
    if image_size is None:
        raise MmlinksError(
            f"{extractor.name} reports boxes in original pixels but the image size is unknown: pass "
            "image_size=(width, height) to postprocess, or feed the tensors preprocess returned"
        )
    w, h = image_size
    return int(w), int(h)


class GlobalExtractor(Extractor):
    """A backbone whose model maps a [B, 3, H, W] batch to [B, dim] vectors."""

    kind = "global"

    def postprocess(self, inference: Any, image_size: tuple[int, int] | None = None) -> ImageFeatures:
        vec = raw_inference(inference)
        return ImageFeatures(features=self._cast(vec).reshape(-1))


def weights_version(path: Path, known: dict[str, str] | None = None) -> str:
    """``<label>-<sha256[:8]>``: label names well-known files (e.g. ``imagenet``), else ``sha256``."""
    h8 = file_sha256(path)[:8]
    return f"{(known or {}).get(h8, 'sha256')}-{h8}"


def load_state_dict(path: Path, extractor: str) -> dict[str, torch.Tensor]:
    """A state dict from ``path`` (tensors only, never pickled code); unwraps common containers."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt file, not a torch file, pickled objects
        detail = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise MmlinksError(f"{extractor}: cannot read weights {path}: {detail}") from exc
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict):
        raise MmlinksError(f"{extractor}: {path} does not hold a state dict")
    return {k.removeprefix("module."): v for k, v in state.items()}


def load_weights_into(
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    extractor: str,
    path: Path,
    optional_prefixes: tuple[str, ...] = (),
) -> None:
    """``load_state_dict`` that allows only keys under ``optional_prefixes`` to be missing."""
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatch
        raise MmlinksError(f"{extractor}: weights {path} do not fit the model: {str(exc)[:300]}") from exc
    missing = [k for k in missing if not k.startswith(optional_prefixes)]
    if missing or unexpected:
        raise MmlinksError(
            f"{extractor}: weights {path} do not fit the model "
            f"(missing {missing[:3]}{'...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]})"
        )
