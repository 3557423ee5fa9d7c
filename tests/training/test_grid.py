"""The paper grids (Hessel et al. 2019 Tables 2, 3 and S1-S4) and one real Ray Tune + MLflow run."""

import argparse
import json
import math
import time
from dataclasses import replace

import pytest

from models.experiment import package_run
from schemas.errors import MmlinksError
from schemas.manifest import Manifest
from tests.conftest import small_train_config, tracking_uri
from training.config import TrainConfig
from training.grid import (
    GRIDS,
    MAIN_ROWS,
    PAPER_VARIANTS,
    GridSpec,
    TrialResult,
    build_table,
    format_table,
    point_b,
    run_grid,
    variant,
)


@pytest.mark.parametrize("name", ["paper-table2", "paper-table3"])
def test_grids_are_the_papers(name):
    spec, base = GRIDS[name], TrainConfig()
    # Ten trained rows per b (supplement Tables S1-S4) for b in {10, 20, 30}: 30 points.
    assert len(spec.points) == 30
    by_b = {}
    for p in spec.points:
        by_b.setdefault(point_b(p, base), []).append(variant(p))
        TrainConfig.from_dict({**base.to_dict(), **spec.base_overrides, **p}).validate()
    assert sorted(by_b) == [10, 20, 30]
    for variants in by_b.values():
        assert variants == list(PAPER_VARIANTS)
        assert {v[0] for v in variants} == {"nostruct", "dc", "tk", "ap"}
        assert ("tk", "half", "hard") in variants and ("tk", "half", "mean") not in variants
        assert sum(v[0] == "nostruct" for v in variants) == 2 and sum(v[0] == "ap" for v in variants) == 3
    assert {p["batch_docs"] for p in spec.points} == {11, 21, 31}  # B = b + 1 documents per batch
    if name == "paper-table2":
        assert spec.datasets == ("MSCOCO", "Story-DII", "Story-SIS", "DII-Stress")
        assert spec.base_overrides == {}
    else:
        assert spec.datasets == ("RQA", "DIY")  # WIKI has no ground truth: not in Table 3
        assert spec.base_overrides == {"max_tokens": 50}
    # The main table's rows are trained variants; its NoStruct is the one without hard negatives.
    assert {v for v, _ in MAIN_ROWS} <= set(PAPER_VARIANTS)
    assert MAIN_ROWS[0][0] == ("nostruct", "full", "mean")


def _trial(ds, o, k, n, b, auc, status="ok"):
    return TrialResult(
        dataset=ds,
        key=f"{o}-{k}-{n}-b{b}",
        method="",
        b=b,
        overrides={"objective": o, "k": k, "negatives": n, "batch_docs": b + 1},
        status=status,
        run_id=f"r-{ds}-{o}{k}{n}{b}",
        test={"auc": auc, "p_at_1": 50.0, "p_at_5": 40.0, "n_docs": 8} if status == "ok" else {},
        random={"auc": 50.0, "p_at_1": 20.0, "p_at_5": 20.0} if status == "ok" else {},
        error="" if status == "ok" else "training failed: boom",
    )


