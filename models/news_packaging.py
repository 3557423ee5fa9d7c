"""The news pyfunc packaged (issue #18): its files (checkpoint, vocabulary, archive index,
languages, serving threads) logged into a run or saved to a folder, and what a news run's end
calls (``package_news_run``: the archive index of the whole dataset, then the model)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from archive.build import build_archive_index
from archive.index import ArchiveIndex
from models.news_serving import SIGNATURE, NewsModel
from models.news_threads import SERVE_THREADS, checked_threads
from schemas.errors import MmlinksError
from training.news.model import NewsRetrieval
from training.text import Vocabulary


def train_languages(paths: list) -> list[str]:
    """The languages of the training samples (what the served model accepts)."""
    from schemas.shards import read_table

    meta = read_table(paths, columns=["metadata"]).column("metadata").to_pylist()
    return sorted({dict(m or {}).get("language", "") for m in meta} - {""})


def _artifacts(
    root: Path,
    checkpoint_dir: str,
    vocab: Vocabulary,
    index: ArchiveIndex,
    languages,
    run_id,
    threads: dict | None = SERVE_THREADS,
) -> dict:
    """The pyfunc's files under ``root``, by artifact name."""
    if not languages:
        raise MmlinksError("the training split names no language (metadata 'language')")
    shutil.copytree(checkpoint_dir, root / "checkpoint")
    vocab.save(root / "vocab.json")
    index.save(root / "archive")
    info = {"languages": list(languages), "run_id": run_id, "threads": checked_threads(threads)}
    (root / "news.json").write_text(json.dumps(info))
    artifacts = {
        "checkpoint": str(root / "checkpoint"),
        "vocab": str(root / "vocab.json"),
        "archive": str(root / "archive"),
        "news": str(root / "news.json"),
    }
    return artifacts


def log_news_model(
    checkpoint_dir: str,
    vocab: Vocabulary,
    index: ArchiveIndex,
    languages: list[str],
    run_id: str,
    path: str | Path | None = None,
    threads: dict | None = SERVE_THREADS,
) -> str:
    """Log the news pyfunc (checkpoint, vocabulary, archive index, languages) into the active
    run: its model URI; or, with ``path``, write it to that folder (no tracking store: ``mlflow
    models serve -m PATH`` serves it, ``mlflow.pyfunc.load_model(PATH)`` loads it): the path.
    ``threads``: the serving threads (``SERVE_THREADS``; None: the libraries' defaults)."""
    example = pd.DataFrame([{"language": (languages or [""])[0], "headline": "an example headline"}])
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = _artifacts(Path(tmp), checkpoint_dir, vocab, index, languages, run_id, threads)
        return NewsModel()._log(artifacts, SIGNATURE, example, ("faiss-cpu",), path)


def package_news_run(
    checkpoint_dir: str, net: NewsRetrieval, vocab: Vocabulary, data: str, manifest, run_id: str
) -> str:
    """What the experiment calls for a news run: the archive index of every image of the
    dataset (all splits: the newsroom's archive), then the packaged model; its URI."""
    paths = [str(p) for p in manifest.shard_paths(data)]
    info = {"run_id": run_id, "dataset_version": manifest.dataset_version}
    index = build_archive_index(net, paths, "flat", info)
    languages = train_languages([str(p) for p in manifest.shard_paths(data, "train")])
    return log_news_model(checkpoint_dir, vocab, index, languages, run_id)
