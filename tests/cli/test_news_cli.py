"""`mmlinks data synth-news` and `mmlinks train --objective news` as a user runs them: the cheap
parts (the Ray fit itself is tests/training/news/test_news_train.py)."""

import json

from tests.cli.test_cli import _one_line_error, run


def test_synth_news_json_output_is_one_object(tmp_path):
    proc = run("data", "synth-news", "--out", str(tmp_path / "raw"), "--articles", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["documents"] == 4
    lines = (tmp_path / "raw" / "articles.jsonl").read_text().splitlines()
    assert len(lines) == 4 and {"headline", "language", "images"} <= set(json.loads(lines[0]))


def test_train_news_refuses_a_dataset_without_news_samples_before_training(dataset, tmp_path):
    work = tmp_path / "work"
    proc = run("train", "--data", str(dataset), "--objective", "news", "--workdir", str(work))
    _one_line_error(proc, "--objective news: ")
    assert "does not hold news samples" in proc.stderr and "--source news-jsonl" in proc.stderr
    bad = run(
        "train",
        "--data",
        str(dataset),
        "--objective",
        "news",
        "--news-sources",
        "caption",
        "--random-drop",
        "0.3",
    )
    _one_line_error(bad, "random_drop")


def test_train_news_multilingual_recipes_are_flags_checked_before_training(tmp_path):
    from tests.training.news.helpers import write_news_dataset

    write_news_dataset(tmp_path)
    proc = run("train", "--data", str(tmp_path), "--objective", "news", "--multilingual", "all-for-one")
    _one_line_error(proc, "init_from")
    assert "--init-from DIR" in proc.stderr  # the flags exist (argparse took them) and are checked
