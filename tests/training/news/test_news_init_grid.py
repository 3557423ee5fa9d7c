"""Table 2 from Table 1's encoders (``--init-from-grid``, training/grid/init_grid.py): a Table 1
grid as the trials leave it in an in-process SQLite MLflow store (parent run, finished and
failed trials with their validation history, each with a logged news model holding its
checkpoint), resolved to the best "full" trial per source, downloaded, and turned into the
Table 2 trials' overrides; the refusals of a wrong run, dataset or architecture. No Ray fit."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from cli.grid import grid_selection
from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from tests.conftest import tracking_uri
from training.config import TrainConfig
from training.grid import GRIDS
from training.grid.init_grid import INIT_ORDER, table1_encoders
from training.grid.plan import check_inputs, grid_inits, trial_specs
from training.news.recipes import read_checkpoint

from .helpers import news_checkpoint, write_news_dataset

BASE = {"d_shared": "16", "news_heads": "2", "news_encoder": "attention", "select_by": "val_medr"}


def _trial(client, exp, parent, tmp, point, medrs, version, status="FINISHED", **params):
    tags = {"mlflow.parentRunId": parent, "mmlinks.grid.point": point, "mmlinks.grid.dataset": "de"}
    rid = client.create_run(exp, tags=tags).info.run_id
    params = {**BASE, "dataset_version": version, "subword_buckets": "20", **params}
    client.log_batch(
        rid,
        metrics=[Metric("val_medr", m, 0, epoch) for epoch, m in enumerate(medrs)],
        params=[Param(k, v) for k, v in params.items()],
    )
    model = client.create_logged_model(exp, name="model", source_run_id=rid)
    root = tmp / rid
    shutil.copytree(tmp / "ckpt", root / "artifacts" / "checkpoint")
    (root / "artifacts" / "checkpoint" / "trial.json").write_text(json.dumps({"point": point}))
    client.log_model_artifacts(model.model_id, str(root))
    client.finalize_logged_model(model.model_id, "READY")
    client.set_terminated(rid, status)
    return rid


@pytest.fixture(scope="module")
def table1(tmp_path_factory):
    """A finished Table 1 grid: full@SOURCE seed 0, and seed 1 for caption (better there) and lead
    (worse there), a better vse@caption trial and a failed full@caption trial that must be ignored."""
    tmp = tmp_path_factory.mktemp("init-grid")
    data, docs = write_news_dataset(tmp / "data")
    news_checkpoint(tmp / "ckpt", docs)
    version = Manifest.read(data).dataset_version
    uri = tracking_uri(tmp)  # a copy of the once-migrated empty store
    client = MlflowClient(uri)
    exp = client.create_experiment("mmlinks", artifact_location=str(tmp / "artifacts"))
    parent = client.create_run(exp, tags={"mmlinks.grid": "news-table1", "mmlinks.grid.role": "parent"})
    pid = parent.info.run_id
    for source in INIT_ORDER:
        first = [9.0, 3.0] if source != "caption" else [9.0, 5.0]
        _trial(client, exp, pid, tmp, f"full@{source}-s0", first, version)
        if source in ("caption", "lead"):
            _trial(client, exp, pid, tmp, f"full@{source}-s1", [4.0, 6.0], version)
    _trial(client, exp, pid, tmp, "vse@caption-s0", [1.0], version)
    _trial(client, exp, pid, tmp, "full@caption-s2", [1.0], version, status="FAILED")
    return {"uri": uri, "parent": pid, "data": str(data), "tmp": tmp, "client": client, "exp": exp}


def test_table2_trials_load_the_best_full_trial_per_source(table1):
    base = TrainConfig(
        objective="news", data=table1["data"], d_shared=16, news_heads=2, word_vectors="random"
    )
    inits = table1_encoders(
        table1["uri"], table1["parent"], {"de": table1["data"]}, base, table1["tmp"] / "dl"
    )
    plan = inits["de"]
    assert (plan["subword_buckets"], plan["fuser_warmup_epochs"]) == (20, 1)
    parts = [p.split("=", 1) for p in plan["init_from"].split(",")]
    assert [s for s, _ in parts] == list(INIT_ORDER)  # caption first: its embeddings and image tower
    chosen = {s: json.loads((Path(f) / "trial.json").read_text()) for s, f in parts}
    assert chosen["caption"]["point"] == "full@caption-s1"  # best val_medr 4.0 < 5.0
    assert chosen["lead"]["point"] == "full@lead-s0"  # 3.0 < 4.0
    model_cfg, state = read_checkpoint(dict(parts)["body"])
    assert model_cfg["backbone"] == "news" and state
    # the Table 2 trials: divide and conquer rows load them, the from-scratch row does not
    specs = {
        s["key"]: s["overrides"]
        for s in trial_specs(GRIDS["news-table2"], base, {"de": table1["data"]}, inits)
    }
    assert specs["attention-drop-s0"]["init_from"] == plan["init_from"]
    assert specs["mlp-complete-s0"]["fuser_warmup_epochs"] == 1
    assert (
        specs["attention-scratch-s0"]["init_from"] == ""
        and specs["attention-scratch-s0"]["fuser_warmup_epochs"] == 0
    )
    assert check_inputs(GRIDS["news-table2"], base, {"de": table1["data"]}, inits) == {"de": table1["data"]}
    # the CLI hands --init-from-grid to run_grid only when given
    assert grid_selection(argparse.Namespace(init_from_grid=f" {table1['parent']} ")) == {
        "init_from_grid": table1["parent"]
    }
    assert grid_selection(argparse.Namespace(init_from_grid=None)) == {}
    again = table1_encoders(
        table1["uri"], table1["parent"], {"de": table1["data"]}, base, table1["tmp"] / "dl"
    )
    assert again == inits  # downloaded once, reused


def test_wrong_runs_datasets_and_architectures_are_refused(table1):
    base = TrainConfig(
        objective="news", data=table1["data"], d_shared=16, news_heads=2, word_vectors="random"
    )
    uri, pid, data, dl = table1["uri"], table1["parent"], table1["data"], table1["tmp"] / "dl2"
    with pytest.raises(MmlinksError, match="no such MLflow run"):
        table1_encoders(uri, "0" * 32, {"de": data}, base, dl)
    child = table1["client"].search_runs([table1["exp"]], f"tags.mlflow.parentRunId = '{pid}'")[0]
    with pytest.raises(MmlinksError, match="not the parent run of a news-table1 grid"):
        table1_encoders(uri, child.info.run_id, {"de": data}, base, dl)
    with pytest.raises(MmlinksError, match=r"another architecture .*d_shared 16 there, 32 here"):
        table1_encoders(uri, pid, {"de": data}, TrainConfig(objective="news", d_shared=32, news_heads=2), dl)
    with pytest.raises(MmlinksError, match="no finished 'full@caption' trial on dataset 'fr'"):
        table1_encoders(uri, pid, {"fr": data}, base, dl)
    other, _ = write_news_dataset(table1["tmp"] / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["dataset_version"] = "another"
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MmlinksError, match="dataset version"):
        table1_encoders(uri, pid, {"de": str(other)}, base, dl)
    with pytest.raises(MmlinksError, match="only news-table2"):
        grid_inits(GRIDS["news-table1"], base, {"de": data}, uri, str(dl), pid)
    assert grid_inits(GRIDS["news-table2"], base, {"de": data}, uri, str(dl), None) == {}
    with pytest.raises(MmlinksError, match="not both"):
        grid_inits(
            GRIDS["news-table2"],
            TrainConfig(objective="news", init_from="/x"),
            {"de": data},
            uri,
            str(dl),
            pid,
        )
