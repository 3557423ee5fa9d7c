"""Liu et al.'s Tables 1-4 as grids (training/grid/news.py): each table's rows x columns as
TrainConfig overrides that validate, row selection and seeds, the refusal of an all-for-one row
without a model to start from, and the tables printed in the paper's layouts from synthetic
trial results (no training)."""

from __future__ import annotations

import pytest

from schemas.errors import MmlinksError
from training.config import TrainConfig
from training.grid import GRIDS, TrialResult, build_table, format_table
from training.grid.news import LAYOUTS, SOURCES, flat_news_metrics
from training.grid.plan import check_inputs, select_spec, trial_specs

from .helpers import write_news_dataset


@pytest.fixture(scope="module")
def news_data(tmp_path_factory):
    folder, _ = write_news_dataset(tmp_path_factory.mktemp("news-grid"))
    return str(folder)


def test_every_table_expands_to_valid_news_configs(news_data):
    base = TrainConfig(data=news_data, seed=3, word_vectors="random", init_from="caption=/ckpt")
    # all-for-one starts from one model (not per-source encoders), one-for-all needs aligned vectors
    aligned = {"init_from": "/ckpt", "word_vectors": "text:de.vec,text:fr.vec"}
    multi = TrainConfig.from_dict({**base.to_dict(), **aligned})
    sizes = {"news-table1": 6 * 4, "news-table2": 9, "news-table34": 3}
    for name, n in sizes.items():
        spec, b = GRIDS[name], multi if name == "news-table34" else base
        assert spec.family == "news" and spec.repeats == 1
        specs = trial_specs(spec, b, {"de": news_data})
        assert len(specs) == n and len({s["key"] for s in specs}) == n
        for s in specs:
            cfg = TrainConfig.from_dict({**b.to_dict(), **s["overrides"]})
            cfg.validate()
            assert cfg.objective == "news" and cfg.seed == 3
    t1 = trial_specs(GRIDS["news-table1"], base, {"de": news_data})
    assert [s["key"] for s in t1[:4]] == [f"vsepp@{src}-s3" for src in SOURCES]
    hal = next(s for s in t1 if s["key"] == "hal@lead-s3")["overrides"]
    assert (hal["news_loss"], hal["news_sources"], hal["subword_buckets"]) == ("hal", "lead", 0)
    rows = list(dict.fromkeys(s["key"].split("@")[0] for s in t1))
    assert rows == ["vsepp", "vse", "order", "chain", "hal", "full"]  # the paper's lines 1.1-1.5, 1.11
    order = next(s for s in t1 if s["key"] == "order@body-s3")["overrides"]
    chain = next(s for s in t1 if s["key"] == "chain@caption-s3")["overrides"]
    assert (order["news_loss"], order["margin"], chain["news_encoder"]) == ("order", 0.05, "chain")
    t2 = {s["key"]: s for s in trial_specs(GRIDS["news-table2"], base, {"de": news_data})}
    assert [s["method"] for s in t2.values()][6] == "Attention Fuser (from scratch)"
    # divide and conquer inherits the base's --init-from; from scratch loads nothing

    def cfg(key: str) -> TrainConfig:
        return TrainConfig.from_dict({**base.to_dict(), **t2[key]["overrides"]})

    assert cfg("mlp-complete-s3").init_from == "caption=/ckpt" and cfg("mlp-complete-s3").random_drop == 0
    assert cfg("attention-scratch-s3").init_from == "" and cfg("attention-drop-s3").random_drop == 0.3
    langs = trial_specs(GRIDS["news-table34"], multi, {"de": news_data})
    assert TrainConfig.from_dict({**multi.to_dict(), **langs[2]["overrides"]}).init_from == "/ckpt"
    assert [s["overrides"]["multilingual"] for s in langs] == ["none", "one-for-all", "all-for-one"]


