"""Alikhani et al.'s Tables 4 / 5 through the Ray Tune grid (training/grid/retrieval.py): the
rows and seeds, the table's layout and MedR sd, the CLI flags, and one real grid run."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from schemas.errors import MmlinksError
from training.config import TrainConfig
from training.grid import GRIDS, TrialResult, build_table, format_table
from training.grid.plan import select_spec, trial_specs

from .test_retrieval_objectives import VOCAB, write_pair_dataset


def test_table_grids_expand_to_every_row_and_seed(tmp_path):
    data = write_pair_dataset(tmp_path / "ds")  # relations Visible, Action, Story
    base = TrainConfig(data=str(data), seed=7)
    spec = GRIDS["coherence-table5"]
    assert spec.family == "retrieval" and spec.repeats == 3 and spec.datasets == ("Clue",)
    specs = trial_specs(spec, base, {"Clue": str(data)})
    rows = list(dict.fromkeys(s["method"] for s in specs))
    assert rows == ["CMCA", "CMCM-NoAttn", "CMCM", *(f"CMCM_{r}" for r in VOCAB)]
    assert len(specs) == 6 * 3 and len({s["key"] for s in specs}) == 18
    for s in specs:  # the paper's protocol and a valid config per trial
        assert s["overrides"]["max_tokens"] == 40 and s["overrides"]["seed"] in (7, 8, 9)
        cfg = TrainConfig.from_dict({**base.to_dict(), **s["overrides"]})
        assert cfg.select_by == "val_medr"
    noattn = [s for s in specs if s["method"] == "CMCM-NoAttn"]
    assert {s["overrides"]["retrieval_pooling"] for s in noattn} == {"mean"}
    assert [s["key"] for s in specs if s["method"] == "CMCM_Action"] == [
        "cmcm-c-Action-s7",
        "cmcm-c-Action-s8",
        "cmcm-c-Action-s9",
    ]
    small = select_spec("coherence-table4", base, None, ["cmca", "cmcm-noattn", "cmcm-c-Story"], 1)
    assert [s["key"] for s in trial_specs(small, base, {"CITE++": str(data)})] == [
        "cmca-s7",
        "cmcm-noattn-s7",
        "cmcm-c-Story-s7",
    ]
    with pytest.raises(MmlinksError, match="no b"):
        select_spec("coherence-table4", base, [10])
    with pytest.raises(MmlinksError, match="once"):
        select_spec("paper-table2", base, None, repeats=3)
    with pytest.raises(MmlinksError, match="no point"):
        trial_specs(select_spec("coherence-table4", base, None, ["ap-full-hard"]), base, {"x": str(data)})
    linking = select_spec("paper-table2", base, [10], ["ap-full-hard", "nostruct-full-mean"])
    assert [s["key"] for s in trial_specs(linking, base, {"x": str(data)})] == [
        "nostruct-full-mean-b10",
        "ap-full-hard-b10",
    ]


def _trial(key, method, seed, medr, r10, status="ok", refined=True):
    test = {"medr": medr, "r1": 10.0, "r5": 30.0, "r10": r10}
    if refined and status == "ok":
        test |= {"ssr_medr": medr - 1, "ssr_r1": 11.0, "ssr_r5": 31.0, "ssr_r10": r10 + 1}
        test |= {"ssr_tuned_medr": medr - 2, "ssr_tuned_r1": 12.0, "ssr_tuned_r5": 32.0}
        test |= {"ssr_tuned_r10": r10 + 2, "ssr_tuned_lambda": 0.5, "ssr_tuned_threshold": 0.1}
    return TrialResult(
        dataset="Clue",
        key=f"{key}-s{seed}",
        method=method,
        b=3,
        overrides={"objective": key.split("-")[0] if key != "cmcm-c-Story" else "cmcm-c", "seed": seed},
        status=status,
        run_id=f"run-{key}-{seed}",
        test=test if status == "ok" else {},
        error="" if status == "ok" else "training failed: boom",
        seed=seed,
        row=key,
    )


def test_table_is_the_papers_layout_with_the_medr_sd_over_seeds():
    seeds = ((0, 19.0), (1, 21.0), (2, 20.0))
    trials = [_trial("cmca", "CMCA", s, m, 40.0 + s, refined=False) for s, m in seeds]
    trials += [_trial("cmcm", "CMCM", s, m, 41.0) for s, m in ((0, 18.0), (1, 18.5))]
    trials += [_trial("cmcm", "CMCM", 2, 0, 0, status="error")]
    trials += [_trial("cmcm-c-Story", "CMCM_Story", 0, 17.0, 42.0)]
    table = build_table(GRIDS["coherence-table5"], trials, TrainConfig())
    assert table["family"] == "retrieval" and table["datasets"] == ["Clue"]
    (block,) = table["blocks"]
    assert [r["method"] for r in block["rows"]] == [
        "CMCA",
        "CMCM",
        "CMCM + SSR",
        "CMCM + SSR (val-tuned)",
        "CMCM_Story",
        "CMCM_Story + SSR",
        "CMCM_Story + SSR (val-tuned)",
    ]
    cmca, cmcm, ssr, tuned, story = (block["rows"][i]["cell"] for i in (0, 1, 2, 3, 4))
    assert cmca["medr"] == pytest.approx(20.0)
    assert cmca["medr_sd"] == pytest.approx(statistics.stdev([19, 21, 20]))
    assert cmca["r10"] == pytest.approx(41.0) and cmca["repeats"] == 3 and cmca["seeds"] == [0, 1, 2]
    assert cmcm["repeats"] == 2 and block["rows"][1]["failed"] == 1  # counted, not averaged
    assert cmcm["medr"] == pytest.approx(18.25) and ssr["medr"] == pytest.approx(17.25)
    assert tuned["refine"] == [(0.5, 0.1), (0.5, 0.1)] and story["medr_sd"] is None  # one repeat: no sd
    text = format_table({"table": table})
    lines = text.splitlines()
    assert lines[0] == "Alikhani et al., Table 5: text-to-image retrieval on Clue"
    assert lines[1].split() == ["MedR↓", "R@1↑", "R@5↑", "R@10↑", "repeats"]
    assert lines[3].split() == ["CMCA", "20.00", "±", "1.00", "10.0", "30.0", "41.0", "3"]
    assert "CMCM (1 failed)" in text and "CMCM_Story + SSR (val-tuned)" in text
    md = format_table({"table": table}, markdown=True)
    assert "| method | MedR↓ | R@1↑ | R@5↑ | R@10↑ | repeats |" in md and "| CMCA | 20.00 ± 1.00 |" in md
    json.dumps(table)


def test_grid_flags_select_rows_and_repeats(tmp_path, monkeypatch):
    import argparse

    from cli import grid as grid_command
    from cli.train_options import add_train_args

    data = write_pair_dataset(tmp_path / "ds")
    parser = argparse.ArgumentParser()
    add_train_args(parser)
    parser.add_argument("--data")
    grid_command.add_grid_args(parser)
    seen = {}

    def fake_run_grid(name, base, datasets, uri, max_concurrent, b_values, progress, **kw):
        seen.update(name=name, base=base, datasets=datasets, **kw)
        trials = [_trial("cmca", "CMCA", 0, 3.0, 90.0, refined=False)]
        from training.grid import GridResult

        return GridResult(name, "parent", uri, datasets, trials, build_table(GRIDS[name], trials, base))

    monkeypatch.setattr("training.grid.run_grid", fake_run_grid)
    argv = ["--grid", "coherence-table5", "--data", str(data), "--grid-rows", "cmca,cmcm"]
    args = parser.parse_args([*argv, "--grid-repeats", "1", "--epochs", "1", "--cam-hidden", "4"])
    args.workdir = str(tmp_path)
    out = grid_command.cmd_train_grid(args)
    assert seen["rows"] == ["cmca", "cmcm"] and seen["repeats"] == 1
    assert seen["base"].epochs == 1 and seen["base"].cam_hidden == 4
    assert seen["datasets"] == {"synthetic": str(data)}
    assert out["table_text"].startswith("Alikhani et al., Table 5") and "CMCA" in out["table_text"]
    assert "rows" not in grid_command.grid_selection(parser.parse_args(argv[:4]))


def test_retrieval_grid_end_to_end_through_the_cli(tmp_path, ray_local, capfd):
    """`mmlinks train --grid coherence-table5` on a 40-pair dataset, CMCA and CMCM, one seed,
    one epoch: two real Tune trials, each a single-worker Ray Train run logged under one parent
    MLflow run; the JSON holds the table with both rows and CMCM's refined rows."""
    from mlflow.tracking import MlflowClient

    from cli.main import main

    data = write_pair_dataset(tmp_path / "ds")
    flags = ["--epochs", "1", "--d-shared", "16", "--batch-docs", "4", "--word-vectors", "random"]
    flags += ["--min-word-count", "1", "--workers", "0", "--pool-size", "10", "--n-pools", "2"]
    argv = ["train", "--grid", "coherence-table5", "--data", str(data), "--workdir", str(tmp_path)]
    argv += ["--grid-rows", "cmca,cmcm", "--grid-repeats", "1", "--json", *flags]
    argv += ["--storage-path", str(tmp_path / "ray")]
    capfd.readouterr()
    assert main([*argv, "--max-concurrent-trials", "2"]) == 0, capfd.readouterr().err[-3000:]
    out = json.loads(capfd.readouterr().out)
    keys = [t["key"] for t in out["trials"]]
    assert keys == ["cmca-s0", "cmcm-s0"], keys
    assert all(t["status"] == "ok" for t in out["trials"]), [t["error"] for t in out["trials"]]
    (block,) = out["table"]["blocks"]
    methods = [r["method"] for r in block["rows"]]
    assert methods == ["CMCA", "CMCM", "CMCM + SSR", "CMCM + SSR (val-tuned)"]
    for row in block["rows"]:
        assert 1 <= row["cell"]["medr"] <= 10 and 0 <= row["cell"]["r10"] <= 100, row
    client = MlflowClient(out["tracking_uri"])
    parent = client.get_run(out["parent_run_id"])
    assert parent.data.params["family"] == "retrieval" and parent.data.params["repeats"] == "1"
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{out['parent_run_id']}'"
    )
    assert {c.info.run_id for c in children} == {t["run_id"] for t in out["trials"]}
    for c in children:
        assert math.isfinite(c.data.metrics["test_medr"]) and c.data.params["seed"] == "0"
    table_md = Path(client.download_artifacts(out["parent_run_id"], "grid/table.md")).read_text()
    assert "| CMCM + SSR |" in table_md and "Table 5" in table_md
