"""``--image-centring auto`` and ``--image-mean-weight -1`` (issues #33, #44): the image side
follows the training split's image ratio, measured on the real split's shards: below 5 the
images are read as they are (none), at or above it balanced centring with the document-mean
part at weight 1."""

from pathlib import Path

import pytest

from pipelines.confounds import dataset_confounds
from schemas.manifest import Manifest
from training.config import TrainConfig
from training.link.image_side import AUTO_RATIO, AUTO_WEIGHTS, image_side


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
    assert cfg.image_mean_weight == -1 and cfg.image_centring == "auto"  # the defaults
    assert image_side(cfg, _train_paths(dataset)) == ("none", AUTO_WEIGHTS[0])
    assert image_side(TrainConfig(data=str(looked)), _train_paths(looked)) == ("balanced", 1.0)
    balanced = TrainConfig(data=str(dataset), image_centring="balanced")
    assert image_side(balanced, _train_paths(dataset)) == ("balanced", 0.5)  # the weight alone: auto


def test_a_choice_given_is_kept_and_an_unused_weight_is_the_old_default(looked):
    paths = _train_paths(looked)
    for weight in (0.7, 0.0):
        cfg = TrainConfig(data=str(looked), image_centring="balanced", image_mean_weight=weight)
        assert image_side(cfg, paths) == ("balanced", weight)
    assert image_side(TrainConfig(data=str(looked), image_centring="none"), paths) == ("none", 0.5)
    assert image_side(TrainConfig(data=str(looked), image_centring="doc"), paths) == ("doc", 0.5)


@pytest.mark.parametrize("bad", [-0.5, -2.0])
def test_a_negative_weight_other_than_auto_is_refused(bad):
    with pytest.raises(Exception, match=r"image_mean_weight|image-mean-weight"):
        TrainConfig(data="x", image_mean_weight=bad)