def test_table_follows_the_paper_layout():
    spec = GRIDS["paper-table3"]
    trials = [
        _trial("DIY", "ap", "full", "hard", 10, 61.8),
        _trial("RQA", "ap", "full", "hard", 10, 69.3),
        _trial("RQA", "nostruct", "full", "mean", 10, 60.5),
        _trial("RQA", "ap", "half", "hard", 10, 0, status="error"),
        _trial("RQA", "ap", "full", "hard", 20, 69.4),
        _trial("extra", "ap", "full", "hard", 20, 55.0),
    ]
    table = build_table(spec, trials, TrainConfig())
    assert table["datasets"] == ["RQA", "DIY", "extra"]  # the paper's order, then the rest
    main, all10, all20 = table["blocks"]
    assert (main["layout"], main["b"], all10["b"], all20["b"]) == ("main", 10, 10, 20)
    assert [r["method"] for r in main["rows"]] == ["Random", "NoStruct", "AP", "  + 1/2 k"]
    assert [r["method"] for r in all10["rows"]] == [
        "Random",
        "NoStruct",
        "AP + hard neg",
        "AP + hard neg + 1/2 k",
    ]
    assert [r["method"] for r in all20["rows"]] == ["Random", "AP + hard neg"]
    ap = main["rows"][2]["cells"]
    assert ap["RQA"]["auc"] == 69.3 and ap["DIY"]["auc"] == 61.8 and ap["extra"] is None
    assert main["rows"][3]["cells"]["RQA"]["error"] == "training failed: boom"
    assert main["rows"][0]["cells"]["DIY"]["auc"] == 50.0
    text = format_table({"table": table})
    lines = text.splitlines()
    assert lines[0].startswith("Hessel et al. 2019, Table 3")
    assert lines[1].split() == ["RQA", "DIY", "extra"]
    assert lines[2].split() == ["method", "AUC", "p@1/p@5", "AUC", "p@1/p@5", "AUC", "p@1/p@5"]
    assert lines[4].split()[:3] == ["Random", "50.0", "20.0/20.0"]
    assert "69.3  50.0/40.0" in text and "failed" in text and "Obj Detect" in text
    with_od = build_table(spec, trials, TrainConfig(), {"Obj Detect": {"RQA": {"auc": 58.7, "p_at_1": 25.1}}})
    assert [r["method"] for r in with_od["blocks"][0]["rows"]][:3] == ["Random", "Obj Detect", "NoStruct"]
    assert with_od["blocks"][0]["rows"][1]["cells"]["DIY"] is None
    assert "58.7  25.1/-" in format_table({"table": with_od}) and "Obj Detect (paper" not in str(
        with_od["notes"]
    )
    md = format_table({"table": table}, markdown=True)
    assert "| method | RQA AUC | RQA p@1/p@5 |" in md and md.count("### ") == 3


def test_bad_grid_inputs_are_refused(dataset, tmp_path):
    base = small_train_config(dataset, tmp_path)
    with pytest.raises(MmlinksError, match="unknown grid"):
        run_grid("table9", base, {"x": str(dataset)}, f"sqlite:///{tmp_path}/m.db")
    with pytest.raises(MmlinksError, match="not a directory"):
        run_grid("paper-table2", base, {"MSCOCO": str(tmp_path / "nope")}, f"sqlite:///{tmp_path}/m.db")
    with pytest.raises(MmlinksError, match="no point"):
        run_grid("paper-table2", base, {"x": str(dataset)}, f"sqlite:///{tmp_path}/m.db", b_values=[7])
    bad = GridSpec("bad", "bad", ("x",), ({"objective": "cosine", "batch_docs": 4},))
    with pytest.raises(MmlinksError, match="objective"):
        run_grid(bad, base, {"x": str(dataset)}, f"sqlite:///{tmp_path}/m.db")
    assert not (tmp_path / "m.db").exists()  # refused before any run was opened


