"""The extractor registry: options, weights lookup, determinism, and each built-in backbone.

DenseNet169 and Faster R-CNN weights cannot be obtained offline, so their tests load randomly
initialised torchvision models saved to temporary files (the same local-file code path real
weights take); EfficientNet-Lite0 and the grid regions use the real ImageNet weights.
"""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from skimage import data

import features as F
from features import EXTRACTORS, ImageFeatures, get_extractor
from features.base import WEIGHTS_DIR_ENV
from pipelines.inference import model_handler
from schemas.errors import MmlinksError

CAT_NAMES = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}  # ImageNet 281-285


@pytest.fixture(scope="module")
def chelsea() -> Image.Image:
    return Image.fromarray(data.chelsea())


def _noise_images(n: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (40 + 13 * i, 90 - 4 * i, 3), dtype=np.uint8)) for i in range(n)
    ]


# --------------------------------------------------------------------------- registry and options


def test_registry_lists_the_builtins_with_their_kinds():
    kinds = {name: cls.kind for name, cls in EXTRACTORS.items()}
    assert kinds == {
        "efficientnet-lite0": "global",
        "densenet169": "global",
        "fasterrcnn-r50-fpn": "regions",
        "grid-lite0": "regions",
        "clip-vit-b32": "global",
    }
    assert F.extractor_options(EXTRACTORS["fasterrcnn-r50-fpn"]) == [
        "weights",
        "num_regions",
        "box_score_thresh",
        "box_nms_thresh",
        "min_size",
        "max_size",
        "precision",
    ]


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "resnet9000",
            {},
            "unknown feature extractor 'resnet9000'; known: clip-vit-b32, densenet169, efficientnet-lite0",
        ),
        ("grid-lite0", {"num_regions": 4}, "has no option num_regions; options: weights, grid, precision"),
        ("grid-lite0", {"grid": 0}, "option grid must be an integer >= 1"),
        ("grid-lite0", {"grid": 9}, "option grid must be <= 7"),
        ("efficientnet-lite0", {"precision": "bfloat16"}, "precision must be one of float32, float16"),
        (
            "efficientnet-lite0",
            {"weights": "/nonexistent/w.pth"},
            "weights file /nonexistent/w.pth does not exist",
        ),
    ],
)
def test_bad_names_and_options_give_one_line_errors(name, options, message):
    with pytest.raises(MmlinksError) as info:
        get_extractor(name, **options)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_options_from_the_command_line_may_be_strings():
    ext = get_extractor("grid-lite0", grid="4", precision="float16")
    assert ext.grid == 4 and ext.options == {"precision": "float16", "grid": 4}


