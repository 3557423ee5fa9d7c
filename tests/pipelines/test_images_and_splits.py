import io

import imagehash
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
