"""``benchmarks/link_family.py`` (issue #44): the grid's cells, one real run of a tiny cell through
the training path, and the table docs/benchmarks-linking.md shows (ratio, residual, the old
rule's and the measured pick)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

# by path: an installed dependency ships a top-level ``benchmarks`` package of its own
_SPEC = importlib.util.spec_from_file_location(
    "link_family", Path(__file__).resolve().parents[2] / "benchmarks" / "link_family.py"
)
link_family = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(link_family)


def test_the_issue_grid_is_the_issues_cells():
    cells = link_family.issue_grid()
    assert len(cells) == 21 and len(set(cells)) == 21
    topic = [link_family.parse_cell(c) for c in cells if c.startswith("topic:")]
    assert {(c["topics"], c["look_mixing"]) for c in topic} == {
        (k, m) for k in (10, 40, 200) for m in ("added", "clipped")
    }
    assert link_family.parse_cell("topic:40:clipped:5:0") == {
        "look_sharing": "topic",
        "topics": 40,
        "look_mixing": "clipped",
        "look_strength": 5.0,
        "topic_words": 0,
    }
    with pytest.raises(SystemExit, match="bad cell"):
        link_family.parse_cell("topic:40")
    # issue #60's structures as KEY=VALUE parts
    assert link_family.parse_cell("topic:40:added:4.1:looks=3:images=2-3:share=0.5:noise=1") == {
        "look_sharing": "topic",
        "topics": 40,
        "look_mixing": "added",
        "look_strength": 4.1,
        "looks_per_topic": 3,
        "images_min": 2,
        "images_max": 3,
        "look_share": 0.5,
        "feature_noise": 1.0,
    }
    assert link_family.parse_cell("topic:40:added:4.1:extra=2")["extra_sentences"] == 2  # distractors
    assert link_family.parse_cell("topic:40:added:4.1:unlinked=2")["extra_images"] == 2
    with pytest.raises(SystemExit, match="unknown key"):
        link_family.parse_cell("topic:40:added:4:colour=red")
    for bad in ("topic:40:added:4:extra=1.5", "topic:40:added:4:looks=x", "topic:forty:added:4"):
        with pytest.raises(SystemExit, match=r"bad cell .*invalid literal"):  # one line, not a traceback
            link_family.parse_cell(bad)


@pytest.mark.slow
def test_a_tiny_cell_trains_both_rows_and_prints_the_docs_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(link_family, "BASE", dict(link_family.BASE))  # --set changes a module dict
    silenced = logging.root.manager.disable  # each run silences warnings: not this process's later tests
    try:
        out = link_family.main(
            [
                "--cells",
                "topic:4:added:3",
                "--rows",
                "default,bag",
                "--seeds",
                "0",
                "--docs",
                "80",  # >= 65 documents: enough for the residual's 16 directions
                "--dim",
                "64",
                "--corpora",
                str(tmp_path),
                "--set",
                "epochs=1",
                "--markdown",
            ]
        )
    finally:
        logging.disable(silenced)
    entry = out["cells"]["topic:4:added:3"]
    # four topics' looks at strength 3: strong, and in a few directions (the bag's image side)
    assert entry["ratio"][0] >= 5 and entry["residual"][0] < 1
    measured = entry["rows"]["default"][0]
    assert measured["choice"] in measured["scores"] and len(measured["scores"]) == 4
    assert measured["trial_epochs"] == 1  # the run's one epoch
    for row in ("default", "bag"):
        run = entry["rows"][row][0]
        assert 0 <= run["auc"] <= 100 and 0 <= run["p_at_1"] <= 100
    assert entry["default_minus_bag"] == pytest.approx(
        entry["rows"]["default"]["mean_auc"] - entry["rows"]["bag"]["mean_auc"], abs=0.11
    )
    table = capsys.readouterr().err.strip().splitlines()[-3:]
    assert table[0].startswith("| cell | train ratio | residual | measured pick | default | bag |")
    cols = [c.strip() for c in table[2].strip("|").split("|")]
    d, b = entry["rows"]["default"][0], entry["rows"]["bag"][0]
    assert cols == [
        "`topic:4:added:3`",
        f"{entry['ratio'][0]:.1f}",
        f"{entry['residual'][0]:.1f}",
        measured["choice"],
        f"{d['auc']} / {d['p_at_1']}",
        f"{b['auc']} / {b['p_at_1']}",
        f"{entry['default_minus_bag']:+.1f}",
    ]


def test_the_image_centred_auc_takes_each_images_offset_off_and_nothing_else():
    """One document, 3 sentences and 4 images (the 4th named by none): the links score 0.5, the
    rest 0; image 3 scores 0.9 with every sentence (an offset) and image 1 gets +0.3 on all three.
    Raw, image 3's cells outrank every link (AUC 66.7); centred per image, every link is on top."""
    import numpy as np

    from training.metrics import document_metrics

    scores = np.zeros((3, 4))
    links = [(0, 0), (1, 1), (2, 2)]
    for s, i in links:
        scores[s, i] = 0.5
    scores[:, 3] = 0.9
    scores[:, 1] += 0.3
    raw = document_metrics("d", scores, links).auc
    predictions = [{"doc_id": "d", "scores": scores.tolist()}, {"doc_id": "u", "scores": [[0.1, 0.2]]}]
    assert round(100 * raw, 1) == 66.7
    assert link_family.image_centred_auc(predictions, {"d": links, "u": None}) == 100.0


