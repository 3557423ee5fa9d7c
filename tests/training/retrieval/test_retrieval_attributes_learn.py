"""CMCA learns the weak attribute (issue #45): on a small built graded-salience corpus (a small
handwritten digit in one of 4 inks on one of 3 backdrops; `synth-coherence --salience graded`),
trained through the real training loop (``training.driver.fit``, ``--workers 0``) with the
objective's defaults at the retrieval demo's rate and batch, shortened), the top 5 images of the
texts that name the digit show that digit 2.75x as often as chance, not only the ink and backdrop
that dominate the features (docs/benchmarks.md, "Coherence retrieval: fine-grained attributes").
With GloVe's starting vectors, the default before, it fails (2.1x)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import shared_dir

PAIRS = 900  # 500 train, 100 val, 300 test (one pool of every test pair)


@pytest.fixture(scope="module")
def graded_dataset(tmp_path_factory) -> Path:
    from pipelines.build import build_dataset
    from pipelines.build_config import BuildConfig
    from pipelines.coherence_corpus import CoherenceSynthConfig, write_coherence_corpus

    def make(root: Path) -> None:
        cfg = CoherenceSynthConfig(
            pairs=PAIRS, image_size=64, seed=2, salience="graded", split_sizes={"val": 100, "test": 300}
        )
        write_coherence_corpus(root / "raw", cfg)
        build_dataset(
            BuildConfig(
                source="synthetic", input=str(root / "raw"), out=str(root / "ds"), dedupe_threshold="off"
            )
        )

    return shared_dir(tmp_path_factory, "coherence-graded", make) / "ds"


def attribute_report(net, data: Path, cfg, vocab) -> dict:
    from schemas.manifest import Manifest
    from training.data import make_batch
    from training.epoch_batches import validation_batches
    from training.retrieval.objective import evaluate_pairs

    manifest = Manifest.read(data)
    paths = [str(p) for p in manifest.shard_paths(data, "test")]
    batches = [
        make_batch(t, vocab, cfg.max_tokens) for t in validation_batches(paths, 64, 0, 1, ("metadata",))
    ]
    return evaluate_pairs(net.eval(), batches, cfg, list(manifest.relations or []))


@pytest.mark.slow
def test_cmca_learns_the_small_digit_not_only_the_colours(graded_dataset, tmp_path):
    import torch

    from training.config import TrainConfig, preset_values
    from training.driver import fit
    from training.retrieval.objective import build

    values = {
        **preset_values(None, "cmca"),
        "data": str(graded_dataset),
        "objective": "cmca",
        "epochs": 12,
        "d_shared": 64,
        "lr": 3e-3,  # the retrieval demo's rate and batch (cli/demo.py): minutes, not an hour
        "batch_docs": 16,
        "num_workers": 0,
        "storage_path": str(tmp_path / "ray"),
        "n_pools": 1,
        "seed": 0,
    }
    cfg = TrainConfig(**values)
    res = fit(cfg)
    out = attribute_report(res.model, graded_dataset, cfg, res.vocab)
    attrs = out["attributes"]
    print({a: (round(m["top5_match"], 3), round(m["chance"], 3)) for a, m in attrs.items()}, out["t2i"])
    assert attrs["digit"]["queries"] >= 150
    assert attrs["ink"]["top5_match"] >= 0.8 and attrs["backdrop"]["top5_match"] >= 0.8
    # the weak attribute: well above chance (about 0.1). Measured at margin 0.3: 0.353 with random
    # word vectors (the default), 0.224 with GloVe (the default before issue #45), which starts the digit
    # words nearly parallel; at margin 0.5 (the default since 11-27): 0.344; with batches of alike
    # pairs (`--batch-sampling auto`, since 11-27 too): 0.42
    assert attrs["digit"]["top5_match"] >= 2.75 * attrs["digit"]["chance"], attrs["digit"]
    # the bar is out of an untrained model's reach
    torch.manual_seed(0)
    fresh = attribute_report(build(res.model_config), graded_dataset, cfg, res.vocab)["attributes"]
    assert fresh["digit"]["top5_match"] < 2 * fresh["digit"]["chance"], fresh["digit"]
