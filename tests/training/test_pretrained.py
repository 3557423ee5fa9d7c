"""Pretrained text towers (issue #20): the real all-MiniLM-L6-v2 weights as the text side of the
``minilm`` backbone, under every objective and tuning mode, and one Ray Train run end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from schemas.shards import read_table
from tests.conftest import tracking_uri
from training.backbone import build_model, get_backbone
from training.config import TrainConfig
from training.data import TRAINING_COLUMNS, make_batch
from training.epoch_batches import drop_empty
from training.objectives.registry import objective_loss
from training.text import Vocabulary

# SentenceTransformer(<the package's folder>).encode(SENTENCES)[:, :6] (sentence-transformers
# 6.2.0), computed once: MiniLMTower must give the library's embeddings, not just unit vectors.
SENTENCES = ["A man is eating food.", "The big blue square sits on a red star, next to a tiny dog!"]
REFERENCE = np.array(
    [
        [0.033242, 0.004406, -0.006277, 0.048379, -0.138702, -0.033617],
        [0.053376, 0.018623, 0.042431, 0.114023, -0.052966, 0.012315],
    ]
)


@pytest.fixture(scope="module")
def train_batch(dataset):
    manifest = Manifest.read(dataset)
    table, _ = drop_empty(read_table(manifest.shard_paths(dataset, "train"), columns=TRAINING_COLUMNS))
    table = table.sort_by("doc_id").slice(0, 6)
    vocab = Vocabulary.build([s for doc in table.column("sentences").to_pylist() for s in doc], 1)
    return manifest, table, vocab


def _config(dataset, **kw) -> TrainConfig:
    return TrainConfig(data=str(dataset), backbone="minilm", d_multi=16, batch_docs=6, lr=1e-2, **kw)


def _model(dataset, manifest, cfg: TrainConfig, stats=None):
    paths = manifest.shard_paths(dataset, "train")
    model_cfg = get_backbone(cfg.backbone).model_config(cfg, manifest, 0, 0, paths)
    return build_model(model_cfg, None, stats), model_cfg


@pytest.fixture(scope="module")
def tower():
    from training.link.towers import MiniLMTower

    return MiniLMTower().eval()


def test_the_minilm_tower_gives_all_minilm_l6_v2s_embeddings(tower):
    with torch.no_grad():
        out = tower(SENTENCES).numpy()
    np.testing.assert_allclose(out[:, :6], REFERENCE, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert out.shape == (2, 384)


@pytest.mark.parametrize("objective", ["ap", "dc", "tk", "nostruct", "li2021"])
def test_every_objective_trains_the_heads_on_a_frozen_minilm(dataset, train_batch, objective):
    manifest, table, vocab = train_batch
    cfg = _config(dataset, objective=objective, objectives="C+I+D" if objective == "li2021" else "C")
    model, _ = _model(dataset, manifest, cfg)
    spec_prepare = {"nostruct": True}.get(objective, False)
    opt = torch.optim.Adam([g for g in model.param_groups(cfg.lr)], lr=cfg.lr)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(8):
        rng = np.random.default_rng(0)  # the same batch each step: the loss must go down
        t = table
        if spec_prepare:
            from training.data import one_pair_per_document

            t = one_pair_per_document(table, None)
        batch = make_batch(t, vocab, 20, rng)
        gen.manual_seed(0)
        loss, _ = objective_loss(model.eval(), batch, cfg, gen)  # eval: no dropout noise
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        assert model.text_head.weight.grad is not None and model.image.proj.weight.grad is not None
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    # the frozen encoder is not in the module: no gradient, no state_dict entry, vectors cached
    assert not any(k.startswith("encoder") or "bert" in k for k in model.state_dict())
    assert len(model._cache) >= 1


def test_frozen_uses_the_encoders_space_and_last_blocks_trains_the_last_blocks_slower(dataset, train_batch):
    manifest, table, vocab = train_batch
    frozen, cfg_f = _model(dataset, manifest, _config(dataset, tower_tuning="frozen"))
    assert frozen.text_head is None and cfg_f["d_multi"] == 384
    s, v = frozen(make_batch(table, vocab, 20))
    assert s.shape[1] == v.shape[1] == 384

    cfg = _config(dataset, tower_tuning="last-blocks", unfreeze_blocks=1, encoder_lr_scale=0.05)
    model, model_cfg = _model(dataset, manifest, cfg)
    layers = model.encoder.blocks()
    assert all(p.requires_grad for p in layers[-1].parameters())
    assert not any(p.requires_grad for layer in layers[:-1] for p in layer.parameters())
    groups = model.param_groups(1e-3)
    assert [g["lr"] for g in groups] == [1e-3, pytest.approx(5e-5)]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in layers[-1].parameters()}
    # a trained encoder travels in the checkpoint: a rebuilt model gives the same vectors
    with torch.no_grad():
        layers[-1].output.dense.bias.add_(0.5)
        before = model.eval()(make_batch(table, vocab, 20))[0]
        again = build_model(model_cfg)
        again.load_state_dict(model.state_dict())
        after = again.eval()(make_batch(table, vocab, 20))[0]
    torch.testing.assert_close(before, after)


def test_a_model_trained_on_other_minilm_weights_is_refused(dataset, train_batch):
    manifest, _, _ = train_batch
    _, model_cfg = _model(dataset, manifest, _config(dataset))
    with pytest.raises(MmlinksError, match="trained on the minilm weights all-MiniLM-L6-v2-deadbeef"):
        build_model({**model_cfg, "tower_version": "all-MiniLM-L6-v2-deadbeef"})


@pytest.mark.slow  # a Ray Train run with the 90 MB encoder: ~1 min on a quiet machine, 220 s at load 20+
def test_minilm_trains_with_ray_and_serves_through_the_packaged_model(dataset, ray_local, tmp_path):
    """The real weights end to end: Ray Train (1 epoch) -> checkpoint -> MLflow pyfunc -> predict."""
    import mlflow
    import pandas as pd

    from models.packaging import log_link_model
    from tests.conftest import small_train_config
    from training.driver import fit

    cfg = small_train_config(dataset, tmp_path / "ray", backbone="minilm", epochs=1, word_vectors="random")
    result = fit(cfg)
    assert result.history and np.isfinite(result.history[0]["val_loss"])
    mlflow.set_tracking_uri(tracking_uri(tmp_path))
    try:
        mlflow.set_experiment("minilm-tests")  # not an id left active by an earlier test's store
        with mlflow.start_run():
            uri = log_link_model(result.checkpoint_path, result.vocab)
        served = mlflow.pyfunc.load_model(uri)
    finally:
        mlflow.set_tracking_uri(None)
    feats = np.random.default_rng(0).random((2, 1280)).tolist()
    out = served.predict(pd.DataFrame([{"sentences": SENTENCES, "image_features": feats}]))
    scores = np.asarray(out["scores"][0])
    assert scores.shape == (2, 2) and np.isfinite(scores).all() and np.abs(scores).max() <= 1 + 1e-6
