import io

import imagehash
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from features.images import InvalidImage, inspect_image, phash64
from pipelines.splits import assign_split, shard_index


def png(color=(200, 10, 10), size=(64, 48), fmt="PNG") -> bytes:
    buf = io.BytesIO()
    img = Image.new("RGB", size, color)
    for x in range(0, size[0], 8):
        img.putpixel((x, x % size[1]), (0, 0, 0))
    img.save(buf, format=fmt)
    return buf.getvalue()


def test_inspect_image_fingerprints():
    data = png()
    info, img = inspect_image(data)
    assert (info.width, info.height) == (64, 48)
    assert len(info.content_id) == 64
    assert info.phash == int(str(imagehash.phash(img)), 16)
    assert 0 <= info.phash < 2**64


def test_same_photo_re_encoded_has_close_phash_but_new_content_id():
    from skimage import data

    photo = Image.fromarray(data.chelsea())
    encoded = []
    for fmt in ("PNG", "JPEG"):
        buf = io.BytesIO()
        photo.save(buf, format=fmt, quality=70)
        encoded.append(buf.getvalue())
    a, _ = inspect_image(encoded[0])
    b, _ = inspect_image(encoded[1])
    assert a.content_id != b.content_id
    assert bin(a.phash ^ b.phash).count("1") <= 3


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "empty_image"),
        (b"not an image at all", "undecodable"),
        (png()[:60], "undecodable"),
        (png(size=(8, 8)), "too_small"),
    ],
)
def test_bad_images_raise_with_reason(data, reason):
    with pytest.raises(InvalidImage) as exc:
        inspect_image(data)
    assert exc.value.reason == reason


def test_animated_gif_is_rejected():
    frames = [Image.new("RGB", (32, 32), c) for c in ((255, 0, 0), (0, 255, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    with pytest.raises(InvalidImage) as exc:
        inspect_image(buf.getvalue())
    assert exc.value.reason == "animated"


def _encoded(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


_pixels = st.builds(
    lambda seed, w, h: np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8),
    st.integers(0, 10_000),
    st.integers(16, 40),
    st.integers(16, 40),
)


@settings(max_examples=25, deadline=None)
@given(_pixels)
def test_every_mode_decodes_to_what_a_person_sees(rgb):
    """Issue #62: 16-bit greyscale, palette with a transparent index, RGBA and LA over a page,
    EXIF orientation and CMYK decode to the RGB a person sees (a 16-bit PNG came out 99.6 % white)."""
    from features.images import decode

    grey = rgb[..., 0]
    # 16-bit greyscale: the same picture at 8 bits (PIL's own convert clipped it to white)
    deep = Image.fromarray(grey.astype(np.uint16) * 257)
    out = np.asarray(decode(_encoded(deep)))
    assert np.abs(out.astype(int) - grey[..., None]).max() <= 1
    # transparency over white: an alpha of 0 is the page, 255 the pixel
    alpha = np.where(grey > 127, 255, 0).astype(np.uint8)
    rgba = np.dstack([rgb, alpha])
    out = np.asarray(decode(_encoded(Image.fromarray(rgba, "RGBA"))))
    assert (out[alpha == 0] == 255).all() and (out[alpha == 255] == rgb[alpha == 255]).all()
    la = Image.fromarray(np.dstack([grey, alpha]), "LA")
    out = np.asarray(decode(_encoded(la)))
    assert (out[alpha == 0] == 255).all() and (out[alpha == 255][:, 0] == grey[alpha == 255]).all()
    # a palette whose index 0 is transparent
    pal = Image.fromarray((grey > 127).astype(np.uint8), "P")
    pal.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    out = np.asarray(decode(_encoded(pal, transparency=0)))
    assert (out[grey <= 127] == 255).all() and (out[grey > 127] == (200, 100, 50)).all()
    # EXIF orientation 6: shown turned 90 degrees clockwise
    exif = Image.Exif()
    exif[0x0112] = 6
    out = np.asarray(decode(_encoded(Image.fromarray(rgb), exif=exif)))
    assert (out == np.rot90(rgb, k=-1)).all()
    # CMYK: PIL's conversion (K = 0 keeps the colour's complement)
    cmyk = Image.fromarray(np.dstack([255 - rgb, np.zeros_like(grey)]), "CMYK")
    out = np.asarray(decode(_encoded(cmyk, "TIFF")))
    assert (out == rgb).all()


def test_a_decompression_bomb_is_refused_by_the_projects_own_bound():
    """PIL refuses an image of over 178M pixels inside ``open``, before the project's 50M check:
    either way the reason is ``too_many_pixels`` (issue #62)."""
    huge = _encoded(Image.new("1", (14_000, 14_000)), "PNG")  # 196M pixels of one bit each
    with pytest.raises(InvalidImage) as exc:
        inspect_image(huge)
    assert exc.value.reason == "too_many_pixels"
    mid = _encoded(Image.new("1", (8_000, 8_000)), "PNG")  # 64M: over the project's bound only
    with pytest.raises(InvalidImage) as exc:
        inspect_image(mid)
    assert exc.value.reason == "too_many_pixels" and "8000x8000" in str(exc.value)


def test_phash64_is_unsigned_and_stable():
    img = Image.open(io.BytesIO(png()))
    assert phash64(img) == phash64(img.copy())


@settings(max_examples=200)
@given(st.text(min_size=1, max_size=30))
def test_split_depends_only_on_doc_id(doc_id):
    assert assign_split(doc_id) == assign_split(doc_id)
    assert assign_split(doc_id) in {"train", "val", "test"}
    assert 0 <= shard_index(doc_id, 7) < 7


def test_split_ratios_are_respected_on_many_ids():
    ids = [f"doc-{i}" for i in range(20_000)]
    counts = {s: 0 for s in ("train", "val", "test")}
    for d in ids:
        counts[assign_split(d, {"train": 0.7, "val": 0.2, "test": 0.1})] += 1
    assert abs(counts["train"] / 20_000 - 0.7) < 0.015
    assert abs(counts["test"] / 20_000 - 0.1) < 0.01
    assert all(assign_split(d, {"train": 1.0}) == "train" for d in ids[:100])
