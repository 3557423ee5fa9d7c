"""`--preset paper` gives Hessel et al. 2019 as published; flags the user gives still win."""

import pytest

from cli.main import build_parser
from cli.train_options import train_config_from_args
from schemas.errors import MmlinksError
from training.config import PRESETS, TrainConfig, preset_values


def _config(*argv: str) -> TrainConfig:
    args = build_parser().parse_args(["train", "--data", ".", *argv])
    return train_config_from_args(args)


def test_the_defaults_deviate_from_the_paper_only_where_the_preset_says():
    default, paper = _config(), _config("--preset", "paper")
    changed = {k for k, v in paper.to_dict().items() if default.to_dict()[k] != v}
    assert changed == {k for k, v in PRESETS["paper"].items() if getattr(default, k) != v}
    assert paper.text_pooling == "last" and paper.select_by == "val_loss"
    assert paper.image_centring == "none" and paper.negatives_warmup == 0  # issue #33's image side
    assert default.image_centring == "auto" and default.negatives_warmup == 3


def test_a_flag_given_beside_the_preset_wins():
    assert _config("--preset", "paper", "--text-pooling", "max").text_pooling == "max"
    assert _config("--preset", "paper", "--d-multi", "64").d_multi == 64


def test_an_unknown_preset_is_an_error():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--data", ".", "--preset", "nope"])
    with pytest.raises(MmlinksError, match="unknown preset 'nope'; known: paper"):
        preset_values("nope")


def test_dagster_settings_take_the_preset_under_their_overrides():
    from orchestration.settings import Settings

    s = Settings.from_dict({"train_preset": "paper", "train_base": {"text_pooling": "mean"}})
    assert s.train_config("ap", data="-").text_pooling == "mean"
    assert s.train_config("ap", data="-").select_by == "val_loss"
    with pytest.raises(MmlinksError, match="unknown preset"):
        Settings.from_dict({"train_preset": "nope"})


@pytest.mark.parametrize(
    ("objective", "words"),
    [("ap", "random"), ("cmca", "random"), ("cmcm", "random"), ("cmcm-c", "random"), ("news", "glove")],
)
def test_auto_word_vectors_are_random_for_link_and_retrieval_and_the_paper_keeps_glove(objective, words):
    """issues #44 and #45: GloVe starts digits, colours and tools nearly parallel; the link and
    retrieval defaults start their words random, the paper preset keeps pretrained vectors."""
    extra = ("--relation", "Visible") if objective == "cmcm-c" else ()
    assert _config("--objective", objective, *extra).word_vectors == words
    assert _config("--objective", objective, *extra, "--preset", "paper").word_vectors == "glove"
