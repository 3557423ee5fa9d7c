"""Raw images in serving requests (issue #20): the packaged model runs the extractor it recorded,
configured as the dataset build was (here a tiny CLIP architecture, not the default ViT-B-32),
from the training-time file or the weights lookup, and refuses in one line what it cannot run."""

from __future__ import annotations

import base64
import io
import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.exceptions import MlflowException
from PIL import Image

from features import get_extractor
from models.packaging import served_extractor
from tests.features.test_clip import TINY, save_tiny_clip

CLIP = "clip-vit-b32"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    weights = save_tiny_clip(tmp_path_factory.mktemp("served-clip") / "tiny.pt")
    return weights, get_extractor(CLIP, weights=str(weights), model=TINY).version


@pytest.fixture
def no_weights(tmp_path, monkeypatch):
    """No weight file anywhere the lookup searches (an empty weights dir and torch cache)."""
    monkeypatch.setenv("MMLINKS_WEIGHTS_DIR", str(tmp_path / "weights"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    (tmp_path / "weights").mkdir()
    return tmp_path / "weights"


def _png(seed: int) -> str:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray((rng.random((36, 44, 3)) * 255).astype("uint8")).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_the_recorded_architecture_and_file_are_found_or_refused_in_one_line(tiny, no_weights):
    weights, version = tiny
    ext = served_extractor(CLIP, version, {"model": TINY}, str(weights))
    assert (ext.version, ext.dim, ext.model_name) == (version, 16, "mmlinks-tiny-clip")
    # the training machine's file is gone; the weights dir has the same file
    with pytest.raises(MlflowException, match="cannot load") as err:
        served_extractor(CLIP, version, {"model": TINY}, "/nowhere/tiny.pt")
    assert "send image_features" in str(err.value) and "\n" not in str(err.value)
    shutil.copy(weights, no_weights / "clip-vit-b32.pt")
    assert served_extractor(CLIP, version, {"model": TINY}, "/nowhere/tiny.pt").version == version
    # other weights under the same name give other features: refused, naming both versions
    save_tiny_clip(no_weights / "clip-vit-b32.pt", seed=1)
    with pytest.raises(
        MlflowException, match=f"trained on {CLIP}@{version} features, but this server has {CLIP}@"
    ):
        served_extractor(CLIP, version, {"model": TINY}, None)
    # the default architecture (ViT-B-32) cannot read the tiny file: not served as if it could
    with pytest.raises(MlflowException, match="ViT-B-32-sha256-"):
        served_extractor(CLIP, version, {}, str(weights))


def test_other_extractors_without_their_weights_are_refused(no_weights):
    with pytest.raises(
        MlflowException, match="densenet169@densenet169-x, which this server cannot load"
    ) as err:
        served_extractor("densenet169", "densenet169-x", {}, None)
    assert "no weights found" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(MlflowException, match="unknown feature extractor"):
        served_extractor("resnet-9000", "v1", {}, None)
    with pytest.raises(MlflowException, match="not its version"):
        served_extractor(CLIP, None, {"model": TINY}, None)


def test_the_packaged_model_scores_raw_images_through_its_recorded_extractor(tiny, tmp_path, no_weights):
    """A model trained on tiny-CLIP features (a GRU over 16-d features) with the extractor record
    ``log_link_model`` writes: raw images give exactly the scores of their features. (The pyfunc
    class is loaded from its artifacts as MLflow does; test_clip_towers.py goes through MLflow.)"""
    from types import SimpleNamespace

    from models import integrity
    from models.packaging import LinkModel
    from training.backbone import build_model
    from training.text import Vocabulary

    weights, version = tiny
    sentences = ["a red square", "the blue star"]
    vocab = Vocabulary.build(sentences, min_count=1)
    cfg = {"vocab_size": len(vocab), "word_dim": 8, "image_dim": 16, "d_multi": 8}
    torch.manual_seed(0)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    state = {"model": build_model(cfg).state_dict(), "epoch": 0, "val_loss": 0.0, "best_epoch": 0}
    torch.save(state, ckpt / "state.pt")
    (ckpt / "meta.json").write_text(json.dumps({"model": cfg, "train": {"max_tokens": 20}}))
    vocab.save(tmp_path / "vocab.json")
    record = {"name": CLIP, "version": version, "options": {"model": TINY}, "weights": str(weights)}
    (tmp_path / "extractor.json").write_text(json.dumps(record))
    served = LinkModel()
    artifacts = {
        k: str(tmp_path / f)
        for k, f in [("checkpoint", "ckpt"), ("vocab", "vocab.json"), ("extractor", "extractor.json")]
    }
    logged = SimpleNamespace(
        artifacts=artifacts, model_config=integrity.model_config(artifacts)
    )  # as log_model
    served.load_context(logged)
    images = [_png(0), _png(1)]
    ext = get_extractor(CLIP, weights=str(weights), model=TINY)
    feats = [ext.extract([Image.open(io.BytesIO(base64.b64decode(b)))])[0].features.tolist() for b in images]
    by_images = served.predict(None, pd.DataFrame([{"sentences": sentences, "images": images}]))
    by_features = served.predict(None, pd.DataFrame([{"sentences": sentences, "image_features": feats}]))
    np.testing.assert_allclose(by_images["scores"][0], by_features["scores"][0], atol=1e-5)
    # the file moved away and none in the lookup: a one-line refusal, features still served
    (tmp_path / "extractor.json").write_text(json.dumps({**record, "weights": "/nowhere/tiny.pt"}))
    again = LinkModel()
    again.load_context(SimpleNamespace(artifacts=artifacts, model_config=integrity.model_config(artifacts)))
    with pytest.raises(MlflowException, match="cannot load"):
        again.predict(None, pd.DataFrame([{"sentences": sentences, "images": images}]))
    assert len(again.predict(None, pd.DataFrame([{"sentences": sentences, "image_features": feats}]))) == 1


def test_the_link_jobs_build_options_rebuild_the_recorded_extractor(tiny, no_weights):
    """`mmlinks link --input` featurises raw documents through a Beam build: its extractor
    options are the recorded architecture plus the file that matched, not the defaults."""
    from models.packaging import served_extractor_options

    weights, version = tiny
    opts = served_extractor_options(CLIP, version, {"model": TINY}, str(weights))
    assert opts == {"model": TINY, "weights": str(weights)}
    rebuilt = get_extractor(CLIP, **opts)
    assert (rebuilt.version, rebuilt.dim) == (version, 16)
    shutil.copy(weights, no_weights / "clip-vit-b32.pt")  # the training file gone, the lookup has it
    assert served_extractor_options(CLIP, version, {"model": TINY}, "/nowhere/tiny.pt") == {"model": TINY}
    with pytest.raises(MlflowException, match="not its version"):
        served_extractor_options(CLIP, None, {"model": TINY}, str(weights))