@pytest.mark.slow
def test_the_fit_loop_trains_the_experiments_model_and_a_rerun_resumes_from_its_jsonl(tmp_path, monkeypatch):
    """``--loop fit`` (no MLflow: the GPU image's path) scores the same model as ``mmlinks train
    --workers 0``; a rerun with the same ``--jsonl`` trains nothing and reports what it recorded."""
    monkeypatch.setattr(link_family, "BASE", dict(link_family.BASE))
    jsonl = tmp_path / "runs.jsonl"
    args = ["--cells", "topic:4:added:3", "--rows", "default", "--seeds", "0", "--docs", "80", "--dim", "64"]
    args += ["--corpora", str(tmp_path / "corpora"), "--set", "epochs=1"]
    silenced = logging.root.manager.disable
    try:
        fit = link_family.main([*args, "--loop", "fit", "--jsonl", str(jsonl)])
        experiment = link_family.main(args)

        def no_training(*_a, **_k):
            raise AssertionError("a recorded run was trained again")

        monkeypatch.setattr(link_family, "run_one", no_training)
        again = link_family.main([*args, "--loop", "fit", "--jsonl", str(jsonl)])
        with open(jsonl, "a") as f:
            f.write('{"cell": "topic:4:ad')  # a line cut short by a killed run
        again = link_family.main([*args, "--loop", "fit", "--jsonl", str(jsonl)])
        monkeypatch.setattr(link_family, "run_one", lambda *a, **k: {"auc": -1.0, "p_at_1": -1.0})
        changed = link_family.main([*args[:-1], "epochs=2", "--loop", "fit", "--jsonl", str(jsonl)])
    finally:
        logging.disable(silenced)
    run = fit["cells"]["topic:4:added:3"]["rows"]["default"][0]
    other = experiment["cells"]["topic:4:added:3"]["rows"]["default"][0]
    for key in ("auc", "p_at_1", "best_epoch"):
        assert run[key] == other[key]
    # the fit loop scores validation too, the model the test scores were of
    assert 0 <= run["val_auc"] <= 100 and 0 <= run["val_p_at_1"] <= 100 and "val_auc" not in other
    assert 0 <= run["auc_image_centred"] <= 100
    assert again["cells"]["topic:4:added:3"]["rows"]["default"][0] == run
    # another setting is another run: not reused
    assert changed["cells"]["topic:4:added:3"]["rows"]["default"][0]["auc"] == -1.0


def test_runs_are_read_as_they_finish_not_in_submission_order():
    """The first job waits until the second's result was read: in submission order (``pool.map``)
    that never happens, and a killed run lost every finished run behind a slow one."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    second_read = threading.Event()

    def job(i: int) -> tuple[int, bool]:
        return i, second_read.wait(timeout=30) if i == 0 else True

    order = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for i, ok in link_family.completed(pool, job, [0, 1]):
            order.append((i, ok))
            if i == 1:
                second_read.set()
    assert order == [(1, True), (0, True)]
    assert list(link_family.completed(None, lambda i: i * 2, [1, 2, 3])) == [2, 4, 6]


def test_a_failed_run_drops_the_queued_ones():
    """A run that raises ends the grid at once: the runs still queued are cancelled, not run."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    ran, release = [], threading.Event()

    def job(i: int) -> int:
        if i == 0:
            raise RuntimeError("run 0 failed")
        ran.append(i)
        release.wait(timeout=30)  # a slow run: the one started beside the failure
        return i

    with ThreadPoolExecutor(max_workers=1) as pool:
        with pytest.raises(RuntimeError, match="run 0 failed"):
            list(link_family.completed(pool, job, list(range(50))))
        release.set()
    assert len(ran) <= 1  # at most the run that had started (uncancelled, all 49 ran)


def test_naming_no_cell_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        link_family.main(["--cells", ","])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith("no cell: name one with --cells or --grid"), last


def test_other_validation_and_test_sizes_write_a_corpus_of_their_own(tmp_path, capsys):
    """``--val-docs`` / ``--test-docs``: a corpus with those splits, cached apart from the default
    sizes' (whose folder keeps its name, so caches written before still serve)."""
    from schemas.manifest import Manifest

    default = link_family.corpus_sizes(80, 16)
    assert default == {"docs": 80, "val_docs": 50, "test_docs": 50, "dim": 16}
    assert link_family.corpus_sizes(80, 16, None, None) == default
    sizes = link_family.corpus_sizes(80, 16, 60, 70)
    plain, _ = link_family.make_corpus(tmp_path, "topic:4:added:3", default, 0)
    other, _ = link_family.make_corpus(tmp_path, "topic:4:added:3", sizes, 0)
    assert Path(plain).name == "topic_4_added_3-s0-80-d16"
    assert Path(other).name == "topic_4_added_3-s0-80-d16-v60-t70"
    assert Manifest.read(Path(other)).counts["splits"] == {"train": 80, "val": 60, "test": 70}
    assert Manifest.read(Path(plain)).counts["splits"] == {"train": 80, "val": 50, "test": 50}
    with pytest.raises(SystemExit) as exit_:
        link_family.main(["--cells", "topic:4:added:3", "--test-docs", "1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--test-docs must be >= 2")