def test_missing_weights_say_where_they_were_looked_for(tmp_path, monkeypatch):
    monkeypatch.setenv(WEIGHTS_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    with pytest.raises(MmlinksError) as info:
        get_extractor("densenet169")
    msg = str(info.value)
    assert str(tmp_path / "densenet169.pth") in msg
    assert str(tmp_path / "th" / "hub" / "checkpoints" / "densenet169-b2777c0a.pth") in msg
    assert "weights=PATH" in msg and "\n" not in msg


def test_cuda_request_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(MmlinksError, match="CUDA is not available"):
        model_handler(get_extractor("efficientnet-lite0"), device="cuda")


def test_cpu_malloc_tuning_can_be_turned_off_and_then_nothing_is_trimmed(monkeypatch):
    monkeypatch.setenv(F.cpu_heap.MALLOC_TUNING_ENV, "0")
    assert F.tune_cpu_malloc() is False
    assert F.tune_cpu_heap() is None  # untuned: malloc gives back by itself
    assert F.HeapTrim(slack=0, rss=lambda: 1 << 40)() is False  # and a HeapTrim never trims
    monkeypatch.delenv(F.cpu_heap.MALLOC_TUNING_ENV)
    if platform.libc_ver()[0] == "glibc":
        assert F.tune_cpu_malloc() is True
        heap = F.tune_cpu_heap(slack=123)
        assert isinstance(heap, F.HeapTrim) and heap.slack == 123
        assert F.tune_cpu_heap(slack=None) is None  # never trim


@settings(max_examples=200, deadline=None)
@given(
    slack=st.integers(1, 50),
    steps=st.lists(st.tuples(st.integers(-30, 60), st.integers(0, 40)), max_size=40),
)
def test_the_heap_is_trimmed_exactly_when_rss_grew_by_the_slack_since_the_last_trim(slack, steps):
    """HeapTrim against a plain oracle: each step the process grows by ``delta`` and a trim
    gives back ``freed`` (never below what it started with); a trim happens exactly when RSS is
    ``slack`` or more above the lowest RSS seen since the last trim (or the start)."""
    rss, gives = [1000], [0]
    trims: list[int] = []

    def trim(_pad: int) -> None:
        trims.append(rss[0])
        rss[0] = max(1000, rss[0] - gives[0])

    heap = F.HeapTrim(slack=slack, rss=lambda: rss[0], trim=trim)
    floor, want = None, 0
    for delta, freed in steps:
        rss[0], gives[0] = max(0, rss[0] + delta), freed
        before = rss[0]
        trimmed = heap()
        due = floor is not None and before >= floor and before - floor >= slack
        assert trimmed is due
        if due:
            want += 1
            floor = rss[0]
        elif floor is None or before < floor:
            floor = before
    assert heap.trims == len(trims) == want


def test_a_zero_slack_trims_after_every_batch_the_first_included():
    trims = []
    heap = F.HeapTrim(slack=0, rss=lambda: 100, trim=trims.append)
    assert [heap() for _ in range(3)] == [True, True, True]
    assert heap.trims == len(trims) == 3


TRIM_CHILD = """
import ctypes, json
import psutil
from features.cpu_heap import HeapTrim, tune_cpu_malloc
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
assert tune_cpu_malloc()  # as a feature worker: freed buffers stay in the heap
rss = lambda: psutil.Process().memory_info().rss >> 20
heap = HeapTrim(slack=64 << 20)
heap()
start = rss()
blocks = []
for i in range(3000):  # 64-128 KB buffers, as decode and resize leave them
    p = libc.malloc(65536 + 16 * (i % 4096))
    ctypes.memset(p, 1, 65536)
    blocks.append(p)
for i, p in enumerate(blocks):
    if i % 100:  # every 100th stays: the heap cannot shrink from its top
        libc.free(p)
grown = rss()
trimmed = heap()
print(json.dumps({"start": start, "grown": grown, "after": rss(), "trimmed": trimmed}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_a_trim_gives_the_heaps_free_pages_back_to_the_os():
    """With tune_cpu_malloc's thresholds, ~190 MiB of freed buffers stay resident; HeapTrim gives
    them back once the process is its slack above where it started (a fresh process: pytest's
    own heap is not this test's)."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", TRIM_CHILD], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["grown"] - got["start"] > 150, got  # freed, but still resident
    assert got["trimmed"] is True
    assert got["after"] - got["start"] < 40, got


def test_a_new_backbone_is_one_small_registered_class(monkeypatch):
    monkeypatch.setattr(F.base, "EXTRACTORS", dict(EXTRACTORS))

    @F.register
    class MeanColour(F.GlobalExtractor):
        name = "mean-colour"
        version = "none"
        dim = 3

        def __init__(self, *, scale: float = 1.0, precision: str = "float32"):
            super().__init__(precision=precision)
            self.scale = scale

        def preprocess(self, img):
            return torch.from_numpy(
                np.asarray(img.convert("RGB"), dtype=np.float32).transpose(2, 0, 1).copy()
            )

        def load_model(self, device="cpu"):
            return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).eval()

    ext = F.base.get_extractor("mean-colour", scale=2.0)
    img = Image.new("RGB", (20, 10), (10, 20, 30))
    (feats,) = ext.extract([img])
    assert isinstance(feats, ImageFeatures) and feats.regions is None
    assert feats.features.tolist() == [10.0, 20.0, 30.0]
    with pytest.raises(MmlinksError, match="has no option size; options: scale, precision"):
        F.base.get_extractor("mean-colour", size=3)


# --------------------------------------------------------------------------- efficientnet-lite0


@pytest.fixture(scope="module")
def lite0():
    ext = get_extractor("efficientnet-lite0")
    return ext, ext.load_model()


def test_lite0_features_are_the_pooled_backbone_outputs(lite0, chelsea):
    from features import efficientnet_lite as lite
    from features import fixed_chunk_forward
    from features.efficientnet_lite import EfficientNetLite0Features, load_pretrained
    from features.images import to_model_input

    ext, model = lite0
    assert (ext.name, ext.version, ext.dim, ext.kind) == (
        "efficientnet-lite0",
        "imagenet-57934424",
        1280,
        "global",
    )
    x = ext.preprocess(chelsea)
    direct = to_model_input(chelsea, lite.INPUT_SIZE, lite.INPUT_MEAN, lite.INPUT_STD, 256)
    assert x.dtype == torch.float32 and np.array_equal(x.numpy(), direct)
    old = fixed_chunk_forward(load_pretrained(EfficientNetLite0Features), [x])[0]
    feats = ext.postprocess(ext.forward(model, [x])[0])
    assert feats.features.dtype == np.float32 and feats.features.shape == (1280,)
    # the extractor runs channels-last (faster on CPU): the same values up to float rounding
    np.testing.assert_allclose(feats.features, old.numpy(), rtol=1e-4, atol=1e-5)
    # the pooled vector is the classifier's input: the pretrained head calls Chelsea a cat
    probs = load_pretrained()._fc(torch.from_numpy(feats.features)).softmax(-1)
    assert float(probs[281:286].sum()) > 0.8


@pytest.mark.slow
def test_features_do_not_depend_on_the_other_images_in_the_batch(lite0):
    ext, model = lite0
    torch.manual_seed(1)
    images = list(torch.randn(13, 3, 224, 224))
    alone = ext.forward(model, images[:1])[0]
    for batch in (images[:3], images[:8], images[:13], [images[0], *images[5:12]]):
        assert torch.equal(ext.forward(model, batch)[0], alone)


def test_float16_precision(lite0, chelsea):
    ext, model = lite0
    half = get_extractor("efficientnet-lite0", precision="float16")
    raw = ext.forward(model, [ext.preprocess(chelsea)])[0]
    f16, f32 = half.postprocess(raw).features, ext.postprocess(raw).features
    assert f16.dtype == np.float16 and np.allclose(f16, f32, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_beam_handler_batches_and_results_do_not_depend_on_batching():
    """Through RunInference (batches of 8 + a short one), region boxes still come out in original
    pixels and every image's result equals extracting it alone."""
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.testing.util import assert_that, equal_to

    from pipelines.direct_runner import DirectRunner

    ext = get_extractor("grid-lite0", grid=3)
    images = dict(enumerate(_noise_images(11)))
    model = ext.load_model()

    def signature(f: ImageFeatures):
        r = f.regions
        return r["boxes"].tobytes(), r["vectors"].tobytes(), tuple(r["labels"]), r["scores"].tobytes()

    expected = [(k, signature(ext.extract([im], model=model)[0])) for k, im in images.items()]
    handler = model_handler(ext, "cpu", batch_size=8)
    assert handler.batch_elements_kwargs() == {"min_batch_size": 8, "max_batch_size": 8}
    with beam.Pipeline(runner=DirectRunner()) as p:
        out = (
            p
            | beam.Create(sorted(images))
            | beam.Map(lambda k: (k, ext.preprocess(images[k])))
            | RunInference(handler)
            | beam.MapTuple(lambda k, result: (k, signature(ext.postprocess(result.inference))))
        )
        assert_that(out, equal_to(expected))


def test_handler_batch_size_is_a_multiple_of_the_forward_chunk():
    ext = get_extractor("efficientnet-lite0")
    assert model_handler(ext, batch_size=20).batch_elements_kwargs()["max_batch_size"] == 24
    with pytest.raises(MmlinksError, match="batch_size must be an integer >= 1"):
        model_handler(ext, batch_size=0)


def test_a_gpu_forwards_bigger_fixed_chunks():
    """8 images per forward on a CPU; at least 64 on a GPU (8 leaves it idle); None for detectors."""
    ext = get_extractor("efficientnet-lite0")
    assert ext.chunk_for("cpu") == 8 and ext.chunk_for("cuda") == ext.chunk_for("cuda:1") == 64
    detector = object.__new__(EXTRACTORS["fasterrcnn-r50-fpn"])  # no weights needed to ask
    assert detector.chunk_for("cuda") is None


# --------------------------------------------------------------------------- grid-lite0


def test_grid_regions_of_the_pretrained_model_find_the_cat(chelsea):
    ext = get_extractor("grid-lite0")
    assert (ext.kind, ext.dim, ext.version) == ("regions", 1280, "imagenet-57934424")
    (feats,) = ext.extract([chelsea])
    r = feats.regions
    assert feats.features is None
    assert r["boxes"].shape == (36, 4) and r["boxes"].dtype == np.float32
    assert r["vectors"].shape == (36, 1280) and r["scores"].shape == (36,) and len(r["labels"]) == 36
    centre = [r["labels"][row * 6 + col] for row in (2, 3) for col in (2, 3)]
    assert CAT_NAMES & set(centre), centre
    assert ((r["scores"] > 0) & (r["scores"] <= 1)).all()
    # cells map back through the resize (shorter side 256) and centre crop (224) to original pixels
    w, h = chelsea.size
    rw, left = round(w * 256 / h), (round(w * 256 / h) - 224) // 2
    assert np.allclose(
        r["boxes"][0], [left * w / rw, 16 * h / 256, (left + 64) * w / rw, 64 * h / 256 + 16 * h / 256]
    )
    assert np.allclose(r["boxes"][-1, 2:], [(left + 224) * w / rw, 240 * h / 256])
    assert (r["boxes"][:, 2] > r["boxes"][:, 0]).all() and (r["boxes"][:, 3] > r["boxes"][:, 1]).all()


def test_region_postprocess_needs_the_image_size_when_the_tensor_lost_it(chelsea):
    ext = get_extractor("grid-lite0", grid=2)
    model = ext.load_model()
    raw = ext.forward(model, [ext.preprocess(chelsea).clone()])[0]  # clone drops the size tag
    with pytest.raises(MmlinksError, match="image size is unknown"):
        ext.postprocess(raw)
    assert ext.postprocess(raw, image_size=chelsea.size).regions["boxes"].shape == (4, 4)


# --------------------------------------------------------------------------- densenet169


def _old_densenet_keys(state):
    return {re.sub(r"(denselayer\d+\.(?:norm|relu|conv))([12])\.", r"\1.\2.", k): v for k, v in state.items()}


@pytest.fixture(scope="module")
def densenet_files(tmp_path_factory):
    from torchvision.models import densenet169

    torch.manual_seed(0)
    net = densenet169(weights=None).eval()
    d = tmp_path_factory.mktemp("densenet")
    torch.save(net.state_dict(), d / "new.pth")
    old = _old_densenet_keys(net.state_dict())
    assert "features.denseblock1.denselayer1.norm.1.weight" in old
    torch.save(old, d / "densenet169-b2777c0a.pth")
    return net, d


@pytest.mark.slow
def test_densenet169_gives_the_pooled_pre_classifier_features(densenet_files, chelsea):
    net, d = densenet_files
    ext = get_extractor("densenet169", weights=str(d / "new.pth"))
    assert (ext.dim, ext.kind) == (1664, "global") and re.fullmatch(r"sha256-[0-9a-f]{8}", ext.version)
    model = ext.load_model()
    images = [chelsea, *_noise_images(2)]
    x = [ext.preprocess(im) for im in images]
    assert x[0].shape == (3, 224, 224)
    feats = np.stack([ext.postprocess(r).features for r in ext.forward(model, x)])
    assert feats.shape == (3, 1664)
    with torch.no_grad():
        batch = torch.cat([torch.stack(x), torch.zeros(5, 3, 224, 224)])  # one fixed chunk of 8
        direct = torch.nn.functional.adaptive_avg_pool2d(torch.relu(net.features(batch)), 1).flatten(1)[:3]
        assert np.allclose(feats, direct.numpy(), atol=1e-5)
        assert torch.allclose(net.classifier(torch.from_numpy(feats)), net(torch.stack(x)), atol=1e-4)


def test_densenet169_release_key_names_and_lookup_by_env(densenet_files, monkeypatch):
    _, d = densenet_files
    monkeypatch.setenv(WEIGHTS_DIR_ENV, str(d))  # holds the torchvision release file name
    old = get_extractor("densenet169")
    assert old.weights_path == d / "densenet169-b2777c0a.pth"
    new = get_extractor("densenet169", weights=str(d / "new.pth"))
    assert old.version != new.version  # a different file is a different version
    a, b = old.load_model(), new.load_model()
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)


def test_weights_that_do_not_fit_are_a_clear_error(tmp_path):
    torch.save({"features.conv0.weight": torch.zeros(1)}, tmp_path / "bad.pth")
    with pytest.raises(MmlinksError, match="do not fit the model"):
        get_extractor("densenet169", weights=str(tmp_path / "bad.pth")).load_model()
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(MmlinksError, match="cannot read weights"):
        get_extractor("densenet169", weights=str(tmp_path / "junk.pth")).load_model()


# --------------------------------------------------------------------------- fasterrcnn-r50-fpn


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    from torchvision.models.detection import fasterrcnn_resnet50_fpn

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("frcnn") / "random.pth"
    torch.save(fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None).state_dict(), path)
    ext = get_extractor("fasterrcnn-r50-fpn", weights=str(path), num_regions=12, min_size=224, max_size=400)
    return ext, ext.load_model()


