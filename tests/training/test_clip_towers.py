"""CLIP through the whole path (issue #20) with a random tiny CLIP weight file: a Beam build with
the clip-vit-b32 extractor (RunInference), ``mmlinks baseline --method clip-zero-shot``, and the
``clip`` backbone, which starts exactly at zero-shot CLIP, trains under AP, and goes through Ray
Train, MLflow registration and the packaged pyfunc (raw images through the recorded extractor)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.shards import read_table
from tests.features.test_clip import TINY, save_tiny_clip
from training.backbone import build_model, get_backbone
from training.config import TrainConfig
from training.data import TRAINING_COLUMNS, make_batch
from training.epoch_batches import drop_empty
from training.text import Vocabulary

# a Beam build of its own (~30 s on a quiet machine) and one 1-epoch Ray Train run + registration
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def clip_data(corpus, tmp_path_factory):
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig

    root = tmp_path_factory.mktemp("clip-data")
    weights = save_tiny_clip(root / "tiny-clip.pt")
    out = root / "ds"
    build_dataset(
        BuildConfig(
            source="synthetic",
            input=str(corpus),
            out=str(out),
            split_ratios={"train": 0.6, "val": 0.2, "test": 0.2},
            extractor="clip-vit-b32",
            extractor_options={"weights": str(weights), "model": TINY},
        )
    )
    return out, weights


def _table(data, split):
    m = Manifest.read(data)
    return drop_empty(read_table(m.shard_paths(data, split), columns=TRAINING_COLUMNS).sort_by("doc_id"))[0]


def test_the_build_records_clip_and_zero_shot_scores_it(clip_data, tmp_path, capfd):
    from cli.main import main

    data, weights = clip_data
    fe = Manifest.read(data).feature_extractor
    assert (fe.name, fe.dim) == ("clip-vit-b32", 16) and fe.version.startswith("mmlinks-tiny-clip-")
    args = ["baseline", "--data", str(data), "--method", "clip-zero-shot", "--weights", str(weights)]
    assert main([*args, "--clip-model", TINY, "--workdir", str(tmp_path), "--json"]) == 0
    out = json.loads(capfd.readouterr().out)
    assert out["method"] == "clip-zero-shot" and out["n_docs"] > 0 and 0 <= out["auc"] <= 100
    assert out["links"]["predicted"] > 0  # one-to-one assignment per document
    other = save_tiny_clip(tmp_path / "other.pt", seed=1)
    from training.link.zero_shot import clip_zero_shot_baseline

    with pytest.raises(MmlinksError, match="pass the weight file"):
        clip_zero_shot_baseline(data, "test", str(other), TINY)


def test_the_clip_backbone_starts_at_zero_shot_and_trains_under_ap(clip_data):
    from training.data import link_scores
    from training.link.zero_shot import clip_text_tower, zero_shot_scores
    from training.objectives.registry import objective_loss

    data, weights = clip_data
    manifest = Manifest.read(data)
    cfg = TrainConfig(data=str(data), backbone="clip", clip_weights=str(weights), clip_model=TINY, lr=1e-2)
    model_cfg = get_backbone("clip").model_config(cfg, manifest, 0, 0, manifest.shard_paths(data, "train"))
    model = build_model(model_cfg).eval()
    test = _table(data, "test")
    vocab = Vocabulary.build([], 1)
    zero_shot = zero_shot_scores(test, clip_text_tower(manifest, str(weights), TINY))
    for ours, (_, theirs, _) in zip(link_scores(model, make_batch(test, vocab, 20)), zero_shot, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
    opt = torch.optim.Adam(model.param_groups(cfg.lr), lr=cfg.lr)
    batch = make_batch(_table(data, "train").slice(0, 6), vocab, 20, np.random.default_rng(0))
    loss, _ = objective_loss(model.train(), batch, cfg, torch.Generator().manual_seed(0))
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and model.text_head.weight.grad is not None
    # a dataset built from other CLIP weights cannot train this text tower
    with pytest.raises(MmlinksError, match="same CLIP"):
        other = TrainConfig(
            data=str(data),
            backbone="clip",
            clip_weights=str(save_tiny_clip(weights.parent / "o.pt", 2)),
            clip_model=TINY,
        )
        get_backbone("clip").model_config(other, manifest, 0, 0, [])


def test_the_clip_backbone_trains_with_ray_registers_and_serves_raw_images(
    clip_data, corpus, ray_local, tmp_path
):
    """build (above) -> Ray Train (1 epoch) -> evaluate -> MLflow registration -> the packaged
    pyfunc, which scores raw images through the recorded tiny-CLIP extractor exactly as it
    scores their features."""
    import base64

    import mlflow
    import pandas as pd

    from features import get_extractor
    from features.images import decode
    from models.experiment import run_experiment
    from tests.conftest import small_train_config

    data, weights = clip_data
    cfg = small_train_config(
        data,
        tmp_path / "ray",
        backbone="clip",
        clip_weights=str(weights),
        clip_model=TINY,
        epochs=1,
        word_vectors="random",
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = run_experiment(cfg, uri, model_name="clip-towers", alias="candidate")
    assert res.model_version is not None and 0 <= res.test["auc"] <= 100
    mlflow.set_tracking_uri(uri)
    try:
        served = mlflow.pyfunc.load_model(res.model_uri)
    finally:
        mlflow.set_tracking_uri(None)
    pngs = sorted(p for p in corpus.rglob("*.png") if "bad" not in p.parts)[:2]
    images = [base64.b64encode(p.read_bytes()).decode() for p in pngs]
    ext = get_extractor("clip-vit-b32", weights=str(weights), model=TINY)
    feats = [f.features.tolist() for f in ext.extract([decode(p.read_bytes()) for p in pngs])]
    sentences = ["a red square above a star", "a small blue circle"]
    by_images = served.predict(pd.DataFrame([{"sentences": sentences, "images": images}]))
    by_features = served.predict(pd.DataFrame([{"sentences": sentences, "image_features": feats}]))
    assert np.asarray(by_images["scores"][0]).shape == (2, 2)
    np.testing.assert_allclose(by_images["scores"][0], by_features["scores"][0], atol=1e-5)
