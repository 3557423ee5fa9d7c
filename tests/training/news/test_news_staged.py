"""The news family's default recipe (issue #46, ``training/news/staged.py``): a fused model
without ``--init-from`` trains as Liu et al.'s divide and conquer, the stages as runs nested
under one MLflow parent run (a real SQLite store), and one model version is registered."""

from __future__ import annotations

from tests.conftest import tracking_uri
from tests.training.news.helpers import write_news_dataset


def _cfg(data, storage, **kw):
    from training.config import TrainConfig

    base = dict(
        data=str(data),
        objective="news",
        news_sources="headline,caption",
        subword_buckets=16,
        epochs=1,
        d_shared=8,
        news_heads=1,
        batch_docs=4,
        lr=3e-3,
        min_word_count=1,
        word_vectors="random",
        num_workers=0,  # the loop in this process (tests/training/test_train.py: the same run)
        storage_path=str(storage),
        n_pools=1,
        pool_size=4,
    )
    return TrainConfig(**{**base, **kw})


def test_the_default_news_recipe_is_staged_with_random_drop():
    """The defaults of a fused news model are the paper's recipe (old: joint, random_drop 0)."""
    from training.config import TrainConfig
    from training.news.config import drop_rate, staged_recipe
    from training.news.staged import fusion_stage, single_stage

    cfg = TrainConfig(objective="news")
    assert staged_recipe(cfg) and drop_rate(cfg) == 0.3
    assert not staged_recipe(TrainConfig(objective="news", news_recipe="joint"))
    assert not staged_recipe(TrainConfig(objective="news", news_sources="caption"))
    assert not staged_recipe(TrainConfig(objective="news", init_from="caption=/a,lead=/b"))
    assert drop_rate(TrainConfig(objective="news", news_sources="caption")) == 0.0
    assert drop_rate(TrainConfig(objective="news", random_drop=0.0)) == 0.0  # the old behaviour
    one = single_stage(cfg, "lead")
    assert (one.news_sources, drop_rate(one), one.init_from, one.news_recipe) == ("lead", 0.0, "", "joint")
    fused = fusion_stage(cfg, {s: f"/c/{s}" for s in ("headline", "lead", "body", "caption")})
    assert fused.init_from.startswith("caption=/c/caption,") and fused.random_drop == 0.3
    assert fused.fuser_warmup_epochs == 1 and fused.news_recipe == "joint"
    fused.validate()


def test_the_stages_are_the_sources_some_training_article_has(tmp_path):
    """Under the four-source default, a dataset of headline + caption articles trains two
    single-source stages, not four (a lead model would train on nothing); the fused model's
    lead and body encoders start fresh."""
    from schemas.manifest import Manifest
    from training.config import TrainConfig
    from training.news.staged import fusion_stage, sources_in_data, stage_order

    data, _ = write_news_dataset(tmp_path / "ds")
    cfg = TrainConfig(objective="news", data=str(data))
    present = sources_in_data(str(data), Manifest.read(data))
    assert present == {"headline", "caption"}
    assert stage_order(cfg) == ["caption", "headline", "lead", "body"]
    assert stage_order(cfg, present) == ["caption", "headline"]
    fused = fusion_stage(cfg, {"caption": "/c/caption", "headline": "/c/headline"})
    assert fused.init_from == "caption=/c/caption,headline=/c/headline"
    fused.validate()


def test_default_news_train_runs_the_stages_under_one_parent_run_and_registers_once(tmp_path, ray_local):
    from mlflow.tracking import MlflowClient

    from models.experiment import run_experiment
    from training.news.staged import RECIPE_TAG, STAGE_TAG

    data, _ = write_news_dataset(tmp_path / "ds")
    uri = tracking_uri(tmp_path)
    res = run_experiment(_cfg(data, tmp_path / "ray"), uri, model_name="news-staged")
    client = MlflowClient(uri)
    parent = client.get_run(res.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags[RECIPE_TAG] == "staged"
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{res.parent_run_id}'"
    )
    stages = {r.data.tags[STAGE_TAG]: r for r in children}
    assert set(stages) == {"single:caption", "single:headline", "fusion"}
    assert all(r.info.status == "FINISHED" for r in children)
    fusion = stages["fusion"].data.params
    assert res.run_id == stages["fusion"].info.run_id
    assert fusion["init_from"].startswith("caption=") and ",headline=" in fusion["init_from"]
    assert fusion["random_drop"] == "0.3" and fusion["fuser_warmup_epochs"] == "1"
    assert stages["single:caption"].data.params["news_sources"] == "caption"
    # one registered version, the fused model's; the single-source stages are logged only
    versions = client.search_model_versions("name = 'news-staged'")
    assert [(str(v.version), v.run_id) for v in versions] == [("1", res.run_id)]
    assert res.model_version == "1" and res.to_dict()["parent_run_id"] == res.parent_run_id
    assert "test_r10" in parent.data.metrics and parent.data.tags["mmlinks.news.final_run"] == res.run_id


def test_news_recipe_joint_is_one_run_from_scratch(tmp_path, ray_local):
    from mlflow.tracking import MlflowClient

    from models.experiment import run_experiment

    data, _ = write_news_dataset(tmp_path / "ds")
    uri = tracking_uri(tmp_path)
    res = run_experiment(_cfg(data, tmp_path / "ray", news_recipe="joint", random_drop=0.0), uri, "news-j")
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_run(res.run_id).info.experiment_id])
    assert res.parent_run_id is None and [r.info.run_id for r in runs] == [res.run_id]
    assert runs[0].data.params["init_from"] == "" and runs[0].data.params["random_drop"] == "0.0"


def test_sources_no_training_article_has_are_refused_in_one_line_before_a_run(tmp_path):
    """--news-sources lead,body on headline + caption articles: one clear error, no MLflow run."""
    import pytest
    from mlflow.tracking import MlflowClient

    from models.experiment import run_experiment
    from schemas.errors import MmlinksError

    data, _ = write_news_dataset(tmp_path / "ds")
    uri = tracking_uri(tmp_path)
    with pytest.raises(MmlinksError, match=r"no training article .* has any of --news-sources lead,body"):
        run_experiment(_cfg(data, tmp_path / "ray", news_sources="lead,body"), uri, model_name="none")
    client = MlflowClient(uri)
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])
