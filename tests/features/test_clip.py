"""The CLIP extractor (issue #20) with a randomly initialised weight file of a tiny open_clip
architecture (tests/fixtures/mmlinks-tiny-clip.json): CLIP weights are not obtainable offline,
the loading code is the real one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from features import get_extractor
from schemas.errors import MmlinksError

TINY = str(Path(__file__).parents[1] / "fixtures" / "mmlinks-tiny-clip.json")


def save_tiny_clip(path: Path, seed: int = 0) -> Path:
    """A random tiny CLIP saved as an open_clip state dict (what a release .bin holds)."""
    import open_clip

    from features.clip import clip_model_name

    torch.manual_seed(seed)
    net = open_clip.create_model(clip_model_name(TINY), pretrained=None)
    torch.save(net.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory) -> Path:
    return save_tiny_clip(tmp_path_factory.mktemp("clip") / "tiny-clip.pt")


def _images(n: int = 3) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray((rng.random((40 + 7 * i, 50, 3)) * 255).astype("uint8")) for i in range(n)]


def test_clip_features_come_from_the_weight_file_and_name_it(tiny_weights, tmp_path):
    import open_clip

    from features.clip import load_clip

    ext = get_extractor("clip-vit-b32", weights=str(tiny_weights), model=TINY)
    assert ext.dim == 16 and ext.options["model"] == "mmlinks-tiny-clip"
    assert ext.version.startswith("mmlinks-tiny-clip-sha256-")
    feats = np.stack([f.features for f in ext.extract(_images())])
    assert feats.shape == (3, 16) and np.isfinite(feats).all()
    # exactly CLIP's encode_image on open_clip's own preprocessing
    clip = load_clip(TINY, tiny_weights)
    pre = open_clip.image_transform(32, is_train=False)
    with torch.no_grad():
        ref = clip.encode_image(torch.stack([pre(im) for im in _images()])).numpy()
    np.testing.assert_allclose(feats, ref, atol=1e-5)
    # other weights, another version and other features
    other = get_extractor("clip-vit-b32", weights=str(save_tiny_clip(tmp_path / "o.pt", seed=1)), model=TINY)
    assert other.version != ext.version
    assert not np.allclose(np.stack([f.features for f in other.extract(_images(1))]), feats[:1])


def test_a_file_that_is_not_this_clip_is_refused_in_one_line(tiny_weights, tmp_path):
    state = torch.load(tiny_weights, weights_only=True)
    state.pop("text_projection")
    torch.save(state, tmp_path / "partial.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    for name in ("partial.pt", "junk.pt"):
        ext = get_extractor("clip-vit-b32", weights=str(tmp_path / name), model=TINY)
        with pytest.raises(MmlinksError, match="do not load") as err:
            ext.load_model()
        assert "\n" not in str(err.value)
    with pytest.raises(MmlinksError, match="does not exist"):
        get_extractor("clip-vit-b32", weights=str(tmp_path / "absent.pt"), model=TINY)
    with pytest.raises(MmlinksError, match="unknown CLIP architecture"):
        get_extractor("clip-vit-b32", weights=str(tiny_weights), model="ViT-Q-99")