@pytest.mark.slow
def test_fasterrcnn_regions_match_the_detector_output(detector, chelsea):
    from features.detection import coco_categories

    ext, model = detector
    assert (ext.kind, ext.dim) == ("regions", 1024)
    x = ext.preprocess(chelsea)
    assert x.shape == (3, 224, 337) and float(x.max()) <= 1.0
    feats = ext.postprocess(ext.forward(model, [x])[0])
    r = feats.regions
    n = len(r["labels"])
    assert 0 < n <= 12
    assert r["boxes"].shape == (n, 4) and r["vectors"].shape == (n, 1024) and r["scores"].shape == (n,)
    assert r["boxes"].dtype == np.float32 and r["scores"].dtype == np.float32
    assert (np.diff(r["scores"]) <= 0).all()  # ordered by score
    w, h = chelsea.size
    assert (
        (r["boxes"] >= 0).all() and (r["boxes"][:, [0, 2]] <= w).all() and (r["boxes"][:, [1, 3]] <= h).all()
    )
    assert set(r["labels"]) <= set(coco_categories()[1:])
    # the same detections as torchvision's own forward, scaled from the model input to the original
    with torch.no_grad():
        ref = model.detector([x])[0]
    scale = np.asarray([w / x.shape[2], h / x.shape[1]] * 2, dtype=np.float64)
    assert np.allclose(r["boxes"], ref["boxes"].numpy() * scale, atol=1e-3)
    assert np.allclose(r["scores"], ref["scores"].numpy())
    assert r["labels"] == [coco_categories()[i] for i in ref["labels"]]
    # region vectors: the box head on the kept boxes
    with torch.no_grad():
        m = model.detector
        images, _ = m.transform([x])
        fmap = m.backbone(images.tensors)
        vec = m.roi_heads.box_head(m.roi_heads.box_roi_pool(fmap, [ref["boxes"]], images.image_sizes))
    assert np.allclose(r["vectors"], vec.numpy(), atol=1e-5)


