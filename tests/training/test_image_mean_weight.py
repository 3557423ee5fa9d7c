"""``--image-mean-weight -1`` (auto, issue #33): the document-mean part of balanced centring at 1
when the training split's images share a strong look (image ratio >= 5), else 0.5; measured on
the real split's shards."""

from pathlib import Path

import pytest

from pipelines.confounds import dataset_confounds
from schemas.manifest import Manifest
from training.config import TrainConfig
from training.link.mean_weight import AUTO_RATIO, AUTO_WEIGHTS, image_mean_weight


def _train_paths(data: Path) -> list[str]:
    return [str(p) for p in Manifest.read(data).shard_paths(data, "train")]


@pytest.fixture(scope="module")
def looked(dataset, tmp_path_factory):
    from pipelines.image_look import blend_look

    out = tmp_path_factory.mktemp("mean-weight") / "looked"
    blend_look(dataset, out, 0.9, seed=1)
    return out


def test_auto_follows_the_training_splits_image_ratio(dataset, looked):
    plain = dataset_confounds(dataset, ["train"])["train"].image_ratio
    strong = dataset_confounds(looked, ["train"])["train"].image_ratio
    assert plain < AUTO_RATIO <= strong, (plain, strong)
    cfg = TrainConfig(data=str(dataset))
    assert cfg.image_mean_weight == -1 and cfg.image_centring == "balanced"  # the defaults
    assert image_mean_weight(cfg, _train_paths(dataset)) == AUTO_WEIGHTS[0] == 0.5
    assert image_mean_weight(TrainConfig(data=str(looked)), _train_paths(looked)) == AUTO_WEIGHTS[1] == 1.0


def test_a_weight_given_is_kept_and_an_unused_one_is_the_old_default(looked):
    paths = _train_paths(looked)
    assert image_mean_weight(TrainConfig(data=str(looked), image_mean_weight=0.7), paths) == 0.7
    assert image_mean_weight(TrainConfig(data=str(looked), image_mean_weight=0.0), paths) == 0.0
    none = TrainConfig(data=str(looked), image_centring="none")
    assert image_mean_weight(none, paths) == 0.5


@pytest.mark.parametrize("bad", [-0.5, -2.0])
def test_a_negative_weight_other_than_auto_is_refused(bad):
    with pytest.raises(Exception, match=r"image_mean_weight|image-mean-weight"):
        TrainConfig(data="x", image_mean_weight=bad)
