"""CMCA, CMCM and CMCM_c learn (issue #34): on a small built synthetic coherence corpus, trained
through the real training loop (``training.driver.fit``, ``--workers 0``: the loop in this
process, the same run as one Ray worker's), test MedR and R@10 beat chance by a clear margin.

Chance in a pool of P candidates: MedR (P + 1) / 2, R@10 100 * 10 / P. The bars below (text ->
image MedR at most a quarter of the pool, R@10 at least 2.5x chance; image -> text MedR at most
a third) are out of an untrained model's reach (asserted too, so the bar is not one any model
passes); these runs (seed 0) reach about MedR P / 5 and R@10 3-4x chance."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import shared_dir

# a small corpus: 400 pairs -> ~240 train, ~40 val, ~120 test (one pool of every test pair)
PAIRS = 400


@pytest.fixture(scope="module")
def coherence_dataset(tmp_path_factory) -> Path:
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.coherence_corpus import CoherenceSynthConfig, write_coherence_corpus

    def make(root: Path) -> None:
        write_coherence_corpus(root / "raw", CoherenceSynthConfig(pairs=PAIRS, image_size=64, seed=1))
        build_dataset(
            BuildConfig(
                source="synthetic",
                input=str(root / "raw"),
                out=str(root / "ds"),
                split_ratios={"train": 0.6, "val": 0.1, "test": 0.3},
            )
        )

    return shared_dir(tmp_path_factory, "coherence-learns", make) / "ds"


def learn_config(data: Path, objective: str, storage: Path, **kw):
    from training.config import TrainConfig

    base = dict(
        data=str(data),
        objective=objective,
        epochs=10,
        d_shared=64,
        batch_docs=16,
        lr=3e-3,
        min_word_count=1,
        word_vectors="random",
        num_workers=0,
        storage_path=str(storage),
        n_pools=1,
        seed=0,
    )
    if objective == "cmcm-c":
        base["relation"] = "Action"
    base.update(kw)
    return TrainConfig(**base)


def test_metrics(net, data: Path, cfg, vocab) -> dict:
    """Text -> image MedR / R@10 of ``net`` on the test split (one pool of every test pair)."""
    from schemas.manifest import Manifest
    from training.data import make_batch
    from training.epoch_batches import validation_batches
    from training.retrieval.objective import evaluate_pairs

    manifest = Manifest.read(data)
    paths = [str(p) for p in manifest.shard_paths(data, "test")]
    batches = [
        make_batch(t, vocab, cfg.max_tokens) for t in validation_batches(paths, 16, 0, 1, ("metadata",))
    ]
    return evaluate_pairs(net, batches, cfg, list(manifest.relations or []))


test_metrics.__test__ = False  # a helper, not a test


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["cmca", "cmcm", "cmcm-c"])
def test_retrieval_objective_learns(objective, coherence_dataset, tmp_path):
    import torch

    from training.driver import fit
    from training.retrieval.objective import build

    cfg = learn_config(coherence_dataset, objective, tmp_path / "ray")
    res = fit(cfg)
    out = test_metrics(res.model, coherence_dataset, cfg, res.vocab)
    pool = out["t2i"]["pool_size"]
    chance_medr, chance_r10 = (pool + 1) / 2, 100 * 10 / pool
    print(objective, "pool", pool, "MedR", out["t2i"]["medr"], "R@10", out["t2i"]["r10"])
    assert pool == out["pairs"] >= 100
    assert out["t2i"]["medr"] <= pool / 4, out["t2i"]  # chance: pool / 2
    assert out["t2i"]["r10"] >= 2.5 * chance_r10, out["t2i"]
    assert out["i2t"]["medr"] <= pool / 3, out["i2t"]
    # the same bars are out of reach untrained (so they measure learning, not the corpus)
    torch.manual_seed(0)
    fresh = build(res.model_config).eval()
    before = test_metrics(fresh, coherence_dataset, cfg, res.vocab)["t2i"]
    assert before["medr"] > pool / 4 and before["r10"] < 2.5 * chance_r10, before
    assert abs(before["medr"] - chance_medr) < pool / 4
    if objective != "cmca":  # the CAM learned its relation (the corpus's state is in the image)
        ap = out["relation_ap"]["Action"]
        assert ap > 0.8, out["relation_ap"]
