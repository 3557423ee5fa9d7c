"""Decode, validate and fingerprint image bytes; the pixel guard and reasons live here."""

from __future__ import annotations

import hashlib
import io
import re
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

MAX_PIXELS = 50_000_000  # decompression-bomb guard
MIN_SIDE = 16
_OBJECT_AT = re.compile(r" object at 0x[0-9a-fA-F]+>")


class InvalidImage(ValueError):
    """Raised with a short machine-readable ``reason`` (used as a metric name)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ImageInfo:
    content_id: str  # sha256 of the bytes
    width: int
    height: int
    phash: int  # unsigned 64-bit DCT perceptual hash


def decode(data: bytes) -> Image.Image:
    """Fully decode ``data`` into RGB, or raise InvalidImage; truncation is caught by load()."""
    if not data:
        raise InvalidImage("empty_image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if img.width * img.height > MAX_PIXELS:
                raise InvalidImage("too_many_pixels", f"{img.width}x{img.height}")
            if getattr(img, "is_animated", False):
                raise InvalidImage("animated")
            img.load()
    except InvalidImage:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # PIL's own bomb check (at 89M pixels) runs inside open(), before ours can: the same reason
        raise InvalidImage("too_many_pixels", _OBJECT_AT.sub(">", str(exc))[:200]) from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        # PIL names its buffer object by address (``<_io.BytesIO object at 0x7f...>``): dropped, so
        # a dead letter's text is the same in every process and a rebuild's file is byte-identical
        raise InvalidImage("undecodable", _OBJECT_AT.sub(">", str(exc))[:200]) from exc
    if min(img.size) < MIN_SIDE:
        raise InvalidImage("too_small", f"{img.width}x{img.height}")
    return as_seen(img)


def as_seen(img: Image.Image) -> Image.Image:
    """The RGB image a person sees (issue #62): turned as its EXIF orientation says; 16- and
    32-bit greyscale scaled to 8 bits (PIL's ``convert`` clips them: a 16-bit PNG came out 99.6 %
    white); transparency (RGBA, LA, a palette's transparent index) laid over white, as a page
    shows it; CMYK and other modes through PIL's conversion."""
    from PIL import ImageOps

    try:
        img = ImageOps.exif_transpose(img)
    except (OSError, ValueError, SyntaxError):  # a damaged EXIF block: the pixels as stored
        pass
    if img.mode.startswith("I;16"):
        img = Image.fromarray((np.asarray(img, dtype=np.uint32) // 257).astype(np.uint8), "L")
    elif img.mode in ("I", "F"):
        a = np.asarray(img, dtype=np.float64)
        top = (
            65535.0
            if img.mode == "I" and a.max() > 255
            else (1.0 if img.mode == "F" and a.max() <= 1 else 255.0)
        )
        img = Image.fromarray(np.clip(a * (255.0 / top), 0, 255).round().astype(np.uint8), "L")
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        page = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(page, rgba).convert("RGB")
    return img.convert("RGB")


def phash64(img: Image.Image) -> int:
    """imagehash.phash as an unsigned 64-bit int (never key dicts on ImageHash objects)."""
    import imagehash  # here: only the dedupe needs it (a GPU image without it still extracts features)

    bits = imagehash.phash(img, hash_size=8).hash.flatten()
    return int("".join("1" if b else "0" for b in bits), 2)


def inspect_image(data: bytes) -> tuple[ImageInfo, Image.Image]:
    img = decode(data)
    info = ImageInfo(
        content_id=hashlib.sha256(data).hexdigest(),
        width=img.width,
        height=img.height,
        phash=phash64(img),
    )
    return info, img


def to_model_input(
    img: Image.Image, size: int, mean: tuple[float, ...], std: tuple[float, ...], resize: int | None = None
) -> np.ndarray:
    """Resize (shorter side to ``resize``), centre-crop ``size``, normalise; CHW float32."""
    resize = resize or size
    w, h = img.size
    scale = resize / min(w, h)
    img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BILINEAR)
    w, h = img.size
    left, top = (w - size) // 2, (h - size) // 2
    img = img.crop((left, top, left + size, top + size))
    arr = np.asarray(img, dtype=np.float32) / 255.0
    arr = (arr - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(arr.transpose(2, 0, 1))