def test_grid_command_arguments(dataset, tmp_path, monkeypatch, capsys):
    from cli import grid as grid_command

    parser = argparse.ArgumentParser()
    grid_command.add_grid_args(parser)
    args = parser.parse_args(
        ["--grid", "paper-table2", "--grid-data", f"MSCOCO={dataset}", "--grid-data", f"DII-Stress={dataset}"]
    )
    assert grid_command.parse_grid_data(args.grid_data, None) == {
        "MSCOCO": str(dataset),
        "DII-Stress": str(dataset),
    }
    assert grid_command.parse_grid_data([], str(dataset)) == {"synthetic": str(dataset)}  # manifest source
    assert grid_command.parse_b_values("10, 20") == [10, 20]
    for bad in (["MSCOCO"], ["=x"], [f"A={dataset}", f"A={dataset}"]):
        with pytest.raises(MmlinksError):
            grid_command.parse_grid_data(bad, None)
    with pytest.raises(MmlinksError):
        grid_command.parse_b_values("ten")

    seen = {}

    def fake_run_grid(name, base, datasets, uri, max_concurrent, b_values, progress, report_dir, package):
        seen.update(
            name=name,
            base=base,
            datasets=datasets,
            uri=uri,
            max_concurrent=max_concurrent,
            b=b_values,
            reports=report_dir,
        )
        spec = GRIDS[name]
        trials = [
            _trial("MSCOCO", "ap", "full", "hard", 10, 98.7),
            _trial("MSCOCO", "dc", "full", "hard", 10, 0, "error"),
        ]
        from training.grid import GridResult

        return GridResult(name, "parent", uri, datasets, trials, build_table(spec, trials, base))

    monkeypatch.setattr("training.grid.run_grid", fake_run_grid)
    args = parser.parse_args(
        [
            "--grid",
            "paper-table2",
            "--grid-data",
            f"MSCOCO={dataset}",
            "--grid-b",
            "10",
            "--max-concurrent-trials",
            "2",
        ]
    )
    args.workdir = str(tmp_path)
    out = grid_command.cmd_train_grid(args, base_cfg=small_train_config(dataset, tmp_path))
    assert seen["b"] == [10] and seen["max_concurrent"] == 2 and seen["uri"].endswith("mlflow.db")
    assert seen["reports"] == tmp_path / "reports"  # reports land in WORKDIR/reports (issue #46)
    assert out["parent_run_id"] == "parent" and len(out["trials"]) == 2 and out["table"]["blocks"]
    assert "98.7" in out["table_text"] and args.exit_code == 1  # one trial failed
    json.dumps(out)
    grid_command.print_grid(out)
    printed = capsys.readouterr().out
    assert printed.startswith("Hessel et al. 2019, Table 2") and "failed: MSCOCO dc-full-hard-b10" in printed
    assert "1/2 trials" in printed and "parent run: parent" in printed

    # The base config from the `train` flags (what the lead's parser gives cmd_train_grid).
    from cli.main import build_parser

    targs = build_parser().parse_args(
        ["train", "--data", str(dataset), "--epochs", "2", "--workdir", str(tmp_path)]
    )
    targs.grid, targs.grid_data, targs.grid_b, targs.max_concurrent_trials = "paper-table3", [], None, None
    grid_command.cmd_train_grid(targs)
    assert seen["datasets"] == {"synthetic": str(dataset)} and seen["base"].epochs == 2
    assert seen["base"].data == str(dataset)


