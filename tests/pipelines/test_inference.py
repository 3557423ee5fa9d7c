"""pipelines.inference: the RunInference handler that reads its own pixels from the image store."""

from __future__ import annotations

import os
import platform

import numpy as np
import pytest
from PIL import Image

from features import HeapTrim, get_extractor
from features.cpu_heap import MALLOC_TUNING_ENV
from pipelines.image_store import ImageStore
from pipelines.inference import ExtractorModelHandler, model_handler, stored_image_handler


def _stored_images(tmp_path, n: int) -> tuple[ImageStore, list[str], list[Image.Image]]:
    rng = np.random.default_rng(3)
    store = ImageStore(str(tmp_path / "store"))
    ids, images = [], []
    for i in range(n):
        img = Image.fromarray(rng.integers(0, 256, (40 + 11 * i, 90 - 5 * i, 3), dtype=np.uint8))
        path = tmp_path / f"im{i}.png"
        img.save(path)
        ids.append(store.load(str(path)).content_id)
        images.append(img)
    return store, ids, images


def test_a_batch_of_ids_gives_each_image_its_features_and_original_size(tmp_path):
    """Ids in, (id, (width, height)) and the raw output per image out, equal to extracting each
    image alone: region boxes come back in the original pixels of an image the batch read itself."""
    store, ids, images = _stored_images(tmp_path, 5)
    ext = get_extractor("grid-lite0", grid=3)
    handler = stored_image_handler(ext, store.root, "cpu", batch_size=4)
    model = handler.load_model()
    results = handler.run_inference(ids, model)
    assert [r.example for r in results] == [(cid, img.size) for cid, img in zip(ids, images, strict=True)]
    for r, img in zip(results, images, strict=True):
        got = ext.postprocess(r.inference, r.example[1])
        want = ext.extract([img], model=model)[0]
        np.testing.assert_array_equal(got.regions["boxes"], want.regions["boxes"])
        np.testing.assert_array_equal(got.regions["vectors"], want.regions["vectors"])
        assert got.regions["boxes"][:, 2].max() <= img.size[0]


def test_it_batches_like_the_tensor_handler_and_sizes_batches_by_ids():
    ext = get_extractor("efficientnet-lite0")
    handler = stored_image_handler(ext, "/nowhere", batch_size=20)
    assert handler.batch_elements_kwargs() == model_handler(ext, batch_size=20).batch_elements_kwargs()
    assert handler.get_num_bytes(["ab", "cde"]) == 5


def test_an_id_the_store_lacks_fails_its_batch_with_the_reason(tmp_path):
    """RunInference's exception handling turns this into the batch's dead letters (feature_steps)."""
    store, ids, _ = _stored_images(tmp_path, 1)
    handler = stored_image_handler(get_extractor("efficientnet-lite0"), store.root, batch_size=8)
    model = handler.load_model()
    with pytest.raises(KeyError, match="is not in"):
        handler.run_inference([ids[0], "0" * 64], model)


def test_each_cpu_batch_ends_with_a_heap_trim_check(tmp_path):
    """The handler checks the heap after every batch (features.cpu_heap.HeapTrim: a feature worker
    grew ~270 KB an image without it), the stored-image handler after its pixels are freed."""
    store, ids, _ = _stored_images(tmp_path, 3)
    ext = get_extractor("efficientnet-lite0")
    for handler, batches in (
        (stored_image_handler(ext, store.root, batch_size=8), [ids[:2], ids[2:]]),
        (ExtractorModelHandler(ext, "cpu", 8), [[ext.preprocess(Image.new("RGB", (30, 20)))]] * 2),
    ):
        model = handler.load_model()
        if platform.libc_ver()[0] == "glibc" and os.environ.get(MALLOC_TUNING_ENV, "1") != "0":
            assert isinstance(handler._trim, HeapTrim)
        calls = []
        handler._trim = lambda calls=calls: calls.append(1)
        for batch in batches:
            handler.run_inference(batch, model)
        assert len(calls) == 2