def test_fasterrcnn_with_no_detections_gives_empty_regions(detector, chelsea):
    ext, model = detector
    model.detector.roi_heads.score_thresh = 1.0  # nothing passes
    try:
        r = ext.postprocess(ext.forward(model, [ext.preprocess(chelsea)])[0]).regions
    finally:
        model.detector.roi_heads.score_thresh = ext.box_score_thresh
    assert r["boxes"].shape == (0, 4) and r["vectors"].shape == (0, 1024)
    assert r["labels"] == [] and r["scores"].shape == (0,)


def test_fasterrcnn_resizes_like_the_detector_transform():
    from features.detection import detector_input_size

    assert detector_input_size(640, 480, 800, 1333) == (1067, 800)
    assert detector_input_size(480, 640, 800, 1333) == (800, 1067)
    assert detector_input_size(3000, 1000, 800, 1333) == (1333, 444)
    assert detector_input_size(800, 800, 800, 1333) == (800, 800)


def test_the_registry_module_names_every_builtin_once():
    from features import registry

    assert sorted(registry.BUILTIN_EXTRACTORS) == sorted(EXTRACTORS)
    assert registry.global_extractor_names() == ["efficientnet-lite0", "densenet169", "clip-vit-b32"]
    assert registry.region_extractor_names() == ["fasterrcnn-r50-fpn", "grid-lite0"]
    for name, spec in registry.BUILTIN_EXTRACTORS.items():
        cls = EXTRACTORS[name]
        assert (cls.__name__, cls.kind, cls.__module__) == (spec.class_name, spec.kind, spec.module)
    assert get_extractor("efficientnet-lite0").dim == registry.LITE0.dim
    assert get_extractor("grid-lite0").dim == registry.GRID_LITE0.dim
