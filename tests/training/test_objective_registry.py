"""The objective and backbone registries: every name is defined once, config validation, labels
and the training loop read them, and an objective registered from outside (here, from this test
module) trains through the real Ray loop with no other change."""

import sys

import numpy as np
import pytest

from schemas.errors import MmlinksError
from tests.conftest import small_train_config
from training.backbone import backbone_names, get_backbone
from training.config import TrainConfig
from training.link.similarity import SIMILARITIES
from training.objectives.registry import (
    ObjectiveSpec,
    get_objective,
    objective_names,
    register_objective,
    unregister_objective,
)


def toy_loss(s_pad, s_mask, v_pad, v_mask, cfg, generator=None):
    """Mean-pooled hinge on TK at k = half, plus a named extra part (so parts are logged)."""
    from training.link.loss import in_batch_loss
    from training.link.similarity import document_similarity

    cross = in_batch_loss(document_similarity("tk", s_pad, s_mask, v_pad, v_mask, "half"), cfg.margin, "mean")
    spread = 0.01 * (s_pad * s_mask[..., None]).sum(1).norm(dim=-1).mean()
    return cross + spread, {"C": float(cross.detach()), "S": float(spread.detach())}


TOY = ObjectiveSpec(
    name="toy",
    summary="a test objective: TK half with mean negatives plus a small spread term",
    similarity="tk",
    loss=toy_loss,
    label=lambda cfg: f"toy-{cfg.backbone}",
    fields=("margin",),
    parts=lambda cfg: ("C", "S"),
)


@pytest.fixture
def toy_objective():
    register_objective(TOY)
    try:
        yield TOY
    finally:
        unregister_objective(TOY.name)


def test_builtin_objectives_and_backbones_are_registered():
    assert objective_names() == ("nostruct", "dc", "tk", "ap", "li2021", "cmca", "cmcm", "cmcm-c", "news")
    assert backbone_names() == ("gru", "bag", "transformer", "coherence", "news", "minilm", "clip")
    for name in objective_names():
        spec = get_objective(name)
        assert spec.similarity in SIMILARITIES and spec.summary
    labels = {
        "nostruct": "nostruct-hard",
        "dc": "dc-hard",
        "tk": "tk-full-hard",
        "ap": "ap-full-hard",
        "li2021": "li2021-C-gru",
        "cmca": "cmca",
        "cmcm": "cmcm",
        "cmcm-c": "cmcm-c-Action",
        "news": "news-headline+lead+body+caption-attention-drop0.3-vse",
    }
    relation = {"cmcm-c": "Action"}  # cmcm-c trains one relation
    got = {o: TrainConfig(objective=o, relation=relation.get(o, "")).label for o in objective_names()}
    assert got == labels
    assert TrainConfig(objective="li2021", objectives="C+I+D", backbone="transformer").label == (
        "li2021-C+I+D-transformer"
    )
    assert get_objective("nostruct").prepare is not None and get_objective("ap").uses_k
    assert get_backbone("transformer").needs_regions and not get_backbone("gru").needs_regions


def test_unknown_names_are_refused():
    with pytest.raises(MmlinksError, match="unknown objective 'nope'"):
        get_objective("nope")
    with pytest.raises(
        MmlinksError, match=r"objective .* \(one of nostruct, dc, tk, ap, li2021, cmca, cmcm, cmcm-c, news\)"
    ):
        TrainConfig(objective="nope").validate()
    with pytest.raises(ValueError, match="already registered"):
        register_objective(get_objective("ap"))


def test_a_registered_objective_appears_in_the_cli_and_the_dagster_settings(toy_objective):
    from cli.main import build_parser
    from orchestration.settings import Settings

    args = build_parser().parse_args(["train", "--data", "d", "--objective", "toy"])
    assert args.objective == "toy"
    train = next(
        a
        for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions
        if a.dest == "objective"
    )
    assert "toy" in train.choices
    settings = Settings.from_dict({"sources": ["synthetic"], "objectives": {"toy": {"objective": "toy"}}})
    assert settings.train_config("toy", data="d").objective == "toy"


def test_a_registered_objective_is_known_to_config_validation(toy_objective):
    assert "toy" in objective_names()
    cfg = TrainConfig(objective="toy")
    cfg.validate()
    assert (cfg.label, cfg.similarity, cfg.parts) == ("toy-gru", "tk", ("C", "S"))
    unregister_objective("toy")
    with pytest.raises(MmlinksError, match="invalid training config: objective"):
        cfg.validate()


def test_a_registered_objective_trains_through_the_real_loop(dataset, tmp_path, ray_local, toy_objective):
    import ray.cloudpickle

    from training.driver import fit

    # The spec travels to the Ray worker inside the loop config; a test module is not importable
    # there, so its functions go by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        res = fit(small_train_config(dataset, tmp_path / "ray", epochs=1, objective="toy"))
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    (epoch,) = res.history
    assert np.isfinite(epoch["train_loss"]) and np.isfinite(epoch["val_loss"])
    assert {"train_loss_C", "train_loss_S"} <= set(epoch)
    assert 0 <= epoch["val_auc"] <= 100


def test_relation_and_table_rules_follow_spec_fields_not_names():
    """--relation, the default model names of a dataset, the Tables 4/5 row name and a backbone's
    "trains only" check read ObjectiveSpec fields: an objective registered with per_relation and
    a table name gets them with no other change."""
    from types import SimpleNamespace

    from models.registry import default_names
    from training.backbone import only_its_objectives
    from training.grid.retrieval import RETRIEVAL_ROWS, method_name, retrieval_paper_points
    from training.objectives.registry import relation_objectives, relation_problems

    base = get_objective("cmcm-c")
    spec = ObjectiveSpec(**{**base.__dict__, "name": "cmcm-toy", "table_name": "TOY"})
    register_objective(spec)
    try:
        assert relation_objectives() == ("cmcm-c", "cmcm-toy")
        assert relation_problems("cmcm-toy", "") == [
            "relation (cmcm-toy trains one model per relation: --relation NAME)"
        ]
        assert relation_problems("ap", "Story") == ["relation (only cmcm-c or cmcm-toy takes one)"]
        assert relation_problems("cmcm-toy", "Story") == []
        assert TrainConfig(objective="cmcm-toy", relation="Story").parts == ("ret", "cls")
        assert method_name({"objective": "cmcm-toy", "relation": "Story"}) == "TOY_Story"
        assert retrieval_paper_points()[-1] == {"objective": "cmcm-toy", "relation": "*"}
        names = default_names(SimpleNamespace(relations=["Story", "Action"]))
        assert {"mmlinks-cmcm-toy-Story", "mmlinks-cmcm-toy-Action"} <= set(names)
        assert "mmlinks-cmcm-toy" not in default_names(SimpleNamespace(relations=[]))
        assert only_its_objectives("coherence")(SimpleNamespace(objective="ap")) == [
            "backbone (coherence trains only --objective cmca, cmcm, cmcm-c or cmcm-toy)"
        ]
    finally:
        unregister_objective(spec.name)
    assert [label for _, label in RETRIEVAL_ROWS] == ["CMCA", "CMCM-NoAttn", "CMCM", "CMCM_{relation}"]
    assert relation_problems("ap", "Story") == ["relation (only cmcm-c takes one)"]