def test_grid_end_to_end_with_ray_tune_and_mlflow(dataset, tmp_path, ray_local):
    """Two grid points on the fixture dataset as real Tune trials, each a real single-worker Ray
    Train run logged to a real sqlite MLflow store under one parent run."""
    from mlflow.tracking import MlflowClient

    spec = replace(
        GRIDS["paper-table2"],
        name="mini",
        points=(
            {"objective": "nostruct", "k": "full", "negatives": "mean", "batch_docs": 4},
            {"objective": "ap", "k": "full", "negatives": "hard", "batch_docs": 4},
        ),
        main_b=3,
    )
    base = small_train_config(
        dataset,
        tmp_path / "ray",
        epochs=1,
        d_multi=16,
        word_vectors="random",
        run_name="ignored",
        num_workers=1,
    )
    uri = tracking_uri(tmp_path)
    t0 = time.perf_counter()
    res = run_grid(
        spec,
        base,
        {"MSCOCO": str(dataset)},
        uri,
        max_concurrent=2,
        report_dir=tmp_path / "rep",
        package=package_run,
    )
    elapsed = time.perf_counter() - t0
    assert [t.status for t in res.trials] == ["ok", "ok"], [t.error for t in res.trials]
    assert {t.key for t in res.trials} == {"nostruct-full-mean-b3", "ap-full-hard-b3"}

    client = MlflowClient(uri)
    parent = client.get_run(res.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["grid"] == "mini" and parent.data.params["trials"] == "2"
    assert json.loads(parent.data.params["datasets"]) == {"MSCOCO": str(dataset.resolve())}
    # the datasets are the parent's inputs (created before the trials, which then race no more)
    version = Manifest.read(dataset).dataset_version
    assert [d.dataset.name for d in parent.inputs.dataset_inputs] == [f"synthetic-{version}"]
    arts = {a.path for a in client.list_artifacts(res.parent_run_id, "grid")}
    assert {"grid/table.md", "grid/table.json", "grid/table.txt", "grid/trials.json"} <= arts
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{res.parent_run_id}'"
    )
    assert {c.info.run_id for c in children} == {t.run_id for t in res.trials}
    for c in children:
        assert c.info.status == "FINISHED"
        assert c.data.tags["mmlinks.grid.dataset"] == "MSCOCO"
        assert math.isfinite(c.data.metrics["test_auc"])
        assert [d.dataset.name for d in client.get_run(c.info.run_id).inputs.dataset_inputs] == [
            f"synthetic-{version}"
        ]
    assert not client.search_registered_models()  # grid trials are compared, not registered

    main, everything = res.table["blocks"]
    assert res.table["datasets"] == ["MSCOCO"]
    assert [r["method"] for r in main["rows"]] == ["Random", "NoStruct", "AP"]
    assert [r["method"] for r in everything["rows"]] == ["Random", "NoStruct", "AP + hard neg"]
    for row in main["rows"]:
        cell = row["cells"]["MSCOCO"]
        assert all(math.isfinite(cell[m]) for m in ("auc", "p_at_1", "p_at_5")), row
    text = format_table(res)
    assert "NoStruct" in text and "AP + hard neg" in text
    print(f"\n{text}grid of 2 trials: {elapsed:.0f} s (trials {[t.seconds for t in res.trials]} s)")


def test_a_grid_trial_resolves_auto_for_its_own_objective():
    """A grid's base is resolved for the command's objective (ap by default); each trial names its
    own, so a news trial still starts from GloVe and random batches, a coherence trial from random
    vectors and similar batches; a value the user gave stays."""
    from training.grid.retrieval import _config

    base = TrainConfig(objective="ap")
    assert base.word_vectors == "random" and base.batch_sampling == "similar"
    news = TrainConfig.from_dict({**base.given_dict(), "objective": "news"})
    assert news.word_vectors == "glove" and news.batch_sampling == "random"
    given = TrainConfig(objective="ap", batch_sampling="similar", word_vectors="random")
    kept = TrainConfig.from_dict({**given.given_dict(), "objective": "news"})
    assert kept.batch_sampling == "similar" and kept.word_vectors == "random"
    coherence = _config({"objective": "cmca"}, TrainConfig(objective="news"))
    assert coherence.word_vectors == "random" and coherence.batch_sampling == "similar"
    # a retrieval base picks epochs by validation MedR; a link trial from it by the within gap
    assert coherence.select_by == "val_medr"
    link = TrainConfig.from_dict({**coherence.given_dict(), "objective": "ap"})
    assert link.select_by == "val_within"
    link.validate()  # val_medr would be refused for a link objective


def test_an_in_process_gpu_trial_reserves_a_gpu():
    """``--grid --workers 0 --gpu``: each trial trains on a GPU of its own (Ray sets its
    CUDA_VISIBLE_DEVICES only where it reserved one); trials with Ray workers reserve CPUs only
    (their workers reserve the GPUs)."""
    from training.grid.tune_driver import trial_resources

    assert trial_resources(TrainConfig(num_workers=0, use_gpu=True), 1.0) == {"cpu": 1.0, "gpu": 1}
    assert trial_resources(TrainConfig(num_workers=0), 0.5) == {"cpu": 0.5}
    assert trial_resources(TrainConfig(num_workers=2, use_gpu=True), 1.0) == {"cpu": 1.0}