def test_rows_repeats_and_refusals(news_data):
    base = TrainConfig(data=news_data, seed=0)
    small = select_spec("news-table1", base, None, ["vse", "full@caption"], 2)
    keys = [s["key"] for s in trial_specs(small, base, {"de": news_data})]
    assert keys == [f"vse@{s}-s{r}" for s in SOURCES for r in (0, 1)] + ["full@caption-s0", "full@caption-s1"]
    with pytest.raises(MmlinksError, match="--init-from"):
        check_inputs(GRIDS["news-table34"], base, {"de": news_data})
    with pytest.raises(MmlinksError, match="aligned vectors"):
        check_inputs(select_spec("news-table34", base, None, ["one-for-all"]), base, {"de": news_data})
    ok = select_spec("news-table34", base, None, ["target-only"])
    assert list(check_inputs(ok, base, {"de": news_data})) == ["de"]
    with pytest.raises(MmlinksError, match="no b"):
        select_spec("news-table2", base, [10])


def _trial(dataset, row, method, seed, r10, status="ok"):
    test = {}
    if status == "ok":
        test = {
            **{f"t2i_{k}": v for k, v in {"r1": 10.0, "r5": 30.0, "r10": r10, "medr": 4.0 + seed}.items()},
            **{f"i2t_{k}": v for k, v in {"r1": 12.0, "r5": 33.0, "r10": r10 + 1, "medr": 5.0}.items()},
        }
    return TrialResult(
        dataset,
        f"{row}-s{seed}",
        method,
        0,
        {},
        status,
        run_id=f"r{seed}",
        test=test,
        seed=seed,
        row=row,
        error="" if status == "ok" else "boom",
    )


def test_tables_print_in_the_papers_layouts():
    base = TrainConfig()
    t1 = [_trial("de", f"vse@{s}", "VSE", 0, 40.0 + i) for i, s in enumerate(SOURCES)]
    t1 += [_trial("de", "hal@caption", "HAL", 0, 50.0), _trial("de", "hal@caption", "HAL", 1, 0, "error")]
    table = build_table(GRIDS["news-table1"], t1, base)
    text = format_table({"table": table})
    lines = text.splitlines()
    assert lines[0] == "Liu et al., Table 1: single textual source, R@10, on de"
    assert lines[1].split() == [w for d in ("i2t", "t2i") for s in SOURCES for w in (d, s)]
    assert lines[3].split() == ["VSE", "41.0", "42.0", "43.0", "44.0", "40.0", "41.0", "42.0", "43.0"]
    assert lines[4].split() == ["HAL", "(1", "failed)", "51.0", "50.0"]  # only its caption column ran
    t2 = [_trial("de", "attention-drop", "Attention Fuser", s, 60.0 + 2 * s) for s in (0, 1)]
    table2 = build_table(GRIDS["news-table2"], t2, base)
    (row,) = table2["blocks"][0]["rows"]
    assert row["cells"][""]["t2i_r10"] == 61.0 and row["cells"][""]["t2i_medr"] == 4.5
    text2 = format_table({"table": table2})
    assert "t2i MedR" in text2 and "4.5 ± 0.7" in text2 and "no --init-from" in text2
    md = format_table({"table": table2}, markdown=True)
    assert "| Attention Fuser | 12.0 | 33.0 | 62.0 | 5.0 ± 0.0 | 10.0 | 30.0 | 61.0 | 4.5 ± 0.7 |" in md
    t34 = [_trial("fr", "target-only", "target language only", 0, 40.0)]
    t34 += [_trial("fr", "all-for-one", "all-for-one", 0, 44.1)]
    text34 = format_table({"table": build_table(GRIDS["news-table34"], t34, base)})
    assert "44.1 (+4.1)" in text34 and "45.1 (+4.1)" in text34
    assert flat_news_metrics({"t2i": {"r10": 5.0}, "pairs": 3})["test_t2i_r10"] == 5.0
    assert set(LAYOUTS) == {n for n, s in GRIDS.items() if s.family == "news"}
